#!/bin/bash
# Device call for decode past 64 rows and the persistent step's open question (stop 62): the persist probe's
# --trace (never run before); the per-matrix device times of 128- and 256-row decode steps through the wgmma
# product (TSR_CUDA_DQ_TIMES=1, which turns graph replay off since stop 62); decode at 256-512 rows with the product
# taking every row count against main's default (cuBLAS past 256 rows), to find where the two cross. Carry
# .parpack (made here by TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh). Logs under $OUT; summary.txt has each
# step's result and is printed at the end.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
s=$OUT/summary.txt
cat $OUT/gpu.txt >> $s
m8=/tmp/llama8b-4.0
synth_8b $m8 &
synth_pid=$!
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  PATH=/usr/local/cuda/bin:$PATH nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/persist scripts/persist-probe.cu \
    > $OUT/persist_build.log 2>&1
fi
wait $synth_pid
[ -x /tmp/persist ] && { timeout 90 /tmp/persist --trace > $OUT/persist_trace.log 2>&1; echo "persist trace rc=$?" >> $s; }
# decode NAME "ENV..." BATCHES [GEN]
decode() {
  env $2 timeout 150 $bin bench --model $m8 --device cuda --batch $3 --prompt-len 32 --gen ${4:-64} \
    > $OUT/decode-$1.log 2>&1
  echo "decode $1 ($2) rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/decode-$1.log >> $s
}
decode times128 "TSR_CUDA_DQ_TIMES=1" 128 16
grep "^dq path" $OUT/decode-times128.log >> $s
decode times256 "TSR_CUDA_DQ_TIMES=1" 256 16
grep "^dq path" $OUT/decode-times256.log >> $s
decode default "" 256,320,384,448,512
decode all "TSR_CUDA_DQ_WGMMA=1" 256,320,384,448,512
cat $s
