#!/usr/bin/env bash
# Resuming tessera batch: after the output is cut in the middle of a line, after its last lines are deleted, after
# a write fails halfway (TSR_TEST_WRITE_FAIL_AFTER, and a real 16 KiB tmpfs where user namespaces allow mounting
# one), a rerun with the same output completes exactly the missing requests: every custom_id ends up with exactly
# one result line (the duplicate with exactly one duplicate error, each bad line with exactly one error line), and
# greedy results equal those of an uninterrupted run.
. "$(dirname "$0")/../../common/prelude.sh"
run() { "$bin" batch --model "$model" --input "$tmp/in.jsonl" --kv-tokens 8192 --max-running 8 "$@"; }

python3 - "$tmp/in.jsonl" <<'EOF'
import json, sys
words = ["apple", "river", "castle", "dragon", "forest", "robot", "ocean", "winter", "garden", "star"]
with open(sys.argv[1], "w") as f:
    for i in range(40):
        if i % 4 == 3:
            body = {"messages": [{"role": "user", "content": f"Tell me about the {words[i % 10]} number {i}."}],
                    "max_tokens": 8, "temperature": 0}
            url = "/v1/chat/completions"
        else:
            body = {"prompt": f"The {words[i % 10]} and the {words[(i * 3) % 10]} went", "max_tokens": 8,
                    "temperature": 0}
            url = "/v1/completions"
        f.write(json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": url, "body": body}) + "\n")
        if i == 10:
            f.write("{this is not json\n")
        if i == 20:
            f.write(json.dumps({"custom_id": "req-3", "method": "POST", "url": "/v1/completions",
                                "body": {"prompt": "dup"}}) + "\n")
        if i == 30:
            f.write(json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v2/x", "body": {}}) + "\n")
EOF

# check OUT [REF]: exactly one line per request, and (with REF) the same greedy results as REF
check() {
    python3 - "$@" <<'EOF'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
seen = {}
nulls = 0
for l in lines:
    cid = l["custom_id"]
    if cid is None:
        nulls += 1
        continue
    key = (cid, bool(l["error"] and l["error"]["code"] == "duplicate_custom_id"))
    seen[key] = seen.get(key, 0) + 1
assert len(lines) == 43, f"{len(lines)} lines, expected 43"
assert nulls == 1, f"{nulls} error lines without custom_id, expected 1"
assert all(v == 1 for v in seen.values()), {k: v for k, v in seen.items() if v != 1}
assert sum(1 for k in seen if not k[1]) == 41 and ("req-3", True) in seen, sorted(seen)
if len(sys.argv) > 2:
    def results(path):
        out = {}
        for l in map(json.loads, open(path)):
            if l["response"] and l["response"]["status_code"] == 200:
                b = l["response"]["body"]
                out[l["custom_id"]] = [c.get("text", c.get("message", {}).get("content")) for c in b["choices"]]
        return out
    a, b = results(sys.argv[1]), results(sys.argv[2])
    assert len(a) == 40 and a == b, [k for k in a if a.get(k) != b.get(k)]
EOF
}

run --output "$tmp/full.jsonl" 2> "$tmp/err" || fail "full run: $(cat "$tmp/err")"
check "$tmp/full.jsonl" || fail "full run output"

# 1. cut in the middle of line 21
head -n 20 "$tmp/full.jsonl" > "$tmp/cut.jsonl"
sed -n 21p "$tmp/full.jsonl" | head -c 57 >> "$tmp/cut.jsonl"
run --output "$tmp/cut.jsonl" 2> "$tmp/err" || fail "resume after a cut line: $(cat "$tmp/err")"
grep -q "dropping 57 bytes" "$tmp/err" || fail "the cut line was not reported: $(cat "$tmp/err")"
grep -q "written=23 skipped=20" "$tmp/err" || fail "resume did not complete exactly the rest: $(cat "$tmp/err")"
check "$tmp/cut.jsonl" "$tmp/full.jsonl" || fail "output after resuming a cut line"

# 2. the last 15 lines deleted
head -n 28 "$tmp/full.jsonl" > "$tmp/short.jsonl"
run --output "$tmp/short.jsonl" 2> "$tmp/err" || fail "resume after deleted lines: $(cat "$tmp/err")"
grep -q "written=15 skipped=28" "$tmp/err" || fail "resume did not complete exactly the rest: $(cat "$tmp/err")"
check "$tmp/short.jsonl" "$tmp/full.jsonl" || fail "output after resuming deleted lines"

# 3. a write fails halfway through line 11 (simulated full disk): 10 whole lines stay, exit 1, rerun completes
TSR_TEST_WRITE_FAIL_AFTER=10 run --output "$tmp/full2.jsonl" 2> "$tmp/err"
[ $? -eq 1 ] || fail "a failed write should exit 1"
grep -q "No space left on device" "$tmp/err" || fail "no disk-full message: $(cat "$tmp/err")"
[ "$(wc -l < "$tmp/full2.jsonl")" -eq 10 ] \
    || fail "$(wc -l < "$tmp/full2.jsonl") lines after the failed write, expected 10"
[ "$(tail -c 1 "$tmp/full2.jsonl" | od -An -c | tr -d ' ')" = '\n' ] || fail "the file does not end with a whole line"
python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$tmp/full2.jsonl" || fail "damaged lines"
run --output "$tmp/full2.jsonl" 2> "$tmp/err" || fail "resume after the failed write: $(cat "$tmp/err")"
check "$tmp/full2.jsonl" "$tmp/full.jsonl" || fail "output after resuming a failed write"

# 4. a real full disk: a 16 KiB tmpfs in a private mount namespace (skipped where that is not allowed)
mkdir -p "$tmp/mnt"
if unshare -rm sh -c "mount -t tmpfs -o size=16k none '$tmp/mnt'" 2> /dev/null; then
    unshare -rm sh -c "mount -t tmpfs -o size=16k none '$tmp/mnt' &&
        '$bin' batch --model '$model' --input '$tmp/in.jsonl' --kv-tokens 8192 --max-running 8 \
            --output '$tmp/mnt/out.jsonl' 2> '$tmp/err'
        echo \$? > '$tmp/rc'; cp '$tmp/mnt/out.jsonl' '$tmp/disk.jsonl'"
    [ "$(cat "$tmp/rc")" = 1 ] || fail "a full tmpfs should exit 1 (got $(cat "$tmp/rc")): $(cat "$tmp/err")"
    grep -q "No space left on device" "$tmp/err" || fail "no disk-full message: $(cat "$tmp/err")"
    n=$(wc -l < "$tmp/disk.jsonl")
    [ "$n" -gt 0 ] && [ "$n" -lt 43 ] || fail "$n lines on the full tmpfs"
    python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$tmp/disk.jsonl" \
        || fail "damaged lines on the full tmpfs"
    [ "$(tail -c 1 "$tmp/disk.jsonl" | od -An -c | tr -d ' ')" = '\n' ] \
        || fail "the full tmpfs file does not end with a whole line"
    run --output "$tmp/disk.jsonl" 2> "$tmp/err" || fail "resume after the full tmpfs: $(cat "$tmp/err")"
    check "$tmp/disk.jsonl" "$tmp/full.jsonl" || fail "output after resuming from the full tmpfs"
    echo "full tmpfs: $n lines fitted, resume completed"
else
    echo "note: no user namespaces here; the real full-disk case is skipped (the simulated one ran)"
fi
# 5. SIGINT in the middle of a run: exit 130 with whole lines; the rerun completes each request exactly once
python3 -c '
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(400):
        f.write(json.dumps({"custom_id": f"i{i}", "method": "POST", "url": "/v1/completions",
                            "body": {"prompt": f"Number {i} is", "max_tokens": 2, "temperature": 0}})
                + "\n")' "$tmp/int.jsonl"
"$bin" batch --model "$model" --input "$tmp/int.jsonl" --output "$tmp/int_out.jsonl" --kv-tokens 8192 2> "$tmp/err" &
bpid=$!
for _ in $(seq 200); do [ "$(wc -l < "$tmp/int_out.jsonl" 2> /dev/null || echo 0)" -ge 20 ] && break; sleep 0.05; done
kill -INT "$bpid"
wait "$bpid"
rc=$?
[ $rc -eq 130 ] || [ $rc -eq 0 ] || fail "SIGINT: exit $rc ($(cat "$tmp/err"))"
echo "interrupted after $(wc -l < "$tmp/int_out.jsonl") of 400 results (exit $rc)"
"$bin" batch --model "$model" --input "$tmp/int.jsonl" --output "$tmp/int_out.jsonl" --kv-tokens 8192 2> "$tmp/err" ||
    fail "resume after SIGINT: $(cat "$tmp/err")"
python3 -c '
import json, sys, collections
c = collections.Counter(json.loads(l)["custom_id"] for l in open(sys.argv[1]))
assert len(c) == 400 and set(c.values()) == {1}, [k for k, v in c.items() if v != 1]' "$tmp/int_out.jsonl" ||
    fail "after SIGINT and resume, custom_ids are not each written once"
echo "batch resume: ok"
