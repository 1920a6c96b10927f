#!/bin/bash
# Device call (stop 69), parts ordered by importance so that a cut-off call still answers the first question:
# 1. the bulk-copy probe (scripts/bulk-probe.cu: what one SM's bulk copies cost, by size, issuing warps, blocks per SM
#    and tensor copies); needs build-probe/bulk (nvcc -std=c++17 -O3 -arch=sm_90 -o build-probe/bulk
#    scripts/bulk-probe.cu), carried beside .parpack;
# 2. test_cuda as built (the default paths), then with the bulk GEMV copying a group's header (scale codes, table)
#    with its first unit only (TSR_CUDA_GEMV_HDR_ONCE=1, gemv.cu ft_issue; CTest test_cuda_hdronce), and with the wgmma
#    product's words as one tensor copy a stage at every row count (TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_TWORDS=1,
#    gemm_dq_wgmma.cu; CTest test_cuda_dwtwords); both written at stop 69 and off by default until measured;
#    and two units' activations in one copy through the bulk GEMV's ring (TSR_CUDA_GEMV_XPAIR=1, stop 70);
#    and one and two rows on the bulk GEMV with headers once (TSR_CUDA_GEMV_BULK_MIN=1 TSR_CUDA_GEMV_HDR_ONCE=1);
# 3. each against the default, once: decode at batch 1, 4, 8 and 32 of the 8B shape (3-64 rows take the bulk GEMV),
#    and at 96 and 128 rows (the product). Written at stop 69, whose device time ran out before it could run.
# About 120 s on a warm machine. Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here) and build-probe.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -x build-probe/bulk ] && {
  timeout 30 build-probe/bulk > "$OUT/bulk.log" 2>&1; echo "bulk probe rc=$?"; cat "$OUT/bulk.log"
}
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
echo "synth done (at $SECONDS s)"
test_cuda_one default 60
test_cuda_one once 60 TSR_CUDA_GEMV_HDR_ONCE=1
test_cuda_one twords 60 TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_TWORDS=1
test_cuda_one xpair 60 TSR_CUDA_GEMV_XPAIR=1 TSR_CUDA_GEMV_XRING_MIN=9
test_cuda_one bulk1 60 TSR_CUDA_GEMV_BULK_MIN=1 TSR_CUDA_GEMV_HDR_ONCE=1
dec() { # MODEL ROWS NAME [ENV...]: decode tok/s at ROWS (a comma list)
  local model=$1 rows=$2 name=$3
  shift 3
  env "$@" timeout 60 "$bin" bench --model "$model" --device cuda --batch "$rows" --prompt-len 64 --gen 32 \
    > "$OUT/d-$name.log" 2>&1
  echo "decode $name rc=$? $(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {printf "%s:%s ", $1, $3}' "$OUT/d-$name.log")"
}
dec $m8 1,2,4,8,32 every
dec $m8 1,4,8,32 once TSR_CUDA_GEMV_HDR_ONCE=1
dec $m8 24,64 xp0
dec $m8 24,64 xp TSR_CUDA_GEMV_XPAIR=1
dec $m8 24,64 xpo TSR_CUDA_GEMV_XPAIR=1 TSR_CUDA_GEMV_HDR_ONCE=1
dec $m8 96,128 bulkw
dec $m8 96,128 tw TSR_CUDA_DW_TWORDS=1
dec $m8 1,2 b1once TSR_CUDA_GEMV_BULK_MIN=1 TSR_CUDA_GEMV_HDR_ONCE=1
echo "end (at $SECONDS s)"
