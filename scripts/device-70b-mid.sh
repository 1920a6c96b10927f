#!/bin/bash
# Device call of stop 66: the 70B shape at 4.0 bpw, decode at 56 and 64 rows (128-token prompts), the product from
# 53 rows (default now) against the bulk GEMV up to 64 (TSR_CUDA_DQ_MIN_M=65, the default before). About 200 s.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
m70=/tmp/llama70b-4.0
$bin synth --arch llama --hidden 8192 --layers 80 --heads 64 --kv-heads 8 --intermediate 28672 --vocab 128256 \
  --bpw 4.0 --shard-size 4096 --threads 16 --out $m70 > /dev/null 2>&1
echo "synth done at $SECONDS s"
for v in "product:" "gemv:TSR_CUDA_DQ_MIN_M=65"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 120 $bin bench --model $m70 --device cuda --batch 56,64 --prompt-len 128 --gen 24 \
    > $OUT/$name.log 2>&1
  echo "70B $name rc=$? $(awk '/^ +[0-9]+ /{printf "%s:%s (%s ms) ", $1, $3, $4}' $OUT/$name.log) (at $SECONDS s)"
done
