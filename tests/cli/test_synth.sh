#!/usr/bin/env bash
# CLI test of `tessera synth` and `tessera bench` on tiny synthetic models: usage errors, determinism, sharding,
# loading through `tessera logits` (finite, varied logits), a short bench with --json, and the independent numpy
# checker scripts/exl2_check.py (the only part that needs numpy: without it the test ends with 77 = skipped after
# the other checks passed).
set -euo pipefail

: "${TSR_BIN:?TSR_BIN must point to the tessera binary}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
check="$here/../../scripts/exl2_check.py"
tmp="$(mktemp -d /tmp/tsr_cli_synth.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

llama=(--arch llama --hidden 128 --layers 2 --heads 4 --kv-heads 2 --intermediate 352 --vocab 500 --bpw 4.0)
qwen=(--arch qwen2 --hidden 128 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --intermediate 384 --vocab 4096
      --bpw 3.5 --head-bits 8)

# usage errors exit 2, an unreachable target exits 1
set +e
"$TSR_BIN" synth --arch llama --out "$tmp/x" >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing options should exit 2"
"$TSR_BIN" synth "${llama[@]}" --arch gpt2 --out "$tmp/x" >/dev/null 2>&1
[ $? -eq 2 ] || fail "bad --arch should exit 2"
"$TSR_BIN" synth "${llama[@]}" --bpw 2.0 --hidden 64 --out "$tmp/x" >/dev/null 2>&1
[ $? -eq 1 ] || fail "unreachable bpw should exit 1"
"$TSR_BIN" bench >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench without --model should exit 2"
set -e

# deterministic for a seed; another seed differs
"$TSR_BIN" synth "${llama[@]}" --seed 5 --out "$tmp/a" --quiet
"$TSR_BIN" synth "${llama[@]}" --seed 5 --out "$tmp/b" --quiet
"$TSR_BIN" synth "${llama[@]}" --seed 6 --out "$tmp/c" --quiet
cmp -s "$tmp/a/output.safetensors" "$tmp/b/output.safetensors" || fail "same seed, different bytes"
cmp -s "$tmp/a/config.json" "$tmp/b/config.json" || fail "same seed, different config.json"
! cmp -s "$tmp/a/output.safetensors" "$tmp/c/output.safetensors" || fail "different seeds, same bytes"
[ -f "$tmp/a/generation_config.json" ] || fail "no generation_config.json"

# sharded Qwen2 (biases) in several files named like the converter's
"$TSR_BIN" synth "${qwen[@]}" --seed 9 --shard-size 1 --out "$tmp/q" --quiet
nshards=$(ls "$tmp/q"/output-*-of-*.safetensors | wc -l)
[ "$nshards" -ge 2 ] || fail "expected several shards, got $nshards"
[ -f "$tmp/q/output-00001-of-0000$nshards.safetensors" ] || fail "shard names"

# loads and runs: logits finite and not all equal
echo '{"ids": [[1, 17, 42, 99, 3], [7, 8]]}' > "$tmp/prompts.json"
for m in a q; do
  "$TSR_BIN" logits --model "$tmp/$m" --prompts "$tmp/prompts.json" --out "$tmp/$m.logits.safetensors"
  python3 - "$tmp/$m.logits.safetensors" <<'EOF'
import json, math, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for name, t in h.items():
    s, e = t["data_offsets"]
    v = struct.unpack("<%df" % ((e - s) // 4), b[8 + n + s:8 + n + e])
    assert all(math.isfinite(x) for x in v), f"{name}: non-finite logits"
    assert max(v) - min(v) > 1e-3, f"{name}: logits all equal"
EOF
done

# bench runs and writes its JSON
"$TSR_BIN" bench --model "$tmp/q" --batch 1,2 --prompt-len 8 --gen 3 --threads 1 --json "$tmp/bench.json" \
  > "$tmp/bench.txt"
grep -q "decode tok/s" "$tmp/bench.txt" || fail "bench table missing"
python3 - "$tmp/bench.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
assert [r["batch"] for r in j["runs"]] == [1, 2], j["runs"]
for r in j["runs"]:
    assert r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0 and r["bytes_per_decode_step"] > 0
    assert r["peak_rss_bytes"] > 0 and r["logits_finite"]
    # K/V read per step: steps attend 9, 10 and 11 positions; 2 layers x 2 KV heads x 32 dims x K and V x 2 bytes
    assert r["kv_bytes_read_per_decode_step"] == r["batch"] * 10 * 2 * 2 * 32 * 2 * 2, r
    assert r["weights_and_kv_fraction_of_memcpy"] > r["bandwidth_fraction_of_memcpy"] > 0, r
    # prefill arithmetic per prompt: 8 tokens x 2 x (q 128x128, k and v 128x64, o 128x128, gate and up 128x384,
    # down 384x128) x 2 layers, attention 4 x 4 heads x 32 dims x (1 + ... + 8) positions x 2 layers, one head row
    # 2 x 128 x 4096; no GEMM rate on the CPU
    per = 8 * 2 * 196608 * 2 + 4 * 4 * 32 * 36 * 2 + 2 * 128 * 4096
    assert r["prefill_flop"] == r["batch"] * per and r["prefill_flop_per_s"] > 0, r
    assert j["fp16_gemm_flop_per_s"] == 0 and r["prefill_fraction_of_fp16_gemm"] == 0, r
EOF

# a prompt and generation beyond the model's context is refused before any work, naming the context
"$TSR_BIN" synth "${llama[@]}" --max-pos 64 --out "$tmp/short" --quiet
set +e
"$TSR_BIN" bench --model "$tmp/short" --batch 1 --prompt-len 60 --gen 8 --threads 1 > /dev/null 2> "$tmp/ctx.err"
rc=$?
set -e
[ $rc -eq 1 ] || fail "bench beyond the context should exit 1 (got $rc)"
grep -q "beyond the model's context (64 positions)" "$tmp/ctx.err" \
  || fail "bench context message: $(cat "$tmp/ctx.err")"
"$TSR_BIN" bench --model "$tmp/short" --batch 1 --prompt-len 56 --gen 8 --threads 1 > /dev/null

# independent reader
if ! py=$(bash "$here/../../scripts/python-numpy.sh"); then
  echo "numpy missing: skipping scripts/exl2_check.py" >&2
  exit 77
fi
"$py" "$check" --selftest
"$py" "$check" "$tmp/a" --expect-bpw 4.0
"$py" "$check" "$tmp/q" --expect-bpw 3.5
echo "ok"
