#!/usr/bin/env bash
# One device call for prefill work: test_cuda, then the 8B-geometry EXL2 4.0 bpw model (tessera synth) through a
# 2048-token prefill in one chunk (`--max-tokens 2048`; TSR_PREFILL_CHUNK=512: in 512-token chunks, as `tessera serve`
# and `generate` run it by default) under each variant of TSR_PREFILL_VARIANTS ("name:ENV=V,..."
# with BIN=NAME for another build, as in scripts/device-gemv.sh), TSR_PREFILL_RUNS times each (default 2), then the
# per-op device profile of that prefill (TSR_CUDA_PROFILE=2; the first forward left out) and the dequantize path's
# parts (TSR_CUDA_DQ_TIMES=1) with this build (under TSR_PREFILL_PROFILE_ENV="ENV=V,..." when set). Pack first with
# TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh (TSR_GPUPACK_ALT for other builds) and carry `.parpack`; logs go to
# $OUT. About two minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
SECONDS=0
. tests/parallel/gpu-env.sh
[ "${TSR_PREFILL_TESTS:-1}" = 1 ] && run_test_cuda "$out" "${TSR_PREFILL_TEST_VARIANTS:-}"
m8=/tmp/llama8b-4.0
synth_8b $m8
echo "synth done at $SECONDS s"
chunk=${TSR_PREFILL_CHUNK:-2048}
echo "batch prefill tok/s decode tok/s   ms/step (2048-token prompt, chunks of $chunk)"
for v in ${TSR_PREFILL_VARIANTS:-default:}; do
  name=${v%%:*}; envs=${v#*:}
  b=$(variant_bin "$envs")
  for i in $(seq "${TSR_PREFILL_RUNS:-2}"); do
    printf '%-12s ' "$name"
    env ${envs//,/ } timeout 90 "$b" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 8 \
      --max-tokens "$chunk" 2>&1 | tail -1
  done
done
penv=${TSR_PREFILL_PROFILE_ENV:-} # "ENV=V,...": settings for the profile and ncu runs
if [ "${TSR_PREFILL_PROFILE:-1}" = 1 ]; then
  env ${penv//,/ } TSR_CUDA_PROFILE=2 timeout 120 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 \
    --gen 2 --max-tokens 2048 > "$out/profile-prefill.txt" 2>&1
  grep -A20 "prefill (M" "$out/profile-prefill.txt"
  env ${penv//,/ } TSR_CUDA_DQ_TIMES=1 timeout 120 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 \
    --gen 2 --max-tokens 2048 > "$out/dq-times.txt" 2>&1
  grep "dq path M 2048" "$out/dq-times.txt"
fi
if [ "${TSR_PREFILL_NCU:-0}" = 1 ] && command -v ncu > /dev/null; then # one prefill attention launch under ncu
  env ${penv//,/ } TSR_CUDA_PDL=0 timeout 150 ncu --clock-control none -k regex:fa_prefill_kernel -s 10 -c 1 \
    --section SpeedOfLight \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis "$bin" bench --model $m8 --device cuda \
    --batch 1 --prompt-len 2048 --gen 1 --max-tokens 2048 > "$out/ncu-attention.txt" 2>&1
  grep -E "Duration|Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per|Issued Ipc|Eligible|Bank" \
    "$out/ncu-attention.txt" | head -40
fi
for v in ${TSR_PREFILL_DECODE:-}; do # "name:ENV=V,...": decode at batch 1..64 (512-token prompts)
  name=${v%%:*}; envs=${v#*:}
  b=$(variant_bin "$envs")
  echo "--- decode, $name ($envs)"
  env ${envs//,/ } timeout 120 "$b" bench --model $m8 --device cuda --batch 1,8,32,64 --prompt-len 512 --gen 64 \
    2>&1 | tail -4
done
if [ -n "${TSR_PREFILL_70B:-}" ]; then # "name:ENV=V,...": the 2048-token prefill of the 70B geometry at 4.0 bpw
  rm -rf $m8
  m70=/tmp/llama70b-4.0
  "$bin" synth --arch llama --hidden 8192 --layers 80 --heads 64 --kv-heads 8 --intermediate 28672 --vocab 128256 \
    --bpw 4.0 --shard-size 4096 --threads 16 --out $m70 > /dev/null
  for v in $TSR_PREFILL_70B; do
    name=${v%%:*}; envs=${v#*:}
    b=$(variant_bin "$envs")
    printf '70B %-8s ' "$name"
    env ${envs//,/ } timeout 150 "$b" bench --model $m70 --device cuda --batch 1 --prompt-len 2048 --gen 4 \
      --max-tokens 2048 2>&1 | tail -1
    if [ -n "${TSR_PREFILL_70B_BATCH:-}" ]; then # decode too, as scripts/device-matrix.sh runs it
      env ${envs//,/ } timeout 200 "$b" bench --model $m70 --device cuda --batch "$TSR_PREFILL_70B_BATCH" \
        --prompt-len 128 --gen 64 2>&1 | tail -n "$(echo "$TSR_PREFILL_70B_BATCH" | tr ',' '\n' | wc -l)"
    fi
  done
fi
echo "=== done after $SECONDS s"
