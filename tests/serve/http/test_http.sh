#!/usr/bin/env bash
# tessera serve end to end on the bundled model, with real clients against a real server process:
#   curl: health, API keys (401), SSE framing (text/event-stream, data: frames, [DONE], usage chunk), invalid JSON
#         and fields (400), unknown model or path (404), wrong method (405), bodies over --max-body (413, with and
#         without Content-Length), the context limit (400 naming both numbers), /metrics;
#   a client that hangs up mid-stream: its request is cancelled, running sequences return to 0, others are served;
#   a queue limit (429 with Retry-After); SIGTERM with a stream in flight (it ends, the server exits 0);
#   the official openai package (test_openai_client.py): completions, chat, streaming, usage, errors, concurrency.
# Exits 77 (skipped) only when the openai package cannot be installed (no network), after the curl checks pass.
. "$(dirname "$0")/../../common/prelude.sh"
root=$(cd "$here/../../.." && pwd)
key=test-key-123
on_fail() { tail_logs 20 "$tmp"/server*.log; }
tool() { python3 "$here/sse_tool.py" "$@"; }

# start_server LOG ARGS...: starts tessera serve on a free port; sets $port and $spid once /health is 200
start_server() {
  local log=$1
  shift
  "$bin" serve --model "$model" --port 0 "$@" 2> "$log" &
  spid=$!
  pids+=("$spid")
  await_server "$log" "$spid" || fail "server exited at start"
}

# req METHOD PATH [BODY-FILE] [extra curl args...]: prints the status code, body in $tmp/body, headers in $tmp/hdr
req() {
  local method=$1 path=$2 data=${3:-}
  shift 3 2>/dev/null || shift $#
  local args=(-s -o "$tmp/body" -D "$tmp/hdr" -w '%{http_code}' -X "$method" -H "Authorization: Bearer $key"
              -H "Content-Type: application/json")
  [ -n "$data" ] && args+=(--data-binary "@$data")
  curl "${args[@]}" "$@" "http://127.0.0.1:$port$path"
}
json_get() { python3 -c "import json,sys; d=json.load(open('$tmp/body')); print($1)"; }

# small steps, and at most 8 prompt tokens beside decode tokens: prompts prefill over many steps, between others'
# decode tokens, in everything below
start_server "$tmp/server.log" --api-key "$key" --max-body 65536 --kv-tokens 8192 --grace 5 --step-tokens 64 \
  --prefill-chunk 8 \
  --intake "ipc://$tmp/intake.ipc"
base="http://127.0.0.1:$port"
echo "server on port $port"
# the ready line names the ceiling on running sequences: the CPU's default (a GPU's is 256)
for _ in $(seq 1 50); do
  grep -q "^tessera serve: ready: .*, up to 64 running, " "$tmp/server.log" && break; sleep 0.1
done
grep -q "^tessera serve: ready: .*, up to 64 running, API keys required$" "$tmp/server.log" ||
  fail "ready line: $(grep 'ready' "$tmp/server.log")"

# health and keys
[ "$(curl -s "$base/health")" = '{"status":"ok"}' ] || fail "/health body"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/models")" = 401 ] || fail "no key should be 401"
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer nope' "$base/v1/models")" = 401 ] ||
  fail "wrong key should be 401"
[ "$(req GET /v1/models)" = 200 ] || fail "/v1/models"
[ "$(json_get "d['data'][0]['id']")" = tiny-llama-exl2-4.0bpw ] || fail "model id: $(cat "$tmp/body")"
[ "$(req GET /v1/models/tiny-llama-exl2-4.0bpw)" = 200 ] || fail "/v1/models/{id}"
[ "$(req GET /v1/models/other)" = 404 ] || fail "/v1/models/other should be 404"

# the nanomsg intake of the same server gives the same greedy text as HTTP
echo '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}' > "$tmp/greedy.json"
[ "$(req POST /v1/completions "$tmp/greedy.json")" = 200 ] || fail "greedy completion"
http_text=$(json_get "d['choices'][0]['text']")
nn_text=$(timeout 30 "$bin" submit --connect "ipc://$tmp/intake.ipc" --max-tokens 8 --temperature 0 \
  "Once upon a time") || fail "tessera submit to serve --intake"
