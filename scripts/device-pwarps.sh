#!/bin/bash
# Device call (stop 71) for the issuing warps of the wgmma product's copies. Stop 71's first call found a block's copy
# rate grows with the threads that issue them (scripts/bulk-probe.cu: 2 KB copies at 0.73, 1.45 and 2.57 TB/s from 1,
# 2 and 4 warps, 0.72 / 1.30 / 2.11 / 2.97 from 1 / 2 / 4 / 8 lanes of one warp); the product (gemm_dq_wgmma.cu,
# 65-512 rows) now issues its tiles from one warp and its words from another, TSR_CUDA_DW_PWARPS=1 from one. In order:
# 1. the probe's table (build-probe/bulk, carried beside .parpack);
# 2. test_cuda as built, and with the product at every row count from one warp and from two (CTest test_cuda_dwpw1,
#    test_cuda_dqwgmma);
# 3. each product's least µs at 96 and 256 rows (dq_step), one warp and two;
# 4. decode at 65-512 rows, and a 2048-token prefill in chunks of 512, interleaved over two rounds.
# About 3 min on a warm machine. Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here), build-probe.
# Run it without a pipe into tail: a call cut off by its limit returns no output then.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -x build-probe/bulk ]; then
  timeout 40 build-probe/bulk > "$OUT/bulk.log" 2>&1
  echo "probe rc=$?"
  cat "$OUT/bulk.log"
fi
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
echo "synth done (at $SECONDS s)"
ok=1
test_cuda_one default 120 || ok=0
test_cuda_one pw1 120 TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_PWARPS=1 || ok=0
test_cuda_one pw2 120 TSR_CUDA_DQ_WGMMA=1 || ok=0
[ $ok = 1 ] || { grep -E '^\[  FAILED|ERROR|FAIL' "$OUT"/t-*.log | head -20; exit 0; }
for rows in 96 256; do
  dq_step $m8 $rows "p1-$rows" TSR_CUDA_DW_PWARPS=1
  dq_step $m8 $rows "p2-$rows"
done
rows=65,96,128,192,256,384,512
for round in 1 2; do
  decode_ab $m8 $rows pw1 $round TSR_CUDA_DW_PWARPS=1
  decode_ab $m8 $rows pw2 $round
done
echo "end (at $SECONDS s)"
