#!/usr/bin/env bash
# ncu's per-instruction warp sampling of the decode GEMV (kernels/cuda/NOTES.md, stop 20): an 8B-geometry EXL2 4.0 bpw
# model (tessera synth) through `tessera bench --batch 1 --prompt-len 64 --gen 4`, TSR_NCU_COUNT launches of
# TSR_NCU_KERNEL (default: frag_gemv, 4 launches) after the first TSR_NCU_SKIP (default 134: with this model, the
# previous layer's down projection, then q/k/v, o and gate/up of a decode step's second layer), with the caches left
# warm between kernels, exported as ncu's source page in CSV ($OUT/source.csv.xz). Here: `xz -dc ... > s.csv &&
# python3 scripts/ncu-source.py s.csv` prints each launch's stall reasons and its most-sampled instruction windows.
# Pack first with tests/parallel/gpu-pack.sh and carry `.parpack`.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/out}; mkdir -p "$out"
. tests/parallel/gpu-env.sh
cd "$root"
m=/tmp/llama8b-ncu-source
"$bin" synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 \
  --bpw 4.0 --shard-size 4096 --threads 16 --out $m > /dev/null
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); NCU=${NCU:-ncu}
timeout 300 $NCU --clock-control none --cache-control none --kernel-name "regex:${TSR_NCU_KERNEL:-frag_gemv}" \
  --launch-skip "${TSR_NCU_SKIP:-134}" --launch-count "${TSR_NCU_COUNT:-4}" \
  --section WarpStateStats --section SourceCounters --import-source no -o "$out/source" \
  "$bin" bench --model $m --device cuda --batch 1 --prompt-len 64 --gen 4 > "$out/source.log" 2>&1
echo "ncu exit $?"
timeout 120 $NCU --import "$out/source.ncu-rep" --page source --csv --print-source sass > "$out/source.csv" \
  2> "$out/source.err"
echo "source page exit $?"
python3 scripts/ncu-source.py "$out/source.csv" | head -60
xz -9 "$out/source.csv"
rm -f "$out/source.ncu-rep"
rm -rf $m
