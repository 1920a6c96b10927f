#!/usr/bin/env bash
# tessera serve under network abuse on loopback (abuse.py drives it): slowloris, requests sent while the server is
# stopped (they must still be answered), streams nobody reads, thousands of idle connections, oversized headers
# and bodies, malformed JSON, foreign Host and Origin headers. The server runs on the bundled model with small
# limits (a 3 s header timeout, a 6 s connection timeout: time for a lone stream nobody reads to pass its backlog
# on a loaded machine, a 1 MiB body cap, a 4 KiB stream backlog) and an API key, while a normal client keeps
# getting the same greedy completion; its memory must stay bounded, its log must not mention the key, and it must
# exit 0 on SIGTERM at the end.
#
#   test_abuse.sh [FIGURES.json]     (TSR_BIN and TSR_MODELS come from CTest)
. "$(dirname "$0")/../../common/prelude.sh"
figures=${1:-}
on_fail() { tail_logs 30 "$tmp/server.log"; }

header_timeout_s=3
conn_timeout_s=6
max_body=1048576
kv_tokens=32768
kv_bytes=$((kv_tokens * 2048)) # 4 layers x 2 KV heads x 64 dims x K and V x 2 bytes per token

"$bin" serve --model "$model" --port 0 --conn-timeout "$conn_timeout_s" --header-timeout "$header_timeout_s" \
  --max-body "$max_body" \
  --stream-backlog 4096 --kv-tokens "$kv_tokens" --api-key abuse-test-key-0123456789 --grace 5 \
  2> "$tmp/server.log" &
spid=$!
pids+=("$spid")
await_server "$tmp/server.log" "$spid" || fail "server exited at start"
grep 'limits:' "$tmp/server.log"

python3 "$here/abuse.py" --port "$port" --pid "$spid" --conn-timeout "$conn_timeout_s" \
  --header-timeout "$header_timeout_s" --max-body "$max_body" \
  --kv-bytes "$kv_bytes" ${figures:+--figures "$figures"} || fail "abuse.py"

# no secret or request content in the log, and a clean stop
grep -qi 'authorization\|bearer\|abuse-test-key' "$tmp/server.log" && fail "the server log mentions credentials"
kill -TERM "$spid"
for _ in $(seq 1 100); do kill -0 "$spid" 2> /dev/null || break; sleep 0.1; done
kill -0 "$spid" 2> /dev/null && fail "server still running 10 s after SIGTERM"
wait "$spid"
rc=$?
pids=() # reaped: nothing left for the exit trap to kill
[ $rc = 0 ] || fail "server exit code $rc after SIGTERM"
echo "--- server log"
cat "$tmp/server.log"
echo "ok"
