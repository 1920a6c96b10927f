/* Token sampling on the CPU: penalties, logit bias, greedy or temperature with top-k, top-p, min-p and typical-p
 * truncation, drawn with a counter-based random stream.
 *
 * Order (vLLM's and HF's order of warpers): 1. penalties over the token history (repetition: HF rule over prompt
 * and generated tokens, logit > 0 ? logit / r : logit * r, once per distinct token; then frequency and presence:
 * OpenAI rule over generated tokens, logit -= count x frequency + (count > 0) x presence); 2. logit bias (added);
 * 3. greedy when temperature is 0 (or top_k is 1): the first index of the maximum, as torch.argmax does;
 * otherwise 4. logits / temperature, softmax; 5. top-k: keep the k most probable tokens and any tied with the
 * k-th (HF TopKLogitsWarper); 6. top-p over what top-k kept: the smallest prefix, in order of decreasing
 * probability, whose mass reaches top_p (HF TopPLogitsWarper); 7. min-p: drop tokens below min_p x the top
 * probability (HF MinPLogitsWarper); 8. typical-p (HF TypicalLogitsWarper) over what is left; 9. renormalize and
 * draw: u in [0, 1) times the kept mass, walked in order of decreasing probability (ties: lower id first).
 *
 * Step 5 keeps ties by logit, as HF does (top_k 1 is greedy, first maximum); NaN logits count as -inf (never
 * drawn), a +inf logit fails. A tiny nonzero temperature still samples uniformly among tied maxima.
 *
 * "Off" values: top_k 0 (or -1, vLLM's spelling), top_p 1, min_p 0, typical_p 0 or 1 (the sampler treats any
 * value <= 0 or >= 1 as off; tsr_sampling_check rejects those outside [0, 1]), repetition_penalty 1 or 0,
 * frequency/presence 0. So a struct that sets only its first fields (`{.temperature = t, .top_k = k, .top_p =
 * p}`, zeros after) samples with exactly those three, and draws the tokens the earlier sort-everything sampler
 * drew for them (same walk, same uniforms; only a u within ~1e-9 of a boundary between two tokens can differ).
 *
 * The work is linear in the vocabulary and nothing sorts it: probabilities are computed once in a vectorizable
 * pass; truncation gathers only the tokens above a probability threshold that provably contains the kept set, and
 * top-k, top-p and the draw are selections on those (sampler.c). Scratch memory is one workspace per thread,
 * grown on demand and freed when the thread exits. */
#ifndef TSR_SAMPLER_H
#define TSR_SAMPLER_H

#include "runtime/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tsr_sampling {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off: drop tokens below min_p x the top probability */
    float typical_p;          /* 1 = off: locally typical sampling */
    float repetition_penalty; /* 1 = off: HF rule over prompt and generated tokens */
    float frequency_penalty;  /* 0 = off: OpenAI rule, count x penalty over generated tokens */
    float presence_penalty;   /* 0 = off: OpenAI rule, penalty once per generated token id */
} tsr_sampling;

/* One logit_bias entry of a request: added to the token's logit before sampling. */
typedef struct tsr_logit_bias {
    int32_t token;
    float bias;
} tsr_logit_bias;

/* Parameters that change nothing: greedy off, every filter and penalty neutral, temperature 1. */
tsr_sampling tsr_sampling_default(void);

typedef struct tsr_rng {
    uint64_t state;
} tsr_rng;

void tsr_rng_seed(tsr_rng *r, uint64_t seed);
/* Uniform double in [0, 1). */
double tsr_rng_uniform(tsr_rng *r);

/* Index of the largest logit (first on ties; NaN entries are skipped; 0 when every entry is NaN). */
int32_t tsr_argmax(const float *logits, int n);

/* Samples one token with tsr_rng_uniform(rng) (no draw is consumed for greedy). No history and no bias: penalties
 * do nothing here. Fails on invalid parameters, an empty vocabulary, or logits with no finite entry or a +inf. */
tsr_status tsr_sample(const float *logits, int n, const tsr_sampling *p, tsr_rng *rng, int32_t *token);

/* A logits row known only by its best entries (ops.h top_rows): n candidates, ids and logits, largest first (-0
 * below +0, the lower id first on ties), no other entry above the last one (NaN aside; entries equal to the last
 * may be missing, as in lists merged from several devices); complete when they are every non-NaN entry of the row; z =
 * the sum over the whole row of exp((l - max) / T) at the draw's temperature T (with 1 / T capped at FLT_MAX, as the
 * sampler caps it). */
typedef struct tsr_top_row {
    const int32_t *ids;
    const float *vals;
    int n, complete;
    double z;
} tsr_top_row;

