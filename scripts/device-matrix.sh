#!/usr/bin/env bash
# One device call for the CUDA issue's benchmark matrix: `tessera synth` models of Llama-3-8B and Llama-3-70B
# geometry at the bits per weight named in SPECS, each through `tessera bench --batch 1,8,32,64` (8B: 512-token
# prompts, 70B: 128), one model on disk at a time. Pack first with tests/parallel/gpu-pack.sh and carry `.parpack`.
#   SPECS="8b:4.0 8b:2.5 70b:4.0 70b:2.5" bash scripts/device-matrix.sh      (the default SPECS)
# A/B: TSR_MATRIX_VARIANTS="name:ENV=V,ENV=V ..." runs each model's bench once per variant (batches TSR_MATRIX_BATCH,
# default 1,8,32,64); a variant's BIN=NAME runs the pack's tessera-NAME (tests/parallel/gpu-pack.sh TSR_GPUPACK_ALT).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. tests/parallel/gpu-env.sh
cd "$root"
SECONDS=0
for spec in ${SPECS:-8b:4.0 8b:2.5 70b:4.0 70b:2.5}; do
  IFS=: read -r geo bpw <<< "$spec"
  case $geo in
    70b) shape="--hidden 8192 --layers 80 --heads 64 --kv-heads 8 --intermediate 28672"; prompt=128 ;;
    *) shape="--hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336"; prompt=512 ;;
  esac
  m=/tmp/tsr-matrix-$geo-$bpw
  # shellcheck disable=SC2086
  "$bin" synth --arch llama $shape --vocab 128256 --bpw "$bpw" --shard-size 4096 --threads 16 --out "$m" > /dev/null
  echo "--- $geo at $bpw bpw (synth done at $SECONDS s)"
  for v in ${TSR_MATRIX_VARIANTS:-default:}; do
    [ -n "${TSR_MATRIX_VARIANTS:-}" ] && echo "- ${v%%:*} (${v#*:})"
    envs=${v#*:}
    b=$(variant_bin "$envs")
    env ${envs//,/ } timeout 300 "$b" bench --model "$m" --device cuda --batch "${TSR_MATRIX_BATCH:-1,8,32,64}" \
      --prompt-len $prompt --gen 64 2>&1 | tail -6
  done
  rm -rf "$m"
done
echo "=== done after $SECONDS s"
