#!/usr/bin/env bash
# tessera serve under mpirun: rank 0 serves HTTP, two CPU worker ranks run the model (--split layers and tensor).
# Greedy completions must equal the one-process server's, streaming must frame correctly, a client that hangs up
# mid-stream must be cancelled (running sequences back to 0), and SIGUSR1 to mpirun (which forwards it; SIGTERM
# and SIGINT to mpirun kill the job) must stop the server gracefully with a stream in flight, every rank exiting 0.
# /metrics carries each worker's usage (tessera_rank_*, ranks 1 and 2).
#
#   test_http_mpi.sh MPIEXEC
# Exits 77 when mpirun is missing or when this build's tessera refuses to run serve over several ranks.
. "$(dirname "$0")/../../common/prelude.sh"
mpiexec=$1
mpi_env "$mpiexec"
on_fail() { tail_logs 20 "$tmp"/*.log; }
tool() { python3 "$here/sse_tool.py" "$@"; }
body='{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}'

# start LOG CMD...: starts a server on a free port; sets $port and $pid once /health is 200 (returns 1 when the
# command exits first)
start() {
  local log=$1
  shift
  "$@" --model "$model" --port 0 --grace 5 --quiet-ranks 2> "$log" &
  pid=$!
  pids+=("$pid")
  await_server "$log" "$pid"
}

# the one-process reference
start "$tmp/one.log" "$bin" serve || fail "one-process server"
ref=$(curl -s "http://127.0.0.1:$port/v1/completions" -d "$body" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')
[ -n "$ref" ] || fail "no reference text"
kill -TERM "$pid"
wait "$pid" || fail "one-process server exit code"

for split in layers tensor; do
  if ! start "$tmp/$split.log" "$mpiexec" --bind-to none -np 3 "$bin" serve --split "$split"; then
    wait "$pid"
    if grep -q "runs in one process" "$tmp/$split.log"; then
      echo "this tessera does not run serve over several ranks (launcher/main.c): skipped"
      exit 77
    fi
    fail "mpirun serve --split $split did not start"
  fi
  got=$(curl -s "http://127.0.0.1:$port/v1/completions" -d "$body" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')
  [ "$got" = "$ref" ] || fail "$split: '$got' != one process '$ref'"
  curl -sS -N -o "$tmp/s.sse" "http://127.0.0.1:$port/v1/chat/completions" \
    -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": true}' || fail "$split: stream"
  tool frames "$tmp/s.sse" > /dev/null || fail "$split: SSE framing"
  tool disconnect "$port" x > /dev/null || fail "$split: disconnect client"
  for _ in $(seq 1 100); do
    [ "$(tool metric "$port" tessera_running_sequences)" = 0 ] && break
    sleep 0.1
  done
  [ "$(tool metric "$port" tessera_running_sequences)" = 0 ] || fail "$split: sequences left running"
  # each worker's usage, asked when the loop was first idle: its process's peak memory, its planned capacity
  for r in 1 2; do
    [ "$(tool metric "$port" "tessera_rank_peak_host_bytes{rank=\"$r\"}")" -gt 0 ] || fail "$split: rank $r usage"
  done
  tool metric "$port" 'tessera_rank_capacity_bytes{rank="2"}' > /dev/null || fail "$split: rank 2 capacity"
  # graceful stop with a stream in flight
  tool stream "$port" x 400 "$tmp/t.sse" > /dev/null &
  cpid=$!
  for _ in $(seq 1 200); do [ -e "$tmp/t.sse.started" ] && break; sleep 0.05; done
  kill -USR1 "$pid"
  wait "$pid" || fail "$split: mpirun exit code $? after SIGUSR1"
  wait "$cpid" || fail "$split: the stream client failed"
  tool frames "$tmp/t.sse" > /dev/null || fail "$split: the stream in flight did not end cleanly"
  rm -f "$tmp/t.sse" "$tmp/t.sse.started"
  grep -q "stopped" "$tmp/$split.log" || fail "$split: no 'stopped' line"
done
echo "serve.http_mpi: all checks passed"
