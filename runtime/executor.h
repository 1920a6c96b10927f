/* An executor runs step plans (runtime/step.h): in this process over a tsr_engine, or across MPI ranks
 * (parallel/). The coordinator's service loop drives one through this table and never knows which.
 *
 * run() fills results[i] for step->seqs[i]; on failure the step had no effect the scheduler relies on (it ends
 * the step's sequences with an error) and the executor may be unusable afterwards (a dead rank): `broken` says so.
 * Geometry fields are fixed at creation.
 *
 * An executor whose ranks form a pipeline of layer stages can have several steps in flight (depth > 1): while the
 * last stage runs one step, the first runs the next, so every stage works at once when the steps hold different
 * sequences (the scheduler's max_plans). submit() sends a step on its way and returns; collect() waits for the
 * oldest submitted step and fills the results (and logits) given to its submit(). */
#ifndef TSR_EXECUTOR_H
#define TSR_EXECUTOR_H

#include "runtime/step.h"

struct tsr_engine;
struct tsr_forward_ctx;

#define TSR_EXECUTOR_MAX_DEPTH 8

/* What a rank holding the model (or a part of it) has used so far (tsr_executor.usage). */
typedef struct tsr_rank_usage {
    int32_t rank, pad;    /* its MPI rank: 0 in one process, the workers' 1.. under mpirun */
    uint64_t peak_device; /* memory allocated through its backend at most (0: not counted there, the CPU) */
    uint64_t peak_host;   /* its process's peak resident memory (0: unknown) */
    uint64_t capacity;    /* usable device bytes it was planned with (0: not limited) */
    int64_t steps;        /* steps it ran */
} tsr_rank_usage;

typedef struct tsr_executor tsr_executor;
struct tsr_executor {
    int vocab;              /* logits per row */
    int page_size, n_pages; /* the KV pool every rank holds (same numbering everywhere) */
    int max_step_tokens;    /* tokens one step may carry */
    int max_context;        /* the model's context length */
    int broken;             /* set when a failure makes further steps impossible */
    int depth;              /* steps that may be in flight at once (1: run() only; at most TSR_EXECUTOR_MAX_DEPTH) */
    /* logits: NULL, or [rows][vocab] fp32 for the rows the step's sequences ask for (tsr_step_seq.logits), in
     * plan order; how `tessera logits` and tests read whole rows through any executor */
    tsr_status (*run)(tsr_executor *x, const tsr_step *step, tsr_step_result *results, float *logits);
    /* depth > 1 only (NULL otherwise). submit: at most `depth` steps between submit and collect (TSR_ERR_ARG
     * beyond); the step may be reused once submit returns, results and logits must stay valid until its collect.
     * collect: TSR_ERR_ARG when nothing is in flight; a failure fails that step as run() would. run() may be
     * called only with nothing in flight. */
    tsr_status (*submit)(tsr_executor *x, const tsr_step *step, tsr_step_result *results, float *logits);
    tsr_status (*collect)(tsr_executor *x);
    /* Optional: the usage of each rank holding the model into out[0 .. n - 1]: this process (n = 1) or, under
     * mpirun, the workers in order (TSR_ERR_ARG where more than max, or with steps in flight); a failure is a dead
     * rank's, as run()'s. */
    tsr_status (*usage)(tsr_executor *x, tsr_rank_usage *out, int max, int *n);
    void (*close)(tsr_executor *x); /* frees the executor (and what it owns) */
    void *impl;
};

/* An executor over an engine of this process; the engine stays the caller's (close() leaves it open). Its KV
 * pool's own free list is not used: page numbers come from the plans. */
tsr_status tsr_executor_local(struct tsr_engine *e, tsr_executor **out);

/* The usage of the rank `rank` whose engine is `e` (planned with `capacity` usable device bytes, 0: not limited),
 * after `steps` steps: its backend's peak allocation and this process's peak resident memory. */
tsr_rank_usage tsr_rank_usage_of(int rank, const struct tsr_engine *e, uint64_t capacity, long steps);

