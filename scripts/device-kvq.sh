#!/usr/bin/env bash
# Quantized KV caches on the lent GPU, one call (~2 min): test_cuda by default, with the exact rotated-domain kernel
# (TSR_CUDA_ATTN_KVQ=0), with prefill batches through the decode kernel (TSR_CUDA_FLASH=0) and with few splits; then
# the 8B 4.0 bpw synth through `tessera bench` with f16, Q4, Q8, Q6 caches and Q4 on the exact kernel (512 positions
# at batch 1 and 8, 8192 positions at batch 1 and 2), and the per-op device profile of f16 and Q4 at batch 1.
# Pack first (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh) and carry `.parpack`; logs go to $OUT.
set -uo pipefail
. tests/parallel/gpu-env.sh
SECONDS=0
mkdir -p $OUT
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
for v in default:X=1 kvqexact:TSR_CUDA_ATTN_KVQ=0 flashoff:TSR_CUDA_FLASH=0 splits3:TSR_CUDA_ATTN_SPLITS=3; do
  name=${v%%:*}; envs=${v#*:}
  env ${envs//,/ } timeout 150 "$P/bin/test_cuda" > $OUT/test_cuda-$name.log 2>&1
  echo "test_cuda $name exit $? at $SECONDS s"
  grep -E "FAILED|ERROR|mismatch|relative error|differ" $OUT/test_cuda-$name.log | head -8
done
grep -E "rope_store" $OUT/test_cuda-default.log | head -30 > $OUT/rope-lines.txt
m=/tmp/l8; "$bin" synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 \
  --vocab 128256 --bpw 4.0 --max-pos 33280 --shard-size 2048 --threads 16 --out $m > /dev/null
echo "synth at $SECONDS s"
for v in f16:f16 q4:q4 q8:q8 q6:q6 q4exact:q4,TSR_CUDA_ATTN_KVQ=0 f16:f16 q4:q4; do
  name=${v%%:*}; e=${v#*:}; kv=${e%%,*}; envs=$(echo "$e" | sed -E 's/^[^,]*,?//')
  echo "--- $name 512 b1,8 (at $SECONDS s)"
  env $envs X=1 timeout 100 "$bin" bench --model $m --device cuda --batch 1,8 --prompt-len 512 --gen 32 --kv-dtype $kv 2>&1 | tail -2
done
for kv in f16 q4; do
  echo "--- $kv 8192 b1"
  timeout 120 "$bin" bench --model $m --device cuda --batch 1,2 --prompt-len 8192 --gen 16 --max-tokens 8192 --kv-dtype $kv 2>&1 | tail -2
done
for kv in f16 q4; do
  echo "--- $kv profile b1 512"
  TSR_CUDA_PROFILE=2 timeout 100 "$bin" bench --model $m --device cuda --batch 1 --prompt-len 512 --gen 16 --kv-dtype $kv > $OUT/prof-$kv.txt 2>&1
  grep -iE 'attention|rope|store|merge|total|sum' $OUT/prof-$kv.txt | head -12
done
echo "done at $SECONDS s"
