#!/bin/bash
# Device call of stop 66's final state: test_cuda by default and under every variant of run_test_cuda
# (tests/parallel/gpu-env.sh) plus the product at every row count split 3 ways; then decode of the 8B shape at
# 1/8/64 rows (512-token prompts) and at 52-64 rows. Run at 50cebc4, where the product took rows from 53 (reverted
# to 65 after scripts/device-70b-mid.sh). About 350 s. Carry .parpack. Prints a summary; the logs stay under $OUT.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1 &
sp=$!
TSR_TEST_UNTIL=${TSR_TEST_UNTIL:-330} run_test_cuda $OUT "dwsplit3:TSR_CUDA_DQ_WGMMA=1,TSR_CUDA_DW_SPLITS=3" 2>&1 \
  | grep -E '^test_cuda|FAILED|mismatch' | head -60
wait $sp
for v in "b1-64:--batch 1,8,64 --prompt-len 512 --gen 64" "b52-64:--batch 52,56,60,64 --prompt-len 32 --gen 32"; do
  name=${v%%:*}; args=${v#*:}
  timeout 100 $bin bench --model $m8 --device cuda $args > $OUT/$name.log 2>&1
  echo "decode $name rc=$? $(awk '/^ +[0-9]+ /{printf "%s:%s (%s) ", $1, $3, $7}' $OUT/$name.log)"
done
