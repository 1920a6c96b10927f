#!/usr/bin/env bash
# Quantized KV caches on the lent GPU, one call (~2 min): test_cuda by default and under TSR_KVQ_TESTS' variants
# ("name:ENV=V,..."; default: the exact rotated-domain kernel TSR_CUDA_ATTN_KVQ=0, prefill batches through the decode
# kernel TSR_CUDA_FLASH=0, at most 3 splits), then the 8B 4.0 bpw synth through `tessera bench` under each of
# TSR_KVQ_BENCH's variants ("name:KV,ENV=V,BIN=NAME"; KV a --kv-dtype; default f16, Q4, Q8, Q6 and Q4 on the exact
# kernel) at 512 positions (batch 1 and 8) and of TSR_KVQ_LONG's at 8192 (batch 1 and 2), and the per-op device
# profile at batch 1 of each kv dtype in TSR_KVQ_PROFILE (default "f16 q4"); TSR_KVQ_CHUNKED's variants (none by
# default) prefill a 32K-token prompt in 512-token chunks at batch 1; TSR_KVQ_SERVE=1 runs `tessera batch` over a Q4
# cache with steps that mix long-context decode rows and prompt chunks. TSR_KVQ_TESTS=none skips the tests.
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
    case ",$envs," in
      *,BIN=*) b=${envs#*BIN=}; tc=$P/alt/test_cuda-${b%%,*}; envs=$(echo ",$envs" | sed -E 's/,BIN=[^,]*//; s/^,//') ;;
    esac
    env ${envs//,/ } X=1 timeout 150 "$tc" > "$out/test_cuda-$name.log" 2>&1
    echo "test_cuda $name exit $? at $SECONDS s"
    grep -E "PASSED|FAILED|ERROR|mismatch|differ" "$out/test_cuda-$name.log" | head -8
  done
  grep -E "rope_store" "$out/test_cuda-default.log" | head -30
fi
m=/tmp/l8; synth_8b $m 4.0 --max-pos 33280
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
# the serving path over a Q4 cache (TSR_KVQ_SERVE=1): `tessera batch` on the 8B synth with token-id prompts of 300
# to 1500 tokens, steps of 128 tokens with at most 16 prompt tokens beside decode rows, so that steps hold
# long-context decode rows followed by a prompt chunk (kernels/kv_copy_plan.c: the split); twice, and once more
# with TSR_CUDA_FLASH=0 (every batch through the decode kernel): every line answered, the first two identical
if [ "${TSR_KVQ_SERVE:-0}" = 1 ]; then
  # the serving path needs a tokenizer: Llama 3's (the synth's vocabulary), from the fixtures
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    tests/fixtures/tokenizers/llama3/tokenizer.json.xz "$m/tokenizer.json"
  cp tests/fixtures/tokenizers/llama3/tokenizer_config.json "$m/"
  python3 - > /tmp/kvq-batch.jsonl <<'PY'
import json
for i in range(24):
    ids = [(7 * i + 13 * k) % 120000 + 100 for k in range(300 + 53 * i)]
    print(json.dumps({"custom_id": "q%d" % i, "method": "POST", "url": "/v1/completions",
                      "body": {"prompt": ids, "max_tokens": 24 + i % 5, "temperature": 0}}))
PY
  for run in 1 2 flashoff; do
    env $([ $run = flashoff ] && echo TSR_CUDA_FLASH=0) X=1 timeout 200 "$bin" batch --model $m --device cuda \
      --kv-dtype q4 --step-tokens 128 --prefill-chunk 16 --input /tmp/kvq-batch.jsonl \
      --output "$out/kvq-batch-$run.jsonl" --quiet
    echo "batch q4 ($run) exit $? at $SECONDS s"
  done
  python3 - "$out" <<'PY'
import json, sys
def texts(run):
    rows = [json.loads(l) for l in open("%s/kvq-batch-%s.jsonl" % (sys.argv[1], run))]
    return {r["custom_id"]: (r["response"] or {}).get("body", {}).get("choices", [{}])[0].get("text") for r in rows}
a, b, c = texts("1"), texts("2"), texts("flashoff")
print("answered: %d / %d / %d of 24; runs 1 and 2 identical: %s; flash off differs on %d"
      % (sum(v is not None for v in a.values()), sum(v is not None for v in b.values()),
         sum(v is not None for v in c.values()), a == b, sum(a.get(k) != c.get(k) for k in a)))
PY
fi
for kv in ${TSR_KVQ_PROFILE:-f16 q4}; do
  echo "--- $kv profile b1 512"
  TSR_CUDA_PROFILE=2 timeout 100 "$bin" bench --model $m --device cuda --batch 1 --prompt-len 512 --gen 16 \
    --kv-dtype $kv > "$out/prof-$kv.txt" 2>&1
  grep -iE 'attention|rope|store|merge|total|sum' "$out/prof-$kv.txt" | head -12
done
echo "done at $SECONDS s"
