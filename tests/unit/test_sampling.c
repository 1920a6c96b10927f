/* The sampler (runtime/sampler.c) and the step sampler (runtime/step_sample.c) against references computed
 * differently: the float64 numpy transcription of HF's warpers in tests/fixtures/text/sampling-ref.json (written
 * by scripts/make-sampling-refs.py); a plain C reference below that sorts the whole vocabulary and follows HF's
 * code line by line (ascending sorts, -inf masks); empirical frequencies over many seeds against exact
 * probabilities (a chi-square bound; draws are deterministic, so the test is too); hand-computed penalties; the
 * previous qsort-based sampler for identical tokens; and log-probabilities against a double log-softmax. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/cpu/cpu_kernels.h"
#include "runtime/sampler.h"
#include "runtime/step.h"
#include "tests/common/fixtures.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567ull;
static double urand(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}
static double nrand(void)
{
    double u1 = urand(), u2 = urand();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}

static tsr_sampling params(float t, int k, float p, float mp, float typ)
{
    tsr_sampling s = tsr_sampling_default();
    s.temperature = t;
    s.top_k = k;
    s.top_p = p;
    s.min_p = mp;
    s.typical_p = typ;
    return s;
}

/* ---- a plain reference: HF's warpers over the whole vocabulary -------------------------------------------- */

typedef struct {
    double v;
    int id;
} vi;

static int by_v_asc(const void *a, const void *b)
{
    const vi *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return x->id > y->id ? -1 : x->id < y->id; /* ties: higher id first, so lower ids come last (kept) */
}

static void softmax_d(const double *s, int n, double *p)
{
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) m = s[i] > m ? s[i] : m;
    for (int i = 0; i < n; i++) z += p[i] = isfinite(s[i]) ? exp(s[i] - m) : 0;
    for (int i = 0; i < n; i++) p[i] /= z;
}

/* Final probabilities (penalties already applied to l). Returns 1 when a truncation decision is within `tol` of
 * its boundary (float rounding could go either way), 0 otherwise. */
static int ref_probs(const float *l, int n, const tsr_sampling *sp, double tol, double *out)
{
    if (sp->temperature == 0 || sp->top_k == 1) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (l[i] > l[best]) best = i;
        for (int i = 0; i < n; i++) out[i] = i == best;
        return 0;
    }
    double *s = calloc((size_t)n, sizeof *s), *p = calloc((size_t)n, sizeof *p);
    vi *o = malloc((size_t)n * sizeof *o);
    assert_true(n > 0 && s && p && o);
    int amb = 0;
    for (int i = 0; i < n; i++) s[i] = (double)l[i] / sp->temperature;
    if (sp->top_k > 0 && sp->top_k < n) { /* TopKLogitsWarper */
        for (int i = 0; i < n; i++) o[i] = (vi){s[i], i};
        qsort(o, (size_t)n, sizeof *o, by_v_asc);
        double kth = o[n - sp->top_k].v;
        double gap = o[n - sp->top_k].v - o[n - sp->top_k - 1].v; /* exact ties are kept, near ties ambiguous */
        if (gap > 0 && gap < tol * 10) amb = 1;
        for (int i = 0; i < n; i++)
            if (s[i] < kth) s[i] = -INFINITY;
    }
    if (sp->top_p < 1) { /* TopPLogitsWarper: ascending, remove cumulative <= 1 - top_p, keep the last */
        softmax_d(s, n, p);
        for (int i = 0; i < n; i++) o[i] = (vi){s[i], i};
        qsort(o, (size_t)n, sizeof *o, by_v_asc);
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += p[o[i].id];
            if (isfinite(o[i].v) && fabs(cum - (1 - (double)sp->top_p)) < tol) amb = 1;
            if (cum <= 1 - (double)sp->top_p && i < n - 1) s[o[i].id] = -INFINITY;
        }
    }
    if (sp->min_p > 0) { /* MinPLogitsWarper */
        softmax_d(s, n, p);
        double mx = 0;
        for (int i = 0; i < n; i++) mx = p[i] > mx ? p[i] : mx;
        double thr = sp->min_p * mx;
        for (int i = 0; i < n; i++) {
            if (p[i] > 0 && fabs(p[i] - thr) < tol * mx) amb = 1;
            if (p[i] < thr) s[i] = -INFINITY;
        }
    }
    if (sp->typical_p > 0 && sp->typical_p < 1) { /* TypicalLogitsWarper */
        softmax_d(s, n, p);
        double ent = 0;
        for (int i = 0; i < n; i++)
            if (p[i] > 0) ent -= p[i] * log(p[i]);
        for (int i = 0; i < n; i++) o[i] = (vi){p[i] > 0 ? fabs(-log(p[i]) - ent) : INFINITY, i};
        qsort(o, (size_t)n, sizeof *o, by_v_asc); /* any order among equal scores gives the same set */
        double cum = 0;
        int last = n - 1;
        for (int i = 0; i < n; i++) {
            cum += p[o[i].id];
            if (p[o[i].id] > 0 && fabs(cum - sp->typical_p) < tol) amb = 1;
            if (cum >= sp->typical_p) {
                last = i;
                break;
            }
        }
        double thr = o[last].v;
        for (int i = 0; i < n; i++) {
            if (isfinite(o[i].v) && o[i].v != thr && fabs(o[i].v - thr) < tol) amb = 1;
            if (o[i].v > thr && i > 0) s[o[i].id] = -INFINITY;
        }
    }
    softmax_d(s, n, out);
    free(s);
    free(p);
    free(o);
    return amb;
}

/* ---- HF transcription fixture ----------------------------------------------------------------------------- */

