/* The NCCL comm: device buffers of GPU workers (CUDA builds with NCCL). See comm.h.
 *
 * The communicator is bootstrapped from a unique id that member 0 broadcasts over the group's MPI communicator, and
 * is created non-blocking so that set-up and NCCL's lazy connection at the first operation can be given up after the
 * comm's timeout (ncclCommAbort) instead of hanging. Operations are queued on the CUDA backend's stream, in order
 * with the kernels around them, and may be captured into CUDA graphs (capturable). A watchdog thread aborts the
 * communicator when queued work has not finished within timeout_s of the last operation (a dead or stuck peer);
 * sync() waits for the queued work, with the same deadline, and disarms it. With TSR_PEER_SUM=1 (opt-in until
 * verified on two GPUs), when every member runs on one host and can map the others' GPU memory, sums of up to
 * TSR_PEER_SUM_MAX floats (default 256 Ki: a 70B layer's at up to 32 tokens) take the one-shot peer kernel of
 * kernels/cuda/peer_sum.h instead of NCCL; the members agree on it when the comm is created. Environment defaults
 * (NCCL_NVLS_ENABLE=0, NCCL_CUMEM_ENABLE=0) are set in parallel/rank.c before any NCCL call. */
#ifndef TSR_PARALLEL_COMM_NCCL_H
#define TSR_PARALLEL_COMM_NCCL_H

#include "parallel/comm.h"

#include <mpi.h>

/* Creates the NCCL comm over the members of `group` (collective over group; the CUDA device must be selected). */
tsr_status tsr_comm_nccl_new(MPI_Comm group, double timeout_s, tsr_comm **out);

#endif
