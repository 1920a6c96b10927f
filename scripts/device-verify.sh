#!/bin/bash
# Device call: test_cuda on main (default and TSR_CUDA_DQ_PAIR=0), the 8B synth model, bench at batch 64-256 and 1,
# the head at 256 rows against 128 (TSR_HEAD_ROWS), scripts/persist-probe.cu (plain and --trace), then per-op device
# profiles at batch 1 and 256. Carry .parpack (made here by TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh). Logs
# under $OUT; summary.txt has each step's return code.
set -u
. tests/parallel/gpu-env.sh >/dev/null
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
( timeout 150 $P/bin/test_cuda > $OUT/t.log 2>&1; echo "test_cuda rc=$?" ) >> $OUT/summary.txt
( TSR_CUDA_DQ_PAIR=0 timeout 150 $P/bin/test_cuda > $OUT/t_nopair.log 2>&1; echo "test_cuda DQ_PAIR=0 rc=$?" ) >> $OUT/summary.txt
m8=/tmp/llama8b-4.0
synth_8b $m8
timeout 200 $bin bench --model $m8 --device cuda --batch 64,128,192,256 --prompt-len 32 --gen 64 > $OUT/bench_big.log 2>&1; echo "bench big rc=$?" >> $OUT/summary.txt
# the head in one call of 256 rows (TSR_HEAD_ROWS, the default) against two of 128 (stop 60), alternating
for r in 128 256 128 256; do
  TSR_HEAD_ROWS=$r timeout 100 $bin bench --model $m8 --device cuda --batch 256 --prompt-len 32 --gen 64 \
    > $OUT/bench_head$r.log 2>&1
  echo "bench head $r rc=$?" >> $OUT/summary.txt; grep -E '^ +[0-9]+ ' $OUT/bench_head$r.log >> $OUT/summary.txt
done
timeout 100 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 512 --gen 128 > $OUT/bench_b1.log 2>&1; echo "bench b1 rc=$?" >> $OUT/summary.txt
# the persistent step's memory-side ceiling (scripts/persist-probe.cu)
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  PATH=/usr/local/cuda/bin:$PATH nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/persist scripts/persist-probe.cu > $OUT/persist_build.log 2>&1 &&
    timeout 120 /tmp/persist > $OUT/persist.log 2>&1; echo "persist rc=$?" >> $OUT/summary.txt
  timeout 120 /tmp/persist --trace > $OUT/persist_trace.log 2>&1; echo "persist trace rc=$?" >> $OUT/summary.txt
fi
TSR_CUDA_PROFILE=2 timeout 100 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 512 --gen 64 > $OUT/prof_b1.log 2>&1
TSR_CUDA_PROFILE=2 timeout 100 $bin bench --model $m8 --device cuda --batch 256 --prompt-len 32 --gen 32 > $OUT/prof_b256.log 2>&1