static void test_python_refs(void **state)
{
    (void)state;
    char path[4096];
    assert_non_null(tsr_fixture_path(path, sizeof path, "text/sampling-ref.json"));
    json_t *cases = json_load_file(path, 0, NULL);
    assert_true(json_is_array(cases) && json_array_size(cases) >= 15);
    size_t ci;
    json_t *c;
    json_array_foreach(cases, ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *jl = json_object_get(c, "logits"), *jp = json_object_get(c, "probs");
        int n = (int)json_array_size(jl);
        assert_int_equal(json_array_size(jp), (size_t)n);
        float l[64], got[64];
        double want[64];
        assert_true(n <= 64);
        for (int i = 0; i < n; i++) {
            l[i] = (float)json_number_value(json_array_get(jl, (size_t)i));
            want[i] = json_number_value(json_array_get(jp, (size_t)i));
        }
        tsr_sampling sp = {
            (float)json_number_value(json_object_get(c, "temperature")),
            (int)json_integer_value(json_object_get(c, "top_k")),
            (float)json_number_value(json_object_get(c, "top_p")),
            (float)json_number_value(json_object_get(c, "min_p")),
            (float)json_number_value(json_object_get(c, "typical_p")),
            (float)json_number_value(json_object_get(c, "repetition_penalty")),
            (float)json_number_value(json_object_get(c, "frequency_penalty")),
            (float)json_number_value(json_object_get(c, "presence_penalty")),
        };
        json_t *jh = json_object_get(c, "history"), *jb = json_object_get(c, "bias");
        int32_t hist[64];
        tsr_logit_bias bias[16];
        int nh = (int)json_array_size(jh), nb = (int)json_array_size(jb);
        for (int i = 0; i < nh; i++) hist[i] = (int32_t)json_integer_value(json_array_get(jh, (size_t)i));
        for (int i = 0; i < nb; i++) {
            json_t *e = json_array_get(jb, (size_t)i);
            bias[i] = (tsr_logit_bias){(int32_t)json_integer_value(json_array_get(e, 0)),
                                       (float)json_number_value(json_array_get(e, 1))};
        }
        int np = (int)json_integer_value(json_object_get(c, "n_prompt"));
        assert_int_equal(tsr_apply_penalties(l, n, &sp, hist, nh, np), TSR_OK);
        assert_int_equal(tsr_apply_logit_bias(l, n, bias, nb), TSR_OK);
        assert_int_equal(tsr_sampling_probs(l, n, &sp, got), TSR_OK);
        for (int i = 0; i < n; i++) {
            if ((want[i] == 0) != (got[i] == 0))
                fail_msg("%s: token %d kept by %s only (%g vs %g)", name, i, want[i] ? "HF" : "tessera", want[i],
                         got[i]);
            if (fabs(got[i] - want[i]) > 2e-6 + 2e-5 * want[i])
                fail_msg("%s: p[%d] = %.8g, HF %.8g", name, i, got[i], want[i]);
        }
        /* the draw is the inverse CDF of that distribution: a grid of u lands on each token p x N times */
        enum { N = 20000 };
        int count[64] = {0};
        for (int j = 0; j < N; j++) {
            int32_t t;
            assert_int_equal(tsr_sample_u(l, n, &sp, (j + 0.5) / N, &t), TSR_OK);
            assert_true(t >= 0 && t < n);
            count[t]++;
        }
        for (int i = 0; i < n; i++)
            if (fabs(count[i] - want[i] * N) > 2) fail_msg("%s: u grid hits token %d %d times, want %.1f", name, i,
                                                           count[i], want[i] * N);
    }
    json_decref(cases);
}

/* ---- each filter against the reference, small and large vocabularies ------------------------------------ */

static void fill_logits(float *l, int n, int peaks)
{
    for (int i = 0; i < n; i++) l[i] = (float)(1.5 * nrand());
    for (int j = 0; j < peaks; j++) l[(int)(urand() * n)] += (float)(6 + 2 * nrand()); /* an LLM-like head */
}

/* Decisions closer than this to their boundary are redrawn: tessera's float probabilities are within a few 1e-8 */
#define TOL 1e-7

static void check_against_ref(const float *l, int n, const tsr_sampling *sp, const char *what)
{
    double *want = malloc((size_t)n * sizeof *want);
    float *got = malloc((size_t)n * sizeof *got);
    assert_int_equal(ref_probs(l, n, sp, TOL, want), 0);
    assert_int_equal(tsr_sampling_probs(l, n, sp, got), TSR_OK);
    double sum = 0;
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if ((want[i] == 0) != (got[i] == 0))
            fail_msg("%s (n %d): token %d kept by %s only (%g vs %g)", what, n, i,
                     want[i] ? "the reference" : "tessera", want[i], got[i]);
        if (fabs(got[i] - want[i]) > 1e-7 + 1e-5 * want[i])
            fail_msg("%s (n %d): p[%d] = %.9g, reference %.9g", what, n, i, got[i], want[i]);
        sum += got[i];
        kept += got[i] > 0;
    }
    assert_true(fabs(sum - 1) < 1e-5);
    assert_true(kept >= 1);
    free(want);
    free(got);
}

static void test_filters_vs_reference(void **state)
{
    (void)state;
    const struct {
        tsr_sampling sp;
        const char *what;
    } cases[] = {
        {params(1.0f, 0, 1, 0, 0), "temperature 1"},
        {params(0.6f, 0, 1, 0, 0), "temperature 0.6"},
        {params(1.0f, 50, 1, 0, 0), "top-k 50"},
        {params(0.8f, 2, 1, 0, 0), "top-k 2"},
        {params(0.8f, 0, 0.9f, 0, 0), "top-p 0.9"},
        {params(1.2f, 0, 0.3f, 0, 0), "top-p 0.3"},
        {params(1.0f, 0, 0.999f, 0, 0), "top-p 0.999"}, /* small vocabularies only: the tail is a continuum */
        {params(1.0f, 0, 1, 0.05f, 0), "min-p 0.05"},
        {params(0.7f, 0, 1, 0.001f, 0), "min-p 0.001"},
        {params(1.0f, 0, 1, 0, 0.9f), "typical 0.9"},
        {params(1.3f, 0, 1, 0, 0.2f), "typical 0.2"},
        {params(1.0f, 40, 0.9f, 0, 0), "top-k 40 + top-p 0.9"},
        {params(0.9f, 1000, 0.95f, 0.01f, 0.95f), "top-k + top-p + min-p + typical"},
        {params(1.1f, 0, 0.8f, 0.1f, 0), "top-p + min-p"},
        {params(1.0f, 300, 1, 0.2f, 0), "top-k + min-p"},
        {params(0.9f, 5000, 1, 0, 0), "top-k 5000"},
        {params(1.0f, 3000, 0.97f, 0, 0), "top-k 3000 + top-p"},
    };
    const int sizes[] = {7, 100, 32000, 128256};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        float *l = malloc((size_t)n * sizeof *l);
        double *tmp = malloc((size_t)n * sizeof *tmp);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (cases[c].sp.top_k >= n || (cases[c].sp.top_p > 0.99f && n > 1000)) continue;
            int tries = 0;
            do { /* logits whose decisions are not on a knife's edge */
                fill_logits(l, n, n > 100 ? 40 : 1);
                if (++tries > 50) fail_msg("%s (n %d): no unambiguous logits", cases[c].what, n);
            } while (ref_probs(l, n, &cases[c].sp, TOL, tmp));
            check_against_ref(l, n, &cases[c].sp, cases[c].what);
        }
        free(l);
        free(tmp);
    }
}

