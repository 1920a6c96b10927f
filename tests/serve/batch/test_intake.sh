#!/usr/bin/env bash
# The nanomsg intake with its reference client: `tessera intake` on an ipc:// address (and one on tcp://), then
# `tessera submit` for completions and chat, streamed and not, the message sequence (accepted, chunks, exactly
# one done), request errors, cancellation, and a client killed mid-stream whose request the intake must cancel.
# Finally SIGTERM stops the intake with exit 0 and its stats line counts the vanished client.
. "$(dirname "$0")/../../common/prelude.sh"
addr="ipc://$tmp/intake.ipc"
pid=
on_exit() { [ -n "$pid" ] && kill "$pid" 2> /dev/null && wait "$pid" 2> /dev/null; }
on_fail() { [ -f "$tmp/intake.err" ] && sed 's/^/  intake: /' "$tmp/intake.err"; }
export TMPDIR=$tmp # the clients' reply sockets (a killed client cannot remove its own)

start_intake() { # ADDR: starts `tessera intake` in the background and waits until it listens
    # 2 ms per step (runtime/service.c's test hook): the killed client's 1500 tokens take 3 s or more, longer than
    # the 1 s it takes to find it gone, however fast the machine decodes
    TSR_TEST_STEP_SLEEP_MS=2 "$bin" intake --model "$model" --listen "$1" --kv-tokens 8192 --client-timeout 5 \
        --send-timeout 1 2> "$tmp/intake.err" &
    pid=$!
    for _ in $(seq 100); do
        grep -q "serving" "$tmp/intake.err" 2> /dev/null && return 0
        kill -0 "$pid" 2> /dev/null || fail "intake exited at start"
        sleep 0.1
    done
    fail "intake did not start"
}
stop_intake() {
    kill -TERM "$pid"
    wait "$pid"
    local rc=$?
    pid=
    [ $rc -eq 0 ] || fail "intake exited $rc after SIGTERM"
}
submit() { "$bin" submit --connect "$addr" --timeout 60 "$@"; }

start_intake "$addr"

# non-streaming completions: the same text as tessera generate (greedy)
out=$(submit --max-tokens 8 --temperature 0 "Once upon a time") || fail "submit completions"
gen=$("$bin" generate --model "$model" --prompt "Once upon a time" --max-tokens 8)
[ "Once upon a time$out" = "$gen" ] || fail "intake text '$out' differs from generate '$gen'"

# streaming: the same text, in more than one chunk
sout=$(submit --stream --max-tokens 8 --temperature 0 "Once upon a time") || fail "submit --stream"
[ "$sout" = "$out" ] || fail "streamed '$sout' differs from '$out'"
submit --raw --stream --max-tokens 8 --temperature 0 --request-id s1 "Once upon a time" > "$tmp/raw" ||
    fail "submit --raw"
python3 - "$tmp/raw" <<'EOF' || fail "message sequence"
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1])]
types = [m["type"] for m in msgs]
assert types[0] == "accepted" and types[-1] == "done" and types.count("done") == 1, types
assert all(t == "chunk" for t in types[1:-1]) and types.count("chunk") >= 3, types
assert all(m["request_id"] == "s1" and m["client_id"] for m in msgs), msgs
rid = msgs[0]["id"]
chunks = [m["chunk"] for m in msgs if m["type"] == "chunk"]
assert all(c["id"] == rid and c["object"] == "text_completion" for c in chunks), chunks
assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), chunks[-1]
assert msgs[-1]["status_code"] == 200
EOF

# chat, streamed, with the usage chunk
cat > "$tmp/chat.json" <<'EOF'
{"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 6, "stream": true,
 "stream_options": {"include_usage": true}, "temperature": 0}
EOF
submit --raw --body "$tmp/chat.json" > "$tmp/raw_chat" || fail "chat stream"
python3 - "$tmp/raw_chat" <<'EOF' || fail "chat messages"
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1])]
chunks = [m["chunk"] for m in msgs if m["type"] == "chunk"]
assert (chunks[0]["object"] == "chat.completion.chunk"
        and chunks[0]["choices"][0]["delta"].get("role") == "assistant"), chunks[0]
assert chunks[-1]["usage"]["completion_tokens"] == 6 and chunks[-1]["choices"] == [], chunks[-1]
assert msgs[-1]["type"] == "done"
EOF
submit --chat --max-tokens 6 "Hello" > /dev/null || fail "submit --chat"

