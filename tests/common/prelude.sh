# The common start of the shell tests that drive the tessera command on the bundled model (tests/serve/*/test_*.sh,
# tests/cli/test_commands.sh): each sources it first, by its path relative to the script (for tests/serve/http,
# `. "$(dirname "$0")/../../common/prelude.sh"`), and keeps its own specifics (arguments, servers, clients, checks)
# in place. It turns on `set -u` and gives the script:
#   bin, model   the tessera binary (TSR_BIN) and the bundled model's directory (under TSR_MODELS), set by CTest;
#   here         the sourcing script's directory;
#   tmp          a fresh temporary directory;
#   pids         background processes to kill (-9) at exit: add each with pids+=("$pid");
#   cleanup      the EXIT trap: runs the script's on_exit when it defines one, kills what pids lists, removes $tmp;
#   fail MSG     prints "FAIL: MSG", then whatever the script's on_fail prints (say, tail_logs of its servers), and
#                exits 1;
#   tail_logs N FILE...   the last N lines of each FILE that exists, under a "--- FILE" header;
#   mpi_env MPIEXEC       skips the test (exit 77) without MPIEXEC, else lets Open MPI run as root, oversubscribe
#                         the cores and copy without cross-process memory access (containers often forbid it);
#   await_server LOG PID  waits until the `tessera serve` of PID (or the mpirun above it), logging to LOG, names its
#                         port (sets $port) and answers /health with 200; returns 1 when PID exits first and fails
#                         when /health answers anything but 200, 503 (loading) or nothing, or after 60 s.
set -u
bin=${TSR_BIN:?TSR_BIN not set}
model=${TSR_MODELS:?}/tiny-llama-exl2-4.0bpw
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
tmp=$(mktemp -d)
pids=()

cleanup() {
  declare -F on_exit > /dev/null && on_exit
  local p
  for p in ${pids[@]+"${pids[@]}"}; do kill -9 "$p" 2> /dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  declare -F on_fail > /dev/null && on_fail
  exit 1
}

tail_logs() {
  local n=$1 f
  shift
  for f in "$@"; do [ -f "$f" ] && { echo "--- $f"; tail -n "$n" "$f"; }; done
  return 0
}

mpi_env() {
  command -v "$1" > /dev/null || { echo "no $1: skipped"; exit 77; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
}

await_server() {
  local log=$1 pid=$2 code listen='s|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p'
  port=""
  for _ in $(seq 1 600); do
    [ -z "$port" ] && port=$(sed -n "$listen" "$log" 2> /dev/null | head -n 1)
    if [ -n "$port" ]; then
      code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
      [ "$code" = 200 ] && return 0
      [ "$code" = 503 ] || [ "$code" = 000 ] || fail "/health while loading answered $code"
    fi
    kill -0 "$pid" 2> /dev/null || return 1
    sleep 0.1
  done
  fail "server not ready after 60 s ($log)"
}