/* The drawn token's interval in the CDF (decreasing probability) holds u, with slack for near-ties. */
static void test_draw_is_inverse_cdf(void **state)
{
    (void)state;
    const int n = 128256;
    float *l = malloc((size_t)n * sizeof *l);
    double *p = malloc((size_t)n * sizeof *p);
    vi *o = malloc((size_t)n * sizeof *o);
    const tsr_sampling cases[] = {params(1.0f, 0, 1, 0, 0), params(0.8f, 0, 0.9f, 0, 0), params(1.5f, 0, 1, 0, 0)};
    for (size_t c = 0; c < 3; c++) {
        do
            fill_logits(l, n, 40);
        while (ref_probs(l, n, &cases[c], TOL, p)); /* the same kept set on both sides */
        for (int i = 0; i < n; i++) o[i] = (vi){p[i], i};
        qsort(o, (size_t)n, sizeof *o, by_v_asc); /* ascending; walk from the top */
        for (int j = 0; j < 250; j++) {
            double u = j < 200 ? (j + 0.5) / 200 : urand();
            int32_t t;
            assert_int_equal(tsr_sample_u(l, n, &cases[c], u, &t), TSR_OK);
            assert_true(p[t] > 0);
            double lo = 0, hi = 0; /* mass strictly above t (beyond near-ties), and up to t (with near-ties) */
            for (int i = n - 1; i >= 0; i--) {
                if (o[i].v > p[t] * (1 + 1e-6)) lo += o[i].v;
                if (o[i].v >= p[t] * (1 - 1e-6)) hi += o[i].v;
            }
            if (!(u >= lo - 1e-7 && u <= hi + 1e-7))
                fail_msg("case %zu: u %.9f drew token %d whose CDF interval is [%.9f, %.9f]", c, u, t, lo, hi);
        }
    }
    free(l);
    free(p);
    free(o);
}

/* ---- frequencies over many seeds -------------------------------------------------------------------------- */

static int32_t step_draw(const float *logits, int n, const tsr_sampling *sp, uint64_t seed, uint32_t index,
                         const int32_t *hist, int nh, int np, const tsr_logit_bias *bias, int nb)
{
    float *l = malloc((size_t)n * sizeof *l);
    memcpy(l, logits, (size_t)n * sizeof *l);
    tsr_step_seq q = {.id = 1, .n_tokens = 1, .sample = 1, .n_logprobs = -1, .seed = seed, .sample_index = index,
                      .sampling = *sp, .hist0 = 0, .n_hist = nh, .n_hist_prompt = np, .bias0 = 0, .n_bias = nb};
    tsr_step st = {.version = TSR_STEP_VERSION, .n_seqs = 1, .seqs = &q, .hist = (int32_t *)hist, .n_hist = nh,
                   .bias = (tsr_logit_bias *)bias, .n_bias = nb};
    tsr_step_result r;
    tsr_status s = tsr_step_sample(l, n, &st, &q, &r);
    free(l);
    if (s != TSR_OK) fail_msg("tsr_step_sample: %s", tsr_last_error());
    return r.token;
}

static void test_frequencies(void **state)
{
    (void)state;
    enum { V = 24, N = 40000 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)(1.2 * nrand());
    int32_t hist[] = {3, 3, 5, 9, 9, 9, 14};
    tsr_logit_bias bias[] = {{7, 1.5f}, {20, -3.0f}};
    struct {
        tsr_sampling sp;
        int with_hist;
    } cases[] = {
        {params(1.0f, 0, 1, 0, 0), 0},     {params(0.7f, 6, 1, 0, 0), 0},     {params(1.0f, 0, 0.8f, 0, 0), 0},
        {params(1.0f, 0, 1, 0.1f, 0), 0},  {params(1.0f, 0, 1, 0, 0.7f), 0},  {params(1.4f, 10, 0.9f, 0.02f, 0), 1},
    };
    cases[5].sp.repetition_penalty = 1.4f;
    cases[5].sp.frequency_penalty = 0.3f;
    cases[5].sp.presence_penalty = 0.2f;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const tsr_sampling *sp = &cases[c].sp;
        float pl[V];
        memcpy(pl, l, sizeof pl);
        int nh = cases[c].with_hist ? 7 : 0, nb = cases[c].with_hist ? 2 : 0, np = cases[c].with_hist ? 2 : 0;
        assert_int_equal(tsr_apply_penalties(pl, V, sp, hist, nh, np), TSR_OK);
        assert_int_equal(tsr_apply_logit_bias(pl, V, bias, nb), TSR_OK);
        double want[V];
        assert_int_equal(ref_probs(pl, V, sp, 1e-9, want), 0);
        for (int mode = 0; mode < 2; mode++) { /* many seeds at one index; one seed at many indices */
            int count[V] = {0};
            for (int j = 0; j < N; j++) {
                int32_t t = mode == 0 ? step_draw(l, V, sp, (uint64_t)j * 7919u + 1, 3, hist, nh, np, bias, nb)
                                      : step_draw(l, V, sp, 42, (uint32_t)j, hist, nh, np, bias, nb);
                count[t]++;
            }
            double chi2 = 0;
            int df = -1;
            for (int i = 0; i < V; i++) {
                if (want[i] == 0) {
                    if (count[i]) fail_msg("case %zu: token %d is filtered out but was drawn %d times", c, i, count[i]);
                    continue;
                }
                double e = want[i] * N;
                chi2 += (count[i] - e) * (count[i] - e) / e;
                df++;
            }
            double bound = df + 6 * sqrt(2.0 * (df > 0 ? df : 1)) + 6;
            if (chi2 > bound) fail_msg("case %zu mode %d: chi-square %.1f over %d dof (bound %.1f)", c, mode, chi2, df,
                                       bound);
        }
    }
}

/* ---- penalties and bias against hand-computed values ------------------------------------------------------ */

