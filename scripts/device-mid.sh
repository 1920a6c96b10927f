#!/bin/bash
# Device call of stop 66: (1) the product from 53 rows (TSR_CUDA_DQ_MIN_M=53) against the bulk GEMV (default: the
# product from 65) at 52-64 decode rows, twice each, alternating; (2) per-matrix device times of a 2048-token prefill
# in chunks of 2048 and 1024 rows (TSR_CUDA_DQ_TIMES=1), the cuBLAS path against the product (TSR_CUDA_DQ_WGMMA=1):
# whether some matrix shapes prefill faster through the product. About 120 s. Carry .parpack.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
for rep in 1 2; do
  for v in "gemv:" "product53:TSR_CUDA_DQ_MIN_M=53"; do
    name=${v%%:*}; envs=${v#*:}
    env $envs timeout 100 $bin bench --model $m8 --device cuda --batch 52,56,60,64 --prompt-len 32 --gen 32 \
      > $OUT/mid-$name-$rep.log 2>&1
    echo "mid $name #$rep rc=$? $(awk '/^ +[0-9]+ /{printf "%s:%s ", $1, $3}' $OUT/mid-$name-$rep.log)"
  done
done
for c in 2048 1024; do
  for v in "cublas:" "product:TSR_CUDA_DQ_WGMMA=1"; do
    name=${v%%:*}; envs=${v#*:}
    env TSR_CUDA_DQ_TIMES=1 $envs timeout 100 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 2048 \
      --gen 2 --max-tokens $c > $OUT/pt-$name-$c.log 2>&1
    echo "prefill chunk $c $name rc=$? $(awk '/^ +[0-9]+ /{printf "pf %s", $2}' $OUT/pt-$name-$c.log)"
    n='([0-9.]+)'
    grep "^dq path M $c," $OUT/pt-$name-$c.log \
      | sed -E "s/^dq path M [0-9]+, ([0-9x]+): ([0-9]+) calls.*least $n, $n, $n\)/  \1 x\2: \3 + \4 + \5/"
  done
done
