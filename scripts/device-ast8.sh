#!/bin/bash
# Device call (stop 68), parts ordered by importance so that a cut-off call still answers the first question:
# 1. the service loop (scheduler + service + local executor, `bench --concurrency`, whose max_running is the
#    concurrency) at 64, 128 and 256 sequences running on the 8B 4.0 bpw shape: the evidence for the GPU default of
#    --max-running (launcher/backend_select.h); then `tessera batch --device cuda` on the bundled model, whose summary
#    line must say "up to 256 running";
# 2. test_cuda with the wgmma product's 8 activation tiles in flight at most 128 rows a block (gemm_dq_wgmma.cu; the
#    default since stop 68) and with TSR_CUDA_DW_AST=4 (4 tiles at every row count, as before);
# 3. the two against each other: per-matrix times of a 96-row step, and decode at 65 / 96 / 128 rows, each twice,
#    alternating. (At stop 68's first call 4 tiles were the default and 8 took TSR_CUDA_DW_AST=8; same kernels.)
# About 150 s on a warm machine. Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here).
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
echo "synth done (at $SECONDS s)"
timeout 200 "$bin" bench --model $m8 --device cuda --concurrency 64,128,256 --prompt-len 256 --gen 64 \
  > "$OUT/svc.log" 2>&1
echo "service rc=$? (at $SECONDS s)"
grep -E '^(setup|conc| *[0-9]+ )' "$OUT/svc.log"; grep -i 'error' "$OUT/svc.log" | head -3
req='{"custom_id": "%s", "method": "POST", "url": "/v1/completions", "body": {"prompt": "%s", "max_tokens": 8}}\n'
printf "$req" a "Once upon a time" b "The cat" > /tmp/in.jsonl
timeout 60 "$bin" batch --model models/tiny-llama-exl2-4.0bpw --device cuda --input /tmp/in.jsonl \
  --output /tmp/out.jsonl 2> "$OUT/batch.err"
echo "batch rc=$? $(grep -o 'up to [0-9]* running' "$OUT/batch.err") lines=$(wc -l < /tmp/out.jsonl)"
test_cuda_one ast8 150
test_cuda_one ast4 150 TSR_CUDA_DW_AST=4
for r in 1 2; do
  dq_step $m8 96 ast4-$r TSR_CUDA_DW_AST=4
  dq_step $m8 96 ast8-$r
done
dec() { # NAME [ENV...]: decode tok/s at 65, 96 and 128 rows
  local name=$1
  shift
  env "$@" timeout 90 "$bin" bench --model $m8 --device cuda --batch 65,96,128 --prompt-len 32 --gen 64 \
    > "$OUT/d-$name.log" 2>&1
  echo "decode $name rc=$? $(awk '$1 == 65 || $1 == 96 || $1 == 128 {printf "%s:%s ", $1, $3}' "$OUT/d-$name.log")"
}
for r in 1 2; do
  dec ast4-$r TSR_CUDA_DW_AST=4
  dec ast8-$r
done
echo "end (at $SECONDS s)"
