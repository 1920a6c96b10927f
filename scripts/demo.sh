#!/usr/bin/env bash
# The first README command: installs what is missing, builds, and runs the bundled model on a prompt.
# Usage: scripts/demo.sh ["prompt text"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh > build.log 2>&1 || { tail -n 50 build.log >&2; exit 1; }
prompt=${1:-Once upon a time}
exec build/tessera generate --model models/tiny-llama-exl2-4.0bpw --prompt "$prompt" --max-tokens 64
