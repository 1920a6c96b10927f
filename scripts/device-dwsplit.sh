#!/bin/bash
# Device call for the wgmma product's K split and 128-row tiles (kernels/cuda/gemm_dq_wgmma.cu, stop 61), most
# needed first: test_cuda with the product on (its own splits); the 8B synth model's decode at 96-256 rows through
# the cuBLAS path and the product; test_cuda with 3 ranges per tile everywhere, then by default; then the product in
# 256-row tiles only and unsplit, the bulk GEMV against the product at 40 and 64 rows, the 2048-token prefill in
# chunks of 512 and whole, and the per-matrix times of a 256-row step (TSR_CUDA_DQ_TIMES). Carry .parpack (made here
# by TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh). Logs under $OUT; 0summary.txt has each step's result.
set -u
. tests/parallel/gpu-env.sh >/dev/null
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
s=$OUT/0summary.txt  # first by name: a call brings back 8 files, the first by name
tests() {
  for v in "$@"; do
    name=${v%%:*}; envs=${v#*:}
    env $envs timeout 150 $P/bin/test_cuda > $OUT/t-$name.log 2>&1
    echo "test_cuda $name ($envs) rc=$? $(grep -cE '^\[  FAILED|ERROR' $OUT/t-$name.log) failure lines" >> $s
  done
}
# decode NAME "ENV..." BATCHES
decode() {
  env $2 timeout 100 $bin bench --model $m8 --device cuda --batch $3 --prompt-len 32 --gen 64 > $OUT/decode-$1.log 2>&1
  echo "decode $1 ($2) rc=$?" >> $s; grep -E '^ +[0-9]+ ' $OUT/decode-$1.log >> $s
}
tests "dw:TSR_CUDA_DQ_WGMMA=1"
grep -q "rc=124" $s && { echo "test_cuda timed out: nothing timed" >> $s; exit 1; }
m8=/tmp/llama8b-4.0
synth_8b $m8
dw="TSR_CUDA_DQ_WGMMA_MAX_M=4096"
decode cublas TSR_CUDA_DQ_WGMMA=0 96,128,192,256
decode dw "$dw" 96,128,192,256
tests "split3:TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_SPLITS=3" "default:"
decode dw256 "$dw TSR_CUDA_DW_ROWS=256" 96,128
decode gemv "" 40,64
decode dwlow "TSR_CUDA_DQ_MIN_M=33 $dw" 40,64
for v in "cublas:TSR_CUDA_DQ_WGMMA=0" "dw:$dw"; do
  name=${v%%:*}; envs=${v#*:}
  for chunk in 512 2048; do
    env $envs timeout 60 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 2 \
      --max-tokens $chunk > $OUT/prefill-$name-$chunk.log 2>&1
    rc=$?; row=$(grep -E '^ +[0-9]+ ' $OUT/prefill-$name-$chunk.log | head -1)
    echo "prefill $name chunk $chunk rc=$rc: $row" >> $s
  done
done
decode dw1 "$dw TSR_CUDA_DW_SPLITS=1" 96,256
for v in "cublas:TSR_CUDA_DQ_WGMMA=0" "dw:$dw"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs TSR_CUDA_DQ_TIMES=1 timeout 60 $bin bench --model $m8 --device cuda --batch 256 --prompt-len 32 --gen 4 \
    > $OUT/times-$name.log 2>&1
done
