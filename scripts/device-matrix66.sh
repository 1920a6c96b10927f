#!/bin/bash
# Device call of stop 66: the CUDA issue's matrix on main with the wgmma product up to 512 rows, and two questions.
# 8B at 4.0 bpw: batch 1/8/32/64 (512-token prompts, gen 64), decode at 96-512 rows (prompt 32, gen 32), a
# 2048-token prefill in one chunk; decode at 40-64 rows by default (the bulk GEMV) against the product from 33 rows
# (TSR_CUDA_DQ_MIN_M=33: its tiles of 96 rows); 70B at 4.0 bpw: batch 1/8/32/64 (128-token prompts, gen 64), then
# decode at 256-512 rows by default against the product held to 256 rows (TSR_CUDA_DQ_WGMMA_MAX_M=256, as before stop
# 66). About 400 s. Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here). Prints a summary: per row
# batch, prefill tok/s, decode tok/s, ms/step, % of copy; the logs stay under $OUT.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
row() { grep -E '^setup' "$1" | sed -E 's/.*device copy ([0-9.]+ GB\/s).*GEMM ([0-9.]+ TFLOP\/s).*/  copy \1, gemm \2/'
  awk '/^ +[0-9]+ /{printf "  %s: pf %s dec %s ms %s %s\n", $1, $2, $3, $4, $7}' "$1"; }
b() { local name=$1 envs=$2; shift 2; env $envs timeout 200 $bin bench --device cuda "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? (at $SECONDS s)"; row $OUT/$name.log; }
b 8b-matrix "" --model $m8 --batch 1,8,32,64 --prompt-len 512 --gen 64
b 8b-rows "" --model $m8 --batch 96,128,192,256,384,512 --prompt-len 32 --gen 32
b 8b-prefill "" --model $m8 --batch 1 --prompt-len 2048 --gen 8 --max-tokens 2048
b 8b-mid-gemv "" --model $m8 --batch 40,48,56,64 --prompt-len 32 --gen 32
b 8b-mid-product "TSR_CUDA_DQ_MIN_M=33" --model $m8 --batch 40,48,56,64 --prompt-len 32 --gen 32
rm -rf $m8
m70=/tmp/llama70b-4.0
$bin synth --arch llama --hidden 8192 --layers 80 --heads 64 --kv-heads 8 --intermediate 28672 --vocab 128256 \
  --bpw 4.0 --shard-size 4096 --threads 16 --out $m70 > /dev/null
echo "70B synth done (at $SECONDS s)"
b 70b-matrix "" --model $m70 --batch 1,8,32,64 --prompt-len 128 --gen 64
b 70b-rows "" --model $m70 --batch 256,384,512 --prompt-len 32 --gen 16
b 70b-rows-max256 "TSR_CUDA_DQ_WGMMA_MAX_M=256" --model $m70 --batch 256,384,512 --prompt-len 32 --gen 16
