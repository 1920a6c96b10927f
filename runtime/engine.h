/* A single-process engine: one model, one backend, one paged KV pool, and sequences that own pages.
 *
 * This is what the commands (generate, logits, bench) and, later, each worker rank drive. tsr_engine_feed()
 * appends tokens to several sequences at once: it packs them into forward calls of at most max_tokens tokens
 * (prefill chunks of different sequences share a call), reserving KV pages as the sequences grow, and hands back
 * the logits each sequence asked for.
 *
 * A worker rank of a split model opens an engine on its part (opts.part, and opts.on_load to cut a tensor shard
 * before the weights reach the backend); the KV pool then holds the part's layers and local KV heads. */
#ifndef TSR_ENGINE_H
#define TSR_ENGINE_H

#include "runtime/forward.h"

typedef struct tsr_engine_opts {
    int max_tokens;       /* tokens per forward call (default TSR_STEP_TOKENS_DEFAULT) */
    int page_size;        /* tokens per KV page (default 16) */
    long kv_tokens;       /* KV pool size in tokens; 0: kv_fraction of the backend's free memory after the weights and
                             workspace when the backend reports it (GPU), else max_position_embeddings */
    double kv_fraction;   /* share of free memory for the KV pool when kv_tokens is 0 (default 0.9) */
    long max_context;     /* the longest sequence served, below the model's context (0: the model's): sizes the
                             default pool where memory does not, and a quantized cache's rebuild room */
    tsr_dtype kv_dtype;   /* TSR_F16 (default) or TSR_F32 */
    const tsr_ops *ops;   /* default: the CPU backend */
    const tsr_model_part *part; /* load only this part of the model (NULL: all of it) */
    /* called once the model is loaded, before its weights go to the backend (NULL: nothing); a failure fails the
     * open */
    tsr_status (*on_load)(void *ctx, tsr_model *m);
    void *on_load_ctx;
    size_t memory_cap;    /* bytes this engine may use on its device when sizing the KV pool from free memory (0: no
                             cap); the weights and workspace count against it */
} tsr_engine_opts;

typedef struct tsr_engine {
    tsr_model *model;
    const tsr_ops *ops;
    tsr_kv_cache kv;
    tsr_forward_ctx *fwd;
    int max_tokens;
    int max_context;      /* the longest sequence it serves: opts.max_context or the model's context */
    size_t memory_cap;    /* opts.memory_cap: the device bytes it was planned under (0: not limited) */
    long kv_pool_tokens;  /* the pool's size in tokens, as allocated */
    float *feed_logits;   /* tsr_engine_feed's host rows, kept between calls */
    size_t feed_rows;     /* rows feed_logits holds */
} tsr_engine;

typedef struct tsr_seq {
    int32_t *pages;
    int n_pages, cap_pages;
    int len;              /* tokens already in the cache */
} tsr_seq;

/* The greedy choice of a logits row: the first index of its largest logit (NaN entries skipped; 0 when there is
 * none) and that logit (NaN then). */
typedef struct tsr_pick {
    int32_t id;
    float value;
} tsr_pick;

/* One sequence's part of a tsr_engine_feed() call. */
typedef struct tsr_feed {
    tsr_seq *seq;
    const int32_t *tokens;
    int n_tokens;
    tsr_logits_mode logits;
    float *out;           /* [n_tokens or 1][vocab] as asked; NULL with TSR_LOGITS_NONE */
    tsr_pick *pick;       /* with TSR_LOGITS_LAST and out NULL: receives the last row's pick instead of the row (a
                             call whose rows are all picks keeps them on the device: tsr_forward_argmax) */
} tsr_feed;

tsr_status tsr_engine_open(const char *model_dir, const tsr_engine_opts *opts, tsr_engine **out);
void tsr_engine_close(tsr_engine *e);

/* Processes every feed's tokens. On failure (e.g. the KV pool is full) the sequences keep what was cached before
 * the failing forward call. */
tsr_status tsr_engine_feed(tsr_engine *e, tsr_feed *feeds, int n);

/* Frees a sequence's pages and resets it to empty. */
void tsr_engine_seq_release(tsr_engine *e, tsr_seq *seq);

#endif
