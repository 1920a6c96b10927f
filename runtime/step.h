/* The step plan: everything a worker needs to run one step, and what the last stage hands back.
 *
 * The coordinator's scheduler fills a tsr_step (which sequences run, which tokens at which positions, their page
 * tables, their sampling parameters); the executor runs it: in one process (runtime/step_exec.c) or across ranks
 * (parallel/), where it travels as one flat, versioned buffer made by tsr_step_pack() and checked by
 * tsr_step_unpack(). Variable-length parts (tokens, page tables, penalty histories, logit biases) live in shared
 * arrays; each sequence names its slice by offset and count. Workers keep no per-sequence state: a plan is
 * complete on its own, which keeps preemption, cancellation and a restarted worker simple.
 *
 * Random draws are counter-based: the token sampled for a sequence depends only on its seed, its sample index and
 * its logits, so a seed gives the same output whatever else shares the batch. */
#ifndef TSR_STEP_H
#define TSR_STEP_H

#include "runtime/sampler.h"
#include "runtime/status.h"

#include <stddef.h>
#include <stdint.h>

#define TSR_STEP_VERSION 1u
#define TSR_MAX_LOGPROBS 20

typedef struct tsr_step_seq {
    uint64_t id;              /* the scheduler's sequence id */
    int32_t pos0;             /* position of the first token of this step; 0..pos0-1 are cached */
    int32_t n_tokens;         /* tokens of this step (a prefill chunk, or 1 in decode) */
    int32_t token0;           /* offset of its tokens in tsr_step.tokens */
    int32_t page0, n_pages;   /* its page table in tsr_step.pages; covers positions 0..pos0+n_tokens-1 */
    int32_t sample;           /* 1: sample the next token from the last row's logits; 0: prefill chunk only */
    int32_t n_logprobs;       /* with sample: top log-probabilities to return (0..TSR_MAX_LOGPROBS), -1: none */
    int32_t logits;           /* rows of raw logits to hand back: 0 none, 1 the last token's, 2 every token's */
    uint64_t seed;            /* sampling seed of the request */
    uint32_t sample_index;    /* tokens this sequence sampled before (the counter of its random stream) */
    tsr_sampling sampling;    /* temperature, top-k/p, min-p, typical-p, penalties */
    int32_t hist0, n_hist;    /* penalty history in tsr_step.hist: prompt tokens then generated tokens; only
                                 filled when a penalty is active */
    int32_t n_hist_prompt;    /* how many of the n_hist are prompt tokens */
    int32_t bias0, n_bias;    /* logit biases in tsr_step.bias */
} tsr_step_seq;

typedef struct tsr_step {
    uint32_t version;
    int32_t n_seqs, n_tokens, n_pages, n_hist, n_bias;
    tsr_step_seq *seqs;
    int32_t *tokens;
    int32_t *pages;
    int32_t *hist;
    tsr_logit_bias *bias;
    /* capacities (owned by the builder; unpacked steps point into the buffer and have 0 capacities) */
    int32_t cap_seqs, cap_tokens, cap_pages, cap_hist, cap_bias;
} tsr_step;

/* What the last stage returns for each sequence of the step, in plan order. Sequences that did not sample have
 * token -1. */
typedef struct tsr_step_result {
    int32_t token;
    float logprob;                             /* log-probability of token under the model's distribution; filled
                                                  when the sequence asked for logprobs (n_logprobs >= 0), else 0 */
    int32_t n_top;                             /* entries of top_ids/top_logprobs filled */
    int32_t top_ids[TSR_MAX_LOGPROBS];
    float top_logprobs[TSR_MAX_LOGPROBS];
} tsr_step_result;

/* Builder: empties the step keeping its arrays. */
void tsr_step_clear(tsr_step *s);
void tsr_step_free(tsr_step *s);

/* Appends a sequence; tokens, pages, hist and bias are copied into the shared arrays. hist/bias may be NULL with
 * count 0. seq->token0/page0/hist0/bias0 are filled in. */
tsr_status tsr_step_add(tsr_step *s, const tsr_step_seq *seq, const int32_t *tokens, const int32_t *pages,
                        const int32_t *hist, const tsr_logit_bias *bias);

/* Checks offsets, counts and ranges (tokens < vocab, pages < n_pages_total, positions covered by page tables).
 * A plan that passes cannot make a worker read or write out of bounds. */
tsr_status tsr_step_validate(const tsr_step *s, int vocab, int n_pages_total, int page_size);

/* Rows of logits the step hands back (see tsr_step_seq.logits). */
int tsr_step_logit_rows(const tsr_step *s);

/* Serializes into one flat little-endian buffer (malloc'd). */
tsr_status tsr_step_pack(const tsr_step *s, uint8_t **buf, size_t *len);
/* Parses a buffer made by tsr_step_pack (version checked, every size checked against len). The step's arrays
 * point into buf, which must outlive it. */
tsr_status tsr_step_unpack(const uint8_t *buf, size_t len, tsr_step *out);

/* Samples seq's next token from its logits row (vocab entries; modified in place: penalties, bias, temperature)
 * with seq's parameters, history, biases and counter-based random stream, and fills out (token, its logprob and
 * the top n_logprobs alternatives, all from the unmodified distribution: log_softmax of the model's logits). */
tsr_status tsr_step_sample(float *logits, int vocab, const tsr_step *step, const tsr_step_seq *seq,
                           tsr_step_result *out);

/* Whether seq's token is just the greedy pick of its logits row (the first index of the largest logit): it samples
 * greedily (temperature 0 or top_k 1), asks for no log-probabilities, and no penalty or bias changes the row. Such
 * a row need not leave the device (tsr_forward_argmax). */
int tsr_step_pick_ok(const tsr_step_seq *seq);

/* tsr_step_sample for a sequence with tsr_step_pick_ok, given its row's pick (token, and value: that logit):
 * the same checks, the same token, and the same error when the row has no finite maximum. */
tsr_status tsr_step_sample_pick(int32_t token, float value, int vocab, const tsr_step *step, const tsr_step_seq *seq,
                                tsr_step_result *out);

/* Whether seq's token can come from its row's candidates (tsr_forward_top): it samples, asks for no
 * log-probabilities, and no penalty or bias changes the row (greedy or not). */
int tsr_step_top_ok(const tsr_step_seq *seq);

/* tsr_step_sample for a sequence with tsr_step_top_ok, given its row's candidates (ids, vals: TSR_TOP_MAX entries,
 * id -1 past the row's non-NaN count) and z, the row's sum of exp((l - max) / T) at the sequence's temperature:
 * the same checks and the same stream (tsr_sample_top). *decided = 0 when the candidates cannot decide: then run
 * tsr_step_sample on the whole row. The result has no log-probability (none was asked for). */
tsr_status tsr_step_sample_top(const int32_t *ids, const float *vals, double z, int vocab, const tsr_step *step,
                               const tsr_step_seq *seq, tsr_step_result *out, int *decided);

/* The inverse temperature tsr_forward_top needs for seq's row (1 for greedy; capped at FLT_MAX). */
float tsr_step_inv_temp(const tsr_step_seq *seq);

#endif
