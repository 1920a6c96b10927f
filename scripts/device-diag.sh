#!/bin/bash
# Device call for where the wgmma product's time goes at 256 rows (stop 65; NOTES.md "Stop 65"): test_cuda by
# default, then per-matrix times of a 256-row decode step (TSR_CUDA_DQ_TIMES=1, the least µs of each product with its
# reduction) for the full kernel and for the diagnostics of gemm_dq_wgmma.cu (TSR_CUDA_DW_DIAG, wrong results):
# nostore (no epilogue), copy (the copies alone), nodecode (copies and wgmma's, no decode), mma (decode and wgmma's
# on stages read again and again, no copies). About 30 s on a warm machine. Carry .parpack (made here by
# TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh).
set -u
. tests/parallel/gpu-env.sh >/dev/null
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1 &
sp=$!
test_cuda_one default 120
wait $sp
for d in none nostore copy nodecode mma; do
  e=""; [ $d = none ] || e="TSR_CUDA_DW_DIAG=$d"
  dq_step $m8 256 $d $e
done
