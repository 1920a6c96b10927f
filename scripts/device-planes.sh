#!/bin/bash
# Device call (stop 71) for copies from several producer threads. Stop 71's probe found a block's bulk-copy rate grows
# with its issuing threads, lanes of one warp as much as warps (2 KB copies: 0.72, 1.30, 2.11, 2.97 TB/s from 1, 2,
# 4, 8 lanes), as if a thread's copies completed one after another; TSR_CUDA_DW_PWARPS=2 (the wgmma product's tiles
# and words from two warps, now the default) gained 3-6 % at 96-512 rows. Measured here, in order:
# 1. test_cuda with the new settings: the product's lanes taking turns a stage (TSR_CUDA_DW_PLANES), the bulk GEMV's
#    lanes taking turns a unit (TSR_CUDA_GEMV_PLANES, with one row on the bulk GEMV and XR from 9 rows);
# 2. the product's least µs a matrix at 96 rows under each;
# 3. decode at 1-64 rows (the bulk GEMV) and 65-512 (the product), and a 2048-token prefill in chunks of 512, then
#    the defaults once more for the call's spread.
# About 3-4 min on a warm machine. Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here).
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
echo "synth done (at $SECONDS s)"
dw=1 gv=1
test_cuda_one default 120 # two producer warps in the product are now the default
test_cuda_one dwplanes 120 TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_PWARPS=2 TSR_CUDA_DW_PLANES=4 || dw=0
test_cuda_one gemvplanes 120 TSR_CUDA_GEMV_PLANES=4 TSR_CUDA_GEMV_BULK_MIN=1 TSR_CUDA_GEMV_XRING_MIN=9 || gv=0
grep -hE '^\[  FAILED|ERROR|FAIL' "$OUT"/t-*.log | head -20
dq_step $m8 96 d96 TSR_CUDA_DW_PWARPS=2
if [ $dw = 1 ]; then
  dq_step $m8 96 pl4-96 TSR_CUDA_DW_PWARPS=2 TSR_CUDA_DW_PLANES=4
fi
bench() { # NAME ROWS ENVS (comma list): one decode line
  env ${3//,/ } timeout 120 "$bin" bench --model $m8 --device cuda --batch "$2" --prompt-len 64 --gen 32 \
    > "$OUT/ab-$1.log" 2>&1
  echo "decode $1 rc=$? $(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {printf "%s:%s ", $1, $3}' "$OUT/ab-$1.log")" \
    "(at $SECONDS s)"
}
few="default:"
[ $gv = 1 ] && few="$few gpl4:TSR_CUDA_GEMV_PLANES=4 b1pl4:TSR_CUDA_GEMV_PLANES=4,TSR_CUDA_GEMV_BULK_MIN=1"
many="pw1:TSR_CUDA_DW_PWARPS=1 pw2:TSR_CUDA_DW_PWARPS=2"
[ $dw = 1 ] && many="$many pl4:TSR_CUDA_DW_PWARPS=2,TSR_CUDA_DW_PLANES=4"
# one round and the defaults again (device time was short at stop 71): TSR_PLANES_ROUNDS=2 for two
for round in $(seq "${TSR_PLANES_ROUNDS:-1}"); do
  for v in $few; do bench "${v%%:*}-$round" 1,2,4,8,16,32,64 "${v#*:}"; done
  for v in $many; do
    bench "${v%%:*}-$round" 65,96,128,256,512 "${v#*:}"
    printf 'prefill %-8s %s ' "${v%%:*}" "$round"
    envs=${v#*:}
    env ${envs//,/ } timeout 90 "$bin" bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 8 \
      --max-tokens 512 2>&1 | tail -1
  done
done
bench default-again 1,2,4,8,16,32,64 ""
bench pw2-again 65,96,128,256,512 TSR_CUDA_DW_PWARPS=2
echo "end (at $SECONDS s)"
