#!/usr/bin/env bash
# test_peer_ipc (the one-shot peer sums across processes, through CUDA IPC) under mpirun with 2, 3 and 4 members;
# on a machine with one GPU they all share it. Exit 77 (skipped) where no GPU is present.
#   bash tests/gpu/test_peer_ipc.sh MPIEXEC TEST_PEER_IPC
set -u
mpiexec=$1
bin=$2
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "test_peer_ipc: no GPU, skipped"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
for np in 2 3 4; do
  timeout 120 "$mpiexec" --bind-to none -np "$np" "$bin" || { echo "FAIL: test_peer_ipc under mpirun -np $np"; exit 1; }
done
