/* The coordinator's service loop: requests in, streamed text out, one scheduler and one executor in between.
 *
 * Front doors (tessera batch, the HTTP gateway, the nanomsg intake) submit requests from any thread; one loop
 * thread owns the scheduler: it admits submitted requests, plans a step, runs it on the executor, commits the
 * results, detokenizes each sequence incrementally, matches stop strings (holding back text that may be the start
 * of one, never emitting the stop text), and reports progress through the request's callback. Callbacks run on
 * the loop thread and must be quick (copy and signal); they may call tsr_service_cancel() but not submit.
 *
 * Every submitted request gets exactly one final event (finish != TSR_FINISH_NONE), whatever happens: finished,
 * cancelled, deadline, executor failure, shutdown. After that event its id is never mentioned again. */
#ifndef TSR_SERVICE_H
#define TSR_SERVICE_H

#include "runtime/executor.h"
#include "runtime/sched/scheduler.h"
#include "runtime/text/tokenizer.h"

typedef struct tsr_service_opts {
    tsr_sched_opts sched;     /* page_size, n_pages, max_step_tokens, max_context are taken from the executor
                                 when 0 */
    int skip_special;         /* detokenize without special tokens (default 1; -1 keeps them) */
} tsr_service_opts;

typedef struct tsr_gen_request {
    const int32_t *prompt;    /* token ids (copied) */
    int n_prompt;
    tsr_seq_params params;    /* sampling, seed, max_tokens, stop ids, logprobs, bias, deadline (0: none) */
    const char *const *stop;  /* stop strings (copied); the text ends before the first match */
    int n_stop;
} tsr_gen_request;

typedef struct tsr_gen_event {
    uint64_t id;
    const char *text;         /* new text released by this event (UTF-8, may be empty) */
    size_t text_len;
    int32_t token;            /* the token sampled in this event, or -1 (a final event without a token) */
    const tsr_step_result *result; /* its log-probabilities (when asked), or NULL */
    tsr_finish_reason finish; /* NONE while running; the last event has the reason */
    const char *error;        /* with TSR_FINISH_ERROR: why */
    int n_prompt, n_generated, n_cached; /* usage so far */
    double t_submit, t_first_token;      /* seconds on the service clock (t_first_token 0 before it) */
} tsr_gen_event;

typedef void (*tsr_gen_callback)(const tsr_gen_event *ev, void *user);

#define TSR_SERVICE_MAX_WORKERS 64 /* worker ranks whose usage the stats carry */
#define TSR_SERVICE_USAGE_PERIOD 5.0 /* seconds between two questions to the workers about their usage */

typedef struct tsr_service_stats {
    tsr_sched_stats sched;
    uint64_t requests_total, requests_finished, requests_failed, requests_cancelled;
    uint64_t tokens_in, tokens_out;
    double busy_s, sched_s;   /* time in steps (executor) and in the scheduler (planning + committing) */
    int executor_broken;
    /* The usage of each rank holding the model (this process, or the workers under mpirun) as last asked: at the
     * loop's first idle moment, then at most every TSR_SERVICE_USAGE_PERIOD seconds when no step is in flight (none
     * until then, or where the executor has no `usage`). */
    int n_ranks;
    tsr_rank_usage ranks[TSR_SERVICE_MAX_WORKERS];
} tsr_service_stats;

typedef struct tsr_service tsr_service;

/* Starts the loop thread. The executor and tokenizer stay the caller's and must outlive the service. Without a
 * tokenizer (tok NULL: a synthetic model) events carry tokens but no text, and stop strings are refused. */
tsr_status tsr_service_start(tsr_executor *x, const tsr_tokenizer *tok, const tsr_service_opts *opts,
                             tsr_service **out);

/* Queues a request. Fails (and never calls cb) on invalid parameters, a prompt that cannot fit, a full queue
 * (TSR_ERR_BUSY), a stopping service or a broken executor (TSR_ERR_REMOTE). *id is set before cb can run. */
tsr_status tsr_service_submit(tsr_service *s, const tsr_gen_request *req, tsr_gen_callback cb, void *user,
                              uint64_t *id);

/* Cancels a request at any point; its final event has TSR_FINISH_CANCELLED (unless it already finished). */
void tsr_service_cancel(tsr_service *s, uint64_t id);

/* Blocks until every request submitted so far has had its final event. */
void tsr_service_wait_idle(tsr_service *s);

void tsr_service_get_stats(tsr_service *s, tsr_service_stats *out);

/* Seconds on the service clock (CLOCK_MONOTONIC). */
double tsr_service_now(void);

/* Stops accepting, lets running requests finish for up to grace_s seconds, cancels the rest (each gets its final
 * event), stops the thread and frees the service. */
void tsr_service_stop(tsr_service *s, double grace_s);

#endif
