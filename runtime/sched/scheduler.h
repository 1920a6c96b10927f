/* The coordinator's scheduler: continuous batching over a paged KV pool with a shared prefix cache.
 *
 * Plain data structures with no model and no clock of their own (callers pass `now` in seconds), so every
 * decision is testable with a fake clock. Each step: tsr_sched_plan() picks the work (decode tokens of running
 * sequences first, then prefill chunks of admitted ones, within a token budget), assigns KV pages and fills a
 * tsr_step; the executor runs it; tsr_sched_commit() appends the sampled tokens and reports what happened as
 * events. Stop strings are the caller's business (it sees the text); it ends a sequence with tsr_sched_finish().
 *
 * Pages: fixed size, reference counted (runtime/sched/pages.h). Full pages of a sequence are registered in the
 * prefix index under a hash chained over (previous page's hash, the page's token ids); a new sequence starts from
 * the longest chain of cached pages, sharing them, and only prefills the rest. A page is written only by the one
 * sequence that owns it exclusively (a shared page is always full and never written again). When pages run out,
 * the newest running sequence is preempted: its pages are freed and it goes back to the front of the queue with
 * its generated tokens kept, to be re-prefilled later (nothing lost). Ownership: the scheduler owns all sequences
 * and pages; ids are never reused. */
#ifndef TSR_SCHED_SCHEDULER_H
#define TSR_SCHED_SCHEDULER_H

#include "runtime/step.h"

/* The front doors' max_prefill_decoding (serve, intake, bench --concurrency): on an H200 with 8-32 clients sending
 * 2048-token prompts, 1024 cut the worst inter-token gaps by 40 % against no limit for 6-10 % of the throughput,
 * where 512 cost 20-27 % (BENCHMARKS.md, stop 28). */
#define TSR_PREFILL_CHUNK_DEFAULT 1024

/* What a zero max_running and max_waiting mean (the scheduler's defaults; the service applies them too, since its
 * admission bound counts both). */
#define TSR_SCHED_RUNNING_DEFAULT 64
#define TSR_SCHED_WAITING_DEFAULT 1024

typedef struct tsr_sched_opts {
    int page_size;           /* tokens per page (must match the executor's KV pool) */
    int n_pages;             /* pages in the pool */
    int max_step_tokens;     /* token budget of one step (<= the executor's max tokens per call) */
    int max_prefill_decoding; /* prompt tokens a step may carry when it also carries decode tokens, whose streams
                                 wait for the whole step (0 = as many as the budget leaves) */
    int max_running;         /* ceiling on sequences holding pages (default 64; at most max_step_tokens) */
    int max_waiting;         /* queue length before submit refuses with TSR_ERR_BUSY (default 1024) */
    int prefix_cache;        /* 1: share and keep full prompt pages (default on; -1 = off) */
    int max_context;         /* prompt + generated tokens a sequence may reach (the model's context) */
    int vocab;               /* logits per row, 0 = unknown; when set, submit refuses prompt tokens, stop ids and
                                bias tokens outside it (one bad id would otherwise fail its whole step) */
    int max_plans;           /* steps that may be planned before the oldest is committed (default 1, at most
                                TSR_SCHED_MAX_PLANS): an executor that pipelines steps over layer stages runs
                                several at once, each with its own sequences */
} tsr_sched_opts;

#define TSR_SCHED_MAX_PLANS 8

/* What one request asks of its sequence. */
typedef struct tsr_seq_params {
    tsr_sampling sampling;
    uint64_t seed;
    int max_tokens;          /* tokens to generate at most (>= 1) */
    int min_tokens;          /* stop tokens are ignored before this many (default 0) */
    const int32_t *stop_ids; /* tokens that end the sequence (EOS ids and the request's); copied */
    int n_stop_ids;
    int ignore_eos;          /* 1: generate max_tokens whatever */
    int n_logprobs;          /* -1 none, else 0..TSR_MAX_LOGPROBS alternatives per token */
    const tsr_logit_bias *bias; /* copied */
    int n_bias;
    double deadline;         /* absolute time (same clock as `now`); 0 = none */
} tsr_seq_params;

typedef enum tsr_finish_reason {
    TSR_FINISH_NONE = 0,
    TSR_FINISH_STOP,         /* a stop token or (via tsr_sched_finish) a stop string */
    TSR_FINISH_LENGTH,       /* max_tokens or the context limit */
    TSR_FINISH_CANCELLED,    /* tsr_sched_cancel() */
    TSR_FINISH_DEADLINE,     /* the request's deadline passed */
    TSR_FINISH_ERROR,        /* the executor failed this sequence's step, or it can never fit the pool */
} tsr_finish_reason;

