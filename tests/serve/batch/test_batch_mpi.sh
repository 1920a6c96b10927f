#!/usr/bin/env bash
# tessera batch under mpirun: the coordinator (rank 0) runs the batch and two CPU workers run the model (layer
# split); the output must equal a one-process run's (greedy and seeded texts, n > 1, error lines), with an fp16 and
# a Q4 KV cache.
#
#   test_batch_mpi.sh MPIEXEC
. "$(dirname "$0")/../../common/prelude.sh"
mpiexec=$1
mpi_env "$mpiexec"

# one request a line; the here-document is unquoted so that a backslash at a line's end joins it to the next (so no
# dollar signs, backquotes or other backslashes in it)
cat > "$tmp/in.jsonl" <<JSONL
{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time", \
"max_tokens": 12, "temperature": 0}}
{"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", \
"content": "Tell me a story."}], "max_tokens": 12, "temperature": 0}}
{"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "The cat", "max_tokens": 8, "n": 3, \
"temperature": 1, "seed": 5}}
{"custom_id": "d", "method": "POST", "url": "/v1/embeddings", "body": {}}
{"custom_id": "e", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 100000}}
JSONL
# the same with an fp16 and a Q4 KV cache (the plan's cache mode on every worker)
for kv in f16 q4; do
  "$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/one.jsonl" --kv-tokens 4096 --kv-dtype $kv \
      2> "$tmp/err" || fail "one process ($kv): $(cat "$tmp/err")"
  timeout 300 "$mpiexec" --bind-to none -np 3 "$bin" batch --model "$model" --input "$tmp/in.jsonl" \
      --output "$tmp/mpi.jsonl" --kv-tokens 4096 --kv-dtype $kv --quiet-ranks 2> "$tmp/err" ||
      fail "mpirun -np 3 ($kv): $(cat "$tmp/err")"
  python3 - "$tmp/one.jsonl" "$tmp/mpi.jsonl" <<'PY' || fail "results differ ($kv)"
import json, sys
def load(path):
    out = {}
    for l in map(json.loads, open(path)):
        r = l["response"]
        if r and r["status_code"] == 200:
            out[l["custom_id"]] = [c.get("text", c.get("message", {}).get("content")) for c in r["body"]["choices"]]
        else:
            out[l["custom_id"]] = (r and r["status_code"], l["error"] and l["error"]["code"])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == 5 and a == b, (a, b)
PY
done
echo "batch under mpirun: ok"
