#!/bin/bash
# Device call for the wgmma product's K split (kernels/cuda/gemm_dq_wgmma.cu, stop 61): test_cuda by default, with
# the product on (its own splits) and with 3 ranges per tile everywhere; then the 8B synth model's decode at 96-256
# rows and its 2048-token prefill in chunks of 512 and whole, through the cuBLAS path, the product with its splits,
# the product unsplit and the product in tiles of 256 rows only (decode), the bulk GEMV against the product at 40
# and 64 rows, and the per-matrix times of a 256-row step (TSR_CUDA_DQ_TIMES). Carry .parpack (made
# here by TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh). Logs under $OUT; summary.txt has each step's result.
set -u
. tests/parallel/gpu-env.sh >/dev/null
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
s=$OUT/summary.txt
tests() {
  for v in "$@"; do
    name=${v%%:*}; envs=${v#*:}
    env $envs timeout 150 $P/bin/test_cuda > $OUT/t-$name.log 2>&1
    echo "test_cuda $name ($envs) rc=$? $(grep -cE '^\[  FAILED|ERROR' $OUT/t-$name.log) failure lines" >> $s
  done
}
tests "dw:TSR_CUDA_DQ_WGMMA=1"
grep -q "rc=124" $s && { echo "test_cuda timed out: nothing timed" >> $s; exit 1; }
m8=/tmp/llama8b-4.0
synth_8b $m8
variants=("cublas:TSR_CUDA_DQ_WGMMA=0" "dw:TSR_CUDA_DQ_WGMMA_MAX_M=4096"
  "dw1:TSR_CUDA_DQ_WGMMA_MAX_M=4096 TSR_CUDA_DW_SPLITS=1"
  "dw256:TSR_CUDA_DQ_WGMMA_MAX_M=4096 TSR_CUDA_DW_ROWS=256")
for v in "${variants[@]}"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 120 $bin bench --model $m8 --device cuda --batch 96,128,192,256 --prompt-len 32 --gen 64 \
    > $OUT/decode-$name.log 2>&1
  echo "decode $name rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/decode-$name.log >> $s
done
# 33-64 rows: the bulk GEMV (default) against the product
for v in "gemv:" "dwlow:TSR_CUDA_DQ_MIN_M=33 TSR_CUDA_DQ_WGMMA_MAX_M=4096"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 100 $bin bench --model $m8 --device cuda --batch 40,64 --prompt-len 32 --gen 64 \
    > $OUT/decode-$name.log 2>&1
  echo "decode $name rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/decode-$name.log >> $s
done
tests "split3:TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_SPLITS=3"
for rep in 1 2; do
  for v in "${variants[@]:0:2}"; do
    name=${v%%:*}; envs=${v#*:}
    for chunk in 512 2048; do
      env $envs timeout 60 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 2 \
        --max-tokens $chunk > $OUT/prefill-$name-$chunk-$rep.log 2>&1
      rc=$?; row=$(grep -E '^ +[0-9]+ ' $OUT/prefill-$name-$chunk-$rep.log | head -1)
      echo "prefill $name chunk $chunk rc=$rc: $row" >> $s
    done
  done
done
for v in "${variants[@]:0:2}"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs TSR_CUDA_DQ_TIMES=1 timeout 60 $bin bench --model $m8 --device cuda --batch 256 --prompt-len 32 --gen 4 \
    > $OUT/times-$name.log 2>&1
done
tests "default:"