static void test_penalties(void **state)
{
    (void)state;
    float l[7] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 0.0f, 1.0f};
    int32_t hist[] = {0, 1, /* generated: */ 2, 2, 4, 1, 99 /* beyond the vocabulary: ignored */};
    tsr_sampling sp = tsr_sampling_default();
    sp.repetition_penalty = 2.0f;
    sp.frequency_penalty = 0.5f;
    sp.presence_penalty = 0.25f;
    assert_int_equal(tsr_apply_penalties(l, 7, &sp, hist, 7, 2), TSR_OK);
    /* repetition over {0,1,2,4}: 2 -> 1, -1 -> -2, 0.5 -> 0.25, -2 -> -4; then over generated {2:2, 4:1, 1:1}:
     * minus count x 0.5 and 0.25 once */
    const float want[7] = {1.0f, -2.75f, -1.0f, 3.0f, -4.75f, 0.0f, 1.0f};
    for (int i = 0; i < 7; i++) assert_float_equal(l[i], want[i], 1e-6);

    /* only the repetition penalty; 0 and 1 mean off */
    float a[3] = {1.5f, -1.5f, 0.0f};
    tsr_sampling r = tsr_sampling_default();
    int32_t h2[] = {0, 1, 2, 0, 0};
    r.repetition_penalty = 1.5f;
    assert_int_equal(tsr_apply_penalties(a, 3, &r, h2, 5, 5), TSR_OK);
    assert_float_equal(a[0], 1.0f, 1e-6);
    assert_float_equal(a[1], -2.25f, 1e-6);
    assert_float_equal(a[2], 0.0f, 0);
    for (int k = 0; k < 2; k++) {
        float b[3] = {1.5f, -1.5f, 0.0f};
        r.repetition_penalty = k ? 1.0f : 0.0f;
        assert_int_equal(tsr_apply_penalties(b, 3, &r, h2, 5, 0), TSR_OK);
        assert_float_equal(b[0], 1.5f, 0);
        assert_float_equal(b[1], -1.5f, 0);
    }
    /* frequency/presence ignore prompt tokens */
    float c[3] = {0, 0, 0};
    tsr_sampling f = tsr_sampling_default();
    f.frequency_penalty = 1.0f;
    int32_t h3[] = {0, 0, 0, 1};
    assert_int_equal(tsr_apply_penalties(c, 3, &f, h3, 4, 3), TSR_OK);
    assert_float_equal(c[0], 0, 0);
    assert_float_equal(c[1], -1, 0);
    /* a negative history token fails and changes nothing */
    int32_t bad[] = {1, -3};
    float d[3] = {1, 2, 3};
    assert_int_equal(tsr_apply_penalties(d, 3, &f, bad, 2, 0), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "negative"));
    assert_float_equal(d[1], 2, 0);
    assert_int_equal(tsr_apply_penalties(d, 3, &f, bad, 2, 3), TSR_ERR_ARG); /* n_prompt > n_hist */

    /* bias adds up, and checks its tokens */
    float e[4] = {0, 1, 2, 3};
    tsr_logit_bias bs[] = {{1, 2.0f}, {3, -5.0f}, {1, 0.5f}};
    assert_int_equal(tsr_apply_logit_bias(e, 4, bs, 3), TSR_OK);
    assert_float_equal(e[1], 3.5f, 0);
    assert_float_equal(e[3], -2.0f, 0);
    tsr_logit_bias out_of_range[] = {{4, 1.0f}};
    assert_int_equal(tsr_apply_logit_bias(e, 4, out_of_range, 1), TSR_ERR_ARG);
    tsr_logit_bias not_finite[] = {{0, NAN}};
    assert_int_equal(tsr_apply_logit_bias(e, 4, not_finite, 1), TSR_ERR_ARG);
    assert_int_equal(tsr_logit_bias_check(bs, 3, 4), TSR_OK);
    assert_int_equal(tsr_logit_bias_check(out_of_range, 1, 4), TSR_ERR_ARG);
    tsr_logit_bias huge[] = {{0, 101.0f}};
    assert_int_equal(tsr_logit_bias_check(huge, 1, 4), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "[-100, 100]"));

    /* through the step: a +100 bias forces a token; the penalized favourite loses greedy */
    float g[4] = {5.0f, 4.9f, 0.0f, 1.0f};
    tsr_sampling gs = tsr_sampling_default();
    gs.temperature = 0;
    gs.repetition_penalty = 1.1f;
    int32_t gh[] = {0};
    assert_int_equal(step_draw(g, 4, &gs, 1, 0, gh, 1, 1, NULL, 0), 1);
    tsr_logit_bias force[] = {{2, 100.0f}};
    tsr_sampling hot = tsr_sampling_default();
    for (uint32_t i = 0; i < 50; i++) assert_int_equal(step_draw(g, 4, &hot, 9, i, NULL, 0, 0, force, 1), 2);
}

/* ---- greedy, determinism, the old sampler ----------------------------------------------------------------- */

