/* The process model: who this process is in an `mpirun` job.
 *
 * MPI is initialized only when the process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE,
 * PMIX_RANK or PMI_RANK in the environment); a plain `tessera generate` never touches MPI. Rank 0 is the
 * coordinator, ranks 1..N-1 are workers; with one rank (or no launcher) both roles share the process. The local
 * rank comes from MPI_Comm_split_type(SHARED); a worker's GPU is its index among the workers of its host.
 *
 * MPI_THREAD_MULTIPLE is requested: all of tessera's MPI calls of a process are made by one thread at a time (the
 * command's thread, or the service loop thread that drives the executor), which SERIALIZED would cover, but the
 * thread making them changes between start-up and the service loop. Every communicator tessera makes returns
 * errors instead of aborting (MPI_ERRORS_RETURN).
 *
 * Defaults set before any NCCL use unless the user set them: NCCL_NVLS_ENABLE=0 (NVLink SHARP multicast off) and,
 * when neither NCCL_CUMEM_ENABLE nor NCCL_P2P_LEVEL is set, NCCL_CUMEM_ENABLE=0 (NCCL's default setup hung once at
 * its first collective on the two-H200 machine; this setting fixed it).
 *
 * Leaving: tsr_rank_finalize() ends MPI cleanly when every rank is known to be leaving, and otherwise (a worker
 * died, timed out or failed) aborts the whole job so that no rank is left waiting. Under MPI the coordinator also
 * turns SIGTERM (sent by the launcher when another rank dies) into an error message and a non-zero exit. */
#ifndef TSR_PARALLEL_RANK_H
#define TSR_PARALLEL_RANK_H

#include "runtime/status.h"

typedef struct tsr_rank_info {
    int mpi;                    /* MPI is initialized (launched by mpirun / srun) */
    int rank, size;             /* MPI_COMM_WORLD */
    int local_rank, local_size; /* on this host */
    int worker;                 /* worker index (rank - 1), -1 on the coordinator */
    int n_workers;              /* size - 1; 0 without workers (one process does everything) */
    int local_worker;           /* index among the workers of this host (-1 on the coordinator) */
    int local_workers;          /* workers on this host */
    char host[64];
} tsr_rank_info;

/* 1 when an MPI launcher started this process. */
int tsr_rank_launched(void);

/* Initializes MPI when launched (see above); otherwise fills a one-process rank info. Idempotent. Fails when MPI
 * cannot start or lacks thread support. */
tsr_status tsr_rank_init(int *argc, char ***argv);

/* This process's place (valid after tsr_rank_init; a one-process info before). */
const tsr_rank_info *tsr_rank(void);

/* 1 on a worker rank of a multi-rank job. */
int tsr_rank_is_worker(void);

/* 1 when the job has worker ranks (size > 1). */
int tsr_rank_multi(void);

/* Tells the rank layer that the job can no longer end cleanly (a peer failed or died). */
void tsr_rank_mark_broken(void);

/* Ends MPI: MPI_Finalize when the job is clean, MPI_Abort(rc) when tsr_rank_mark_broken() was called. Returns rc. */
int tsr_rank_finalize(int rc);

/* A "[rank r/n]" prefix for this process's messages ("" without MPI). */
const char *tsr_rank_tag(void);

#endif
