#!/usr/bin/env bash
# tessera batch on the bundled model with a mix of good and bad lines: completions and chat requests, n > 1 and a
# list of prompts, bodies the API refuses (400/404 inside the response), lines that are not batch requests
# (invalid JSON, unknown url, missing body, wrong method, a non-string custom_id) and a duplicate custom_id. The
# output must have one line per input line, OpenAI's batch output shape, and the right codes; the command's exit
# codes follow the usual rules.
. "$(dirname "$0")/../../common/prelude.sh"

# one request a line; the here-document is unquoted so that a backslash at a line's end joins it to the next (so no
# dollar signs, backquotes or other backslashes in it)
cat > "$tmp/in.jsonl" <<EOF
{"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time", \
"max_tokens": 8, "temperature": 0}}
{"custom_id": "c2", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", \
"content": "Tell me a story."}], "max_tokens": 8, "temperature": 0}}
{"custom_id": "c3", "method": "POST", "url": "/v1/completions", "body": {"prompt": "broken"
{"custom_id": "c4", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
{"custom_id": "c5", "method": "POST", "url": "/v1/completions"}
{"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "dup", "max_tokens": 4}}
{"custom_id": "c7", "method": "POST", "url": "/v1/completions", "body": {"prompt": "The cat", "max_tokens": 6, \
"n": 3, "temperature": 1, "seed": 5}}
{"custom_id": "c8", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "temperature": "hot"}}
{"custom_id": "c9", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 100000}}
{"custom_id": "c10", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "no-such-model", \
"messages": [{"role": "user", "content": "hi"}]}}

{"custom_id": "c11", "method": "POST", "url": "/v1/completions", "body": {"prompt": ["One day", "The dog"], "n": 2, \
"max_tokens": 5, "temperature": 0.8, "seed": 1}}
{"custom_id": "c12", "method": "GET", "url": "/v1/completions", "body": {"prompt": "x"}}
{"custom_id": 17, "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
{"custom_id": "c15", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time", \
"max_tokens": 8, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}}
{"custom_id": "c14", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "tiny-llama-exl2-4.0bpw", \
"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}], "max_tokens": 12, \
"stop": ["."]}}
EOF

"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" --kv-tokens 8192 \
    2> "$tmp/err" || fail "batch exited $? ($(cat "$tmp/err"))"
grep -q "^tessera batch: stats .*lines_done=15 " "$tmp/err" || fail "stats line: $(cat "$tmp/err")"
# the CPU's default ceiling on running sequences (launcher/backend_select.h; a GPU's is 256)
grep -q "^tessera batch: 15 requests, .*, up to 64 running$" "$tmp/err" ||
    fail "default --max-running: $(cat "$tmp/err")"

python3 - "$tmp/out.jsonl" <<'EOF' || fail "output check"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 15, f"{len(lines)} output lines, expected 15"
by_id = {}
nulls = []
for l in lines:
    assert set(l) == {"id", "custom_id", "response", "error"}, l
    assert l["id"].startswith("batch_req_"), l["id"]
    if l["custom_id"] is None:
        nulls.append(l)
    else:
        by_id.setdefault(l["custom_id"], []).append(l)
assert len({l["id"] for l in lines}) == 15, "batch_req ids are not unique"

def ok(cid, object_, n):
    (l,) = [l for l in by_id[cid] if not l["error"]]
    r = l["response"]
    assert l["error"] is None and r["status_code"] == 200, l
    assert r["request_id"], l
    b = r["body"]
    assert b["object"] == object_, b
    assert len(b["choices"]) == n, b
    assert sorted(c["index"] for c in b["choices"]) == list(range(n)), b
    assert b["usage"]["completion_tokens"] > 0, b
    return b

b = ok("c1", "text_completion", 1)
assert b["choices"][0]["text"], b
b15 = ok("c15", "text_completion", 1)  # "stream" is ignored in a batch: the whole response
assert b15["choices"][0]["text"] == b["choices"][0]["text"], (b15, b)
ok("c2", "chat.completion", 1)
b = ok("c7", "text_completion", 3)
texts = [c["text"] for c in b["choices"]]
assert len(set(texts)) > 1, f"n=3 with temperature 1 gave identical choices: {texts}"
ok("c11", "text_completion", 4)
b = ok("c14", "chat.completion", 1)
assert "." not in b["choices"][0]["message"]["content"], b

def api_error(cid, status):
    (l,) = by_id[cid]
    assert l["error"] is None and l["response"]["status_code"] == status, l
    e = l["response"]["body"]["error"]
    assert e["message"] and e["type"], l
    return e

api_error("c8", 400)
assert api_error("c9", 400)["code"] == "context_length_exceeded"
assert api_error("c10", 404)["code"] == "model_not_found"

def line_error(l, code):
    assert l["response"] is None, l
    assert l["error"]["code"] == code, l
    assert l["error"]["message"] and isinstance(l["error"]["line"], int), l

line_error(by_id["c4"][0], "invalid_url")
line_error(by_id["c5"][0], "missing_required_parameter")
line_error(by_id["c12"][0], "invalid_method")
c1 = by_id["c1"]
assert len(c1) == 2, c1
dups = [l for l in c1 if l["error"]]
assert len(dups) == 1 and dups[0]["error"]["code"] == "duplicate_custom_id" and dups[0]["error"]["line"] == 6, c1
assert "c3" not in by_id and len(nulls) == 2, nulls
nulls.sort(key=lambda l: l["error"]["line"])
line_error(nulls[0], "invalid_json_line")
line_error(nulls[1], "invalid_custom_id")
assert [l["error"]["line"] for l in nulls] == [3, 14], nulls
print("format ok")
EOF

# greedy completions in the batch equal `tessera generate` (which prints the prompt first)
text=$(python3 -c '
import json, sys
for l in open(sys.argv[1]):
    l = json.loads(l)
    if l["custom_id"] == "c1" and l["response"]:
        sys.stdout.write(l["response"]["body"]["choices"][0]["text"])' "$tmp/out.jsonl")
gen=$("$bin" generate --model "$model" --prompt "Once upon a time" --max-tokens 8) || fail "generate"
[ "Once upon a time$text" = "$gen" ] || fail "batch text '$text' differs from generate '$gen'"

# steps of 4 tokens (prompts prefilled over several steps, beside other requests' decode rows) give the same greedy
# completions, in more steps
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/out4.jsonl" --kv-tokens 8192 --step-tokens 4 \
    2> "$tmp/err4" || fail "batch --step-tokens 4 exited $? ($(cat "$tmp/err4"))"
python3 - "$tmp/out.jsonl" "$tmp/out4.jsonl" "$tmp/err" "$tmp/err4" <<'EOF' || fail "--step-tokens 4"
import json, re, sys
def greedy(path):
    out = {}
    for l in open(path):
        l = json.loads(l)
        if l["custom_id"] in ("c1", "c2", "c15") and l["response"]:
            c = l["response"]["body"]["choices"][0]
            out[l["custom_id"]] = c["text"] if "text" in c else c["message"]["content"]
    return out
a, b = greedy(sys.argv[1]), greedy(sys.argv[2])
assert len(a) == 3 and a == b, (a, b)
steps = [int(re.search(r" steps=(\d+)", open(p).read()).group(1)) for p in sys.argv[3:5]]
assert steps[1] > steps[0], steps
print("step-tokens ok", steps)
EOF
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/o0.jsonl" --step-tokens 0 2> /dev/null
[ $? -eq 2 ] || fail "--step-tokens 0 should exit 2"

# two requests at a time (greedy, fixed lengths), prompts admitted beside a decoding request in chunks of at most 2
# tokens: the same completions (the scheduler's own test checks the chunks; here, when a request is admitted beside
# a decoding one depends on how fast the lines are read, so the step counts are only printed)
fmt='{"custom_id": "g%d", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once upon a time there was'
fmt+=' a little dog who lived in a small house by the sea, number %d", "max_tokens": %d, "temperature": 0,'
fmt+=' "ignore_eos": true}}\n'
for i in 1 2 3 4; do
  printf "$fmt" $i $i $((4 * i))
done > "$tmp/greedy.jsonl"
for pc in 0 2; do
  "$bin" batch --model "$model" --input "$tmp/greedy.jsonl" --output "$tmp/out-pc$pc.jsonl" --kv-tokens 8192 \
      --max-running 2 --prefill-chunk $pc 2> "$tmp/err-pc$pc" || fail "batch --prefill-chunk $pc exited $?"
done
python3 - "$tmp/out-pc0.jsonl" "$tmp/out-pc2.jsonl" "$tmp/err-pc0" "$tmp/err-pc2" <<'EOF' || fail "--prefill-chunk 2"
import json, re, sys
def texts(path):
    return {l["custom_id"]: l["response"]["body"]["choices"][0]["text"] for l in map(json.loads, open(path))}
a, b = texts(sys.argv[1]), texts(sys.argv[2])
assert len(a) == 4 and a == b, (a, b)
steps = [int(re.search(r" steps=(\d+)", open(p).read()).group(1)) for p in sys.argv[3:5]]
print("prefill-chunk ok, steps", steps)
EOF
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/o1.jsonl" --prefill-chunk -1 2> /dev/null
[ $? -eq 2 ] || fail "--prefill-chunk -1 should exit 2"

# rerunning on a complete output does nothing
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" 2> "$tmp/err" || fail "rerun"
[ "$(wc -l < "$tmp/out.jsonl")" -eq 15 ] || fail "rerun added lines"
grep -q "written=0 skipped=15" "$tmp/err" || fail "rerun stats: $(cat "$tmp/err")"

# usage and runtime errors
"$bin" batch --model "$model" --input "$tmp/in.jsonl" 2> /dev/null
[ $? -eq 2 ] || fail "missing --output should exit 2"
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/in.jsonl" 2> /dev/null
[ $? -eq 2 ] || fail "input == output should exit 2"
"$bin" batch --model "$model" --input "$tmp/none.jsonl" --output "$tmp/o.jsonl" 2> "$tmp/err"
[ $? -eq 1 ] || fail "missing input should exit 1"
grep -q "none.jsonl" "$tmp/err" || fail "message does not name the input"
"$bin" batch --model /nonexistent --input "$tmp/in.jsonl" --output "$tmp/o2.jsonl" 2> "$tmp/err"
[ $? -eq 1 ] || fail "missing model should exit 1"
printf 'not ours\n{"custom_id": "x", "error": null, "response": null}\n' > "$tmp/foreign.jsonl"
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/foreign.jsonl" 2> "$tmp/err"
[ $? -eq 1 ] || fail "a damaged output in the middle should exit 1"
grep -q "line 1" "$tmp/err" || fail "message does not name the damaged line: $(cat "$tmp/err")"
echo "batch format: ok"