# request errors come back as OpenAI errors and exit 1
submit --body <(echo '{"prompt": "x", "temperature": "hot"}') 2> "$tmp/err"
[ $? -eq 1 ] || fail "a bad body should exit 1"
grep -q "error 400.*temperature" "$tmp/err" || fail "bad body message: $(cat "$tmp/err")"
submit --url /v1/embeddings --body <(echo '{"input": "x"}') 2> "$tmp/err"
[ $? -eq 1 ] && grep -q "error 404" "$tmp/err" || fail "unknown url: $(cat "$tmp/err")"
submit --raw --body <(echo '{"prompt": "x", "max_tokens": 100000}') > "$tmp/raw_err"
python3 -c '
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1])]
assert [m["type"] for m in msgs] == ["error"] and msgs[0]["error"]["code"] == "context_length_exceeded", msgs' \
    "$tmp/raw_err" || fail "context error: $(cat "$tmp/raw_err")"

# malformed messages are dropped and counted, never answered wrongly or fatal; envelope errors are answered
for m in 'not json' '[1]' '{"type": "submit"}' '{"type": "ping", "client_id": "ghost"}' \
         '{"type": "submit", "client_id": "y", "reply_to": "http://example.com/"}'; do
    "$bin" submit --connect "$addr" --send "$m" || fail "--send '$m'"
done
submit --raw --request-id "" --max-tokens 2 "x" > "$tmp/raw_env"
grep -q '"code":"invalid_request_id"' "$tmp/raw_env" || fail "empty request_id: $(cat "$tmp/raw_env")"

# cancel after 3 chunks: the request ends with "done" and finish_reason "abort", long before max_tokens
echo '{"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": true, "stream": true}' > "$tmp/long.json"
submit --raw --body "$tmp/long.json" --cancel-after 3 > "$tmp/raw_cancel" || fail "cancel"
python3 - "$tmp/raw_cancel" <<'EOF' || fail "cancelled stream: $(tail -n 3 "$tmp/raw_cancel")"
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1])]
assert msgs[-1]["type"] == "done", msgs[-1]
chunks = [m["chunk"] for m in msgs if m["type"] == "chunk"]
assert len(chunks) < 200, len(chunks)
assert chunks[-1]["choices"][0]["finish_reason"] == "abort", chunks[-1]
EOF

# a client killed mid-stream: its request is cancelled (replies undeliverable for 1 s, or no ping for 5 s)
"$bin" submit --connect "$addr" --stream --body "$tmp/long.json" > "$tmp/victim.out" 2>&1 &
victim=$!
for _ in $(seq 100); do [ -s "$tmp/victim.out" ] && break; sleep 0.05; done
[ -s "$tmp/victim.out" ] || fail "the victim client got no text"
kill -9 "$victim"
wait "$victim" 2> /dev/null
for _ in $(seq 100); do grep -q "vanished" "$tmp/intake.err" && break; sleep 0.1; done
grep -q "client submit-$victim-[0-9a-f]* vanished (.*): cancelling 1 request" "$tmp/intake.err" ||
    fail "the killed client's request was not cancelled"
# the intake still serves
out2=$(submit --max-tokens 8 --temperature 0 "Once upon a time") || fail "submit after the vanished client"
[ "$out2" = "$out" ] || fail "after the vanished client: '$out2'"

# concurrent clients
pids=()
for k in 1 2 3 4 5 6; do
    "$bin" submit --connect "$addr" --timeout 60 --stream --max-tokens 12 "Client $k says" > "$tmp/c$k.out" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "a concurrent client failed"; done
for k in 1 2 3 4 5 6; do [ -s "$tmp/c$k.out" ] || fail "concurrent client $k got nothing"; done

stop_intake
grep -q "^tessera intake: stats .*bad_messages=5 .*clients_vanished=1 cancelled_vanished=1" "$tmp/intake.err" ||
    fail "stats: $(grep stats "$tmp/intake.err")"

# tcp:// works the same way
port=$((20000 + RANDOM % 20000))
addr="tcp://127.0.0.1:$port"
start_intake "$addr"
tout=$(submit --stream --max-tokens 8 --temperature 0 "Once upon a time") || fail "submit over tcp"
[ "$tout" = "$out" ] || fail "tcp text '$tout'"
stop_intake

# no intake listening: submit gives up with exit 1
"$bin" submit --connect "ipc://$tmp/nobody.ipc" --max-tokens 2 "x" 2> "$tmp/err"
[ $? -eq 1 ] || fail "submit without an intake should exit 1"
echo "intake: ok"
