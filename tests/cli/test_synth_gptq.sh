#!/usr/bin/env bash
# CLI test of `tessera synth --format gptq` on tiny geometries: option errors, determinism, `tessera inspect`
# (format and group size), `tessera generate` and `tessera bench --batch 1 --gen 4` on the model, sharding with
# model.safetensors.index.json (same greedy tokens as one file), and the independent numpy checker
# scripts/exl2_check.py in its GPTQ mode (the only part that needs numpy: without it the test ends with 77 =
# skipped after the other checks passed).
set -euo pipefail

: "${TSR_BIN:?TSR_BIN must point to the tessera binary}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
check="$here/../../scripts/exl2_check.py"
tmp="$(mktemp -d /tmp/tsr_cli_synth_gptq.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

geo=(--arch llama --hidden 128 --layers 2 --heads 4 --kv-heads 2 --intermediate 352 --vocab 500)
gptq=(--format gptq "${geo[@]}" --group-size 64 --act-order)

# usage errors exit 2 (with a message naming the option), a geometry GPTQ cannot store exits 1
expect_exit() { # code, message fragment, args...
  local want=$1 frag=$2 rc=0
  shift 2
  "$TSR_BIN" synth "$@" --out "$tmp/x" >/dev/null 2>"$tmp/err" || rc=$?
  [ "$rc" -eq "$want" ] || fail "synth $* exited $rc, expected $want"
  grep -q -- "$frag" "$tmp/err" || fail "synth $*: message lacks '$frag': $(cat "$tmp/err")"
}
expect_exit 2 "--format must be" --format gguf "${geo[@]}"
expect_exit 2 "--group-size 100" "${gptq[@]}" --group-size 100
expect_exit 2 "--group-size 0" "${gptq[@]}" --group-size 0
expect_exit 2 "--act-order is a GPTQ option" "${geo[@]}" --act-order
expect_exit 2 "EXL2 groups are 32, 64 or 128" "${geo[@]}" --group-size 256
expect_exit 2 "--bpw is an EXL2 option" "${gptq[@]}" --bpw 4.0
expect_exit 2 "--head-bits is an EXL2 option" "${gptq[@]}" --head-bits 8
expect_exit 1 "multiples of 8" "${gptq[@]}" --intermediate 340
[ ! -e "$tmp/x/model.safetensors" ] || fail "a failed synth left a model behind"

# deterministic for a seed; another seed differs
"$TSR_BIN" synth "${gptq[@]}" --seed 5 --out "$tmp/a" > "$tmp/a.txt" 2>/dev/null
grep -q "GPTQ 4-bit, group size 64, act-order" "$tmp/a.txt" || fail "synth summary: $(cat "$tmp/a.txt")"
"$TSR_BIN" synth "${gptq[@]}" --seed 5 --out "$tmp/b" --quiet
"$TSR_BIN" synth "${gptq[@]}" --seed 6 --out "$tmp/c" --quiet
for f in model.safetensors config.json quantize_config.json generation_config.json; do
  cmp -s "$tmp/a/$f" "$tmp/b/$f" || fail "same seed, different $f"
done
! cmp -s "$tmp/a/model.safetensors" "$tmp/c/model.safetensors" || fail "different seeds, same bytes"
python3 - "$tmp/a/config.json" <<'EOF'
import json, sys
q = json.load(open(sys.argv[1]))["quantization_config"]
want = {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": True, "sym": False,
        "checkpoint_format": "gptq"}
assert all(q.get(k) == v for k, v in want.items()), q
EOF

# inspect reports GPTQ and the group size
"$TSR_BIN" inspect --model "$tmp/a" > "$tmp/inspect.txt"
grep -Eq "^format +gptq" "$tmp/inspect.txt" || fail "inspect format: $(cat "$tmp/inspect.txt")"
grep -q "gptq 4-bit, group size 64, act-order" "$tmp/inspect.txt" || fail "inspect quantization line"

# generate: 4 greedy tokens
ids=$("$TSR_BIN" generate --model "$tmp/a" --ids 1,17,42,99 --max-tokens 4 --ignore-eos --print-ids 2>/dev/null)
echo "$ids" | grep -Eq '^[0-9]+(,[0-9]+){3}$' || fail "generate printed '$ids'"

# bench --batch 1 --gen 4 runs and reports finite logits
"$TSR_BIN" bench --model "$tmp/a" --batch 1 --gen 4 --prompt-len 8 --threads 1 --json "$tmp/bench.json" \
  > "$tmp/bench.txt"
grep -q "decode tok/s" "$tmp/bench.txt" || fail "bench table missing"
python3 - "$tmp/bench.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert [r["batch"] for r in j["runs"]] == [1], j["runs"]
for r in j["runs"]:
    assert r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0 and r["bytes_per_decode_step"] > 0
    assert r["logits_finite"]
EOF

# sharded (1 MiB files; the fp16 embedding and head are 2 MiB each), with an index: the same greedy tokens as
# one file
"$TSR_BIN" synth --format gptq --arch llama --hidden 128 --layers 2 --heads 4 --kv-heads 2 --intermediate 352 \
  --vocab 8192 --group-size 64 --act-order --seed 5 --shard-size 1 --out "$tmp/s" --quiet
"$TSR_BIN" synth --format gptq --arch llama --hidden 128 --layers 2 --heads 4 --kv-heads 2 --intermediate 352 \
  --vocab 8192 --group-size 64 --act-order --seed 5 --out "$tmp/s1" --quiet
nshards=$(ls "$tmp/s"/model-*-of-*.safetensors | wc -l)
[ "$nshards" -ge 2 ] || fail "expected several shards, got $nshards"
[ -f "$tmp/s/model-00001-of-0000$nshards.safetensors" ] || fail "shard names"
[ -f "$tmp/s/model.safetensors.index.json" ] || fail "no model.safetensors.index.json"
t1=$("$TSR_BIN" generate --model "$tmp/s" --ids 1,17,42 --max-tokens 4 --ignore-eos --print-ids 2>/dev/null)
t2=$("$TSR_BIN" generate --model "$tmp/s1" --ids 1,17,42 --max-tokens 4 --ignore-eos --print-ids 2>/dev/null)
[ "$t1" = "$t2" ] || fail "sharded model generates '$t1', single file '$t2'"

# Qwen2 (q/k/v biases), sequential groups of 32, symmetric zero points
"$TSR_BIN" synth --format gptq --arch qwen2 --hidden 128 --layers 2 --heads 4 --kv-heads 2 --intermediate 384 \
  --vocab 1000 --sym --group-size 32 --seed 3 --out "$tmp/q" --quiet
"$TSR_BIN" generate --model "$tmp/q" --ids 1,2,3 --max-tokens 4 --ignore-eos --print-ids >/dev/null 2>&1 ||
  fail "qwen2 GPTQ model does not run"

# independent reader
if ! py=$(bash "$here/../../scripts/python-numpy.sh"); then
  echo "numpy missing: skipping scripts/exl2_check.py" >&2
  exit 77
fi
"$py" "$check" "$tmp/a" --expect-bpw 4.51 --tolerance 0.01
"$py" "$check" "$tmp/s" --quiet
"$py" "$check" "$tmp/q" --quiet
echo "ok"