/* tsr_sample_u for a row known by its candidates: *decided = 1 with the token when they decide the draw, 0 when
 * the whole row is needed (sample that with tsr_sample_u). They decide: greedy; top-k with the k-th candidate
 * above the last one (all its ties are then in); min-p alone whose threshold lies above the last candidate;
 * top-p whose nucleus ends inside the candidates (not on a tie); plain temperature when the draw lands on a
 * candidate; any filter when the row is complete. The token is tsr_sample_u's over the whole row, except that z
 * instead of the row's own sum sets top-p's mass and the plain draw's target: a u within about 1e-6 (relative) of
 * a boundary between two tokens may pick the neighbour. Typical-p with neither top-k, top-p nor min-p always needs
 * the row (its center is a mean over all of it), as does a non-finite maximum. Fails on invalid parameters or u,
 * as tsr_sample_u does. */
tsr_status tsr_sample_top(const tsr_top_row *row, const tsr_sampling *p, double u, int32_t *token, int *decided);

/* Checks a tsr_sampling for a request front door; TSR_ERR_ARG with a message naming the field and the allowed
 * range: temperature finite >= 0; top_k >= -1; top_p in (0, 1]; min_p and typical_p in [0, 1]; repetition_penalty
 * finite >= 0; frequency_penalty and presence_penalty in [-2, 2] (OpenAI's range). */
tsr_status tsr_sampling_check(const tsr_sampling *p);

/* Checks a request's logit biases: tokens in [0, vocab) (vocab <= 0 skips that check), biases finite and in
 * [-100, 100] (OpenAI's range). */
tsr_status tsr_logit_bias_check(const tsr_logit_bias *bias, int n_bias, int vocab);

/* Whether p picks greedily: temperature 0 or top_k 1 (then the token is the first index of the largest logit). */
int tsr_sampling_is_greedy(const tsr_sampling *p);

/* Whether p needs the token history (a repetition, frequency or presence penalty is active). */
int tsr_sampling_uses_history(const tsr_sampling *p);

/* Applies the penalties of p in place. hist holds n_hist tokens: the first n_prompt are the prompt's, the rest
 * were generated. The repetition penalty covers all of them, frequency and presence only the generated ones.
 * History ids >= n are ignored (as HF does for ids beyond the output vocabulary); a negative id fails. */
tsr_status tsr_apply_penalties(float *logits, int n, const tsr_sampling *p, const int32_t *hist, int n_hist,
                               int n_prompt);

/* Adds the biases in place (repeated tokens add up). Fails on a token outside [0, n) or a non-finite bias. */
tsr_status tsr_apply_logit_bias(float *logits, int n, const tsr_logit_bias *bias, int n_bias);

/* The token that uniform u in [0, 1) selects from the distribution tsr_sampling_probs describes (steps 3-9 above;
 * logits already penalized and biased). Greedy ignores u. */
tsr_status tsr_sample_u(const float *logits, int n, const tsr_sampling *p, double u, int32_t *token);

/* tsr_sample_u that also sets *lse to log(sum(exp(logits))) when computing it cost nothing extra (temperature 1
 * and no top-k or min-p-only truncation, so the softmax ran over the whole vocabulary), to NaN otherwise. It
 * equals tsr_logsumexp(logits, n) exactly (same code, same order of operations). */
tsr_status tsr_sample_u_lse(const float *logits, int n, const tsr_sampling *p, double u, int32_t *token,
                            double *lse);

/* The final distribution over the n tokens (steps 3-9; logits already penalized and biased): probs[i] is 0 for
 * removed tokens and the kept ones sum to 1; one-hot for greedy. Shares the truncation code of tsr_sample_u; for
 * tests and diagnostics. */
tsr_status tsr_sampling_probs(const float *logits, int n, const tsr_sampling *p, float *probs);

/* The index-th uniform (0-based) of the stream tsr_rng_seed(seed) produces: a pure function of (seed, index),
 * so a sequence's draw does not depend on what else ran. */
double tsr_rng_uniform_at(uint64_t seed, uint64_t index);

/* log(sum(exp(x))) over n entries (NaN entries count as -inf): -inf when no entry is finite, +inf when one is
 * +inf. Vectorized; about 1e-7 relative accuracy in each exponential. */
double tsr_logsumexp(const float *x, int n);

/* This thread's spare float buffer of at least n entries, for callers of the sampler (the sampler functions never
 * touch it); valid until the next call with a larger n or tsr_sampler_release(). NULL (message set) when out of
 * memory. */
float *tsr_sampler_scratch(size_t n);

/* Frees this thread's sampling workspace now (it is otherwise freed when the thread exits). */
void tsr_sampler_release(void);

#endif
