/* A model run as the commands see it: one call that, depending on how the process was started, opens
 *   - one process (no mpirun, or a single rank): the engine and the local executor (runtime/executor.h);
 *   - the coordinator (rank 0 of an mpirun job): the start-up of every rank (hello, plan, load, ready) and the
 *     parallel executor (parallel/coordinator.h);
 *   - a worker (rank >= 1): its device, binding, comms and model part, then the worker loop until SHUTDOWN; the
 *     call returns when the worker is done (session->worker is set and the command just exits with worker_rc).
 *
 * Start-up, every rank (parallel/protocol.h): each worker selects its device (a GPU worker takes GPU = its index
 * among the workers of its host), binds itself with hwloc and sends a HELLO with its usable memory (free memory,
 * capped by --gpu-memory); rank 0 reads the model's description, makes the plan (parallel/plan.h) and broadcasts it,
 * or the reason it cannot (then every rank leaves with that message, before any weight is loaded); the ranks make
 * their communicators (MPI, and NCCL for GPU workers when built with it); each worker loads its part and answers
 * READY; rank 0 reports every worker that failed to load, naming the rank and reason, shuts the workers down and
 * fails. Every wait is bounded (--load-timeout, --comm-timeout).
 *
 * Only rank 0 prints results; workers print one start-up line each on stderr (unless --quiet-ranks) and errors. */
#ifndef TSR_PARALLEL_SESSION_H
#define TSR_PARALLEL_SESSION_H

#include "kernels/ops.h"
#include "parallel/options.h"
#include "parallel/plan.h"
#include "runtime/engine.h"
#include "runtime/executor.h"

typedef struct tsr_session_req {
    const char *cmd; /* the command, for messages */
    const char *model_dir;
    const char *device; /* "cpu", "cuda" or "cuda:N" (workers take cuda:<local worker index>) */
    tsr_status (*select_backend)(const char *device, const tsr_ops **ops); /* the launcher's backend selection */
    int threads; /* CPU threads (0: all cores, or a worker's bound cores) */
    int max_tokens, page_size; /* tokens per step (0: TSR_STEP_TOKENS_DEFAULT); KV page size (0: 16) */
    tsr_dtype kv_dtype;
    long kv_tokens;     /* KV pool the command needs (0: as much as fits) */
    double kv_fraction; /* with kv_tokens 0: the share of the memory left after weights and workspace the pool
                           takes (0: the default, 0.9 of a device's free memory in one process, 0.95 of a planned
                           capacity); unused where kv_tokens is given */
    long max_context;   /* the longest sequence served (0: the model's context); TSR_ERR_ARG beyond the model's */
} tsr_session_req;

typedef struct tsr_session {
    tsr_executor *x;      /* rank 0 / one process: drive this */
    tsr_engine *engine;   /* one process only */
    tsr_model_config cfg; /* the model's configuration (rank 0 / one process) */
    tsr_plan plan;
    int worker;    /* 1: this rank was a worker and has finished */
    int worker_rc; /* its exit code */
} tsr_session;

/* Opens the run (see above). On a worker rank it returns TSR_OK with session->worker set once the worker is done.
 * Errors carry their message (tsr_last_error); on rank 0 a worker's load failure names the worker. */
tsr_status tsr_session_open(const tsr_session_req *req, const tsr_par_opts *o, tsr_session **out);

/* On rank 0 of a multi-rank job whose command fails before tsr_session_open (a bad prompt, a missing tokenizer):
 * tells the waiting workers to leave (they exit 1 without a message). Nothing elsewhere. */
void tsr_session_cancel(const char *why);

/* Closes the executor (shutting the workers down), the engine, the session. NULL is fine. */
void tsr_session_close(tsr_session *s);

#endif
