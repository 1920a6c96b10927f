#!/bin/bash
# Device call closing stop 66: test_cuda by default and with the product at every row count, on main as it lands
# (the product for 65-512 rows), then decode of the 8B shape at 1/8/64 rows (512-token prompts). About 90 s.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1 &
sp=$!
test_cuda_one default 100
test_cuda_one dqwgmma 100 TSR_CUDA_DQ_WGMMA=1
wait $sp
timeout 100 $bin bench --model $m8 --device cuda --batch 1,8,64 --prompt-len 512 --gen 64 > $OUT/b.log 2>&1
echo "decode rc=$? $(awk '/^ +[0-9]+ /{printf "%s:%s (%s) ", $1, $3, $7}' $OUT/b.log)"