const char *tsr_finish_reason_str(tsr_finish_reason r); /* "stop", "length", "cancelled", "deadline", "error" */

/* One thing that happened to a sequence during tsr_sched_commit() (or cancel/finish/plan). */
typedef struct tsr_sched_event {
    uint64_t id;
    int32_t token;           /* the token appended, or -1 when this event only finishes the sequence */
    const tsr_step_result *result; /* the executor's result for that token (logprobs), or NULL */
    tsr_finish_reason finish;     /* != NONE: the sequence ended; its pages are released (kept in the prefix
                                      cache when full and cached) and its id is gone after this event */
    int n_prompt, n_generated, n_cached; /* usage: prompt tokens, generated so far, prompt tokens from the cache */
} tsr_sched_event;

typedef struct tsr_sched_stats {
    int waiting, running, preempted_total;
    int pages_total, pages_free, pages_cached;   /* cached: unreferenced pages kept for the prefix cache */
    uint64_t prefix_lookups, prefix_hits, prefix_hit_tokens, prefix_evictions;
    uint64_t prefill_tokens, decode_tokens, steps;
} tsr_sched_stats;

typedef struct tsr_sched tsr_sched;

tsr_status tsr_sched_new(const tsr_sched_opts *opts, tsr_sched **out);
void tsr_sched_free(tsr_sched *s);

/* Queues a request (prompt copied). Fails with TSR_ERR_ARG for an empty prompt or prompt + max_tokens beyond
 * max_context (message names both numbers), or beyond the whole page pool (prompt + max_tokens - 1 KV slots),
 * TSR_ERR_BUSY when the queue is full. */
tsr_status tsr_sched_submit(tsr_sched *s, const int32_t *prompt, int n_prompt, const tsr_seq_params *p, double now,
                            uint64_t *id);

/* Ends a sequence at any point (queued, prefilling or decoding); its finish event comes from the next
 * tsr_sched_drain_events(). Unknown ids are ignored (the sequence may have just finished). */
void tsr_sched_cancel(tsr_sched *s, uint64_t id);
/* Ends a sequence with the given reason (the caller matched a stop string). */
void tsr_sched_finish(tsr_sched *s, uint64_t id, tsr_finish_reason reason);

/* Builds the next step into `step` (cleared first). Expired deadlines end sequences here. Returns TSR_OK with
 * step->n_seqs == 0 when there is nothing to run; TSR_ERR_ARG while max_plans non-empty steps await
 * tsr_sched_commit (commit the oldest first, with NULL results if it failed).
 *
 * With max_plans > 1 a step may be planned while earlier ones are in flight: it takes only sequences that are in
 * none of them, at most ceil(running / max_plans) decode tokens (so that the running sequences spread over the
 * plans in flight), never preempts a sequence in flight (a sequence short of a page then waits for the next plan)
 * and never hands out a page that a step in flight still writes: pages of sequences that end meanwhile are freed
 * when their step is committed, and pages enter the prefix index only at commit. */
tsr_status tsr_sched_plan(tsr_sched *s, double now, tsr_step *step);

/* Applies the results of the oldest step awaiting commit (results[i] belongs to step->seqs[i]; NULL results means
 * the step failed: its sequences end with TSR_FINISH_ERROR) and queues the events. Steps are committed in the
 * order they were planned; any other step is refused with TSR_ERR_ARG. */
tsr_status tsr_sched_commit(tsr_sched *s, const tsr_step *step, const tsr_step_result *results, double now);

/* Hands out the queued events (valid until the next call into the scheduler). */
int tsr_sched_drain_events(tsr_sched *s, const tsr_sched_event **events);

/* Tokens of a live sequence: prompt then generated (NULL if unknown). */
const int32_t *tsr_sched_tokens(const tsr_sched *s, uint64_t id, int *n_prompt, int *n_total);

int tsr_sched_idle(const tsr_sched *s); /* 1 when nothing is queued or running and no event is pending */
void tsr_sched_get_stats(const tsr_sched *s, tsr_sched_stats *out);

/* Checks every invariant (reference counts equal the page-table references plus the cache's; free list and
 * referenced pages disjoint; no page written by two sequences; prefix index entries point to live pages). For
 * tests; returns TSR_ERR_INTERNAL with a description of the first violation. */
tsr_status tsr_sched_check(const tsr_sched *s);

#endif
