#!/bin/bash
# Device call: test_cuda on main (default, TSR_CUDA_DQ_WGMMA=0 and TSR_CUDA_DQ_PAIR=0 with it), the 8B synth model,
# decode at 64-256 rows by default against the cuBLAS path (TSR_CUDA_DQ_WGMMA=0), batch 1, the 2048-token prefill,
# then scripts/persist-probe.cu --trace; TSR_VERIFY_QUICK=1 leaves out the TSR_CUDA_DQ_PAIR=0 test and the probe.
# Carry .parpack (made here by TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh). Logs under $OUT; 0summary.txt has each
# step's result.
set -u
. tests/parallel/gpu-env.sh >/dev/null
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
s=$OUT/0summary.txt  # first by name: a call brings back 8 files, the first by name
quick=${TSR_VERIFY_QUICK:-0}
variants=("default:" "cublas:TSR_CUDA_DQ_WGMMA=0")
[ "$quick" = 1 ] || variants+=("nopair:TSR_CUDA_DQ_WGMMA=0 TSR_CUDA_DQ_PAIR=0")
for v in "${variants[@]}"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 150 $P/bin/test_cuda > $OUT/t-$name.log 2>&1
  echo "test_cuda $name ($envs) rc=$? $(grep -cE '^\[  FAILED|ERROR' $OUT/t-$name.log) failure lines" >> $s
done
m8=/tmp/llama8b-4.0
synth_8b $m8
for v in "default:" "cublas:TSR_CUDA_DQ_WGMMA=0"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 120 $bin bench --model $m8 --device cuda --batch 64,80,96,128,192,256 --prompt-len 32 --gen 64 \
    > $OUT/decode-$name.log 2>&1
  echo "decode $name ($envs) rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/decode-$name.log >> $s
done
timeout 100 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 512 --gen 128 > $OUT/bench_b1.log 2>&1
echo "batch 1 rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/bench_b1.log >> $s
timeout 60 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 2 > $OUT/prefill.log 2>&1
echo "prefill 2048 rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/prefill.log >> $s
if [ "$quick" != 1 ] && { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  PATH=/usr/local/cuda/bin:$PATH nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/persist scripts/persist-probe.cu \
    > $OUT/persist_build.log 2>&1 && timeout 60 /tmp/persist --trace > $OUT/persist_trace.log 2>&1
  echo "persist trace rc=$?" >> $s
fi
