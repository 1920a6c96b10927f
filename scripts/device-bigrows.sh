#!/bin/bash
# Device call of stop 66: where the wgmma product should hand over to the cuBLAS path past 256 rows, now that
# dw_rows spreads M over the fewest row tiles (320 rows: two tiles of 160, not two of 256). test_cuda by default,
# with the product at every row count (its M = 300 case takes two tiles of 160) and split 3 and 1 ways; decode of the
# 8B shape at 288-512 rows by default (cuBLAS past 256), through the product (TSR_CUDA_DQ_WGMMA_MAX_M=4096) and
# through it with whole 256-row tiles (TSR_CUDA_DW_ROWS=256, as before); decode at 640-1024 rows and a 2048-token
# prefill in chunks of 512, 1024 and 2048 rows (--max-tokens) by cuBLAS and by the product. About 300 s. Carry
# .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here). Prints its summary; the logs stay under $OUT.
set -u
. tests/parallel/gpu-env.sh >/dev/null
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1 &
sp=$!
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
test_cuda_one default 150
test_cuda_one dqwgmma 150 TSR_CUDA_DQ_WGMMA=1
test_cuda_one dwsplit3 150 TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_SPLITS=3
test_cuda_one dwsplit1 150 TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_SPLITS=1
wait $sp
row() { awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $3}' "$1"; }
for v in "cublas:" "product:TSR_CUDA_DQ_WGMMA_MAX_M=4096" \
  "product256:TSR_CUDA_DQ_WGMMA_MAX_M=4096 TSR_CUDA_DW_ROWS=256"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 150 $bin bench --model $m8 --device cuda --batch 288,320,384,448,512 --prompt-len 32 --gen 16 \
    > $OUT/d-$name.log 2>&1
  echo "decode 288-512 $name rc=$? $(row $OUT/d-$name.log) (at $SECONDS s)"
done
for v in "cublas:" "product:TSR_CUDA_DQ_WGMMA_MAX_M=4096"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 150 $bin bench --model $m8 --device cuda --batch 640,768,1024 --prompt-len 32 --gen 12 \
    > $OUT/e-$name.log 2>&1
  echo "decode 640-1024 $name rc=$? $(row $OUT/e-$name.log) (at $SECONDS s)"
  for c in 512 1024 2048; do
    env $envs timeout 100 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 4 --max-tokens $c \
      > $OUT/p-$name-$c.log 2>&1
    echo "prefill 2048 chunk $c $name rc=$? $(awk '/^ +[0-9]+ /{printf "prefill %s decode %s", $2, $3}' \
      $OUT/p-$name-$c.log) (at $SECONDS s)"
  done
done
