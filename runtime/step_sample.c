/* Sampling one sequence of a step plan (tsr_step_sample, declared in step.h).
 *
 * The last stage calls this for each sequence that samples. Log-probabilities are reported under the model's own
 * distribution, so they come from the untouched logits: the top n_logprobs entries, the log-sum-exp, and the raw
 * value of every token the penalties or biases are about to change are taken first. Then the sequence's
 * penalties (its history slice: n_hist_prompt prompt tokens, then generated ones) and biases are applied in place
 * and the sampler draws with the counter-based uniform tsr_rng_uniform_at(seed, sample_index): the token depends
 * only on the seed, the sample index and the logits, never on the rest of the batch. When nothing changes the
 * logits, the log-sum-exp comes after the draw, for free when the sampler already normalized at temperature 1.
 * Every slice is checked against the step's arrays first, so a bad plan fails with a message instead of reading
 * out of bounds. */
#include "runtime/step.h"

#include "kernels/ops.h"

#include <float.h>
#include <math.h>
#include <string.h>

#define TOP_BLOCK 64

/* Floats as integers in the same order (NaN with the sign bit clear above +inf): an integer maximum vectorizes. */
static inline int32_t okey(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) & 0x7FFFFFFFu));
}

/* The n largest entries that are not NaN, largest first, lower id first on ties. Once n are held, a block whose
 * maximum (an integer max over okey, vectorized) is not above the smallest held is skipped whole. */
static int top_n(const float *x, int vocab, int n, int32_t *ids, float *vals)
{
    int have = 0;
    for (int b = 0; b < vocab; b += TOP_BLOCK) {
        int e = b + TOP_BLOCK < vocab ? b + TOP_BLOCK : vocab;
        if (have == n) {
            int32_t bm = INT32_MIN;
            for (int i = b; i < e; i++) {
                int32_t k = okey(x[i]);
                bm = k > bm ? k : bm;
            }
            if (bm <= okey(vals[n - 1])) continue; /* NaNs may let a block through; the scan skips them */
        }
        for (int i = b; i < e; i++) {
            float v = x[i];
            if (v != v || (have == n && !(v > vals[n - 1]))) continue;
            int j = have < n ? have++ : n - 1;
            while (j > 0 && vals[j - 1] < v) {
                vals[j] = vals[j - 1];
                ids[j] = ids[j - 1];
                j--;
            }
            vals[j] = v;
            ids[j] = i;
        }
    }
    return have;
}

static int slice_ok(int32_t at, int32_t count, int32_t total, const void *base)
{
    return at >= 0 && count >= 0 && at <= total && count <= total - at && (count == 0 || base);
}

/* The checks every sampled sequence passes first: its logprob count, its history and bias slices, its
 * parameters. */
static tsr_status check_seq(const tsr_step *step, const tsr_step_seq *seq)
{
    unsigned long long id = (unsigned long long)seq->id;
    if (seq->n_logprobs < -1 || seq->n_logprobs > TSR_MAX_LOGPROBS)
        return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu asks for %d logprobs (at most %d)", id,
                        (int)seq->n_logprobs, TSR_MAX_LOGPROBS);
    if (!slice_ok(seq->hist0, seq->n_hist, step->n_hist, step->hist) || seq->n_hist_prompt < 0 ||
        seq->n_hist_prompt > seq->n_hist)
        return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu has a bad history slice (%d+%d of %d, %d prompt)", id,
                        (int)seq->hist0, (int)seq->n_hist, (int)step->n_hist, (int)seq->n_hist_prompt);
    if (!slice_ok(seq->bias0, seq->n_bias, step->n_bias, step->bias))
        return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu has a bad bias slice (%d+%d of %d)", id,
                        (int)seq->bias0, (int)seq->n_bias, (int)step->n_bias);
    tsr_status st = tsr_sampling_check(&seq->sampling);
    return st == TSR_OK ? TSR_OK : tsr_fail_context(st, "step sample: sequence %llu", id);
}

int tsr_step_pick_ok(const tsr_step_seq *seq)
{
    return seq->sample && seq->n_logprobs < 0 && seq->n_bias == 0 && tsr_sampling_is_greedy(&seq->sampling) &&
           !tsr_sampling_uses_history(&seq->sampling);
}

tsr_status tsr_step_sample_pick(int32_t token, float value, int vocab, const tsr_step *step, const tsr_step_seq *seq,
                                tsr_step_result *out)
{
    if (vocab <= 0 || !step || !seq || !out)
        return tsr_fail(TSR_ERR_ARG, "step sample: missing plan or result (vocabulary %d)", vocab);
    *out = (tsr_step_result){.token = -1};
    if (!seq->sample) return TSR_OK;
    TSR_TRY(check_seq(step, seq));
    if (!tsr_step_pick_ok(seq))
        return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu needs its whole logits row, not the greedy pick",
                        (unsigned long long)seq->id);
    /* as tsr_step_sample: a row without a finite maximum is an error */
    if (!isfinite(value) || token < 0 || token >= vocab)
        return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu: the logits are not finite",
                        (unsigned long long)seq->id);
    out->token = token;
    return TSR_OK;
}

int tsr_step_top_ok(const tsr_step_seq *seq)
{
    return seq->sample && seq->n_logprobs < 0 && seq->n_bias == 0 && !tsr_sampling_uses_history(&seq->sampling);
}

float tsr_step_inv_temp(const tsr_step_seq *seq)
{
    if (tsr_sampling_is_greedy(&seq->sampling)) return 1.0f;
    float inv = 1.0f / seq->sampling.temperature;
    return inv <= FLT_MAX ? inv : FLT_MAX;
}