static void test_greedy(void **state)
{
    (void)state;
    float ties[6] = {1, 5, 3, 5, -2, 5};
    tsr_sampling g = {.temperature = 0, .top_k = 0, .top_p = 1};
    tsr_rng rng;
    tsr_rng_seed(&rng, 1);
    int32_t t;
    assert_int_equal(tsr_sample(ties, 6, &g, &rng, &t), TSR_OK);
    assert_int_equal(t, 1);
    assert_int_equal(step_draw(ties, 6, &g, 5, 5, NULL, 0, 0, NULL, 0), 1);
    tsr_sampling k1 = tsr_sampling_default();
    k1.top_k = 1;
    assert_int_equal(step_draw(ties, 6, &k1, 5, 5, NULL, 0, 0, NULL, 0), 1);
    float probs[6];
    assert_int_equal(tsr_sampling_probs(ties, 6, &g, probs), TSR_OK);
    assert_true(probs[1] == 1 && probs[3] == 0 && probs[5] == 0);
    /* top-k keeps every token tied with the k-th, as HF does, on both selection paths */
    float kt[6] = {5, 4, 3, 3, 3, 1};
    tsr_sampling k3 = params(1, 3, 1, 0, 0);
    assert_int_equal(tsr_sampling_probs(kt, 6, &k3, probs), TSR_OK);
    for (int i = 0; i < 6; i++) assert_true((probs[i] > 0) == (i < 5));
    enum { NT_ = 20000 };
    float *tl = malloc(NT_ * sizeof *tl);
    float *tp = malloc(NT_ * sizeof *tp);
    double *want = malloc(NT_ * sizeof *want);
    for (int i = 0; i < NT_; i++) tl[i] = (float)((i * 37) % 100) / 10;
    for (int k = 150; k <= 3000; k += 2850) { /* heap (k <= 1024) and quickselect paths; 200 tokens per value */
        tsr_sampling sk = params(1, k, 1, 0, 0);
        ref_probs(tl, NT_, &sk, 0, want);
        assert_int_equal(tsr_sampling_probs(tl, NT_, &sk, tp), TSR_OK);
        int kept = 0;
        for (int i = 0; i < NT_; i++) {
            assert_true((tp[i] > 0) == (want[i] > 0));
            kept += tp[i] > 0;
        }
        assert_int_equal(kept, (k + 199) / 200 * 200);
    }
    free(tl);
    free(tp);
    free(want);
    /* tiny temperatures (down to denormal ones) keep the tied maxima only, each equally likely */
    const float tiny[] = {1e-6f, 1e-30f, 1e-40f};
    float tm[5] = {1, 3, 3, -2, 2.9999f};
    for (int i = 0; i < 3; i++) {
        tsr_sampling st = params(tiny[i], 0, 1, 0, 0);
        assert_int_equal(tsr_sampling_probs(tm, 5, &st, probs), TSR_OK);
        assert_float_equal(probs[1], 0.5, 1e-6);
        assert_float_equal(probs[2], 0.5, 1e-6);
        assert_float_equal(probs[0] + probs[3] + probs[4], 0, 0);
        st.top_p = 0.9f; /* the first of the two holds 0.5 < 0.9: both stay */
        assert_int_equal(tsr_sampling_probs(tm, 5, &st, probs), TSR_OK);
        assert_float_equal(probs[1], 0.5, 1e-6);
        assert_float_equal(probs[2], 0.5, 1e-6);
    }
    float nan_first[3] = {NAN, 1, 2};
    assert_int_equal(tsr_argmax(nan_first, 3), 2);
    /* -0 and +0 tie: the first wins, with and without a NaN in the row */
    float zeros[4] = {-1, -0.0f, 0.0f, -2};
    assert_int_equal(tsr_argmax(zeros, 4), 1);
    zeros[3] = NAN;
    assert_int_equal(tsr_argmax(zeros, 4), 1);
    /* long vocabularies: the first maximum across blocks */
    float *big = calloc(100000, sizeof *big);
    big[70001] = 3;
    big[99999] = 3;
    big[5] = 2;
    assert_int_equal(tsr_argmax(big, 100000), 70001);
    free(big);
}

/* The greedy pick path (tsr_step_pick_ok, tsr_step_sample_pick): which sequences may take it, and that it gives the
 * sampler's token and errors for the row's own argmax. */
static void test_pick(void **state)
{
    (void)state;
    tsr_step_seq q = {.id = 3, .n_tokens = 1, .sample = 1, .n_logprobs = -1, .sampling = tsr_sampling_default()};
    tsr_step st = {.version = TSR_STEP_VERSION, .n_seqs = 1, .seqs = &q};
    assert_false(tsr_step_pick_ok(&q)); /* temperature 1 samples */
    q.sampling.temperature = 0;
    assert_true(tsr_step_pick_ok(&q));
    q.sampling.temperature = 0.7f;
    q.sampling.top_k = 1;
    assert_true(tsr_step_pick_ok(&q));
    q.n_logprobs = 0; /* a logprob needs the whole row */
    assert_false(tsr_step_pick_ok(&q));
    q.n_logprobs = -1;
    q.sampling.presence_penalty = 0.5f; /* penalties change the row */
    assert_false(tsr_step_pick_ok(&q));
    q.sampling.presence_penalty = 0;
    q.n_bias = 1;
    assert_false(tsr_step_pick_ok(&q));
    q.n_bias = 0;
    q.sample = 0;
    assert_false(tsr_step_pick_ok(&q));
    q.sample = 1;

    float rows[3][6] = {{1, 5, 3, 5, -2, 5}, {NAN, -1, NAN, -0.5f, -3, -0.5f}, {NAN, NAN, NAN, NAN, NAN, NAN}};
    for (int r = 0; r < 3; r++) {
        float l[6];
        memcpy(l, rows[r], sizeof l);
        tsr_step_result full, picked;
        tsr_status want = tsr_step_sample(l, 6, &st, &q, &full);
        const int32_t id = tsr_argmax(rows[r], 6);
        assert_int_equal(tsr_step_sample_pick(id, rows[r][id], 6, &st, &q, &picked), want);
        if (want == TSR_OK) assert_int_equal(picked.token, full.token);
    }
    /* the same parameter checks as the sampler */
    q.sampling.top_p = 2;
    assert_int_equal(tsr_step_sample_pick(1, 5.0f, 6, &st, &q, &(tsr_step_result){0}), TSR_ERR_ARG);
    q.sampling.top_p = 1;
    /* a sequence that needs its row is refused */
    q.sampling.top_k = 0;
    assert_int_equal(tsr_step_sample_pick(1, 5.0f, 6, &st, &q, &(tsr_step_result){0}), TSR_ERR_ARG);
}

/* tsr_sample_top against tsr_sample_u over the whole row, with candidates and z from the CPU reference of the
 * device op (top_rows): rows flat and peaked, with ties, NaN and -inf entries, and a row shorter than the candidate
 * count; every filter; many draws. Every decided token is the whole row's; top-k and complete rows are always
 * decided, and the candidates decide most draws of peaked rows. */
