#!/usr/bin/env bash
# The second README command (and what CI runs): installs what is missing, builds with warnings as errors, and runs
# the whole CTest suite, then the CPU suite once more in a sanitizer build (ASan + UBSan + LSan). CUDA code, when
# a toolkit is present, is compiled for one architecture only (sm_90a) to keep the 2-core CI fast; release builds
# use the full list (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
export TSR_BUILD_DIR=${TSR_BUILD_DIR:-build}
# with nvcc on the PATH the CUDA code must build: TSR_CUDA=ON turns a failed CUDA check into an error, where the
# default (AUTO) would quietly build and test without kernels/cuda
cuda=()
if command -v nvcc > /dev/null 2>&1; then cuda=(-DTSR_CUDA=ON); fi
bash scripts/build.sh -DTSR_WERROR=ON -DTSR_CUDA_ARCHS=90a "${cuda[@]}"
(cd "$TSR_BUILD_DIR" && ctest --output-on-failure -j "${TSR_JOBS:-$(nproc)}" --timeout 900)

# Second stage: the sanitizer build (AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer; CPU only)
# runs the whole CPU suite again, the MPI tests included. The fuzz targets are skipped there: every build already
# runs them against a sanitized copy of the core. TSR_SANITIZE_STAGE=0 skips the stage (quick local runs).
if [ "${TSR_SANITIZE_STAGE:-1}" != 0 ]; then
  san=${TSR_SANITIZE_BUILD_DIR:-build-sanitize}
  TSR_BUILD_DIR=$san bash scripts/build.sh -DTSR_WERROR=ON -DTSR_SANITIZE=ON -DTSR_CUDA=OFF
  (cd "$san" && ctest --output-on-failure -j "${TSR_JOBS:-$(nproc)}" -LE "fuzz|gpu")
fi
