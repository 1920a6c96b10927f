#!/bin/sh
# tessera template end to end: renders the qwen3 fixture template (tools, generation prompt, extra variables),
# checks exit codes (0 ok, 1 runtime error with the template line on stderr, 2 usage) and --help.
set -u
BIN=${TSR_BIN:?run through ctest}
FX=${TSR_FIXTURES:?run through ctest}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

printf '[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi \\u00e9"}]' > "$T/conv.json"
"$BIN" template --tokenizer "$FX/tokenizers/qwen3" --messages "$T/conv.json" --add-generation-prompt > "$T/out" \
    || fail "render exited $?"
{ printf '<|im_start|>system\nBe brief.<|im_end|>\n'
  printf '<|im_start|>user\nHi \303\251<|im_end|>\n<|im_start|>assistant\n'; } > "$T/want"
cmp "$T/out" "$T/want" || fail "qwen3 render differs: $(od -c "$T/out" | head -5)"

printf '{"enable_thinking": false}' > "$T/vars.json"
printf '[{"type":"function","function":{"name":"f","parameters":{}}}]' > "$T/tools.json"
"$BIN" template --tokenizer "$FX/tokenizers/qwen3" --messages "$T/conv.json" --tools "$T/tools.json" \
    --vars "$T/vars.json" --add-generation-prompt > "$T/out2" || fail "tools render exited $?"
grep -q '{"type": "function", "function": {"name": "f", "parameters": {}}}' "$T/out2" || fail "tools json missing"
tail -c 30 "$T/out2" | grep -q '<think>' || fail "enable_thinking=false ignored"

# --template overrides; no trailing newline is added
printf '{%% for m in messages %%}[{{ m.role }}]{%% endfor %%}' > "$T/t.jinja"
"$BIN" template --template "$T/t.jinja" --messages "$T/conv.json" > "$T/out3" || fail "--template exited $?"
[ "$(cat "$T/out3")" = "[system][user]" ] && [ "$(wc -c < "$T/out3")" -eq 14 ] \
    || fail "--template output: $(cat "$T/out3")"

# runtime error -> 1 with the message and line
printf 'ok\n{{ raise_exception("no system role") }}' > "$T/bad.jinja"
"$BIN" template --template "$T/bad.jinja" --messages "$T/conv.json" > /dev/null 2> "$T/err"
rc=$?; [ $rc -eq 1 ] || fail "raise_exception exit $rc"
grep -q 'no system role' "$T/err" && grep -q 'template line 2' "$T/err" || fail "error message: $(cat "$T/err")"
printf '{%% include "x" %%}' > "$T/unsup.jinja"
"$BIN" template --template "$T/unsup.jinja" --messages "$T/conv.json" > /dev/null 2> "$T/err"
rc=$?; [ $rc -eq 1 ] || fail "unsupported exit $rc"
grep -q 'unsupported' "$T/err" || fail "unsupported message: $(cat "$T/err")"

# usage errors -> 2, --help -> 0
"$BIN" template --messages "$T/conv.json" > /dev/null 2>&1; rc=$?; [ $rc -eq 2 ] || fail "missing --tokenizer exit $rc"
"$BIN" template --bogus > /dev/null 2>&1; rc=$?; [ $rc -eq 2 ] || fail "unknown option exit $rc"
"$BIN" template --help > "$T/help" || fail "--help exit $?"
grep -q -- '--add-generation-prompt' "$T/help" || fail "--help text"
"$BIN" template --tokenizer "$T/nowhere" --messages "$T/conv.json" > /dev/null 2>&1; rc=$?
[ $rc -eq 1 ] || fail "missing tokenizer dir exit $rc"
echo "template CLI: ok"
