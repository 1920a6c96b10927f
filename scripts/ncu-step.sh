#!/usr/bin/env bash
# Every kernel of a batch-1 decode step under ncu, for the fixed costs per layer (kernels/cuda/NOTES.md, stop 19):
# an 8B-geometry EXL2 4.0 bpw model (tessera synth) through `tessera bench --batch 1 --prompt-len 64 --gen 4`, each
# launch's duration, DRAM bytes read, warp instructions and grid size, with the caches left as the previous kernel
# left them (--cache-control none: ncu's default flushes them before every kernel, which makes a kernel that reads
# its predecessor's output look several times slower than in a real step). Kernels still run one at a time, so PDL
# overlap is absent. The CSV goes to $OUT/ncu-step.csv.xz; here, `xz -dc ... > s.csv && python3
# scripts/ncu-step.py s.csv` prints the table of the last complete forward pass. Pack first with
# tests/parallel/gpu-pack.sh and carry `.parpack`.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/out}; mkdir -p "$out"
. tests/parallel/gpu-env.sh
cd "$root"
m=/tmp/llama8b-ncu-step
"$bin" synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256 \
  --bpw 4.0 --shard-size 4096 --threads 16 --out $m > /dev/null
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); NCU=${NCU:-ncu}
SECONDS=0
timeout 500 $NCU --clock-control none --cache-control none --csv --launch-count "${TSR_NCU_COUNT:-3200}" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,launch__grid_size \
  "$bin" bench --model $m --device cuda --batch 1 --prompt-len 64 --gen 4 > "$out/ncu-step.csv" 2> "$out/ncu-step.err"
echo "ncu exit $? after $SECONDS s"
python3 scripts/ncu-step.py "$out/ncu-step.csv" | head -30
xz -9 "$out/ncu-step.csv"
rm -rf $m