static void test_top(void **state)
{
    (void)state;
    enum { N = 3000, SHORT = 50, DRAWS = 60 };
    static float row[N];
    const tsr_sampling cfg[] = {
        {.temperature = 0.8f, .top_p = 1},  {.temperature = 1, .top_k = 40, .top_p = 1},
        {.temperature = 0.7f, .top_p = 0.9f}, {.temperature = 1, .top_p = 0.95f, .min_p = 0.05f},
        {.temperature = 1, .top_p = 1, .min_p = 0.1f}, {.temperature = 1, .top_p = 1, .typical_p = 0.9f},
        {.temperature = 0.5f, .top_k = 20, .top_p = 0.8f}, {.temperature = 1.3f, .top_p = 0.5f, .typical_p = 0.5f},
        {.temperature = 0, .top_p = 1},
    };
    const int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    uint64_t r = 0x70D5EEDull;
    int decided_all = 0, total = 0, decided_peaked = 0, total_peaked = 0;
    for (int shape = 0; shape < 4; shape++) {
        const int n = shape == 3 ? SHORT : N;
        const float sigma = shape == 0 ? 1.0f : shape == 1 ? 4.0f : 24.0f;
        for (int i = 0; i < n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            float g = (float)((r >> 40) & 0xFFFF) / 65536.0f - 0.5f;
            row[i] = sigma * g * g * g * 8.0f; /* heavy upper tail: a few large logits */
        }
        row[7] = row[11] = row[13]; /* ties */
        row[5] = NAN;
        row[9] = -INFINITY;
        for (int c = 0; c < n_cfg; c++) {
            const tsr_sampling *p = &cfg[c];
            float inv = p->temperature > 0 ? 1.0f / p->temperature : 1.0f;
            int32_t ids[TSR_TOP_MAX];
            float vals[TSR_TOP_MAX], z;
            tsr_cpu_top_rows(row, 1, n, TSR_TOP_MAX, &inv, ids, vals, &z);
            int count = 0;
            while (count < TSR_TOP_MAX && ids[count] >= 0) count++;
            const tsr_top_row tr = {ids, vals, count, count < TSR_TOP_MAX, z};
            for (int d = 0; d < DRAWS; d++) {
                const double u = (d + 0.37) / DRAWS;
                int32_t tok = -1, want = -1;
                int decided = 0;
                assert_int_equal(tsr_sample_top(&tr, p, u, &tok, &decided), TSR_OK);
                assert_int_equal(tsr_sample_u(row, n, p, u, &want), TSR_OK);
                if (decided && tok != want)
                    fail_msg("shape %d config %d u %.4f: candidates drew %d, the row %d", shape, c, u, tok, want);
                if ((p->top_k > 0 && p->top_k < count) || shape == 3 || p->temperature == 0) assert_true(decided);
                decided_all += decided;
                total++;
                if (shape == 2) {
                    decided_peaked += decided;
                    total_peaked++;
                }
            }
        }
    }
    printf("tsr_sample_top: %d of %d draws decided by the candidates (%d of %d on the peaked row)\n", decided_all,
           total, decided_peaked, total_peaked);
    assert_true(decided_peaked * 2 > total_peaked);
    /* bad parameters fail as the sampler does; a non-finite top leaves the row to the sampler */
    int32_t ids[2] = {3, 1};
    float vals[2] = {INFINITY, 1};
    tsr_top_row bad = {ids, vals, 2, 1, 1.0};
    int32_t tok;
    int decided = 1;
    tsr_sampling p = tsr_sampling_default();
    assert_int_equal(tsr_sample_top(&bad, &p, 0.5, &tok, &decided), TSR_OK);
    assert_false(decided);
    p.top_p = 2;
    assert_int_equal(tsr_sample_top(&bad, &p, 0.5, &tok, &decided), TSR_ERR_ARG);
}

static void test_determinism(void **state)
{
    (void)state;
    /* the counter-based stream is the sequential one */
    tsr_rng r;
    tsr_rng_seed(&r, 77);
    for (uint64_t i = 0; i < 100; i++) assert_true(tsr_rng_uniform(&r) == tsr_rng_uniform_at(77, i));
    /* uniform and uncorrelated over indices and over seeds */
    enum { N = 50000, B = 20 };
    for (int mode = 0; mode < 2; mode++) {
        int bins[B] = {0};
        double prev = 0, sxy = 0, sx = 0, sxx = 0;
        for (int i = 0; i < N; i++) {
            double u = mode ? tsr_rng_uniform_at((uint64_t)i, 0) : tsr_rng_uniform_at(12345, (uint64_t)i);
            assert_true(u >= 0 && u < 1);
            bins[(int)(u * B)]++;
            if (i) sxy += (u - 0.5) * (prev - 0.5);
            sx += u;
            sxx += (u - 0.5) * (u - 0.5);
            prev = u;
        }
        double chi2 = 0, e = (double)N / B;
        for (int b = 0; b < B; b++) chi2 += (bins[b] - e) * (bins[b] - e) / e;
        assert_true(chi2 < 19 + 6 * sqrt(38.0));
        assert_true(fabs(sxy / sxx) < 0.03);
        assert_true(fabs(sx / N - 0.5) < 0.01);
    }
    /* same seed and index: same token, whatever else is in the step */
    enum { V = 1000 };
    float l[V];
    for (int i = 0; i < V; i++) l[i] = (float)nrand();
    tsr_sampling sp = params(1.0f, 0, 0.95f, 0, 0);
    int32_t alone = step_draw(l, V, &sp, 2024, 17, NULL, 0, 0, NULL, 0);
    assert_int_equal(step_draw(l, V, &sp, 2024, 17, NULL, 0, 0, NULL, 0), alone);
    tsr_step_seq qs[3] = {
        {.id = 10, .sample = 1, .n_logprobs = 5, .seed = 1, .sample_index = 0, .sampling = params(0.5f, 5, 1, 0, 0)},
        {.id = 11, .sample = 1, .n_logprobs = -1, .seed = 2024, .sample_index = 17, .sampling = sp},
        {.id = 12, .sample = 1, .n_logprobs = 2, .seed = 3, .sample_index = 9, .sampling = params(0, 0, 1, 0, 0)},
    };
    tsr_step st = {.version = TSR_STEP_VERSION, .n_seqs = 3, .seqs = qs};
    tsr_step_result res[3];
    for (int i = 0; i < 3; i++) {
        float c[V];
        memcpy(c, l, sizeof c);
        assert_int_equal(tsr_step_sample(c, V, &st, &qs[i], &res[i]), TSR_OK);
    }
    assert_int_equal(res[1].token, alone);
    /* different indices draw different tokens often (near-uniform over many tokens) */
    float flat[V];
    for (int i = 0; i < V; i++) flat[i] = 0;
    int same = 0;
    tsr_sampling one = tsr_sampling_default();
    int32_t first = step_draw(flat, 64, &one, 5, 0, NULL, 0, 0, NULL, 0);
    for (uint32_t i = 1; i < 200; i++) same += step_draw(flat, 64, &one, 5, i, NULL, 0, 0, NULL, 0) == first;
    assert_true(same < 15);
}

