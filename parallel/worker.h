/* The worker loop of ranks 1..N-1: wait for the coordinator's messages, run each STEP's part (parallel/stage.h),
 * answer RESULT from the leader, and leave on SHUTDOWN.
 *
 * Waiting for the next message has no deadline (the coordinator may be idle for long; if it dies the launcher ends
 * the job). A failing step sends ERROR with this rank's identity and reason to rank 0, which fails the step and
 * ends the job; the worker then waits --comm-timeout for the SHUTDOWN or the abort and otherwise aborts itself.
 *
 * Test hook: TSR_TEST_DIE_AFTER_STEPS=n makes the worker of world rank TSR_TEST_DIE_RANK (default: the last rank)
 * _exit(9) when step n+1 arrives (with TSR_TEST_DIE_MODE=hang: stop answering instead), to check that the
 * coordinator fails fast instead of hanging. */
#ifndef TSR_PARALLEL_WORKER_H
#define TSR_PARALLEL_WORKER_H

#include "parallel/stage.h"

#include <mpi.h>

typedef struct tsr_worker {
    MPI_Comm ctrl;   /* rank 0 = the coordinator */
    int rank;        /* world rank */
    tsr_stage stage; /* engine, plan, comms */
    double timeout_s;
} tsr_worker;

/* Runs until SHUTDOWN; returns the process exit code (0, or 1 after a failure). */
int tsr_worker_loop(tsr_worker *wk);

/* Reports a failure to rank 0 (ERROR message naming this rank) and waits for the SHUTDOWN; returns 1. */
int tsr_worker_fail(MPI_Comm ctrl, int rank, const char *what, tsr_status st, double timeout_s);

#endif
