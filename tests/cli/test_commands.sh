#!/usr/bin/env bash
# The tessera command end to end on the bundled model: generate (ids and text, greedy equal to ExLlamaV2's first
# tokens), logits, inspect, bench through the scheduler, and the exit codes and messages for bad input (usage 2,
# runtime 1, never a crash).
. "$(dirname "$0")/../common/prelude.sh"

# greedy ids after prompt 0 match the first ExLlamaV2 greedy tokens of the fixture
ids=$("$bin" generate --model "$model" --ids 0,1392,1329,263,680 --max-tokens 10 --print-ids) || fail "generate --ids"
[ "$ids" = "16,722,328,263,1037,1207,1259,304,518,18" ] || fail "greedy ids: $ids"
text=$("$bin" generate --model "$model" --prompt "Once upon a time" --max-tokens 20) || fail "generate --prompt"
case "$text" in *"there was a little girl"*) ;; *) fail "generated text: $text" ;; esac
"$bin" generate --model "$model" --prompt "Hello" --chat --max-tokens 5 --temperature 0.7 --seed 1 > /dev/null \
    || fail "--chat"
a=$("$bin" generate --model "$model" --prompt "Hello" --max-tokens 12 --temperature 1 --top-p 0.9 --seed 7 --print-ids)
b=$("$bin" generate --model "$model" --prompt "Hello" --max-tokens 12 --temperature 1 --top-p 0.9 --seed 7 --print-ids)
[ "$a" = "$b" ] || fail "same seed, different tokens: $a / $b"

echo '{"ids": [[0, 1392, 1329], [0, 5, 9, 11]]}' > "$tmp/p.json"
"$bin" logits --model "$model" --prompts "$tmp/p.json" --out "$tmp/l.safetensors" || fail "logits"
[ -s "$tmp/l.safetensors" ] || fail "logits output empty"
"$bin" inspect --model "$model" --context 1024 --batch 2 | grep -q "format         exl2" || fail "inspect"

# bench through the scheduler: one row per level, with the gaps between tokens (p50, p99) after the TTFTs
"$bin" bench --model "$model" --concurrency 2 --prompt-len 40 --gen 6 --requests 8 --prefill-chunk 8 > "$tmp/conc" \
    || fail "bench --concurrency"
grep -q "itl p50 *itl p99" "$tmp/conc" || fail "bench --concurrency header: $(cat "$tmp/conc")"
grep -q "prompt tokens beside decode tokens: 8" "$tmp/conc" || fail "bench --concurrency setup: $(cat "$tmp/conc")"
awk '$1 == 2 && $2 == 8 && NF == 13 && $8 > 0 && $9 >= $8 {ok = 1} END {exit !ok}' "$tmp/conc" \
    || fail "bench --concurrency row: $(cat "$tmp/conc")"
"$bin" bench --model "$model" --concurrency 2 --prefill-chunk -1 2> /dev/null
[ $? -eq 2 ] || fail "bad --prefill-chunk"
# the KV cache's mode and share: bad values and both sizes at once are usage errors
"$bin" generate --model "$model" --ids 1,2 --kv-dtype q5 2> /dev/null; [ $? -eq 2 ] || fail "generate --kv-dtype q5"
"$bin" serve --model "$model" --kv-fraction 0 2> /dev/null; [ $? -eq 2 ] || fail "serve --kv-fraction 0"
"$bin" serve --model "$model" --kv-fraction 1.5 2> /dev/null; [ $? -eq 2 ] || fail "serve --kv-fraction 1.5"
"$bin" batch --model "$model" --input x --output y --kv-tokens 64 --kv-fraction 0.5 2> "$tmp/err"
[ $? -eq 2 ] && grep -q "not both" "$tmp/err" || fail "batch --kv-tokens with --kv-fraction"
# a share of memory the CPU backend does not report is refused, not ignored (with --gpu-memory it is a share of that)
printf '%s\n' '{"custom_id":"a","method":"POST","url":"/v1/completions","body":{"prompt":"hi","max_tokens":2}}' \
  > "$tmp/one.jsonl"
"$bin" batch --model "$model" --input "$tmp/one.jsonl" --output "$tmp/one.out" --kv-fraction 0.5 2> "$tmp/err"
[ $? -eq 1 ] && grep -q "does not report" "$tmp/err" || fail "batch --kv-fraction on the CPU: $(cat "$tmp/err")"
"$bin" batch --model "$model" --input "$tmp/one.jsonl" --output "$tmp/one.out" --kv-fraction 0.5 --gpu-memory 256MiB \
  --quiet || fail "batch --kv-fraction with --gpu-memory on the CPU"
"$bin" intake --model "$model" --listen ipc:///tmp/x --kv-dtype z 2> /dev/null
[ $? -eq 2 ] || fail "intake --kv-dtype z"
# the ranks' options take effect under mpirun (tests/parallel/test_mpi.sh runs them); one process refuses them
"$bin" bench --model "$model" --split layers 2> "$tmp/err"
[ $? -eq 2 ] || fail "bench --split in one process should exit 2"
grep -q "under mpirun" "$tmp/err" || fail "bench --split message: $(cat "$tmp/err")"

# usage errors exit 2, runtime errors 1, each with a message
"$bin" generate --model "$model" 2> "$tmp/err"; [ $? -eq 2 ] || fail "missing prompt should exit 2"
"$bin" generate --model "$model" --ids 1,x 2> "$tmp/err"; [ $? -eq 2 ] || fail "bad ids should exit 2"
"$bin" generate --model "$model" --ids 5000 2> "$tmp/err"; [ $? -eq 2 ] || fail "out-of-vocabulary id should exit 2"
"$bin" logits --model /nonexistent --prompts "$tmp/p.json" --out "$tmp/x" 2> "$tmp/err"
[ $? -eq 1 ] || fail "missing model should exit 1"
grep -q "/nonexistent" "$tmp/err" || fail "message does not name the directory"
echo '{"ids": [[0, 99999]]}' > "$tmp/bad.json"
"$bin" logits --model "$model" --prompts "$tmp/bad.json" --out "$tmp/x" 2> "$tmp/err"
[ $? -eq 1 ] || fail "bad token should exit 1"
mkdir "$tmp/broken" && cp "$model"/*.json "$tmp/broken/"
head -c 200000 "$model/output.safetensors" > "$tmp/broken/output.safetensors"
"$bin" generate --model "$tmp/broken" --ids 0,1 --max-tokens 1 2> "$tmp/err"; rc=$?
[ $rc -eq 1 ] || fail "truncated weights should exit 1 (got $rc)"
grep -q "output.safetensors" "$tmp/err" || fail "message does not name the file: $(cat "$tmp/err")"
"$bin" nosuchcommand 2> /dev/null; [ $? -eq 2 ] || fail "unknown command should exit 2"
echo "commands: ok"
