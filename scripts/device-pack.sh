#!/usr/bin/env bash
# Builds the CUDA binaries here for the lent GPU machine and packs them with the shared libraries that machine
# lacks into .devbin/ (ignored by git; name it in the device tool's `carry`). Portable code (no -march=native),
# sm_90 only. Run scripts/device-check.sh or scripts/device-perf.sh there afterwards.
# TSR_DEVPACK_SRC: source tree to build (default: this checkout); TSR_DEVPACK_BUILD: build folder (default
# build-dev), e.g. a snapshot of HEAD with kernels/cuda/ overlaid when other work in the checkout does not build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
src=${TSR_DEVPACK_SRC:-$root}
build=${TSR_DEVPACK_BUILD:-$root/build-dev}
cmake -S "$src" -B "$build" -DTSR_NATIVE=OFF -DTSR_CUDA=ON -DTSR_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release > "$build.configure.log"
cmake --build "$build" -j "$(nproc)" --target tessera test_cuda > "$build.log"
rm -rf .devbin && mkdir -p .devbin/lib
cp "$build/tessera" "$build/tests/gpu/test_cuda" .devbin/
strip .devbin/tessera .devbin/test_cuda
for lib in libjansson.so.4 libpcre2-8.so.0 libutf8proc.so.2 libcmocka.so.0; do
  cp -L "/lib/x86_64-linux-gnu/$lib" .devbin/lib/
done
grep -qx '/.devbin/' .git/info/exclude 2>/dev/null || echo '/.devbin/' >> .git/info/exclude
# the binaries travel compressed (the device tool carries 64 MiB in all): .devpack/devbin.tar.xz
rm -rf .devpack && mkdir -p .devpack
tar -cJf .devpack/devbin.tar.xz .devbin
grep -qx '/.devpack/' .git/info/exclude 2>/dev/null || echo '/.devpack/' >> .git/info/exclude
du -sh .devbin .devpack
