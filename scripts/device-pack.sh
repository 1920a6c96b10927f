#!/usr/bin/env bash
# Builds the CUDA binaries here for the lent GPU machine and packs them with the shared libraries that machine
# lacks into .devbin/ (ignored by git; name it in the device tool's `carry`). Portable code (no -march=native),
# sm_90 only. Run scripts/device-check.sh there afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-dev -DTSR_NATIVE=OFF -DTSR_CUDA=ON -DTSR_CUDA_ARCHS=90 -DCMAKE_BUILD_TYPE=Release > build-dev.configure.log
cmake --build build-dev -j "$(nproc)" --target tessera test_cuda > build-dev.log
rm -rf .devbin && mkdir -p .devbin/lib
cp build-dev/tessera build-dev/tests/gpu/test_cuda .devbin/
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
