#!/bin/bash
# Device call for decode past 64 rows and the persistent step's open questions (stops 62-64; BENCHMARKS.md "stop 62"
# to "stop 64"). This version (written at stop 64, not yet run): test_cuda by default (the product's sums stored
# through shared memory, its tiles by 32 rows); decode at 80-256 rows by default and with the direct stores
# (TSR_CUDA_DW_EPI=0), twice each, and with stop 62's tiles (TSR_CUDA_DW_ROWS=64);
# batch 1/8/64 and the 2048-token prefill; per-matrix times at 256 rows (and without stores) and 128; test_cuda with
# the direct stores and split 3 ways; ncu's stall reasons of the product at 256 rows; the persist probe's --trace
# (its releasing barrier last) and its table with --compute --release.
# Carry .parpack (made here by TSR_GPUPACK_SLIM=1 tests/parallel/gpu-pack.sh). Logs under $OUT; 0summary.txt is
# printed line by line as it is made; where the product's warps stall at 256 rows (ncu) comes before the probe.
set -u
. tests/parallel/gpu-env.sh >/dev/null
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt
s=$OUT/0summary.txt  # first by name: a call brings back 8 files, the first by name
cat $OUT/gpu.txt >> $s
m8=/tmp/llama8b-4.0
synth_8b $m8 &
synth_pid=$!
PATH=/usr/local/cuda/bin:$PATH nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/persist scripts/persist-probe.cu \
  > $OUT/persist_build.log 2>&1 &
probe_pid=$!
# test_cuda under settings ("name:ENV=V ..."), its failures' first lines into the summary
tests() {
  for v in "$@"; do
    name=${v%%:*}; envs=${v#*:}
    env $envs TSR_FIXTURES=$PWD/tests/fixtures TSR_FIXTURES_BUILD=$fx TSR_MODELS=$PWD/models timeout 120 \
      $P/bin/test_cuda > $OUT/t-$name.log 2>&1
    echo "test_cuda $name ($envs) rc=$? $(grep -cE '^\[  FAILED|ERROR' $OUT/t-$name.log) failure lines" | tee -a $s
    grep -m6 -E 'FAIL|ERROR|mismatch|max err' $OUT/t-$name.log | cut -c1-200 | tee -a $s
  done
}
tests "default:"
wait $synth_pid
# SHORT=1 (little device time left): no split-3 or direct-store tests, no ncu, no probe
short=${SHORT:-0}
# decode at 80-256 rows: the defaults (the staged epilogue, tiles by 32 rows) twice, with the direct stores
# (TSR_CUDA_DW_EPI=0) twice, and with stop 62's tiles (TSR_CUDA_DW_ROWS=64)
for v in "def1:" "direct1:TSR_CUDA_DW_EPI=0" "def2:" "direct2:TSR_CUDA_DW_EPI=0" "by64:TSR_CUDA_DW_ROWS=64"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs timeout 150 $bin bench --model $m8 --device cuda --batch 80,96,136,160,200,224,256 --prompt-len 32 \
    --gen 32 > $OUT/decode-$name.log 2>&1
  echo "decode $name ($envs) rc=$?" | tee -a $s; grep -E '^ +[0-9]+ ' $OUT/decode-$name.log | tee -a $s
done
# paths these changes leave (batch 1-64 and the 2048-token prefill through cuBLAS): a regression check
timeout 120 $bin bench --model $m8 --device cuda --batch 1,8,64 --prompt-len 512 --gen 64 > $OUT/b1.log 2>&1
echo "batch 1/8/64 rc=$?" | tee -a $s; grep -E '^ +[0-9]+ |copy' $OUT/b1.log | cut -c1-200 | tee -a $s
timeout 120 $bin bench --model $m8 --device cuda --batch 1 --prompt-len 2048 --gen 8 --max-tokens 2048 \
  > $OUT/pf.log 2>&1
echo "prefill 2048 rc=$?" | tee -a $s; grep -E '^ +[0-9]+ ' $OUT/pf.log | tee -a $s
# per matrix at 256 and 128 rows: the defaults, and at 256 without the stores (what the staged epilogue still costs)
for v in "def256:256:" "nostore256:256:TSR_CUDA_DW_DIAG=nostore" "def128:128:"; do
  name=${v%%:*}; rest=${v#*:}; rows=${rest%%:*}; envs=${rest#*:}
  env TSR_CUDA_DQ_TIMES=1 $envs timeout 100 $bin bench --model $m8 --device cuda --batch $rows --prompt-len 32 \
    --gen 8 > $OUT/splits-$name.log 2>&1
  echo "per matrix $name ($envs) rc=$?" | tee -a $s; grep "^dq path M $rows" $OUT/splits-$name.log | tee -a $s
done
[ "$short" = 1 ] || tests "direct:TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_EPI=0" \
  "dwsplit3:TSR_CUDA_DQ_WGMMA=1 TSR_CUDA_DW_SPLITS=3"
[ "$short" = 1 ] && exit 0
# where the product's warps stall at 256 rows (ncu; graphs off so that each launch is its own; the second decode
# step's first two layers: q/k/v, o, gate, up, down): the stall reasons per issued instruction, the tensor pipe and
# the write traffic; then the same without the stores (TSR_CUDA_DW_DIAG=nostore): whether its loop issues and stalls
# as the full kernel's does (NOTES.md, stop 64: the nostore instantiation may be scheduled differently).
NCU=$(ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); NCU=${NCU:-ncu}
for v in "dw:" "dwnostore:TSR_CUDA_DW_DIAG=nostore"; do
  name=${v%%:*}; envs=${v#*:}
  env $envs TSR_CUDA_GRAPHS=0 timeout 200 $NCU --clock-control none --cache-control none --csv \
    --kernel-name regex:dq_wgmma --launch-skip 165 --launch-count 10 --metrics "gpu__time_duration.sum,\
launch__grid_size,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,\
regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,dram__bytes_write.sum,lts__t_sectors_op_write.sum" \
    $bin bench --model $m8 --device cuda --batch 256 --prompt-len 32 --gen 4 > $OUT/ncu-$name.csv 2> $OUT/ncu-$name.err
  echo "ncu $name ($envs) rc=$?" | tee -a $s
  python3 - "$OUT/ncu-$name.csv" <<'PY' | tee -a $s
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("no ncu rows")
h = rows[0]; ix = {k: i for i, k in enumerate(h)}
per = collections.OrderedDict()
for r in rows[1:]:
    if not r[ix["ID"]].isdigit(): continue
    per.setdefault(r[ix["ID"]], {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
for k, m in per.items():
    st = sorted(((float(v.replace(",", "")), n.split("stalled_")[1].split("_per")[0]) for n, v in m.items()
                 if "stalled" in n), reverse=True)[:7]
    oth = {n: v for n, v in m.items() if "stalled" not in n}
    print(k, " ".join(f"{n}={v}" for n, v in oth.items()))
    print("   stalls/issue:", " ".join(f"{n} {v:.2f}" for v, n in st))
PY
done
wait $probe_pid
if [ -x /tmp/persist ]; then
  timeout 90 /tmp/persist --trace > $OUT/persist_trace.log 2>&1; echo "persist trace rc=$?" | tee -a $s
  timeout 120 /tmp/persist --compute --release > $OUT/persist_rel.log 2>&1; echo "persist release rc=$?" | tee -a $s
  grep -A4 -E '^ahead, ring|no fence|releasing' $OUT/persist_trace.log | tee -a $s; cat $OUT/persist_rel.log | tee -a $s
fi
