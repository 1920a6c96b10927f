# Sourced by tests/parallel/gpu-check.sh and scripts/device-final.sh on the lent GPU machine: unpacks
# .parpack (made by tests/parallel/gpu-pack.sh) once, points the loader, Open MPI, PMIx and hwloc at it, and
# decompresses the reference fixtures. Sets P (the pack), bin (tessera), ldiff (logits_diff), fx, mpi() and
# variant_bin().
# ---- the packed binaries and Open MPI ----
pk=/tmp/parbin
[ -f .parpack/parbin.tar.xz ] || {
  echo "gpu-check: no .parpack/parbin.tar.xz (run tests/parallel/gpu-pack.sh here, carry .parpack)"; exit 2
}
# unpacked again whenever the pack differs from the one unpacked (a machine still warm from an earlier call)
sum=$(md5sum < .parpack/parbin.tar.xz)
if [ ! -x "$pk/.parbin/bin/tessera" ] || [ "$(cat "$pk/.sum" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$pk" && mkdir -p "$pk" && xz -dc .parpack/parbin.tar.xz | tar -xf - -C "$pk" && echo "$sum" > "$pk/.sum"
fi
P=$pk/.parbin
bin=$P/bin/tessera
ldiff=$P/bin/logits_diff
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' \
  2>/dev/null || true)
export LD_LIBRARY_PATH=$P/lib:$P/ompi/lib/x86_64-linux-gnu/openmpi/lib${nccl_lib:+:$nccl_lib}:${LD_LIBRARY_PATH:-}
export OPAL_PREFIX=$P/ompi PATH=$P/ompi/bin:$PATH
export OMPI_MCA_mca_base_component_path=$P/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$P/ompi/pmix2/lib/pmix HWLOC_PLUGINS_PATH=$P/hwloc
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# the machine may carry its own PMIx plugins, for another PMIx version: do not let ours warn about them
export PMIX_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
# never NVLink multicast on these shared machines (tessera sets it too; kept here for every process)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -e /usr/lib/x86_64-linux-gnu/pmix2 ] ||
  { mkdir -p /usr/lib/x86_64-linux-gnu && ln -s "$P/ompi/pmix2" /usr/lib/x86_64-linux-gnu/pmix2; } 2>/dev/null
mpi() { local np=$1; shift; timeout "${TSR_RUN_TIMEOUT:-300}" mpirun --bind-to none -np "$np" "$bin" "$@"; }
# other builds to A/B against (the pack's alt/tessera-NAME, gpu-pack.sh's TSR_GPUPACK_ALT) as /tmp/tessera-NAME;
# variant_bin "ENV=V,BIN=NAME,..." prints the binary a variant runs: /tmp/tessera-NAME, else $bin
for f in "$P"/alt/tessera-*; do
  [ -f "$f" ] || continue
  cp "$f" "/tmp/$(basename "$f")" && chmod +x "/tmp/$(basename "$f")"
done
variant_bin() {
  case ",$1," in *,BIN=*) local b=${1#*BIN=}; echo "/tmp/tessera-${b%%,*}" ;; *) echo "$bin" ;; esac
}
# run_test_cuda OUT "name:ENV=V,... ...": test_cuda into OUT/test_cuda.log, then once more with the GEMV's per-block
# gather (TSR_CUDA_GEMV_PRESTAGE=0), once with the bulk GEMV for every group of 9-16 rows (TSR_CUDA_GEMV_FRAG_N=0),
# once with its activations through the copy ring from 9 rows and once staged at every row count (as the CTest
# entries test_cuda_ring and test_cuda_stage), the fused decode MLP in a grid of one block (test_cuda_mlp_grid) and
# left out, with the MLP's fold off, without activations staged ahead (aheadoff), with the mma.sync prefill attention
# (fwoff) and its K/V tiles of 32 positions (fa32), the wgmma one with tiles of 128 (fw128), the prefill product
# that dequantizes in registers (dqwgmma), the permutation pass for every prefill input (convertoff), one row's
# 4-bit units on integer tensor cores in EXL2 too (imma) and in neither (immaoff), planned for 99 KB of shared memory
# per block (smem99, as sm_86/sm_89 cards), the decode attention in at most 3 splits (splits3), the attention merge by
# thread for every split count (mergeold), the residual pass of decode rows in one block (rcoff), and once per variant
# under its settings (OUT/test_cuda-NAME.log), each with a summary line; the fixtures are this checkout's, unpacked
# into $fx. With TSR_TEST_UNTIL=S, variants not yet started when the script's $SECONDS reaches S are skipped (and
# said so)
run_test_cuda() {
  local out=$1 v name envs
  export TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models
  timeout 200 "$P/bin/test_cuda" > "$out/test_cuda.log" 2>&1
  echo "test_cuda exit $? (at $SECONDS s)"; grep -E "PASSED|FAILED|ERROR|mismatch|max " "$out/test_cuda.log" | head -30
  # paths no longer taken by default, then the caller's variants
  for v in gather:TSR_CUDA_GEMV_PRESTAGE=0 bulk:TSR_CUDA_GEMV_FRAG_N=0 \
    ring:TSR_CUDA_GEMV_FRAG_N=0,TSR_CUDA_GEMV_XRING_MIN=9 stage:TSR_CUDA_GEMV_XRING=0 \
    mlpgrid:TSR_CUDA_MLP_BLOCKS=1 mlpoff:TSR_CUDA_MLP_FUSE=0 foldoff:TSR_CUDA_MLP_FOLD=0 \
    aheadoff:TSR_CUDA_STAGE_AHEAD=0 fwoff:TSR_CUDA_FA_WGMMA=0 fa32:TSR_CUDA_FA_WGMMA=0,TSR_CUDA_FA_BKV=32 \
    fw128:TSR_CUDA_FW_BKV=128 dqwgmma:TSR_CUDA_DQ_WGMMA=1 convertoff:TSR_CUDA_CONVERT=0 \
    imma:TSR_CUDA_GEMV_IMMA=1 immaoff:TSR_CUDA_GEMV_IMMA=0 smem99:TSR_CUDA_SMEM_OPTIN=101376 \
    splits3:TSR_CUDA_ATTN_SPLITS=3 mergeold:TSR_CUDA_MERGE_ITEM=0 rcoff:TSR_CUDA_RESIDUAL_CLUSTER=0 \
    kvqexact:TSR_CUDA_ATTN_KVQ=0 flashoff:TSR_CUDA_FLASH=0 dwast4:TSR_CUDA_DW_AST=4 \
    dwpw1:TSR_CUDA_DQ_WGMMA=1,TSR_CUDA_DW_PWARPS=1 \
    dwpairs:TSR_CUDA_DQ_WGMMA=1,TSR_CUDA_DW_KPAIRS=2,TSR_CUDA_DW_RPAIRS=2 $2; do
    name=${v%%:*}; envs=${v#*:}
    if [ -n "${TSR_TEST_UNTIL:-}" ] && [ "$SECONDS" -ge "$TSR_TEST_UNTIL" ]; then
      echo "test_cuda ($name): not run (TSR_TEST_UNTIL=$TSR_TEST_UNTIL s reached)"; continue
    fi
    env ${envs//,/ } timeout 200 "$P/bin/test_cuda" > "$out/test_cuda-$name.log" 2>&1
    echo "test_cuda ($name: $envs) exit $? (at $SECONDS s)"
    grep -E "PASSED|FAILED|ERROR|mismatch" "$out/test_cuda-$name.log" | head -10
  done
}
fx=/tmp/tsr-fixtures
mkdir -p "$fx/reference"
python3 - "$fx" <<'PY'
import lzma, os, sys, glob
for f in glob.glob("tests/fixtures/reference/*.xz"):
    dst = os.path.join(sys.argv[1], "reference", os.path.basename(f)[:-3])
    if not os.path.exists(dst):
        with lzma.open(f) as a, open(dst, "wb") as b:
            b.write(a.read())
PY
# synth_8b DIR [BPW [ARGS...]]: the Llama-3-8B-geometry EXL2 model (tessera synth, BPW 4.0 unless given, ARGS added
# to its command) at DIR, made unless DIR/config.json is there already (a machine still warm from an earlier call)
synth_8b() {
  local dir=$1 bpw=${2:-4.0}
  shift; [ $# -gt 0 ] && shift
  [ -f "$dir/config.json" ] || "$bin" synth --arch llama --hidden 4096 --layers 32 --heads 32 --kv-heads 8 \
    --intermediate 14336 --vocab 128256 --bpw "$bpw" --shard-size 2048 --threads 16 "$@" --out "$dir" > /dev/null
}
# test_cuda_one NAME SECONDS [ENV=V ...]: test_cuda once under the settings given (at most SECONDS), its log to
# $OUT/t-NAME.log, then one summary line: its exit code, its failure lines counted, the script's $SECONDS so far;
# returns test_cuda's exit code
test_cuda_one() {
  local name=$1 limit=$2 rc
  shift 2
  env TSR_FIXTURES="$PWD/tests/fixtures" TSR_FIXTURES_BUILD="$fx" TSR_MODELS="$PWD/models" "$@" \
    timeout "$limit" "$P/bin/test_cuda" > "$OUT/t-$name.log" 2>&1
  rc=$?
  echo "test_cuda $name rc=$rc $(grep -cE '^\[  FAILED|ERROR' "$OUT/t-$name.log") failure lines (at $SECONDS s)"
  return $rc
}
# dq_times LOG ROWS: the least µs of each product at ROWS rows in a bench log taken with TSR_CUDA_DQ_TIMES=1, as
# "KxN µs" pairs on one line
dq_times() {
  grep "^dq path M $2," "$1" | sed -E 's/^dq path M [0-9]+, ([0-9x]+): .*least .*, (.*)\)/\1 \2/' | tr '\n' ' '
}
# dq_step MODEL ROWS NAME [ENV=V ...]: one decode step's products timed (TSR_CUDA_DQ_TIMES=1, a bench of ROWS rows,
# 32-token prompts, 8 tokens) under the settings given, its log to $OUT/f-NAME.log, then one summary line: "M ROWS
# NAME rc=..", and the least µs of each product (dq_times)
dq_step() {
  local model=$1 rows=$2 name=$3 rc
  shift 3
  env TSR_CUDA_DQ_TIMES=1 "$@" timeout 60 "$bin" bench --model "$model" --device cuda --batch "$rows" --prompt-len 32 \
    --gen 8 > "$OUT/f-$name.log" 2>&1
  rc=$?
  echo "M $rows $name rc=$rc $(dq_times "$OUT/f-$name.log" "$rows")"
}
# decode_ab MODEL ROWS NAME ROUND [ENV=V ...]: one round of an A/B under the settings given: decode at ROWS (a
# --batch list; 64-token prompts, 32 tokens) with its log to $OUT/ab-NAME-ROUND.log and one line of "rows:tok/s"
# pairs, then a 2048-token prefill in 512-token chunks (the bench's summary line)
decode_ab() {
  local model=$1 rows=$2 name=$3 round=$4 rc
  shift 4
  env "$@" timeout 120 "$bin" bench --model "$model" --device cuda --batch "$rows" --prompt-len 64 --gen 32 \
    > "$OUT/ab-$name-$round.log" 2>&1
  rc=$?
  echo "decode $name $round rc=$rc $(awk '$1 ~ /^[0-9]+$/ && $3 ~ /^[0-9.]+$/ {printf "%s:%s ", $1, $3}' \
    "$OUT/ab-$name-$round.log") (at $SECONDS s)"
  printf 'prefill %-8s %s ' "$name" "$round"
  env "$@" timeout 90 "$bin" bench --model "$model" --device cuda --batch 1 --prompt-len 2048 --gen 8 \
    --max-tokens 512 2>&1 | tail -1
}
