#!/usr/bin/env bash
# One device call for long-context decode work (kernels/cuda/attention_decode.cu and the merge in attention.cu):
# the GPU test suite, then the 8B-geometry EXL2 4.0 bpw model (tessera synth with room for 32K positions) through
# `tessera bench` at 512, 8K and 32K positions under each variant in TSR_LC_VARIANTS ("name:ENV=V,BIN=NAME ...",
# as scripts/device-gemv.sh reads them; default: the build's defaults). TSR_LC_LENGTHS picks the lengths (default
# "512 8192 32768"); a variant's LEN=8192 (last among its settings) runs that length only. TSR_LC_TESTS=0 skips the
# tests; TSR_LC_TEST_VARIANTS ("name:ENV=V,...") runs test_cuda again under each. Pack first with
# TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh and carry `.parpack`; logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
SECONDS=0
. tests/parallel/gpu-env.sh
[ "${TSR_LC_TESTS:-1}" = 1 ] && run_test_cuda "$out" "${TSR_LC_TEST_VARIANTS:-}"
m8=/tmp/llama8b-4.0-32k
synth_8b $m8 4.0 --max-pos 33280
echo "synth done at $SECONDS s"
# batches per length: a 32K batch of 4 holds 17 GB of K/V, of 8 the 8K one 8.6 GB
batches() { case $1 in 512) echo 1,8,32 ;; 8192) echo 1,2,8 ;; *) echo 1,4 ;; esac; }
for v in ${TSR_LC_VARIANTS:-default:}; do
  name=${v%%:*}; envs=${v#*:}
  b=$(variant_bin "$envs")
  lengths=${TSR_LC_LENGTHS:-512 8192 32768}
  case ",$envs," in *,LEN=*) lengths=${envs#*LEN=}; lengths=${lengths%%,*} ;; esac
  envs=$(echo ",$envs" | sed -E 's/,(LEN|BIN)=[^,]*//g; s/^,//')
  for len in $lengths; do
    echo "--- $name ($envs) at $len positions (at $SECONDS s)"
    max=$len; [ "$len" -lt 2048 ] && max=2048
    env ${envs//,/ } timeout 150 "$b" bench --model $m8 --device cuda --batch "$(batches "$len")" \
      --prompt-len "$len" --gen 32 --max-tokens "$max" 2>&1 | tee "$out/bench-$name-$len.txt" | tail -4
  done
done
echo "=== done after $SECONDS s"
