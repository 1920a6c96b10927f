#!/bin/bash
# Device call for what holds the wgmma product at few rows (NOTES.md "Stop 66": its decode step is flat at 0.5-0.6
# TB/s of weights from 40 to 96 rows, at 8B and 70B alike). test_cuda by default; then per-matrix times of a 96-row
# decode step of the 8B shape (TSR_CUDA_DQ_TIMES=1, least µs of each product with its reduction) for the full kernel,
# for the diagnostics of gemm_dq_wgmma.cu (TSR_CUDA_DW_DIAG, wrong results, now in 96-row tiles where M <= 96):
# nostore, copy, copyact, copywords, nodecode, mma, mmaraw, and for K split 1, 2, 4 and 8 ways; the same at 256 rows
# for the full kernel and copy. About 60 s on a warm machine. Carry .parpack (TSR_GPUPACK_SLIM=1
# tests/parallel/gpu-pack.sh here).
set -u
. tests/parallel/gpu-env.sh >/dev/null
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1 &
sp=$!
test_cuda_one default 120
wait $sp
one() { dq_step $m8 $1 $1-$2 "${@:3}"; } # rows name env...
one 96 full
for d in nostore copy copyact copywords nodecode mma mmaraw; do one 96 $d TSR_CUDA_DW_DIAG=$d; done
for sp in 1 2 4 8; do one 96 split$sp TSR_CUDA_DW_SPLITS=$sp; done
one 256 full
one 256 copy TSR_CUDA_DW_DIAG=copy
