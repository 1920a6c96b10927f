#!/bin/bash
# Device call for the copy cuts of stops 69-70 (each bulk copy costs an SM ~0.24 µs whatever its size up to ~4 KB:
# NOTES.md "Stop 69"), parts ordered by importance so that a cut-off call still answers the first questions:
# 1. the bulk-copy probe's two tables (scripts/bulk-probe.cu: by size; then by issuing warps, blocks per SM and tensor
#    copies); needs build-probe/bulk (nvcc -std=c++17 -O3 -arch=sm_90 -o build-probe/bulk scripts/bulk-probe.cu),
#    carried beside .parpack;
# 2. test_cuda as built (the default paths: the unit-1 offset of the product and the activation slots of the bulk
#    GEMV moved), then decode of the 8B shape at batch 1-32;
# 3. each setting, off by default until measured: test_cuda with it, and where that passes, decode against the
#    default's figures of the same call:
#    - once: the bulk GEMV copies a group's header (scale codes, table) with its first unit only
#      (TSR_CUDA_GEMV_HDR_ONCE=1, gemv.cu ft_issue; CTest test_cuda_hdronce), batch 4-32;
#    - xpair: two units' activations in one copy through its ring (TSR_CUDA_GEMV_XPAIR=1, ft_issue_x; CTest
#      test_cuda_xpair), alone and with once, at 24 and 64 rows, and with XR from 9 rows at 12 and 16;
#    - twords (measured at stop 71, 7-10 % slower, and removed);
#    - bulk1: one and two rows on the bulk GEMV with headers once (TSR_CUDA_GEMV_BULK_MIN=1 with once).
# About 3-4 min on a warm machine (test_cuda ~15 s a run). Carry .parpack (TSR_GPUPACK_SLIM=1
# tests/parallel/gpu-pack.sh here) and build-probe.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -x build-probe/bulk ] && {
  timeout 40 build-probe/bulk > "$OUT/bulk.log" 2>&1; echo "bulk probe rc=$?"; cat "$OUT/bulk.log"
}
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
echo "synth done (at $SECONDS s)"
dec() { # NAME ROWS [ENV...]: decode tok/s of the 8B shape at ROWS (a comma list)
  local name=$1 rows=$2
  shift 2
  env "$@" timeout 90 "$bin" bench --model $m8 --device cuda --batch "$rows" --prompt-len 64 --gen 32 \
    > "$OUT/d-$name.log" 2>&1
  echo "decode $name rc=$? $(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {printf "%s:%s ", $1, $3}' "$OUT/d-$name.log")"
}
test_cuda_one default 90 && dec every 1,2,4,8,12,16,24,32,64,96,128
test_cuda_one once 90 TSR_CUDA_GEMV_HDR_ONCE=1 && dec once 4,8,16,32 TSR_CUDA_GEMV_HDR_ONCE=1
if test_cuda_one xpair 90 TSR_CUDA_GEMV_XPAIR=1 TSR_CUDA_GEMV_XRING_MIN=9; then
  dec xp 24,64 TSR_CUDA_GEMV_XPAIR=1
  dec xpo 12,16,24,64 TSR_CUDA_GEMV_XPAIR=1 TSR_CUDA_GEMV_HDR_ONCE=1
  dec xpo9 12,16 TSR_CUDA_GEMV_XPAIR=1 TSR_CUDA_GEMV_HDR_ONCE=1 TSR_CUDA_GEMV_XRING_MIN=9
fi
test_cuda_one bulk1 90 TSR_CUDA_GEMV_BULK_MIN=1 TSR_CUDA_GEMV_HDR_ONCE=1 &&
  dec b1once 1,2 TSR_CUDA_GEMV_BULK_MIN=1 TSR_CUDA_GEMV_HDR_ONCE=1
dec again 1,4,8,16,24,64,96 # the default once more: the spread of the call
echo "end (at $SECONDS s)"
