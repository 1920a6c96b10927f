#!/usr/bin/env bash
# One device call for decode-GEMV work (kernels/cuda/gemv.cu): the GPU test suite, then the 8B-geometry EXL2 4.0 bpw (or
# TSR_GEMV_BPW) model (tessera synth) through `tessera bench` at batch 1 and 8 (or TSR_GEMV_BATCH) under each variant in
# TSR_GEMV_VARIANTS ("name:ENV=V,ENV=V ..."), a full batch 1..64 bench with the defaults, and the per-op device profile
# of a batch-1 step. TSR_GEMV_GPTQ=1 adds a GPTQ 8B bench; TSR_GEMV_PREFILL=1 a 2048-token prefill bench (in 512-token
# chunks, in one chunk, and with the general attention kernel, TSR_CUDA_FLASH=0) and its per-op profile;
# TSR_GEMV_TESTS=0 skips the tests; TSR_GEMV_TEST_VARIANTS ("name:ENV=V,...") runs test_cuda again under each. A
# variant's BATCH=1,8,32 (last among its settings) replaces TSR_GEMV_BATCH for it. Pack first with
# tests/parallel/gpu-pack.sh and carry `.parpack`; logs go to $OUT.
# A/B against other builds: TSR_GPUPACK_SLIM=1 TSR_GPUPACK_ALT="NAME=FILE" bash tests/parallel/gpu-pack.sh packs
# another tessera build FILE beside the new one; a variant naming BIN=NAME runs it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
SECONDS=0
. tests/parallel/gpu-env.sh
[ "${TSR_GEMV_TESTS:-1}" = 1 ] && run_test_cuda "$out" "${TSR_GEMV_TEST_VARIANTS:-}"
m8=/tmp/llama8b-${TSR_GEMV_BPW:-4.0}
synth_8b $m8 "${TSR_GEMV_BPW:-4.0}"
echo "synth done at $SECONDS s"
for v in ${TSR_GEMV_VARIANTS:-default:}; do
  name=${v%%:*}; envs=${v#*:}
  echo "--- $name ($envs)"
  b=$(variant_bin "$envs")
  batch=${TSR_GEMV_BATCH:-1,8}
  case ",$envs," in *,BATCH=*) batch=${envs#*BATCH=}; batch=${batch%%,[A-Z]*} ;; esac
  envs=$(echo ",$envs" | sed -E 's/,BATCH=[0-9,]*[0-9]//; s/^,//')
  env ${envs//,/ } timeout 120 "$b" bench --model $m8 --device cuda --batch "$batch" --prompt-len 512 \
    --gen 64 2>&1 | tail -5
done
if [ "${TSR_GEMV_GPTQ:-0}" = 1 ]; then
  g8=/tmp/llama8b-gptq
  "$bin" synth --format gptq --group-size 128 --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 \
    --intermediate 14336 --vocab 128256 --seed 1 --threads 16 --out $g8 > /dev/null
  echo "--- GPTQ 4-bit g128"
  timeout 90 "$bin" bench --model $g8 --device cuda --batch 1,8,32 --prompt-len 512 --gen 64 2>&1 | tail -3
  rm -rf $g8
fi
if [ "${TSR_GEMV_PREFILL:-0}" = 1 ]; then
  echo "--- 2048-token prefill: 512-token chunks, one chunk, the general attention kernel"
  timeout 90 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 8 2>&1 | tail -1
  timeout 90 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 8 --max-tokens 2048 2>&1 | tail -1
  TSR_CUDA_FLASH=0 timeout 90 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 8 2>&1 | tail -1
  TSR_CUDA_PROFILE=2 timeout 60 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 2 \
    > "$out/profile-prefill-2048.txt" 2>&1
  grep -E "attention|linear|ms|prefill" "$out/profile-prefill-2048.txt" | head -30
fi
echo "--- defaults, batch 1..64 (at $SECONDS s)"
timeout 120 "$bin" bench --model $m8 --device cuda --batch 1,8,32,64 --prompt-len 512 --gen 64 \
  --json "$out/bench-8b.json" 2>&1 | tee "$out/bench-8b.txt" | tail -6
echo "--- per-op profile, batch 1"
TSR_CUDA_PROFILE=2 timeout 60 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 512 --gen 16 \
  > "$out/profile-8b.txt" 2>&1
grep -A30 "decode" "$out/profile-8b.txt" | head -40
echo "=== done after $SECONDS s"
