#!/usr/bin/env bash
# One device call for the dequantize path's slab width (matmul.cu exl2_dq_gemm, TSR_CUDA_DQ_SLAB_COLS): test_cuda
# (TSR_SLAB_TESTS=0 skips it), then the 8B-geometry EXL2 4.0 bpw model (tessera synth) through a 2048-token prefill
# in chunks of each size of TSR_SLAB_CHUNKS and through decode at the batches of TSR_SLAB_BATCH, under each slab width
# of TSR_SLAB_COLS ("0": the whole matrix in one slab, main's default), alternating, TSR_SLAB_RUNS times each
# (default 2). Stop 59 ran it (kernels/cuda/NOTES.md): narrow slabs lose at every row count. The question: whether
# slabs small enough to stay in L2 save the fp16 weights' round trip to DRAM
# at the row counts where the dequantize pass is a large part of the product. Pack first with TSR_GPUPACK_SLIM=1
# tests/parallel/gpu-pack.sh and carry `.parpack`; logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
SECONDS=0
. tests/parallel/gpu-env.sh
[ "${TSR_SLAB_TESTS:-1}" = 1 ] && run_test_cuda "$out" "${TSR_SLAB_TEST_VARIANTS:-}"
m8=/tmp/llama8b-4.0
synth_8b $m8
echo "synth done at $SECONDS s"
for c in ${TSR_SLAB_CHUNKS:-512 2048}; do
  echo "--- prefill of 2048 tokens in chunks of $c: batch prefill tok/s decode tok/s ms/step"
  for i in $(seq "${TSR_SLAB_RUNS:-2}"); do
    for w in ${TSR_SLAB_COLS:-0 1024 2048}; do
      printf 'cols %-6s ' "$w"
      TSR_CUDA_DQ_SLAB_COLS=$w timeout 90 "$bin" bench --model $m8 \
        --device cuda --batch 1 --prompt-len 2048 --gen 8 --max-tokens "$c" 2>&1 | tail -1
    done
  done
done
if [ -n "${TSR_SLAB_BATCH:-}" ]; then
  echo "--- decode at batch $TSR_SLAB_BATCH (256-token prompts)"
  for w in ${TSR_SLAB_COLS:-0 1024 2048}; do
    echo "cols $w"
    TSR_CUDA_DQ_SLAB_COLS=$w timeout 150 "$bin" bench --model $m8 \
      --device cuda --batch "$TSR_SLAB_BATCH" --prompt-len 256 --gen 32 2>&1 \
      | tail -n "$(echo "$TSR_SLAB_BATCH" | tr ',' '\n' | wc -l)"
  done
fi
for w in ${TSR_SLAB_TIMES:-}; do # the dequantize path's parts at 512-row chunks (the first slab's pass, then the rest)
  TSR_CUDA_DQ_SLAB_COLS=$w TSR_CUDA_DQ_TIMES=1 timeout 120 "$bin" bench --model $m8 --device cuda --batch 1 \
    --prompt-len 2048 --gen 2 --max-tokens 512 > "$out/dq-times-$w.txt" 2>&1
  echo "cols $w:"; grep "dq path M 512" "$out/dq-times-$w.txt"
done
echo "=== done after $SECONDS s"
