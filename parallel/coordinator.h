/* The parallel executor: rank 0's tsr_executor (runtime/executor.h) over the worker ranks.
 *
 * run() validates the plan against the pool every worker holds, packs it (tsr_step_pack), sends it to every worker
 * and waits for the leader's RESULT (tokens, log-probabilities and, when logits is not NULL, the asked-for logits
 * rows) or any worker's ERROR. Every wait has the --comm-timeout deadline. A worker's error, a timeout or a
 * malformed answer fails the step with TSR_ERR_REMOTE naming the rank and reason, and marks the executor broken
 * (and the job, so that leaving aborts it: tsr_rank_finalize). close() sends SHUTDOWN to the workers when the
 * executor is not broken. All MPI calls happen on the thread that calls run()/close(). */
#ifndef TSR_PARALLEL_COORDINATOR_H
#define TSR_PARALLEL_COORDINATOR_H

#include "parallel/plan.h"
#include "runtime/config.h"
#include "runtime/executor.h"

#include <mpi.h>

/* ctrl: the coordinator/worker communicator (rank 0 = this process, rank w + 1 = worker w); taken over (freed by
 * close). depth: steps in flight at once (tsr_stage_depth; 1 = run() only). With depth > 1, submit() posts a step
 * to the workers without waiting (they run steps in order) and collect() receives the oldest step's RESULT; the
 * leader answers steps in the order they were sent. */
tsr_status tsr_coordinator_executor(MPI_Comm ctrl, const tsr_plan *plan, const tsr_model_config *cfg, double timeout_s,
                                    int depth, tsr_executor **out);

/* Sends SHUTDOWN to every worker (start-up failures; the executor's close does it otherwise). */
void tsr_coordinator_shutdown(MPI_Comm ctrl, int n_workers, double timeout_s);

#endif