/* The sampler before this one (qsort of the whole vocabulary), kept to show tsr_sample draws the same tokens. */
typedef struct {
    float p;
    int32_t id;
} old_cand;
static int old_by_prob_desc(const void *a, const void *b)
{
    const old_cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}
static int32_t old_sample(const float *logits, int n, float temperature, int top_k, float top_p, tsr_rng *rng)
{
    if (temperature == 0 || top_k == 1) return tsr_argmax(logits, n);
    old_cand *c = malloc((size_t)n * sizeof *c);
    float mx = logits[tsr_argmax(logits, n)];
    for (int i = 0; i < n; i++) {
        c[i].id = i;
        c[i].p = isfinite(logits[i]) ? expf((logits[i] - mx) / temperature) : 0.0f;
    }
    qsort(c, (size_t)n, sizeof *c, old_by_prob_desc);
    int keep = top_k > 0 && top_k < n ? top_k : n;
    if (top_p < 1) {
        double kept = 0, acc = 0;
        for (int i = 0; i < keep; i++) kept += c[i].p;
        int k = 0;
        while (k < keep) {
            acc += c[k].p;
            k++;
            if (acc >= top_p * kept) break;
        }
        keep = k;
    }
    double sum = 0;
    for (int i = 0; i < keep; i++) sum += c[i].p;
    double u = tsr_rng_uniform(rng) * sum, acc = 0;
    int32_t token = c[keep - 1].id;
    for (int i = 0; i < keep; i++) {
        acc += c[i].p;
        if (u < acc) {
            token = c[i].id;
            break;
        }
    }
    free(c);
    return token;
}

static void test_same_tokens_as_before(void **state)
{
    (void)state;
    const struct {
        float t;
        int k;
        float p;
    } cases[] = {{1.0f, 0, 1.0f}, {0.7f, 0, 1.0f}, {0.8f, 40, 1.0f}, {1.0f, 0, 0.9f}, {0.6f, 50, 0.95f}, {0, 0, 1}};
    const int sizes[] = {50, 32000};
    int draws = 0, differ = 0;
    for (size_t si = 0; si < 2; si++) {
        int n = sizes[si];
        float *l = malloc((size_t)n * sizeof *l);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            /* as launcher/cmd_generate.c fills it: the first three fields, zeros after */
            tsr_sampling sp = {.temperature = cases[c].t, .top_k = cases[c].k, .top_p = cases[c].p};
            tsr_rng a, b;
            tsr_rng_seed(&a, 1000 + c);
            tsr_rng_seed(&b, 1000 + c);
            for (int j = 0; j < (n > 1000 ? 40 : 300); j++) {
                fill_logits(l, n, n > 1000 ? 30 : 1);
                int32_t t;
                assert_int_equal(tsr_sample(l, n, &sp, &a, &t), TSR_OK);
                differ += t != old_sample(l, n, cases[c].t, cases[c].k, cases[c].p, &b);
                draws++;
            }
        }
        free(l);
    }
    if (differ) fail_msg("%d of %d draws differ from the previous sampler", differ, draws);
}

/* ---- log-probabilities ------------------------------------------------------------------------------------ */

static void test_logprobs(void **state)
{
    (void)state;
    enum { V = 3000 };
    float l[V], c[V];
    for (int i = 0; i < V; i++) l[i] = (float)(2 * nrand());
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) m = l[i] > m ? l[i] : m;
    for (int i = 0; i < V; i++) z += exp(l[i] - m);
    double lse = m + log(z);
    int32_t hist[] = {5, 6, 7};
    tsr_logit_bias bias[] = {{11, 30.0f}};
    tsr_step_seq q = {.id = 1, .sample = 1, .n_logprobs = 20, .seed = 3, .sample_index = 0,
                      .sampling = params(0.9f, 0, 0.9f, 0, 0), .hist0 = 0, .n_hist = 3, .n_hist_prompt = 1,
                      .bias0 = 0, .n_bias = 1};
    q.sampling.repetition_penalty = 1.3f;
    tsr_step st = {.version = TSR_STEP_VERSION, .n_seqs = 1, .seqs = &q, .hist = hist, .n_hist = 3, .bias = bias,
                   .n_bias = 1};
    for (uint32_t idx = 0; idx < 30; idx++) {
        q.sample_index = idx;
        memcpy(c, l, sizeof c);
        tsr_step_result r;
        assert_int_equal(tsr_step_sample(c, V, &st, &q, &r), TSR_OK);
        assert_int_equal(r.token, 11); /* the bias wins, but its logprob is the model's */
        assert_float_equal(r.logprob, l[11] - lse, 2e-5);
        assert_int_equal(r.n_top, 20);
        for (int i = 0; i < 20; i++) {
            assert_float_equal(r.top_logprobs[i], l[r.top_ids[i]] - lse, 2e-5);
            if (i) assert_true(r.top_logprobs[i] <= r.top_logprobs[i - 1]);
        }
        int above = 0; /* they are the 20 largest */
        for (int i = 0; i < V; i++) above += l[i] > l[r.top_ids[19]];
        assert_int_equal(above, 19);
    }
    /* the whole small vocabulary: the log-probabilities sum to one */
    float s[8] = {0.5f, -1, 2, 2, 0, -3, 1, 0.25f};
    tsr_step_seq q8 = {.id = 2, .sample = 1, .n_logprobs = 20, .seed = 1, .sampling = params(1, 0, 1, 0, 0)};
    tsr_step st8 = {.version = TSR_STEP_VERSION, .n_seqs = 1, .seqs = &q8};
    tsr_step_result r8;
    assert_int_equal(tsr_step_sample(s, 8, &st8, &q8, &r8), TSR_OK);
    assert_int_equal(r8.n_top, 8);
    double acc = 0;
    int found = 0;
    for (int i = 0; i < 8; i++) {
        acc += exp(r8.top_logprobs[i]);
        if (r8.top_ids[i] == r8.token) {
            found = 1;
            assert_float_equal(r8.top_logprobs[i], r8.logprob, 0);
        }
    }
    assert_true(found);
    assert_float_equal(acc, 1.0, 1e-6);
    assert_int_equal(r8.top_ids[0], 2); /* tie 2 and 3: lower id first */
    assert_int_equal(r8.top_ids[1], 3);
    /* -1: no alternatives, 0: none either, but the token's logprob */
    q8.n_logprobs = -1;
    assert_int_equal(tsr_step_sample(s, 8, &st8, &q8, &r8), TSR_OK);
    assert_int_equal(r8.n_top, 0);
    assert_true(r8.logprob < 0 && r8.logprob > -10);
    /* a sequence that does not sample */
    q8.sample = 0;
    assert_int_equal(tsr_step_sample(s, 8, &st8, &q8, &r8), TSR_OK);
    assert_int_equal(r8.token, -1);
}

