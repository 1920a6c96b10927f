#!/usr/bin/env bash
# ncu on the decode GEMV of an 8B-geometry model (tessera synth; TSR_NCU_FORMAT=gptq for 4-bit GPTQ g128, else
# EXL2 4.0 bpw): launch-level throughput, occupancy and warp stall reasons of TSR_NCU_COUNT kernels of
# TSR_NCU_KERNEL after the first TSR_NCU_SKIP (TSR_NCU_CACHE=none keeps the caches warm between kernels). Pack
# with tests/parallel/gpu-pack.sh, carry .parpack; logs to $OUT.
# TSR_NCU_SOURCE=1 samples warp states per SASS instruction instead (kernels/cuda/NOTES.md, stop 20; with
# TSR_NCU_SKIP=134 TSR_NCU_COUNT=4 TSR_NCU_CACHE=none: the previous layer's down projection, then q/k/v, o and
# gate/up of a decode step's second layer) and exports ncu's source page as $OUT/source.csv.xz, tabulated by
# scripts/ncu-source.py (here: `xz -dc ... > s.csv && python3 scripts/ncu-source.py s.csv`).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. tests/parallel/gpu-env.sh
m=/tmp/llama8b-ncu
if [ "${TSR_NCU_FORMAT:-exl2}" = gptq ]; then
  "$bin" synth --format gptq --group-size 128 --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 \
    --intermediate 14336 --vocab 128256 --seed 1 --threads 16 --out $m > /dev/null
else
  "$bin" synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 \
    --bpw 4.0 --shard-size 2048 --threads 16 --out $m > /dev/null
fi
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); NCU=${NCU:-ncu}
if [ "${TSR_NCU_SOURCE:-0}" = 1 ]; then
  what=(--section WarpStateStats --section SourceCounters --import-source no -o "$out/source")
else
  what=(--section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats
        --section InstructionStats --print-details all)
fi
timeout 400 $NCU --clock-control none --cache-control "${TSR_NCU_CACHE:-all}" \
  --kernel-name "regex:${TSR_NCU_KERNEL:-frag_gemv}" --launch-skip "${TSR_NCU_SKIP:-4}" \
  --launch-count "${TSR_NCU_COUNT:-2}" "${what[@]}" \
  "$bin" bench --model $m --device cuda --batch 1 --prompt-len 64 --gen 4 > "$out/ncu.txt" 2>&1
echo "ncu exit $?"
if [ "${TSR_NCU_SOURCE:-0}" = 1 ]; then
  timeout 120 $NCU --import "$out/source.ncu-rep" --page source --csv --print-source sass > "$out/source.csv" \
    2> "$out/source.err"
  echo "source page exit $?"
  python3 scripts/ncu-source.py "$out/source.csv" | head -60
  xz -9 "$out/source.csv"
  rm -f "$out/source.ncu-rep"
else
  rows_re="^  [a-z_].*\(|Duration|DRAM Throughput|Compute \(SM\)|Issued Warp|Eligible Warps|Warp Cycles Per Issued"
  rows_re+="|Stall|stall|Executed Instructions  |Issued Instructions  "
  grep -E "$rows_re" "$out/ncu.txt" | head -90
fi
