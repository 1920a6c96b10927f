#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .devpack, made by scripts/device-pack.sh): the GPU tests, then decode
# benchmarks and per-op device profiles of the 8B-geometry synthetic model for several kernel variants selected
# by environment variables, all in one call. Logs go to $OUT (tests.log, bench.log, profile.log).
# Usage: scripts/device-perf.sh [tests] [bench] [profile] [ncu] [full]   (default: tests bench profile)
#   full: the BENCHMARKS.md command (batch 1,8,32, prompt 512, gen 128) with the default variant.
# Variants: TSR_CUDA_GROUP=0 (q/k/v and gate/up as separate GEMV launches), TSR_CUDA_GEMV_BLOCKS=N (the decode
# GEMV's block target), TSR_CUDA_PDL=0 (no programmatic dependent launch),
# TSR_CUDA_PINNED=0 (pageable copies). TSR_PERF_VARIANTS overrides the list of "name:ENV=V,ENV=V" items.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${*:-tests bench profile}
out=${OUT:-/tmp/out}
mkdir -p "$out"
if [ -f .devpack/devbin.tar.xz ] && [ ! -x .devbin/tessera ]; then tar -xJf .devpack/devbin.tar.xz; fi
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
bin=.devbin/tessera
has() { case " $what " in *" $1 "*) return 0 ;; esac; return 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
if has tests; then
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
  for v in "default:" "nopdl:TSR_CUDA_PDL=0"; do
    name=${v%%:*}; envs=${v#*:}
    echo "=== test_cuda ($name) ===" | tee -a "$out/tests.log"
    env ${envs//,/ } .devbin/test_cuda >> "$out/tests.log" 2>&1
    echo "test_cuda ($name) exit: $?" | tee -a "$out/tests.log"
  done
  grep -E "rel err|FAILED|PASSED|OK \]" "$out/tests.log" | grep -E "FAILED|EXL2|PASSED" | tail -40
fi
if has bench || has profile || has full || has ncu; then
  t0=$(date +%s)
  $bin synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 \
    --bpw 4.0 --out /tmp/llama8b-4.0 > "$out/synth.txt" 2>&1
  echo "synth: $(( $(date +%s) - t0 )) s: $(tail -1 "$out/synth.txt")"
fi
variants=${TSR_PERF_VARIANTS:-"group0:TSR_CUDA_GROUP=0 nopdl:TSR_CUDA_PDL=0 auto:"}
profiles=${TSR_PERF_PROFILES:-"auto:"}
if has bench; then
  for v in $variants; do
    name=${v%%:*}; envs=${v#*:}
    for b in 1 8; do
      echo "=== bench $name ($envs) batch $b ===" >> "$out/bench.log"
      env ${envs//,/ } TSR_CUDA_STEPTIME=1 timeout 120 $bin bench --model /tmp/llama8b-4.0 --device cuda --batch $b \
        --prompt-len 512 --gen 64 >> "$out/bench.log" 2>&1
      echo "--- $name b$b: $(grep -E '^ *[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ ' "$out/bench.log" | tail -1 | tr -s ' ')" \
        "| $(grep 'graph replays' "$out/bench.log" | tail -1)"
    done
  done
fi
if has profile; then
  for v in $profiles; do
    name=${v%%:*}; envs=${v#*:}
    for b in 1 8; do
      echo "=== profile $name batch $b ===" >> "$out/profile.log"
      env ${envs//,/ } TSR_CUDA_PROFILE=2 timeout 120 $bin bench --model /tmp/llama8b-4.0 --device cuda --batch $b \
        --prompt-len 512 --gen 8 >> "$out/profile.log" 2>&1
    done
  done
fi
if has ncu && command -v ncu > /dev/null; then
  # hardware counters of one decode GEMV (layer 0's gate projection, M = 1, first forward: eager, no graph)
  echo "=== ncu: tg_kernel, layer 0 gate, M=1 ===" > "$out/ncu.txt"
  TSR_CUDA_PDL=0 timeout 150 ncu --clock-control none -k regex:tg_kernel -s 4 -c 1 --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    $bin bench --model /tmp/llama8b-4.0 --device cuda --batch 1 --prompt-len 4 --gen 1 >> "$out/ncu.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued" "$out/ncu.txt" | head -20
fi
if has full; then
  echo "=== full: tessera bench --model /tmp/llama8b-4.0 --device cuda --batch 1,8,32 --prompt-len 512 --gen 128 ==="
  TSR_CUDA_STEPTIME=1 timeout 300 $bin bench --model /tmp/llama8b-4.0 --device cuda --batch 1,8,32 --prompt-len 512 \
    --gen 128 --json "$out/bench-8b.json" 2>&1 | tee "$out/bench-full.txt"
fi
rm -rf /tmp/llama8b-4.0
