#!/bin/bash
# Device call for decode past 64 rows and the persistent step's open questions (stop 62; BENCHMARKS.md "stop 62").
# Stop 62's first call ran an earlier version: the persist probe's --trace, the per-matrix times of 128- and 256-row
# decode steps (TSR_CUDA_DQ_TIMES=1, which turns graph replay off since stop 62) and decode at 256-512 rows with the
# wgmma product against cuBLAS. This version (the second call): test_cuda by default and with the product taking
# every row count; decode at 96-256 rows with the product's 192-row tiles and PDL, without the 192-row tiles
# (TSR_CUDA_DW_ROWS=128) and with plain launches (TSR_CUDA_DW_PDL=0); the probe's --trace with its barrier variants
# and its table with --compute --idle-fence; the product's diagnostics at 256 rows. Where a trace build is packed
# beside (TSR_GPUPACK_ALT="trace=build-gpu-trace/tessera", built with -DTSR_CUDA_TRACE=ON; it did not fit a call's
# 64 MiB with the fixtures), also each kernel's share of a replayed 128- and 256-row step. Carry .parpack (made here
# by TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh). Logs under $OUT; summary.txt is printed at the end.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
s=$OUT/summary.txt
cat $OUT/gpu.txt >> $s
m8=/tmp/llama8b-4.0
synth_8b $m8 &
synth_pid=$!
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  PATH=/usr/local/cuda/bin:$PATH nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/persist scripts/persist-probe.cu \
    > $OUT/persist_build.log 2>&1
fi
wait $synth_pid
# the 192-row tiles and the product under PDL (stop 62): test_cuda by default and with the product taking every row
# count, then decode at 96-256 rows with both, without the 192-row tiles (TSR_CUDA_DW_ROWS=128: 256-row tiles past
# 128 rows) and without PDL for the product (TSR_CUDA_DW_PDL=0)
for v in "default:" "dw:TSR_CUDA_DQ_WGMMA=1"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models timeout 150 \
    $P/bin/test_cuda > $OUT/t-$name.log 2>&1
  echo "test_cuda $name ($envs) rc=$? $(grep -cE '^\[  FAILED|ERROR' $OUT/t-$name.log) failure lines" >> $s
done
for v in "new:" "r256:TSR_CUDA_DW_ROWS=128" "nopdl:TSR_CUDA_DW_PDL=0" "new2:"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 150 $bin bench --model $m8 --device cuda --batch 96,136,160,192,256 --prompt-len 32 --gen 64 \
    > $OUT/decode-$name.log 2>&1
  echo "decode $name ($envs) rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/decode-$name.log >> $s
done
if [ -x /tmp/persist ]; then
  timeout 90 /tmp/persist --trace > $OUT/persist_trace.log 2>&1; echo "persist trace rc=$?" >> $s
  timeout 120 /tmp/persist --compute --idle-fence > $OUT/persist_idle.log 2>&1; echo "persist idle-fence rc=$?" >> $s
fi
if [ -x /tmp/tessera-trace ]; then
  for b in 128 256; do
    TSR_CUDA_TRACE=2 timeout 150 /tmp/tessera-trace bench --model $m8 --device cuda --batch $b --prompt-len 32 \
      --gen 16 > $OUT/trace-$b.log 2>&1
    echo "trace $b rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/trace-$b.log >> $s
  done
fi
# what bounds the product at 256 rows: its diagnostics (gemm_dq_wgmma.cu dw_diag; wrong results, timing only), each
# matrix's device time through TSR_CUDA_DQ_TIMES (o, gate, up and down; q/k/v's grouped launch is not timed)
for d in none nodecode copy copyact copywords mma; do
  env TSR_CUDA_DQ_TIMES=1 TSR_CUDA_DW_DIAG=$d timeout 100 $bin bench --model $m8 --device cuda --batch 256 \
    --prompt-len 32 --gen 8 > $OUT/diag-$d.log 2>&1
  echo "diag $d rc=$?" >> $s; grep "^dq path M 256" $OUT/diag-$d.log >> $s
done
cat $s
