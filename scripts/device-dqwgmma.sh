#!/usr/bin/env bash
# One device call for the wgmma product that dequantizes in registers (kernels/cuda/gemm_dq_wgmma.cu): test_cuda with
# it on under each variant of TSR_DW_TESTS ("name:ENV=V,..."), then the 8B-geometry EXL2 4.0 bpw prefill of 2048
# tokens in one chunk (scripts/device-prefill.sh) under each variant of TSR_DW_VARIANTS and the cuBLAS path, the
# per-matrix times of each (TSR_CUDA_DQ_TIMES=1) and of each of TSR_DW_TIMES (variants timed only: the diagnostics,
# TSR_CUDA_DW_DIAG, whose results are wrong), and with TSR_DW_NCU="ENV=V,..." one launch of the kernel under ncu
# (warp states, scheduler, source counters; OUT/ncu-*.txt). A variant's BIN=NAME runs the pack's alt/tessera-NAME
# (gpu-pack.sh's TSR_GPUPACK_ALT) instead of the build's own. Pack first with TSR_GPUPACK_SLIM=1
# tests/parallel/gpu-pack.sh and carry `.parpack`. About a minute, two with ncu.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
. tests/parallel/gpu-env.sh > /dev/null
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
nvidia-smi -L
for v in ${TSR_DW_TESTS:-default:}; do
  name=${v%%:*}; envs=${v#*:}
  env TSR_CUDA_DQ_WGMMA=1 ${envs//,/ } timeout 100 "$P/bin/test_cuda" > "$out/test_cuda-$name.log" 2>&1
  echo "test_cuda ($name: $envs) exit $?"
  grep -E "FAILED|ERROR" "$out/test_cuda-$name.log" | head -6 # failures first: the lines below would hide them
  grep -E "M=300 \(GEMM\)|48 groups|input order|greedy" "$out/test_cuda-$name.log" | head -8
done
variants=${TSR_DW_VARIANTS:-default:}
pv="cublas:"
for v in $variants; do pv="$pv ${v%%:*}:TSR_CUDA_DQ_WGMMA=1,${v#*:}"; done
TSR_PREFILL_TESTS=0 TSR_PREFILL_PROFILE=0 TSR_PREFILL_VARIANTS="$pv" bash scripts/device-prefill.sh 2>&1 | tail -n +2
m8=/tmp/llama8b-4.0
for v in $variants ${TSR_DW_TIMES:-}; do
  envs=${v#*:}
  echo "--- per matrix, ${v%%:*} ($envs)"
  vb=$(variant_bin "$envs"); envs=$(echo ",$envs," | sed 's/,BIN=[^,]*,/,/; s/^,//; s/,$//')
  env TSR_CUDA_DQ_WGMMA=1 ${envs//,/ } TSR_CUDA_DQ_TIMES=1 timeout 60 "$vb" bench --model $m8 --device cuda --batch 1 \
    --prompt-len 2048 --gen 2 --max-tokens 2048 2>&1 | grep "dq path M 2048"
done
if [ -n "${TSR_DW_NCU:-}" ] && command -v ncu > /dev/null; then # the third launch: gate and up of layer 0
  env TSR_CUDA_DQ_WGMMA=1 ${TSR_DW_NCU//,/ } TSR_CUDA_PDL=0 timeout 200 ncu --clock-control none \
    -k regex:dq_wgmma_kernel -s 2 -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
    -o "$out/dw" "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 1 --max-tokens 2048 \
    > "$out/ncu-run.txt" 2>&1
  ncu -i "$out/dw.ncu-rep" --page details > "$out/ncu-details.txt" 2>&1
  grep -E "Duration|Grid Size|Block Size|Throughput|Registers Per|Stall|Warp Cycles Per|Issued Ipc|Eligible" \
    "$out/ncu-details.txt" | head -40
  ncu -i "$out/dw.ncu-rep" --page source --csv --print-source sass > "$out/ncu-sass.csv" 2>&1
  rm -f "$out/dw.ncu-rep"
  wc -l "$out/ncu-sass.csv"
fi
