#!/bin/bash
# Device call for the next stop (written at stop 65, not yet run; NOTES.md "Next steps (as of stop 65)"): test_cuda
# on this branch (q/k/v's grouped product timed under TSR_CUDA_DQ_TIMES), then per-matrix times of a 256-row and a
# 128-row decode step with the K splits the product picks and with 1-6 and 8 for every matrix
# (TSR_CUDA_DW_SPLITS): whether the staged epilogue (stop 64) moved the best split of o, q/k/v and down; and with
# the K splits' reduction one element a thread (TSR_CUDA_DW_REDUCE4=0, the default before this branch); then decode
# at 96-256 rows by default; then at 320-512 rows through cuBLAS (the default past 256) and through the product
# (TSR_CUDA_DQ_WGMMA_MAX_M=512; stop 62 found no clean crossing with the direct stores). About 330 s. Carry
# .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here). Prints its summary; the logs stay under $OUT.
set -u
. tests/parallel/gpu-env.sh >/dev/null
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1 &
sp=$!
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
test_cuda_one default 120
wait $sp
for rows in 256 128; do
  for sp in auto 1 2 3 4 5 6 8 reduce1; do
    e=""; [ $sp = auto ] || e="TSR_CUDA_DW_SPLITS=$sp"; [ $sp = reduce1 ] && e="TSR_CUDA_DW_REDUCE4=0"
    dq_step $m8 $rows $rows-splits$sp $e
  done
done
timeout 120 $bin bench --model $m8 --device cuda --batch 96,128,160,192,224,256 --prompt-len 32 --gen 32 \
  > $OUT/d.log 2>&1
echo "decode rc=$? $(awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $3}' $OUT/d.log)"
for v in "cublas:" "product:TSR_CUDA_DQ_WGMMA_MAX_M=512"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 150 $bin bench --model $m8 --device cuda --batch 320,384,448,512 --prompt-len 32 --gen 16 \
    > $OUT/d512-$name.log 2>&1
  echo "decode 320-512 $name ($envs) rc=$? $(awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $3}' $OUT/d512-$name.log)"
done
