#!/usr/bin/env bash
# ncu on the wgmma product (gemm_dq_wgmma.cu) in a decode step of ROWS rows (default 96) of the 8B 4.0 bpw shape:
# speed of light and memory workload (DRAM bytes and throughput, L2 hit rate and throughput) of TSR_NCU_COUNT
# (default 4: q/k/v, o, gate/up, down of one layer) launches after the first TSR_NCU_SKIP (default 40), caches
# flushed before each, for the full kernel and for the words' copies alone (TSR_CUDA_DW_DIAG=copywords). Each launch's
# grid, duration, DRAM and L2 throughput, L2 hit rate; the reports to $OUT. Pack with
# TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh, carry .parpack.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
. tests/parallel/gpu-env.sh > /dev/null
m=/tmp/llama8b-4.0
synth_8b $m > /dev/null 2>&1
rows=${ROWS:-96}
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); NCU=${NCU:-ncu}
for v in full copywords; do
  envs=(); [ $v = full ] || envs=(TSR_CUDA_DW_DIAG=$v)
  env "${envs[@]}" timeout 200 $NCU --clock-control none --cache-control all --kernel-name regex:dq_wgmma_kernel \
    --launch-skip "${TSR_NCU_SKIP:-40}" --launch-count "${TSR_NCU_COUNT:-4}" --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section LaunchStats --print-details all \
    "$bin" bench --model $m --device cuda --batch "$rows" --prompt-len 32 --gen 4 > "$out/ncu-$v.txt" 2>&1
  echo "ncu $v exit $?"
  rows_re="dq_wgmma_kernel|Duration|DRAM Throughput|^ *Memory Throughput|L2 Hit Rate|Grid Size|Mem Busy|Max Bandwidth"
  rows_re+="|L2 Cache Throughput"
  grep -E "$rows_re" "$out/ncu-$v.txt"
done
grep -iE "error|==PROF==|==WARNING==" "$out/ncu-full.txt" | head -5
