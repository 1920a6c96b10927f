#!/usr/bin/env bash
# One device call that checks and measures what a session changed, in priority order, within a time budget
# (TSR_FINAL_BUDGET seconds, default 480; a step that would start later is skipped and says so). Pack first with
# tests/parallel/gpu-pack.sh and carry `.parpack`. Steps:
#   1. the GPU test suite (test_cuda: every CUDA op against the CPU op, fixture models, quantized KV modes)
#   2. NCCL correctness on two fixture models: one GPU vs mpirun -np 3 --split layers / tensor (gpu-check correct)
#   3. 8B-geometry EXL2 4.0 bpw: tessera bench at batch 1, 8, 32, 64, then the service at concurrency 1..64 with
#      and without a 600-token shared prefix
#   4. 8B-geometry GPTQ (4-bit, groups of 128): tessera bench at batch 1 and 32
#   5. 8B split over two GPUs by layers and by tensors (gpu-check bench)
#   6. kernel variants on the 8B model: where the dequantize + cuBLAS path starts (1 or 5 rows against the
#      default 9), a 2048-token prefill with and without the tensor-core attention, and the per-op device profile
#      of a batch-1 step
#   7. where a tensor-split batch-1 step goes: the per-op device profile of the 8B model on one GPU and on each
#      of two tensor-split workers (all-reduces are counted in the op after them: they share the stream)
# Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/out}
mkdir -p "$out"
budget=${TSR_FINAL_BUDGET:-480}
SECONDS=0
. tests/parallel/gpu-env.sh
test_cuda=$P/bin/test_cuda
only=${TSR_FINAL_ONLY:-} # e.g. "tests service": run only the steps whose names contain one of these words
step() { # name max-seconds-it-needs
  if [ -n "$only" ]; then
    local w hit=0
    for w in $only; do case "$1" in *"$w"*) hit=1 ;; esac; done
    [ $hit = 1 ] || return 1
  fi
  if [ $((SECONDS + $2)) -gt "$budget" ]; then echo "=== $1: skipped ($SECONDS s used of $budget)"; return 1; fi
  echo "=== $1 (at $SECONDS s)"
}
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$out/gpus.txt"

if step "GPU tests" 100; then
  export TSR_FIXTURES=$root/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$root/models
  timeout 200 "$test_cuda" > "$out/test_cuda.log" 2>&1
  echo "test_cuda exit $?"; grep -E "PASSED|FAILED|ERROR| kv " "$out/test_cuda.log" | head -40
fi
if step "NCCL correctness" 120; then
  TSR_CHECK_MODELS="models/tiny-llama-exl2-4.0bpw $(ls -d tests/fixtures/models/*2.5bpw* 2>/dev/null | head -1)" \
    TSR_RUN_TIMEOUT=60 timeout 150 bash tests/parallel/gpu-check.sh correct 2>&1 | tail -8
fi
m8=/tmp/llama8b-4.0
if step "8B EXL2 bench" 150; then
  synth_8b $m8
  timeout 150 "$bin" bench --model $m8 --device cuda --batch 1,8,32,64 --prompt-len 512 --gen 64 \
    --json "$out/bench-8b.json" 2>&1 | tee "$out/bench-8b.txt"
fi
if step "8B service concurrency" 150; then
  synth_8b $m8
  for shared in 0 600; do
    timeout 60 "$bin" bench --model $m8 --device cuda --concurrency 1,8,32,64 --requests 64 --prompt-len 1024 \
      --gen 64 --shared-prefix $shared 2>&1 | tee "$out/bench-8b-service-$shared.txt"
  done
fi
if step "8B GPTQ bench" 100; then
  g8=/tmp/llama8b-gptq
  "$bin" synth --format gptq --group-size 128 --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 \
    --intermediate 14336 --vocab 128256 --seed 1 --out $g8 > /dev/null
  timeout 90 "$bin" bench --model $g8 --device cuda --batch 1,32 --prompt-len 512 --gen 64 \
    --json "$out/bench-8b-gptq.json" 2>&1 | tee "$out/bench-8b-gptq.txt"
  rm -rf $g8
fi
if step "8B split over two GPUs" 150; then
  TSR_MODEL_8B=$m8 TSR_RUN_TIMEOUT=70 timeout 200 bash tests/parallel/gpu-check.sh bench 2>&1 | tail -30
fi
if step "8B kernel variants" 200; then
  synth_8b $m8
  for v in 1 5; do
    echo "--- TSR_CUDA_DQ_MIN_M=$v"
    TSR_CUDA_DQ_MIN_M=$v timeout 60 "$bin" bench --model $m8 --device cuda --batch 4,8,16 --prompt-len 512 --gen 32 \
      --json "$out/bench-8b-dq$v.json" 2>&1 | tail -3
  done
  for f in 1 0; do
    echo "--- prefill of 2048 tokens, TSR_CUDA_FLASH=$f"
    TSR_CUDA_FLASH=$f timeout 60 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 8 \
      --json "$out/bench-8b-p2048-flash$f.json" 2>&1 | tail -1
  done
  echo "--- per-op profile, batch 1"
  TSR_CUDA_PROFILE=2 timeout 60 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 512 --gen 16 \
    > "$out/profile-8b.txt" 2>&1
  tail -25 "$out/profile-8b.txt"
fi
if step "8B tensor profile" 150; then
  synth_8b $m8
  args=(generate --bench --model $m8 --device cuda --batch 1 --prompt-len 512 --gen 32)
  TSR_CUDA_PROFILE=2 timeout 60 "$bin" "${args[@]}" > "$out/prof-1gpu.txt" 2>&1
  OMPI_MCA_orte_tag_output=1 TSR_CUDA_PROFILE=2 TSR_RUN_TIMEOUT=90 mpi 3 "${args[@]}" --split tensor \
    > "$out/prof-tensor.txt" 2>&1
  timeout 60 "$bin" "${args[@]}" 2>&1 | grep "batch "
  TSR_RUN_TIMEOUT=90 mpi 3 "${args[@]}" --split tensor --quiet-ranks 2>&1 | grep "batch "
  for f in prof-1gpu prof-tensor; do
    echo "--- $f"; grep -v -i "pmix\|dlopen\|perhaps" "$out/$f.txt" | grep -A14 "decode (M <= 32)"
  done
fi
echo "=== done after $SECONDS s"
