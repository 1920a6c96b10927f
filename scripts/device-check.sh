#!/usr/bin/env bash
# Runs on the lent GPU machine (see scripts/device-pack.sh; carry .devpack): the GPU test suite, then benchmarks of the bundled
# model and of synthetic models of realistic shape. Logs go to $OUT. Usage: scripts/device-check.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [ -f .devpack/devbin.tar.xz ] && [ ! -x .devbin/tessera ]; then tar -xJf .devpack/devbin.tar.xz; fi
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
fx=/tmp/tsr-fixtures
mkdir -p "$fx/reference"
python3 - "$fx" <<'PY'
import lzma, os, sys, glob
for f in glob.glob("tests/fixtures/reference/*.xz"):
    dst = os.path.join(sys.argv[1], "reference", os.path.basename(f)[:-3])
    if not os.path.exists(dst):
        with lzma.open(f) as a, open(dst, "wb") as b:
            b.write(a.read())
PY
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
bin=.devbin/tessera
if [ "$what" = tests ] || [ "$what" = all ]; then
  .devbin/test_cuda 2>&1 | tee "$out/test_cuda.log"
  echo "test_cuda exit: ${PIPESTATUS[0]}"
  $bin generate --model models/tiny-llama-exl2-4.0bpw --device cuda --prompt "Once upon a time" --max-tokens 40
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  $bin bench --model models/tiny-llama-exl2-4.0bpw --device cuda --batch 1,8,32 --prompt-len 512 --gen 128 \
    --json "$out/bench-tiny.json" 2>&1 | tee "$out/bench-tiny.txt"
  $bin synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 \
    --bpw 4.0 --out /tmp/llama8b-4.0 > /dev/null
  $bin bench --model /tmp/llama8b-4.0 --device cuda --batch 1,8,32 --prompt-len 512 --gen 128 \
    --json "$out/bench-8b.json" 2>&1 | tee "$out/bench-8b.txt"
  if [ -n "${TSR_DEVICE_PROFILE:-}" ]; then
    echo "--- per-op profile, 8B geometry, batch 1 decode (synchronized per op) ---"
    TSR_CUDA_PROFILE=1 $bin bench --model /tmp/llama8b-4.0 --device cuda --batch 1 --prompt-len 64 --gen 32 2>&1 | tail -12
  fi
  rm -rf /tmp/llama8b-4.0
fi
if [ "$what" = bench70 ] || [ "$what" = all ]; then
  $bin synth --arch llama --hidden 8192 --layers 80 --heads 64 --kv-heads 8 --intermediate 28672 --vocab 128256 \
    --bpw 4.0 --out /tmp/llama70b-4.0 > /dev/null
  timeout 300 $bin bench --model /tmp/llama70b-4.0 --device cuda --batch 1,8,32 --prompt-len 128 --gen 64 \
    --json "$out/bench-70b.json" 2>&1 | tee "$out/bench-70b.txt"
fi
