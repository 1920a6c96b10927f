/* Greedy / temperature / top-k / top-p sampling (see sampler.h). */
#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>

void tsr_rng_seed(tsr_rng *r, uint64_t seed) { r->state = seed ^ 0x9E3779B97F4A7C15ull; }

/* splitmix64 */
static uint64_t next(tsr_rng *r)
{
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tsr_rng_uniform(tsr_rng *r) { return (double)(next(r) >> 11) * (1.0 / 9007199254740992.0); }

int32_t tsr_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

typedef struct {
    float p;
    int32_t id;
} cand;

static int by_prob_desc(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

tsr_status tsr_sample(const float *logits, int n, const tsr_sampling *p, tsr_rng *rng, int32_t *token)
{
    if (n <= 0) return tsr_fail(TSR_ERR_ARG, "sampler: empty vocabulary");
    if (!(p->temperature >= 0) || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1))
        return tsr_fail(TSR_ERR_ARG, "sampler: invalid parameters (temperature %g, top_k %d, top_p %g)", p->temperature,
                        p->top_k, p->top_p);
    if (p->temperature == 0 || p->top_k == 1) {
        *token = tsr_argmax(logits, n);
        return TSR_OK;
    }
    cand *c = malloc((size_t)n * sizeof *c);
    if (!c) return tsr_fail(TSR_ERR_NOMEM, "sampler: out of memory");
    float mx = logits[tsr_argmax(logits, n)];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        c[i].id = i;
        c[i].p = isfinite(logits[i]) ? expf((logits[i] - mx) / p->temperature) : 0.0f;
        sum += c[i].p;
    }
    qsort(c, (size_t)n, sizeof *c, by_prob_desc);
    int keep = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    if (p->top_p < 1) {
        double kept = 0;
        for (int i = 0; i < keep; i++) kept += c[i].p;
        double acc = 0;
        int k = 0;
        while (k < keep) {
            acc += c[k].p;
            k++;
            if (acc >= p->top_p * kept) break;
        }
        keep = k;
    }
    sum = 0;
    for (int i = 0; i < keep; i++) sum += c[i].p;
    double u = tsr_rng_uniform(rng) * sum, acc = 0;
    *token = c[keep - 1].id;
    for (int i = 0; i < keep; i++) {
        acc += c[i].p;
        if (u < acc) {
            *token = c[i].id;
            break;
        }
    }
    free(c);
    return TSR_OK;
}
