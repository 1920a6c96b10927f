#!/bin/bash
# Device call (stop 72) for the wgmma product's two consumer pairs at few rows. Stop 71 left the product at 65-128
# rows bound by its consumers (gate at 96 rows ~0.78 µs a stage; the wgmma's on raw words alone 31 of its ~49 µs);
# with at most 128 rows a block now runs two pairs of consumer warpgroups taking turns a stage (EXL2; 120 registers
# each, the pairs' sums added in the epilogue), TSR_CUDA_DW_KPAIRS=1 the one pair as before. In order:
# 1. test_cuda as built, and with the product at every row count (CTest test_cuda_dqwgmma's setting), with two pairs
#    and with one;
# 2. each product's least µs at 96 and 128 rows (dq_step), one pair and two;
# 3. decode at 65-128 rows (256 as a control: one pair there either way), interleaved over two rounds.
# About 2.5 min on a warm machine. Carry .parpack (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh here).
# Run it without a pipe into tail: a call cut off by its limit returns no output then.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
m8=/tmp/llama8b-4.0
synth_8b $m8 > /dev/null 2>&1
echo "synth done (at $SECONDS s)"
ok=1
test_cuda_one default 120 || ok=0
test_cuda_one all2 120 TSR_CUDA_DQ_WGMMA=1 || ok=0
test_cuda_one all1 120 TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_KPAIRS=1 || ok=0
[ $ok = 1 ] || { grep -E '^\[  FAILED|ERROR|FAIL' "$OUT"/t-*.log | head -20; exit 0; }
for rows in 96 128; do
  dq_step $m8 $rows "k1-$rows" TSR_CUDA_DW_KPAIRS=1
  dq_step $m8 $rows "k2-$rows"
done
for round in 1 2; do
  for v in kp1:TSR_CUDA_DW_KPAIRS=1 kp2:; do
    name=${v%%:*} envs=${v#*:}
    env ${envs} timeout 120 "$bin" bench --model $m8 --device cuda --batch 65,80,96,112,128,256 \
      --prompt-len 64 --gen 32 > "$OUT/ab-$name-$round.log" 2>&1
    echo "decode $name $round rc=$? $(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {printf "%s:%s ", $1, $3}' \
      "$OUT/ab-$name-$round.log") (at $SECONDS s)"
  done
done
echo "end (at $SECONDS s)"