/* Host buffers of the candidates path (tsr_forward_top), per forward-call input; zero-initialise. */
typedef struct tsr_top_bufs {
    int32_t *ids;   /* [cap][TSR_TOP_MAX] each row's candidates */
    float *vals;    /* [cap][TSR_TOP_MAX] */
    float *z, *inv; /* [cap]: each row's normalizer and inverse temperature */
    int *undecided; /* [2][cap]: sequences whose candidates could not decide, and their rows */
    int backoff;    /* calls left that copy whole rows instead (tsr_step_top_backoff) */
    int cap;
} tsr_top_bufs;

/* Grows b to n inputs (TSR_ERR_NOMEM, b unchanged where it could not grow); frees it. */
tsr_status tsr_top_bufs_reserve(tsr_top_bufs *b, int n);
void tsr_top_bufs_free(tsr_top_bufs *b);

/* Buffers reused from step to step by tsr_engine_run_step (zero-initialise; free with tsr_step_scratch_free). */
typedef struct tsr_step_scratch {
    float *logits;           /* [cap_rows][vocab] */
    size_t cap_rows;
    struct tsr_seq_input *in;
    int *owner;
    int32_t *pick_ids;       /* [cap_in] greedy picks of a call whose rows all sample greedily */
    float *pick_vals;        /* [cap_in] */
    tsr_top_bufs top;        /* a call whose rows all sample without needing the whole row (tsr_step_call_top) */
    int cap_in;
    int *progress;           /* [2][cap_seqs]: tokens done per sequence, then its first row in `logits` */
    int cap_seqs;
} tsr_step_scratch;

void tsr_step_scratch_free(tsr_step_scratch *s);

/* Runs one plan on an engine: validates it against the engine's vocabulary and KV pool, runs the forward pass
 * (split into calls of at most the engine's max_tokens), samples each sampling sequence's token and copies the
 * asked-for logits rows. The local executor's body; worker ranks run their part of a plan through
 * parallel/stage.c instead (partial layers, hidden-state hand-over, sharded vocabulary). */
tsr_status tsr_engine_run_step(struct tsr_engine *e, tsr_step_scratch *scratch, const tsr_step *step,
                               tsr_step_result *results, float *logits);

/* Whether a forward call's `rows` logits rows (inputs in[0..nb), in[b] belonging to step->seqs[owner[b]]) only
 * feed greedy choices: each input asks for its last row or none, for sampling alone (no raw logits), and
 * tsr_step_pick_ok holds; and rows <= pick_rows (tsr_forward_pick_rows). Then tsr_forward_argmax can replace
 * tsr_forward and tsr_step_sample_pick the sampler. */
int tsr_step_call_picks(const tsr_step *step, const struct tsr_seq_input *in, const int *owner, int nb, size_t rows,
                        int pick_rows);

/* Whether the call's rows can be reduced to their candidates instead (tsr_forward_top): as tsr_step_call_picks,
 * with tsr_step_top_ok (any sampling parameters, no logprobs, penalties or biases) and rows <= top_rows
 * (tsr_forward_top_rows). Rows the candidates cannot decide are fetched whole (tsr_step_sample_undecided). */
int tsr_step_call_top(const tsr_step *step, const struct tsr_seq_input *in, const int *owner, int nb, size_t rows,
                      int top_rows);

/* Samples the n sequences whose candidates could not decide their draw (step->seqs[seq[k]], logits row row[k] of
 * the last tsr_forward_top call) from their whole rows, fetched in one copy of the rows between the first and the
 * last of them into buf (room for the call's rows). */
tsr_status tsr_step_sample_undecided(struct tsr_forward_ctx *fwd, const tsr_step *step, const int *seq, const int *row,
                                     int n, int vocab, float *buf, tsr_step_result *results);

/* After a call that read candidates: when they left more than half of its sampled rows undecided (flat
 * distributions, wide top-p), the next TSR_TOP_BACKOFF calls that could read candidates copy their rows whole
 * instead, so that such a workload pays the candidates' cost on one call in TSR_TOP_BACKOFF + 1. */
#define TSR_TOP_BACKOFF 8
void tsr_step_top_backoff(int *backoff, int undecided, int sampled);

/* The inverse temperature of each of the call's rows, in row order (tsr_step_inv_temp; tsr_forward_top's input). */
void tsr_step_call_inv_temps(const tsr_step *step, const struct tsr_seq_input *in, const int *owner, int nb,
                             float *inv);

#endif