[ "$nn_text" = "$http_text" ] || fail "intake text '$nn_text', HTTP text '$http_text'"

# SSE framing with curl -N
cat > "$tmp/chat.json" <<'EOF'
{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12, "temperature": 0,
 "stream": true, "stream_options": {"include_usage": true}}
EOF
curl -sS -N -D "$tmp/hdr" -o "$tmp/sse" -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
  --data-binary "@$tmp/chat.json" "$base/v1/chat/completions" || fail "streaming chat"
grep -qi '^content-type: text/event-stream' "$tmp/hdr" || fail "stream content type: $(cat "$tmp/hdr")"
grep -qi '^transfer-encoding: chunked' "$tmp/hdr" || fail "stream not chunked"
n=$(tool frames "$tmp/sse") || fail "SSE framing: $n"
[ "$n" -ge 3 ] || fail "only $n frames"
tail -n 4 "$tmp/sse" | head -n 1 | grep -q '"choices":\[\],"usage":{"prompt_tokens"' ||
  fail "usage chunk: $(tail -n 4 "$tmp/sse")"
grep -q '"finish_reason":"\(stop\|length\)"' "$tmp/sse" || fail "no finish_reason in the stream"
head -n 1 "$tmp/sse" | grep -q '"delta":{"role":"assistant","content":""}' ||
  fail "first chunk: $(head -n 1 "$tmp/sse")"

# a per-request deadline ends a long generation early with finish_reason "abort"
echo '{"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": true, "timeout": 0.3}' > "$tmp/deadline.json"
[ "$(req POST /v1/completions "$tmp/deadline.json")" = 200 ] || fail "deadline request: $(cat "$tmp/body")"
[ "$(json_get "d['choices'][0]['finish_reason']")" = abort ] || fail "deadline: $(cat "$tmp/body")"
n_gen=$(json_get "d['usage']['completion_tokens']")
[ "$n_gen" -lt 1000 ] || fail "deadline: generated all $n_gen tokens"
echo '{"prompt": "x", "timeout": -1}' > "$tmp/bad.json"
[ "$(req POST /v1/completions "$tmp/bad.json")" = 400 ] || fail "negative timeout should be 400"

# errors
printf '{"prompt": "x", ' > "$tmp/bad.json"
[ "$(req POST /v1/completions "$tmp/bad.json")" = 400 ] || fail "invalid JSON should be 400"
[ "$(json_get "d['error']['type']")" = invalid_request_error ] || fail "error body: $(cat "$tmp/body")"
echo '{"prompt": "x", "max_tokens": "many"}' > "$tmp/bad.json"
[ "$(req POST /v1/completions "$tmp/bad.json")" = 400 ] || fail "bad field should be 400"
[ "$(json_get "d['error']['param']")" = max_tokens ] || fail "param: $(cat "$tmp/body")"
echo '{"prompt": "x", "model": "gpt-4o"}' > "$tmp/bad.json"
[ "$(req POST /v1/completions "$tmp/bad.json")" = 404 ] || fail "unknown model should be 404"
echo '{"prompt": "Hello", "max_tokens": 4000}' > "$tmp/bad.json"
[ "$(req POST /v1/completions "$tmp/bad.json")" = 400 ] || fail "context overflow should be 400"
json_get "d['error']['message']" | grep -q "2048.*4000" || fail "context message: $(cat "$tmp/body")"
[ "$(req GET /v1/nothing)" = 404 ] || fail "unknown path should be 404"
[ "$(req GET /v1/completions)" = 405 ] || fail "GET on completions should be 405"
python3 -c "import json; print(json.dumps({'prompt': 'a ' * 50000, 'max_tokens': 1}))" > "$tmp/big.json"
[ "$(req POST /v1/completions "$tmp/big.json")" = 413 ] || fail "big body should be 413"
[ "$(req POST /v1/completions "$tmp/big.json" -H 'Transfer-Encoding: chunked')" = 413 ] ||
  fail "big chunked body should be 413"