tsr_status tsr_step_sample_top(const int32_t *ids, const float *vals, double z, int vocab, const tsr_step *step,
                               const tsr_step_seq *seq, tsr_step_result *out, int *decided)
{
    *decided = 0;
    if (vocab <= 0 || !step || !seq || !out || !ids || !vals)
        return tsr_fail(TSR_ERR_ARG, "step sample: missing candidates, plan or result (vocabulary %d)", vocab);
    *out = (tsr_step_result){.token = -1};
    if (!seq->sample) {
        *decided = 1;
        return TSR_OK;
    }
    TSR_TRY(check_seq(step, seq));
    unsigned long long id = (unsigned long long)seq->id;
    if (!tsr_step_top_ok(seq))
        return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu needs its whole logits row, not its candidates", id);
    int n = 0;
    while (n < TSR_TOP_MAX && ids[n] >= 0 && ids[n] < vocab) n++;
    const tsr_top_row row = {ids, vals, n, n < TSR_TOP_MAX || n == vocab, z};
    int32_t token;
    tsr_status st = tsr_sample_top(&row, &seq->sampling, tsr_rng_uniform_at(seq->seed, seq->sample_index), &token,
                                   decided);
    if (st != TSR_OK) return tsr_fail_context(st, "step sample: sequence %llu", id);
    if (*decided) out->token = token;
    return TSR_OK;
}

tsr_status tsr_step_sample(float *logits, int vocab, const tsr_step *step, const tsr_step_seq *seq,
                           tsr_step_result *out)
{
    if (!logits || vocab <= 0 || !step || !seq || !out)
        return tsr_fail(TSR_ERR_ARG, "step sample: missing logits, plan or result (vocabulary %d)", vocab);
    out->token = -1;
    out->logprob = 0;
    out->n_top = 0;
    if (!seq->sample) return TSR_OK;
    TSR_TRY(check_seq(step, seq));
    unsigned long long id = (unsigned long long)seq->id;
    const tsr_sampling *p = &seq->sampling;
    tsr_status st;

    const int32_t *hist = seq->n_hist ? step->hist + seq->hist0 : NULL;
    const tsr_logit_bias *bias = seq->n_bias ? step->bias + seq->bias0 : NULL;
    int n_hist = tsr_sampling_uses_history(p) ? seq->n_hist : 0;
    int n_bias = seq->n_bias;
    int modify = n_hist + n_bias > 0;

    /* the model's distribution, before anything changes the logits */
    int n_top = seq->n_logprobs < 0 ? 0 : seq->n_logprobs < vocab ? seq->n_logprobs : vocab;
    float vals[TSR_MAX_LOGPROBS];
    if (n_top > 0) n_top = top_n(logits, vocab, n_top, out->top_ids, vals);
    double lse = NAN;
    float *raw = NULL;
    if (modify) {
        lse = tsr_logsumexp(logits, vocab);
        /* raw values of the tokens about to change, in history order then bias order */
        raw = tsr_sampler_scratch((size_t)n_hist + (size_t)n_bias);
        if (!raw) return TSR_ERR_NOMEM;
        for (int i = 0; i < n_hist; i++) raw[i] = hist[i] >= 0 && hist[i] < vocab ? logits[hist[i]] : 0.0f;
        for (int i = 0; i < n_bias; i++)
            raw[n_hist + i] = bias[i].token >= 0 && bias[i].token < vocab ? logits[bias[i].token] : 0.0f;
        if (n_hist && (st = tsr_apply_penalties(logits, vocab, p, hist, n_hist, seq->n_hist_prompt)) != TSR_OK)
            return tsr_fail_context(st, "step sample: sequence %llu", id);
        if (n_bias && (st = tsr_apply_logit_bias(logits, vocab, bias, n_bias)) != TSR_OK)
            return tsr_fail_context(st, "step sample: sequence %llu", id);
    }

    int32_t token;
    double lse_free;
    st = tsr_sample_u_lse(logits, vocab, p, tsr_rng_uniform_at(seq->seed, seq->sample_index), &token, &lse_free);
    if (st != TSR_OK) return tsr_fail_context(st, "step sample: sequence %llu", id);
    if (!modify && seq->n_logprobs < 0 && isnan(lse_free)) {
        /* no log-probabilities asked for: skip the pass over the vocabulary they would cost */
        if (!isfinite(logits[token]))
            return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu: the logits are not finite", id);
        out->token = token;
        return TSR_OK;
    }
    if (!modify) lse = isnan(lse_free) ? tsr_logsumexp(logits, vocab) : lse_free; /* the logits are still raw */
    if (!isfinite(lse))
        return tsr_fail(TSR_ERR_ARG, "step sample: sequence %llu: the logits are %s", id,
                        lse > 0 ? "+inf somewhere" : "all -inf or NaN");
    for (int i = 0; i < n_top; i++) out->top_logprobs[i] = (float)((double)vals[i] - lse);

    float chosen = logits[token];
    if (raw) {
        int found = 0;
        for (int i = 0; i < n_hist && !found; i++)
            if (hist[i] == token) {
                chosen = raw[i];
                found = 1;
            }
        for (int i = 0; i < n_bias && !found; i++)
            if (bias[i].token == token) {
                chosen = raw[n_hist + i];
                found = 1;
            }
    }
    out->token = token;
    out->logprob = (float)((double)chosen - lse);
    out->n_top = n_top;
    return TSR_OK;
}
