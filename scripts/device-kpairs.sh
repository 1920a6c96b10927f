#!/bin/bash
# Device call (written at stop 72, when no GPU was lent to run it) for the wgmma product's two pairs of consumer
# warpgroups. Stop 71 left the product at 65-256 rows bound by its consumers (gate at 96 rows ~0.78 µs a stage; the
# wgmma's on raw words alone 31 of its ~49 µs); two pairs at 120 registers each put twice the warps on the decode
# and the wgmma's (EXL2, off by default): TSR_CUDA_DW_KPAIRS=2 in blocks of at most 128 rows (the pairs take turns a
# stage, their sums added in the epilogue), TSR_CUDA_DW_RPAIRS=2 in blocks of 192 or 256 rows (each pair multiplies
# half the rows, every weight decoded once a pair). In order:
# 1. test_cuda as built (it also checks gemv.cu back at 9733e72's, untested on a GPU since stop 72's cleanup), and
#    with the product at every row count with both pairs (CTest test_cuda_dwpairs), and with one pair;
# 2. each product's least µs at 96 and 256 rows (dq_step), one pair and two;
# 3. decode at 65-512 rows and a 2048-token prefill in 512-token chunks, one pair against two, over two rounds.
# About 3 min on a warm machine. Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here).
# Run it without a pipe into tail: a call cut off by its limit returns no output then.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
echo "synth done (at $SECONDS s)"
two="TSR_CUDA_DW_KPAIRS=2 TSR_CUDA_DW_RPAIRS=2"
ok=1
test_cuda_one default 120 || ok=0
test_cuda_one all2 120 TSR_CUDA_DQ_WGMMA=1 $two || ok=0
test_cuda_one all1 120 TSR_CUDA_DQ_WGMMA=1 || ok=0
[ $ok = 1 ] || { grep -E '^\[  FAILED|ERROR|FAIL' "$OUT"/t-*.log | head -20; exit 0; }
for rows in 96 256; do
  dq_step $m8 $rows "p1-$rows"
  dq_step $m8 $rows "p2-$rows" $two
done
rows=65,96,128,192,256,384,512
for round in 1 2; do
  decode_ab $m8 $rows one $round
  decode_ab $m8 $rows two $round $two
done
echo "end (at $SECONDS s)"