printf '\x00\xff{]' > "$tmp/bad.json"
[ "$(req POST /v1/chat/completions "$tmp/bad.json")" = 400 ] || fail "garbage should be 400"
[ "$(curl -s "$base/health")" = '{"status":"ok"}' ] || fail "server unhealthy after bad requests"

# a client that hangs up mid-stream: cancelled at once, nothing left running, others still served
tool disconnect "$port" "$key" > /dev/null || fail "disconnect client"
for _ in $(seq 1 100); do
  running=$(tool metric "$port" tessera_running_sequences) || fail "metrics"
  queued=$(tool metric "$port" tessera_queue_length)
  [ "$running" = 0 ] && [ "$queued" = 0 ] && break
  sleep 0.1
done
[ "$running" = 0 ] || fail "running sequences stay at $running after the client left"
[ "$(tool metric "$port" tessera_requests_cancelled_total)" -ge 1 ] || fail "the request was not cancelled"
[ "$(tool metric "$port" tessera_http_client_disconnects_total)" -ge 1 ] || fail "disconnect not counted"
gen=$(tool metric "$port" tessera_generation_tokens_total)
[ "$gen" -lt 1500 ] || fail "the abandoned request ran to the end ($gen tokens)"
echo '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}' > "$tmp/ok.json"
[ "$(req POST /v1/completions "$tmp/ok.json")" = 200 ] || fail "request after a disconnect"

# concurrent curl clients, streaming and not
clients=()
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 0 ]; then
    curl -sS -N -o "$tmp/c$i" -H "Authorization: Bearer $key" --data-binary "@$tmp/chat.json" \
      "$base/v1/chat/completions" &
  else
    curl -sS -o "$tmp/c$i" -H "Authorization: Bearer $key" --data-binary "@$tmp/ok.json" "$base/v1/completions" &
  fi
  clients+=($!)
done
wait "${clients[@]}"
for i in 2 4 6; do tool frames "$tmp/c$i" > /dev/null || fail "concurrent stream $i"; done
for i in 1 3 5; do
  grep -q '"finish_reason":"length"' "$tmp/c$i" || fail "concurrent request $i: $(cat "$tmp/c$i")"
done

# metrics
curl -s "$base/metrics" > "$tmp/metrics"
for m in tessera_http_requests_total tessera_prompt_tokens_total tessera_generation_tokens_total \
  tessera_queue_length tessera_running_sequences tessera_kv_pages_used tessera_kv_pages_free \
  tessera_prefix_cache_hits_total tessera_time_to_first_token_seconds_bucket \
  tessera_inter_token_latency_seconds_bucket; do
  grep -q "^$m" "$tmp/metrics" || fail "metric $m missing"
done
grep -q '^# TYPE tessera_time_to_first_token_seconds histogram' "$tmp/metrics" || fail "histogram TYPE"

# the openai package
py=$root/.cache/openai-venv/bin/python
if ! "$py" -c 'import openai' 2> /dev/null; then
  # make the venv here when install-deps.sh has not (CI has network; without it this test is skipped)
  { python3 -m venv "$root/.cache/openai-venv" && "$py" -m pip install -q --disable-pip-version-check openai; } \
    > "$tmp/pip.log" 2>&1
fi
have_openai=0
if "$py" -c 'import openai' 2> /dev/null; then
  have_openai=1
  "$py" "$here/test_openai_client.py" "$base/v1" "$key" tiny-llama-exl2-4.0bpw || fail "openai client tests"
fi

# SIGTERM with a stream in flight: the stream still ends with [DONE], the server exits 0
tool stream "$port" "$key" 1000 "$tmp/term.sse" > "$tmp/term.status" &
cpid=$!
for _ in $(seq 1 200); do [ -e "$tmp/term.sse.started" ] && break; sleep 0.05; done
[ -e "$tmp/term.sse.started" ] || fail "the stream before SIGTERM did not start"
kill -TERM "$spid"
for _ in $(seq 1 150); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$spid" 2>/dev/null && fail "server still running 15 s after SIGTERM"
wait "$spid"
rc=$?
[ $rc = 0 ] || fail "server exit code $rc after SIGTERM"
wait "$cpid" || fail "the streaming client failed"
tool frames "$tmp/term.sse" > /dev/null ||
  fail "the stream in flight did not end cleanly: $(tail -c 300 "$tmp/term.sse")"
