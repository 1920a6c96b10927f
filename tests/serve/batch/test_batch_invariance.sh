#!/usr/bin/env bash
# Batch invariance and the prefix cache through tessera batch.
#  1. 32 greedy completions run together (continuous batching, up to 32 sequences per step) give the same text as
#     each run alone: once as `tessera generate` (the engine's single-sequence path) and once as a batch run with
#     one sequence at a time.
#  2. 12 chat requests sharing a ~600-token system prompt: the stats line shows prefix-cache hits covering most of
#     the shared prompt, and fewer tokens prefilled than prompt tokens submitted; the texts equal those of runs
#     without the prefix cache.
. "$(dirname "$0")/../../common/prelude.sh"
stat_of() { sed -n "s/^tessera batch: stats .* $1=\([0-9.]*\).*/\1/p" "$2"; }

python3 - "$tmp/in.jsonl" "$tmp/prompts.txt" <<'EOF'
import json, sys
subjects = ["The old man", "A little girl", "The robot", "My teacher", "The king", "A small dog", "The river",
            "Our village", "The scientist", "A dragon", "The farmer", "The ship", "Her brother", "The moon",
            "A young boy", "The forest"]
verbs = ["walked to", "looked at"]
with open(sys.argv[1], "w") as f, open(sys.argv[2], "w") as p:
    for i in range(32):
        prompt = f"{subjects[i % 16]} {verbs[i // 16]}"
        p.write(prompt + "\n")
        f.write(json.dumps({"custom_id": f"g{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": prompt, "max_tokens": 16, "temperature": 0}}) + "\n")
EOF
texts() {
    python3 -c '
import json, sys
r = {}
for l in map(json.loads, open(sys.argv[1])):
    r[int(l["custom_id"][1:])] = l["response"]["body"]["choices"][0]["text"]
for i in sorted(r):
    print(json.dumps(r[i]))' "$1"
}

"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/together.jsonl" --kv-tokens 8192 \
    --max-running 32 2> "$tmp/err" || fail "batch of 32: $(cat "$tmp/err")"
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/alone.jsonl" --kv-tokens 8192 \
    --max-running 1 --max-inflight 1 2> "$tmp/err1" || fail "batch one at a time: $(cat "$tmp/err1")"
texts "$tmp/together.jsonl" > "$tmp/together.txt"
texts "$tmp/alone.jsonl" > "$tmp/alone.txt"
[ "$(wc -l < "$tmp/together.txt")" -eq 32 ] || fail "expected 32 results"
diff "$tmp/together.txt" "$tmp/alone.txt" > /dev/null || fail "batched and one-at-a-time results differ:
$(diff "$tmp/together.txt" "$tmp/alone.txt")"
i=0
while IFS= read -r prompt; do
    gen=$("$bin" generate --model "$model" --prompt "$prompt" --max-tokens 16) || fail "generate '$prompt'"
    got=$(sed -n "$((i + 1))p" "$tmp/together.txt")
    python3 -c '
import json, sys
gen, prompt, got = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
assert gen.startswith(prompt) and gen[len(prompt):].rstrip("\n") == got.rstrip("\n")' "$gen" "$prompt" "$got" ||
        fail "request $i ('$prompt'): batch $got, generate alone '$gen'"
    i=$((i + 1))
done < "$tmp/prompts.txt"
echo "32 greedy requests: batched = one at a time = generate"

# 2. a shared ~600-token system prompt
python3 - "$tmp/sys.jsonl" <<'EOF'
import json, sys
rules = ("You are a careful assistant for a small library in a quiet town. Answer politely, keep every answer "
         "short and plain, never invent a book that the library does not hold, and always suggest asking the "
         "librarian when unsure. ")
system = " ".join(f"Rule {k}: {rules}" for k in range(7))
questions = ["Where are the maps?", "Do you have books about boats?", "When do you open?", "Can I print here?",
             "Is there a reading room?", "Who wrote the town history?", "Do you lend music?", "Where is the exit?",
             "Can children borrow books?", "Is there free wifi?", "How long can I keep a book?", "Are pets allowed?"]
with open(sys.argv[1], "w") as f:
    for i, q in enumerate(questions):
        f.write(json.dumps({"custom_id": f"s{i}", "method": "POST", "url": "/v1/chat/completions",
                            "body": {"messages": [{"role": "system", "content": system},
                                                  {"role": "user", "content": q}],
                                     "max_tokens": 4, "temperature": 0}}) + "\n")
EOF
"$bin" batch --model "$model" --input "$tmp/sys.jsonl" --output "$tmp/sys_out.jsonl" --kv-tokens 16384 \
    --max-running 4 2> "$tmp/err2" || fail "shared-prefix batch: $(cat "$tmp/err2")"
grep "^tessera batch: stats" "$tmp/err2"
prompt_tokens=$(python3 -c '
import json, sys
print(sum(json.loads(l)["response"]["body"]["usage"]["prompt_tokens"]
          for l in open(sys.argv[1])))' "$tmp/sys_out.jsonl")
hits=$(stat_of prefix_hits "$tmp/err2")
hit_tokens=$(stat_of prefix_hit_tokens "$tmp/err2")
prefill=$(stat_of prefill_tokens "$tmp/err2")
first=$((prompt_tokens / 12))
[ -n "$hits" ] && [ "$hits" -ge 8 ] || fail "prefix_hits=$hits, expected at least 8 of 12 requests to hit"
[ "$first" -ge 500 ] || fail "the prompts are only $first tokens"
[ "$hit_tokens" -ge $((8 * 500)) ] || fail "prefix_hit_tokens=$hit_tokens, expected >= 4000"
[ "$prefill" -lt $((prompt_tokens - 4000)) ] || fail "prefilled $prefill of $prompt_tokens prompt tokens"
echo "shared prefix: $prompt_tokens prompt tokens, $hit_tokens from the prefix cache, $prefill prefilled"

# the cached prefix changes nothing: the same texts without the prefix cache, one request at a time (4 of them)
head -n 4 "$tmp/sys.jsonl" > "$tmp/sys4.jsonl"
"$bin" batch --model "$model" --input "$tmp/sys4.jsonl" --output "$tmp/sys_alone.jsonl" --kv-tokens 16384 \
    --max-running 1 --max-inflight 1 --no-prefix-cache 2> "$tmp/err3" || fail "shared-prefix batch one at a time"
[ "$(stat_of prefix_hits "$tmp/err3")" = 0 ] || fail "--no-prefix-cache still hit: $(cat "$tmp/err3")"
texts_s() { # the texts of s0..s3
    python3 -c '
import json, sys
r = {l["custom_id"]: l["response"]["body"]["choices"][0]["message"]["content"]
     for l in map(json.loads, open(sys.argv[1]))
     if l["custom_id"] in ("s0", "s1", "s2", "s3")}
print(json.dumps(r, sort_keys=True))' "$1"
}
[ "$(texts_s "$tmp/sys_out.jsonl")" = "$(texts_s "$tmp/sys_alone.jsonl")" ] || fail "prefix-cached results differ"
echo "batch invariance: ok"
