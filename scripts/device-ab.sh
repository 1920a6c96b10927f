#!/bin/bash
# Device call (stop 70): decode tok/s of the 8B shape (and with TSR_AB_70B=1 the 70B shape) under settings against
# the default, interleaved over TSR_AB_ROUNDS rounds (default 2) so that drift falls on every variant alike.
#   bash scripts/device-ab.sh ROWS "name:ENV=V,ENV=V" ...
# ROWS is bench's comma list of batches (prompt 64 tokens, 32 generated); each variant is a name and its settings.
# Prints one line per round and variant ("name round: rows:tok/s ..."), logs into $OUT/ab-NAME-ROUND.log.
# Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here).
set -u
. tests/parallel/gpu-env.sh >/dev/null
rows=$1
shift
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
models=/tmp/llama8b-4.0
synth_8b /tmp/llama8b-4.0 > /dev/null 2>&1
if [ "${TSR_AB_70B:-0}" = 1 ]; then
  [ -f /tmp/llama70b-4.0/config.json ] || "$bin" synth --arch llama --hidden 8192 --layers 80 --heads 64 \
    --kv-heads 8 --intermediate 28672 --vocab 128256 --bpw 4.0 --shard-size 4096 --threads 16 \
    --out /tmp/llama70b-4.0 > /dev/null 2>&1
  models="$models /tmp/llama70b-4.0"
fi
echo "models made (at $SECONDS s)"
for model in $models; do
  for round in $(seq 1 "${TSR_AB_ROUNDS:-2}"); do
    for v in default: "$@"; do
      name=${v%%:*} envs=${v#*:} log="$OUT/ab-$(basename "$model")-${v%%:*}-$round.log"
      env ${envs//,/ } timeout 120 "$bin" bench --model "$model" --device cuda --batch "$rows" --prompt-len 64 \
        --gen 32 > "$log" 2>&1
      echo "$(basename "$model") $name $round rc=$? $(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ \
        {printf "%s:%s ", $1, $3}' "$log") (at $SECONDS s)"
    done
  done
done