grep -q "stopped" "$tmp/server.log" || fail "no 'stopped' line"

# a full queue answers 429 with Retry-After
start_server "$tmp/server2.log" --max-running 1 --max-waiting 1 --kv-tokens 4096
base="http://127.0.0.1:$port"
clients=()
for i in 1 2 3 4 5 6; do
  curl -s -o /dev/null -D "$tmp/q$i.hdr" -w '%{http_code}\n' \
    --data-binary '{"prompt": "Once upon a time", "max_tokens": 600, "ignore_eos": true}' \
    "$base/v1/completions" > "$tmp/q$i.code" &
  clients+=($!)
done
wait "${clients[@]}"
n429=$(cat "$tmp"/q*.code | grep -c 429)
n200=$(cat "$tmp"/q*.code | grep -c 200)
[ "$n429" -ge 1 ] || fail "no 429 with a full queue: $(cat "$tmp"/q*.code | tr '\n' ' ')"
[ "$n200" -ge 1 ] || fail "no request served with a full queue"
grep -qi '^retry-after:' $(grep -l 429 "$tmp"/q*.hdr | head -n 1) || fail "429 without Retry-After"
kill -INT "$spid"
wait "$spid" || fail "server exit code $? after SIGINT"

# a quantized KV cache: the greedy text of `tessera generate --kv-dtype q4`; under a memory plan (--gpu-memory, which
# the CPU backend honours too) --kv-fraction sets the pool's share of what weights and workspace leave (default 0.95);
# --max-context: longer requests get 400 naming it
pages=()
for share in "" 0.5; do
  start_server "$tmp/server-q4$share.log" --kv-dtype q4 --gpu-memory 256MiB ${share:+--kv-fraction $share} \
    --max-context 256
  pages+=("$(tool metric "$port" tessera_kv_pages_total)")
  # this process as rank 0 in /metrics: its peak memory and the cap it was planned under
  [ "$(tool metric "$port" 'tessera_rank_peak_host_bytes{rank="0"}')" -gt 0 ] || fail "rank 0 usage"
  [ "$(tool metric "$port" 'tessera_rank_capacity_bytes{rank="0"}')" = 268435456 ] || fail "rank 0 capacity"
  echo '{"prompt": "Once upon a time", "max_tokens": 300}' > "$tmp/long.json"
  [ "$(req POST /v1/completions "$tmp/long.json")" = 400 ] && grep -q "maximum context length is 256" "$tmp/body" ||
    fail "--max-context 256: $(cat "$tmp/body")"
  [ "$(req POST /v1/completions "$tmp/greedy.json")" = 200 ] || fail "q4 completion"
  gen=$("$bin" generate --model "$model" --prompt "Once upon a time" --max-tokens 8 --kv-dtype q4) || fail "generate q4"
  [ "Once upon a time$(json_get "d['choices'][0]['text']")" = "$gen" ] || fail "q4: '$(cat "$tmp/body")' vs '$gen'"
  kill -TERM "$spid"
  wait "$spid" || fail "q4 server exit code"
done
python3 -c "import sys; a, b = map(int, sys.argv[1:]); sys.exit(not abs(b / a - 0.5 / 0.95) < 0.02)" "${pages[@]}" ||
  fail "--kv-fraction 0.5: ${pages[1]} pages against ${pages[0]} at the default 0.95"
echo "q4 cache: the text of generate --kv-dtype q4; --kv-fraction 0.5: ${pages[1]} of ${pages[0]} pages"

if [ $have_openai = 0 ]; then
  echo "SKIP: the openai package could not be installed (see below); the curl checks passed"
  tail -n 5 "$tmp/pip.log"
  exit 77
fi
echo "serve.http: all checks passed"
