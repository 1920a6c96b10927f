#!/usr/bin/env bash
# Runs one libFuzzer target of a clang build (-DTSR_LIBFUZZER=ON) for a bounded time on a working copy of its seed
# corpus, so the repository's corpus is never written to. The working corpus, crash files and the log go under
# BUILD/fuzz-work/NAME/. A dictionary tests/fuzz/dict/NAME.dict, when there is one, is passed with -dict. Run one
# target at a time on a small machine (one process, one core).
#
# Usage: tests/fuzz/run_libfuzzer.sh BUILD NAME [SECONDS] [extra libFuzzer flags...]
#   NAME: safetensors config step tokenizer template openai batch_line intake
# Example: tests/fuzz/run_libfuzzer.sh build-fuzz config 300
set -euo pipefail
build=$(cd "$1" && pwd)
name=$2
seconds=${3:-300}
shift $(($# < 3 ? $# : 3))
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$build/tests/fuzz/fuzz_${name}_libfuzzer
seeds=$repo/tests/fuzz/corpus/$name
[ "$name" = openai ] && seeds=$repo/tests/serve/http/corpus
[ -x "$bin" ] || { echo "no $bin: build it with make -C $build fuzz_${name}_libfuzzer" >&2; exit 1; }
work=$build/fuzz-work/$name
mkdir -p "$work/corpus" "$work/artifacts"
cp -n "$seeds"/* "$work/corpus/" 2>/dev/null || true
dict=()
[ -f "$repo/tests/fuzz/dict/$name.dict" ] && dict=(-dict="$repo/tests/fuzz/dict/$name.dict")
export TSR_FIXTURES=$repo/tests/fixtures TSR_MODELS=$repo/models
cd "$work"
echo "== $name: $(date -u +%FT%TZ), $seconds s, $(ls corpus | wc -l) inputs in the working corpus" | tee log.txt
"$bin" corpus -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "${dict[@]}" "$@" 2>&1 | tee -a log.txt |
  grep -E "INITED|DONE|pulse|ERROR|SUMMARY|stat::" || true
echo "== $name: corpus now $(ls corpus | wc -l) files, $(du -sk corpus | cut -f1) KB;" \
  "artifacts: $(ls artifacts | wc -l)"
