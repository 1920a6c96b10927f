#!/usr/bin/env bash
# Quantized KV caches on the lent GPU, one call (~2 min): test_cuda by default and under TSR_KVQ_TESTS' variants
# ("name:ENV=V,..."; default: the exact rotated-domain kernel TSR_CUDA_ATTN_KVQ=0, prefill batches through the decode
# kernel TSR_CUDA_FLASH=0, at most 3 splits), then the 8B 4.0 bpw synth through `tessera bench` under each of
# TSR_KVQ_BENCH's variants ("name:KV,ENV=V,BIN=NAME"; KV a --kv-dtype; default f16, Q4, Q8, Q6 and Q4 on the exact
# kernel) at 512 positions (batch 1 and 8) and of TSR_KVQ_LONG's at 8192 (batch 1 and 2), and the per-op device
# profile at batch 1 of each kv dtype in TSR_KVQ_PROFILE (default "f16 q4"); TSR_KVQ_CHUNKED's variants (none by
# default) prefill a 32K-token prompt in 512-token chunks at batch 1. TSR_KVQ_TESTS=none skips the tests.
# A variant's BIN=NAME runs another build packed beside this one (tests/parallel/gpu-pack.sh TSR_GPUPACK_ALT; for
# test variants TSR_GPUPACK_ALT_TESTS).
# Pack first (TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh) and carry `.parpack`; logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
. tests/parallel/gpu-env.sh
SECONDS=0
out=${OUT:-/tmp/out}
mkdir -p "$out"
export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
tests=${TSR_KVQ_TESTS-kvqexact:TSR_CUDA_ATTN_KVQ=0 flashoff:TSR_CUDA_FLASH=0 splits3:TSR_CUDA_ATTN_SPLITS=3}
if [ "$tests" != none ]; then
  for v in default:X=1 $tests; do
    name=${v%%:*}; envs=${v#*:}; tc=$P/bin/test_cuda
    case ",$envs," in *,BIN=*) b=${envs#*BIN=}; tc=$P/alt/test_cuda-${b%%,*}; envs=$(echo ",$envs" | sed -E 's/,BIN=[^,]*//; s/^,//') ;; esac
    env ${envs//,/ } X=1 timeout 150 "$tc" > "$out/test_cuda-$name.log" 2>&1
    echo "test_cuda $name exit $? at $SECONDS s"
    grep -E "PASSED|FAILED|ERROR|mismatch|differ" "$out/test_cuda-$name.log" | head -8
  done
  grep -E "rope_store" "$out/test_cuda-default.log" | head -30
fi
m=/tmp/l8; "$bin" synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 --intermediate 14336 \
  --vocab 128256 --bpw 4.0 --max-pos 33280 --shard-size 2048 --threads 16 --out $m > /dev/null
echo "synth at $SECONDS s"
# bench_variant NAME:KV,ENV=V,BIN=NAME PROMPT BATCH GEN [STEP]: one `tessera bench` (STEP: --max-tokens, default
# the prompt up to 2048), its last rows
bench_variant() {
  local name=${1%%:*} e=${1#*:} kv envs b
  kv=${e%%,*}; envs=$(echo "$e" | sed -E 's/^[^,]*,?//')
  b=$(variant_bin "$envs"); envs=$(echo ",$envs" | sed -E 's/,BIN=[^,]*//; s/^,//')
  echo "--- $name ($e) prompt $2 batch $3 (at $SECONDS s)"
  env ${envs//,/ } X=1 timeout 150 "$b" bench --model $m --device cuda --batch "$3" --prompt-len "$2" --gen "$4" \
    --max-tokens "${5:-$(( $2 > 2048 ? $2 : 2048 ))}" --kv-dtype "$kv" 2>&1 | tail -2
}
for v in ${TSR_KVQ_BENCH:-f16:f16 q4:q4 q8:q8 q6:q6 q4exact:q4,TSR_CUDA_ATTN_KVQ=0}; do
  bench_variant "$v" 512 1,8 32
done
for v in ${TSR_KVQ_LONG:-f16:f16 q4:q4}; do bench_variant "$v" 8192 1,2 16; done
# a 32K-token prompt in 512-token chunks (the prefill copy's rule past 32 positions per row), batch 1
for v in ${TSR_KVQ_CHUNKED:-}; do bench_variant "$v" 32768 1 8 512; done
for kv in ${TSR_KVQ_PROFILE:-f16 q4}; do
  echo "--- $kv profile b1 512"
  TSR_CUDA_PROFILE=2 timeout 100 "$bin" bench --model $m --device cuda --batch 1 --prompt-len 512 --gen 16 \
    --kv-dtype $kv > "$out/prof-$kv.txt" 2>&1
  grep -iE 'attention|rope|store|merge|total|sum' "$out/prof-$kv.txt" | head -12
done
echo "done at $SECONDS s"
