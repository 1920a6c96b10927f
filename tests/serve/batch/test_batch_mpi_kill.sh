#!/usr/bin/env bash
# A worker killed in the middle of tessera batch under mpirun (CPU workers, layer split; TSR_TEST_DIE_AFTER_STEPS
# makes the last worker exit during a step, as a crash or an OOM kill would): the coordinator must end the job
# non-zero within seconds, naming the dead rank, with only whole result lines in the output and no result recorded
# for the requests that were in flight. A rerun with the same output then completes every request exactly once,
# with the same greedy results as one uninterrupted process.
#
#   test_batch_mpi_kill.sh MPIEXEC
. "$(dirname "$0")/../../common/prelude.sh"
mpiexec=$1
mpi_env "$mpiexec"
n=60
python3 - "$tmp/in.jsonl" "$n" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": f"Story number {i}: once upon a time", "max_tokens": 6,
                                     "temperature": 0}}) + "\n")
PY
mpirun_batch() { # OUTPUT [env...]: tessera batch over a coordinator and two CPU workers
    local out=$1
    shift
    env "$@" timeout 300 "$mpiexec" --bind-to none -np 3 "$bin" batch --model "$model" --input "$tmp/in.jsonl" \
        --output "$out" --kv-tokens 4096 --max-running 4 --split layers --comm-timeout 10 --quiet-ranks
}
"$bin" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/ref.jsonl" --kv-tokens 4096 --max-running 4 \
    2> "$tmp/err" || fail "one process: $(cat "$tmp/err")"

SECONDS=0
mpirun_batch "$tmp/out.jsonl" TSR_TEST_DIE_AFTER_STEPS=25 TSR_TEST_DIE_RANK=2 > /dev/null 2> "$tmp/err"
rc=$?
took=$SECONDS
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "a killed worker: exit $rc after ${took}s (want non-zero, no timeout)"
[ "$took" -le 30 ] || fail "a killed worker took ${took}s to end the job"
grep -q "rank 2" "$tmp/err" || fail "the error does not name rank 2: $(tail -5 "$tmp/err")"
done_before=$(wc -l < "$tmp/out.jsonl" 2> /dev/null || echo 0)
[ "$done_before" -lt "$n" ] || fail "all $n requests finished before the worker died: the fault came too late"
python3 -c '
import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    assert j["error"] is None and j["response"]["status_code"] == 200, ("a failure was recorded as a result", l[:200])
' "$tmp/out.jsonl" || fail "the interrupted output has a damaged or error line"
echo "killed worker: exit $rc after ${took}s, $done_before of $n results written"

mpirun_batch "$tmp/out.jsonl" > /dev/null 2> "$tmp/err" || fail "resume under mpirun: $(tail -5 "$tmp/err")"
python3 - "$tmp/out.jsonl" "$tmp/ref.jsonl" "$n" <<'PY' \
    || fail "after resuming, results are not each written once or differ"
import collections, json, sys
def load(path):
    rows = [json.loads(l) for l in open(path)]
    count = collections.Counter(r["custom_id"] for r in rows)
    assert set(count.values()) == {1}, [k for k, v in count.items() if v != 1]
    return {r["custom_id"]: r["response"]["body"]["choices"][0]["text"] for r in rows}
got, ref = load(sys.argv[1]), load(sys.argv[2])
assert len(got) == int(sys.argv[3]), len(got)
assert got == ref, [k for k in got if got[k] != ref[k]][:5]
PY
echo "batch after a killed worker: resumed, every request exactly once, greedy results equal one process"
