#!/usr/bin/env bash
# Installs what is missing (scripts/install-deps.sh), then configures and builds tessera into build/.
# Usage: scripts/build.sh [extra cmake -D options...]
# Environment: TSR_BUILD_DIR (default build), TSR_JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
build_dir=${TSR_BUILD_DIR:-build}
jobs=${TSR_JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" > "$build_dir.configure.log" 2>&1 || {
  cat "$build_dir.configure.log" >&2
  exit 1
}
cmake --build "$build_dir" -j "$jobs"