/* ---- parameters and bad input ----------------------------------------------------------------------------- */

static void expect_bad(tsr_sampling sp, const char *field)
{
    assert_int_equal(tsr_sampling_check(&sp), TSR_ERR_ARG);
    if (!strstr(tsr_last_error(), field)) fail_msg("message '%s' does not name %s", tsr_last_error(), field);
}

static void test_params(void **state)
{
    (void)state;
    tsr_sampling d = tsr_sampling_default();
    assert_true(d.temperature == 1 && d.top_k == 0 && d.top_p == 1 && d.min_p == 0 && d.typical_p == 1 &&
                d.repetition_penalty == 1 && d.frequency_penalty == 0 && d.presence_penalty == 0);
    assert_int_equal(tsr_sampling_check(&d), TSR_OK);
    tsr_sampling short_init = {.temperature = 0.7f, .top_k = 0, .top_p = 1.0f}; /* zeros after: all off */
    assert_int_equal(tsr_sampling_check(&short_init), TSR_OK);
    assert_false(tsr_sampling_uses_history(&short_init));
    tsr_sampling vllm = d;
    vllm.top_k = -1;
    assert_int_equal(tsr_sampling_check(&vllm), TSR_OK);
    tsr_sampling b;
    b = d, b.temperature = -0.1f, expect_bad(b, "temperature");
    b = d, b.temperature = INFINITY, expect_bad(b, "temperature");
    b = d, b.temperature = NAN, expect_bad(b, "temperature");
    b = d, b.top_k = -2, expect_bad(b, "top_k");
    b = d, b.top_p = 0, expect_bad(b, "top_p");
    b = d, b.top_p = 1.5f, expect_bad(b, "top_p");
    b = d, b.top_p = NAN, expect_bad(b, "top_p");
    b = d, b.min_p = -0.1f, expect_bad(b, "min_p");
    b = d, b.min_p = 1.1f, expect_bad(b, "min_p");
    b = d, b.typical_p = -0.5f, expect_bad(b, "typical_p");
    b = d, b.typical_p = 2, expect_bad(b, "typical_p");
    b = d, b.repetition_penalty = -1, expect_bad(b, "repetition_penalty");
    b = d, b.repetition_penalty = NAN, expect_bad(b, "repetition_penalty");
    b = d, b.frequency_penalty = 2.5f, expect_bad(b, "frequency_penalty");
    b = d, b.presence_penalty = -3, expect_bad(b, "presence_penalty");
    b = d, b.repetition_penalty = 1.2f;
    assert_true(tsr_sampling_uses_history(&b));

    /* invalid parameters fail tsr_sample too; rng untouched */
    float l[4] = {0, 1, 2, 3};
    int32_t t;
    tsr_rng rng;
    tsr_rng_seed(&rng, 1);
    b = d, b.top_p = 0;
    assert_int_equal(tsr_sample(l, 4, &b, &rng, &t), TSR_ERR_ARG);
    assert_int_equal(tsr_sample(l, 0, &d, &rng, &t), TSR_ERR_ARG);
    assert_int_equal(tsr_sample_u(l, 4, &d, 1.0, &t), TSR_ERR_ARG);
    /* logits the model should never produce */
    float allneg[3] = {-INFINITY, NAN, -INFINITY};
    assert_int_equal(tsr_sample(allneg, 3, &d, &rng, &t), TSR_ERR_ARG);
    float pinf[3] = {0, INFINITY, 1};
    assert_int_equal(tsr_sample(pinf, 3, &d, &rng, &t), TSR_ERR_ARG);
    float some_nan[4] = {NAN, 0, NAN, -INFINITY};
    for (int i = 0; i < 20; i++) {
        assert_int_equal(tsr_sample(some_nan, 4, &d, &rng, &t), TSR_OK);
        assert_int_equal(t, 1); /* NaN and -inf are never drawn */
    }

    /* bad plans fail with a message and never read out of bounds */
    float v[8] = {0};
    int32_t hist[2] = {1, 2};
    tsr_step_seq q = {.id = 7, .sample = 1, .n_logprobs = -1, .sampling = d, .hist0 = 1, .n_hist = 2};
    tsr_step st = {.version = TSR_STEP_VERSION, .n_seqs = 1, .seqs = &q, .hist = hist, .n_hist = 2};
    tsr_step_result r;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "history"));
    q.hist0 = 0, q.n_hist_prompt = 3;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_ERR_ARG);
    q.n_hist_prompt = 0, q.n_bias = 1;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "bias"));
    q.n_bias = 0, q.n_logprobs = TSR_MAX_LOGPROBS + 1;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_ERR_ARG);
    q.n_logprobs = -1;
    tsr_logit_bias bad_bias = {8, 1.0f};
    st.bias = &bad_bias, st.n_bias = 1, q.n_bias = 1;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_ERR_ARG);
    q.n_bias = 0, q.sampling.temperature = -1;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_ERR_ARG);
    assert_non_null(strstr(tsr_last_error(), "sequence 7"));
    q.sampling = d;
    v[3] = NAN;
    v[4] = INFINITY;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_ERR_ARG);
    v[4] = 0;
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_OK);
    assert_true(r.token != 3);
    tsr_sampler_release();
    assert_int_equal(tsr_step_sample(v, 8, &st, &q, &r), TSR_OK); /* the workspace comes back */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_refs),   cmocka_unit_test(test_filters_vs_reference),
        cmocka_unit_test(test_draw_is_inverse_cdf), cmocka_unit_test(test_frequencies),
        cmocka_unit_test(test_penalties),     cmocka_unit_test(test_greedy), cmocka_unit_test(test_pick),
        cmocka_unit_test(test_top),
        cmocka_unit_test(test_determinism),   cmocka_unit_test(test_same_tokens_as_before),
        cmocka_unit_test(test_logprobs),      cmocka_unit_test(test_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
