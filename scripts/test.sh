#!/usr/bin/env bash
# The second README command (and what CI runs): installs what is missing, builds with warnings as errors, and runs
# the whole CTest suite. CUDA code, when a toolkit is present, is compiled for one architecture only (sm_90) to
# keep the 2-core CI fast; release builds use the full list (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export TSR_BUILD_DIR=${TSR_BUILD_DIR:-build}
bash scripts/build.sh -DTSR_WERROR=ON -DTSR_CUDA_ARCHS=90
cd "$TSR_BUILD_DIR"
ctest --output-on-failure -j "${TSR_JOBS:-$(nproc)}" --timeout 900
