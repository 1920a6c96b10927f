/* The CPU sampler (see sampler.h for the order of operations and what counts as "off").
 *
 * It runs for every sequence at every decode step over vocabularies of 32k-152k tokens, so the work is linear in
 * the vocabulary, the hot loops are written to vectorize (a branch-free exponential, selects done on bits, sums
 * in fixed lanes), and the vocabulary is never sorted. Candidates travel as 64-bit keys: probability bits
 * descending, then token id, so the key order is the draw order. With top-k, a heap that skips whole blocks whose
 * largest logit cannot enter picks the k best logits (and ties), and only they get an exponential; min-p alone
 * gathers the logits above a threshold just below its bound; otherwise one pass computes e[i] = exp((l[i] - max)
 * / T) and their sum, and a counting pass picks a threshold tau whose set {e >= tau} provably holds everything
 * top-p and min-p keep. Top-p and the draw are a weighted quickselect, which follows the probability mass instead
 * of the rank (linear on average); typical-p ranks by |u - c| (u = (l - max) / T, c its mean under the
 * distribution), bounded the same way. Plain temperature sampling finds the shell [tau_j, tau_j-1) that holds the
 * drawn position and gathers just that. Draws land where a walk in order of decreasing probability (ties: lower
 * id first) would, as the earlier sort-everything sampler did, so a seed gives the same tokens as before for
 * temperature, top-k and top-p (up to rounding where u falls within ~1e-9 of a boundary). Scratch memory is one
 * workspace per thread, grown on demand and freed by a pthread key destructor at thread exit. */
#include "runtime/sampler.h"
#include "runtime/half.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers -------------------------------------------------------------------------------------- */

#define GOLDEN 0x9E3779B97F4A7C15ull

void tsr_rng_seed(tsr_rng *r, uint64_t seed) { r->state = seed ^ GOLDEN; }

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* splitmix64: the state advances by a constant, so the i-th output is a function of (seed, i) alone */
static uint64_t next(tsr_rng *r) { return mix64(r->state += GOLDEN); }

static double to_unit(uint64_t x) { return (double)(x >> 11) * (1.0 / 9007199254740992.0); }

double tsr_rng_uniform(tsr_rng *r) { return to_unit(next(r)); }

double tsr_rng_uniform_at(uint64_t seed, uint64_t index)
{
    return to_unit(mix64((seed ^ GOLDEN) + (index + 1) * GOLDEN));
}

/* ---- parameters ------------------------------------------------------------------------------------------ */

tsr_sampling tsr_sampling_default(void)
{
    return (tsr_sampling){.temperature = 1.0f,
                          .top_k = 0,
                          .top_p = 1.0f,
                          .min_p = 0.0f,
                          .typical_p = 1.0f,
                          .repetition_penalty = 1.0f,
                          .frequency_penalty = 0.0f,
                          .presence_penalty = 0.0f};
}

tsr_status tsr_sampling_check(const tsr_sampling *p)
{
    if (!p) return tsr_fail(TSR_ERR_ARG, "sampling: no parameters");
    if (!(p->temperature >= 0) || !isfinite(p->temperature))
        return tsr_fail(TSR_ERR_ARG, "sampling: temperature must be a finite number >= 0 (0 = greedy), got %g",
                        p->temperature);
    if (p->top_k < -1)
        return tsr_fail(TSR_ERR_ARG, "sampling: top_k must be >= 0 (0 or -1 = off), got %d", p->top_k);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return tsr_fail(TSR_ERR_ARG, "sampling: top_p must be in (0, 1] (1 = off), got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return tsr_fail(TSR_ERR_ARG, "sampling: min_p must be in [0, 1] (0 = off), got %g", p->min_p);
    if (!(p->typical_p >= 0 && p->typical_p <= 1))
        return tsr_fail(TSR_ERR_ARG, "sampling: typical_p must be in [0, 1] (0 or 1 = off), got %g", p->typical_p);
    if (!(p->repetition_penalty >= 0) || !isfinite(p->repetition_penalty))
        return tsr_fail(TSR_ERR_ARG, "sampling: repetition_penalty must be a finite number >= 0 (0 or 1 = off), got %g",
                        p->repetition_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return tsr_fail(TSR_ERR_ARG, "sampling: frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return tsr_fail(TSR_ERR_ARG, "sampling: presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    return TSR_OK;
}

tsr_status tsr_logit_bias_check(const tsr_logit_bias *bias, int n_bias, int vocab)
{
    if (n_bias < 0 || (n_bias > 0 && !bias)) return tsr_fail(TSR_ERR_ARG, "logit_bias: bad list (%d entries)", n_bias);
    for (int i = 0; i < n_bias; i++) {
        if (bias[i].token < 0 || (vocab > 0 && bias[i].token >= vocab))
            return tsr_fail(TSR_ERR_ARG, "logit_bias: token %d is outside the vocabulary (%d tokens)",
                            (int)bias[i].token, vocab);
        if (!(bias[i].bias >= -100 && bias[i].bias <= 100))
            return tsr_fail(TSR_ERR_ARG, "logit_bias: the bias of token %d must be in [-100, 100], got %g",
                            (int)bias[i].token, bias[i].bias);
    }
    return TSR_OK;
}

static int rep_active(const tsr_sampling *p) { return p->repetition_penalty > 0 && p->repetition_penalty != 1; }

int tsr_sampling_uses_history(const tsr_sampling *p)
{
    return rep_active(p) || p->frequency_penalty != 0 || p->presence_penalty != 0;
}

int tsr_sampling_is_greedy(const tsr_sampling *p) { return p->temperature == 0 || p->top_k == 1; }

/* ---- per-thread workspace -------------------------------------------------------------------------------- */

typedef struct workspace {
    size_t cap;      /* entries of e, keys and cnt */
    float *e;        /* exp((l - max) / T) */
    uint64_t *keys;  /* candidate tokens: (probability bits descending) << 32 | id */
    int32_t *cnt;    /* penalty counts; all zero between calls */
    size_t spare_cap;
    float *spare;    /* tsr_sampler_scratch() */
} workspace;

static pthread_key_t ws_key;
static pthread_once_t ws_once = PTHREAD_ONCE_INIT;
static int ws_key_ok;
static _Thread_local workspace *tls_ws;

static void ws_destroy(void *v)
{
    workspace *w = v;
    if (!w) return;
    free(w->e);
    free(w->keys);
    free(w->cnt);
    free(w->spare);
    free(w);
}

static void ws_key_init(void) { ws_key_ok = pthread_key_create(&ws_key, ws_destroy) == 0; }

void tsr_sampler_release(void)
{
    if (!tls_ws) return;
    if (ws_key_ok) pthread_setspecific(ws_key, NULL);
    ws_destroy(tls_ws);
    tls_ws = NULL;
}

/* This thread's workspace with room for n tokens, or NULL (message set) when memory runs out. */
static workspace *ws_get(size_t n)
{
    if (!tls_ws) {
        pthread_once(&ws_once, ws_key_init);
        tls_ws = calloc(1, sizeof *tls_ws);
        if (!tls_ws) {
            tsr_fail(TSR_ERR_NOMEM, "sampler: out of memory");
            return NULL;
        }
        if (ws_key_ok) pthread_setspecific(ws_key, tls_ws);
    }
    workspace *w = tls_ws;
    if (w->cap < n) {
        size_t cap = n < 4096 ? 4096 : n;
        float *e = malloc(cap * sizeof *e);
        uint64_t *keys = malloc(cap * sizeof *keys);
        int32_t *cnt = calloc(cap, sizeof *cnt);
        if (!e || !keys || !cnt) {
            free(e);
            free(keys);
            free(cnt);
            tsr_fail(TSR_ERR_NOMEM, "sampler: out of memory for a vocabulary of %zu", n);
            return NULL;
        }
        free(w->e);
        free(w->keys);
        free(w->cnt);
        w->e = e;
        w->keys = keys;
        w->cnt = cnt;
        w->cap = cap;
    }
    return w;
}

float *tsr_sampler_scratch(size_t n)
{
    workspace *w = ws_get(0);
    if (!w) return NULL;
    if (w->spare_cap < n || !w->spare) {
        size_t cap = n < 256 ? 256 : n;
        float *s = malloc(cap * sizeof *s);
        if (!s) {
            tsr_fail(TSR_ERR_NOMEM, "sampler: out of memory");
            return NULL;
        }
        free(w->spare);
        w->spare = s;
        w->spare_cap = cap;
    }
    return w->spare;
}

/* ---- vectorizable kernels -------------------------------------------------------------------------------- */

#define LANES 16

/* Selects are done on the bits (half.h's tsr_bits_from_f32 and tsr_f32_from_bits): GCC (without
 * -fno-trapping-math) will not if-convert a float select next to arithmetic that may trap, and then leaves the loop
 * scalar. */
static inline float blend(int c, float a, float b)
{
    uint32_t m = -(uint32_t)c;
    return tsr_f32_from_bits((tsr_bits_from_f32(a) & m) | (tsr_bits_from_f32(b) & ~m));
}

/* e^x for x <= 0: Cephes' expf polynomial after rounding x / ln 2 to an integer with the 1.5 x 2^23 trick, all
 * branch-free so loops over it vectorize. Within 1 ulp of expf (equal to it for 99% of inputs), unbiased; 0 at
 * -87 and below, and for NaN. */
static inline float exp_neg(float x)
{
    int in = isgreater(x, -87.0f); /* quiet comparison: false for NaN */
    float xc = blend(in, x, -87.0f);
    float t = xc * 1.44269504088896341f;
    float r = (t + 12582912.0f) - 12582912.0f;
    float f = xc - r * 0.693359375f;
    f = f - r * -2.12194440e-4f;
    float z = f * f;
    float y = 1.9875691500e-4f;
    y = y * f + 1.3981999507e-3f;
    y = y * f + 8.3334519073e-3f;
    y = y * f + 4.1665795894e-2f;
    y = y * f + 1.6666665459e-1f;
    y = y * f + 5.0000001201e-1f;
    y = y * z + f + 1.0f;
    y = y * tsr_f32_from_bits((uint32_t)((int32_t)r + 127) << 23);
    return blend(in, y, 0.0f);
}

/* Floats as integers in the same order (-0 < +0 aside): the integer maximum vectorizes, the float one does not. */
static inline int32_t okey(float x)
{
    uint32_t u = tsr_bits_from_f32(x);
    return (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) & 0x7FFFFFFFu));
}

#define ARGMAX_BLOCK 64
#define TOP_ROW_MAX 256 /* candidates tsr_sample_top takes at most */
#define OKEY_PINF 0x7F800000 /* okey(+inf); larger keys are NaNs with the sign bit clear */

/* Index of the first maximum, NaN skipped (-1 when every entry is NaN). */
static int argmax_of(const float *x, int n)
{
    int32_t best = INT32_MIN;
    int block = -1;
    for (int b = 0; b < n; b += ARGMAX_BLOCK) {
        int e = b + ARGMAX_BLOCK < n ? b + ARGMAX_BLOCK : n;
        int32_t bm = INT32_MIN;
        for (int i = b; i < e; i++) {
            int32_t k = okey(x[i]);
            bm = k > bm ? k : bm;
        }
        if (bm > best || block < 0) {
            best = bm;
            block = b;
        }
    }
    /* a NaN won, or the maximum is +0, which the keys order above an earlier -0 that ties with it: take the slow
     * path, which skips NaNs and compares values */
    if (best > OKEY_PINF || best == 0) {
        int at = -1;
        for (int i = 0; i < n; i++)
            if (x[i] == x[i] && (at < 0 || x[i] > x[at])) at = i;
        return at;
    }
    for (int i = block; i < n; i++)
        if (okey(x[i]) == best) return x[i] == x[i] ? i : -1;
    return -1;
}

/* Largest entry, NaN skipped (-inf when there is none). */
static float max_of(const float *x, int n)
{
    int i = argmax_of(x, n);
    return i < 0 ? -INFINITY : x[i];
}

int32_t tsr_argmax(const float *logits, int n)
{
    int i = n > 0 ? argmax_of(logits, n) : -1;
    return i < 0 ? 0 : i;
}

/* Sums run in LANES double accumulators (float partial sums lose the small terms next to the large ones: a few
 * 1e-8 of the total, enough to move draws off the old sampler's), block by block; the order of operations is
 * fixed by the code, not by the vector width, so results are the same on every machine. */
#define BLOCK 256

static double lanes_total(const double *s)
{
    double t = 0;
    for (int j = 0; j < LANES; j++) t += s[j];
    return t;
}

/* e[i] = exp((l[i] - m) x inv), inv = 1 / temperature; returns their sum. m must be the finite maximum. */
static double exp_pass(const float *l, int n, float m, float inv, float *e)
{
    double total = 0;
    int i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        for (int j = 0; j < BLOCK; j++) e[i + j] = exp_neg((l[i + j] - m) * inv);
        double s[LANES] = {0};
        for (int b = 0; b < BLOCK; b += LANES)
            for (int j = 0; j < LANES; j++) s[j] += e[i + b + j];
        total += lanes_total(s);
    }
    for (; i < n; i++) total += e[i] = exp_neg((l[i] - m) * inv);
    return total;
}

double tsr_logsumexp(const float *x, int n)
{
    if (n <= 0) return -INFINITY;
    float m = max_of(x, n);
    if (!isfinite(m)) return m; /* -inf: nothing finite; +inf */
    double total = 0;
    float buf[BLOCK];
    int i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        for (int j = 0; j < BLOCK; j++) buf[j] = exp_neg(x[i + j] - m);
        double s[LANES] = {0};
        for (int b = 0; b < BLOCK; b += LANES)
            for (int j = 0; j < LANES; j++) s[j] += buf[b + j];
        total += lanes_total(s);
    }
    for (; i < n; i++) total += exp_neg(x[i] - m);
    return (double)m + log(total);
}

/* The mass of the e[i] >= tau[k], for NT thresholds at once. */
#define NT 4
static void levels(const float *e, int n, const float *tau, double *mass)
{
    for (int k = 0; k < NT; k++) mass[k] = 0;
    int i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int k = 0; k < NT; k++) {
            double s[LANES] = {0};
            for (int b = 0; b < BLOCK; b += LANES)
                for (int j = 0; j < LANES; j++) {
                    uint32_t in = -(uint32_t)isgreaterequal(e[i + b + j], tau[k]);
                    s[j] += tsr_f32_from_bits(tsr_bits_from_f32(e[i + b + j]) & in);
                }
            mass[k] += lanes_total(s);
        }
    for (; i < n; i++)
        for (int k = 0; k < NT; k++)
            if (e[i] >= tau[k]) mass[k] += e[i];
}

/* ---- keys: probability bits descending, then id ascending ------------------------------------------------ */

static uint64_t make_key(float p, int32_t id)
{
    return (uint64_t)(0x7F800000u - tsr_bits_from_f32(p)) << 32 | (uint32_t)id;
}
static int32_t key_id(uint64_t k) { return (int32_t)(uint32_t)k; }
static float key_p(uint64_t k) { return tsr_f32_from_bits(0x7F800000u - (uint32_t)(k >> 32)); }

static void swap64(uint64_t *a, uint64_t *b)
{
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

static void insertion_sort(uint64_t *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint64_t v = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1] > v) {
            a[j] = a[j - 1];
            j--;
        }
        a[j] = v;
    }
}

static void sift_down(uint64_t *a, size_t root, size_t n)
{
    for (;;) {
        size_t c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && a[c + 1] > a[c]) c++;
        if (a[root] >= a[c]) return;
        swap64(&a[root], &a[c]);
        root = c;
    }
}

static void heap_sort(uint64_t *a, size_t n)
{
    for (size_t i = n / 2; i-- > 0;) sift_down(a, i, n);
    for (size_t i = n; i-- > 1;) {
        swap64(&a[0], &a[i]);
        sift_down(a, 0, i);
    }
}

/* Hoare partition around the median of three; keys are distinct. Returns the split: a[0..s) <= pivot <= a[s..n). */
static size_t partition(uint64_t *a, size_t n)
{
    size_t mid = n / 2;
    if (a[mid] < a[0]) swap64(&a[mid], &a[0]);
    if (a[n - 1] < a[0]) swap64(&a[n - 1], &a[0]);
    if (a[n - 1] < a[mid]) swap64(&a[n - 1], &a[mid]);
    uint64_t pivot = a[mid];
    size_t i = 0, j = n - 1;
    for (;;) {
        while (a[i] < pivot) i++;
        while (a[j] > pivot) j--;
        if (i >= j) return j + 1;
        swap64(&a[i], &a[j]);
        i++;
        j--;
    }
}

static void sort_keys(uint64_t *a, size_t n)
{
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    while (n > 24) {
        if (depth-- == 0) {
            heap_sort(a, n);
            return;
        }
        size_t s = partition(a, n);
        if (s < n - s) {
            sort_keys(a, s);
            a += s;
            n -= s;
        } else {
            sort_keys(a + s, n - s);
            n = s;
        }
    }
    insertion_sort(a, n);
}

/* Rearranges a so that a[0..k) are its k smallest keys (in any order), 0 < k < n. */
static void select_keys(uint64_t *a, size_t n, size_t k)
{
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    while (n > 24) {
        if (depth-- == 0) break;
        size_t s = partition(a, n);
        if (k < s) {
            n = s;
        } else if (k > s) {
            a += s;
            n -= s;
            k -= s;
        } else {
            return;
        }
    }
    sort_keys(a, n);
}

/* ---- truncation ------------------------------------------------------------------------------------------ */

/* What survives truncation. all: every token with e > 0 (no filter), described by e and z. Otherwise keys[0..nk)
 * in no particular order (sorted when typical-p ran), of mass zk. lse1: log-sum-exp of the logits when the pass at
 * temperature 1 over the whole vocabulary computed it anyway, NaN otherwise. */
typedef struct kept {
    workspace *w;
    const float *e;
    double z;
    int all;
    size_t nk;
    double zk;
    double lse1;
} kept;

/* Thresholds the plain-temperature draw tries, largest first, to find the shell that holds its target. The last
 * real one (index N_TAU - 1) takes every token of nonzero probability; the padding lets levels() read NT entries
 * from any index. */
static const float tau_schedule[] = {0x1p-1f,   0x1p-3f,   0x1p-6f,   0x1p-10f,    0x1p-14f,    0x1p-20f,
                                     0x1p-27f,  0x1p-35f,  0x1p-45f,  0x1p-60f,    0x1p-80f,    0x1p-100f,
                                     0x1p-115f, 0x1p-126f, FLT_TRUE_MIN, FLT_TRUE_MIN, FLT_TRUE_MIN, FLT_TRUE_MIN};
#define N_TAU 15

/* Keys of the tokens with lo <= e < hi, in id order; keys needs room for n. Blocks of LANES entries are tested
 * at once (vectorized) and skipped when none matches; inside a matching block the loop is branch-free (the store
 * always happens, the count moves only for a match), so scattered matches cost no mispredictions either. */
static size_t gather_shell(const float *e, int n, float lo, float hi, uint64_t *keys)
{
    size_t nk = 0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        int any = 0;
        for (int j = 0; j < LANES; j++) any |= isgreaterequal(e[i + j], lo) & isless(e[i + j], hi);
        if (!any) continue;
        for (int j = i; j < i + LANES; j++) {
            keys[nk] = make_key(e[j], j);
            nk += isgreaterequal(e[j], lo) & isless(e[j], hi);
        }
    }
    for (; i < n; i++) {
        keys[nk] = make_key(e[i], i);
        nk += isgreaterequal(e[i], lo) & isless(e[i], hi);
    }
    return nk;
}

/* Keys of the tokens with e >= tau (gather_shell with no upper bound, one compare less). */
static size_t gather(const float *e, int n, float tau, uint64_t *keys)
{
    size_t nk = 0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        int any = 0;
        for (int j = 0; j < LANES; j++) any |= isgreaterequal(e[i + j], tau);
        if (!any) continue;
        for (int j = i; j < i + LANES; j++) {
            keys[nk] = make_key(e[j], j);
            nk += isgreaterequal(e[j], tau);
        }
    }
    for (; i < n; i++) {
        keys[nk] = make_key(e[i], i);
        nk += isgreaterequal(e[i], tau);
    }
    return nk;
}

/* ---- candidates straight from the logits (top-k, min-p: no exponential over the vocabulary) ---- */

/* Rank keys: smaller is better (larger logit, then lower id). */
static inline uint64_t rank_key(float x, int32_t id)
{
    uint32_t u = (uint32_t)okey(x) + 0x80000000u;
    return (uint64_t)(0xFFFFFFFFu - u) << 32 | (uint32_t)id;
}
static inline int32_t rank_okey(uint64_t r) { return (int32_t)((0xFFFFFFFFu - (uint32_t)(r >> 32)) - 0x80000000u); }

static void sift_up(uint64_t *a, size_t i)
{
    while (i > 0 && a[(i - 1) / 2] < a[i]) {
        swap64(&a[(i - 1) / 2], &a[i]);
        i = (i - 1) / 2;
    }
}

#define HEAP_MAX_K 1024

/* The k best tokens by logit (NaN skipped) and every token tied with the k-th (HF keeps ties), as rank keys in r
 * (room for n); returns how many. Small k: a max-heap of the k best so far, and a block whose largest logit (an
 * integer max, vectorized) is below the worst held is skipped whole, so most of the vocabulary costs one compare.
 * Large k: quickselect over every token. */
static size_t top_k_select(const float *l, int n, size_t k, uint64_t *r)
{
    size_t h = 0;
    if (k <= HEAP_MAX_K) {
        for (int b = 0; b < n; b += ARGMAX_BLOCK) {
            int end = b + ARGMAX_BLOCK < n ? b + ARGMAX_BLOCK : n;
            if (h == k) {
                int32_t bm = INT32_MIN;
                for (int i = b; i < end; i++) {
                    int32_t o = okey(l[i]);
                    bm = o > bm ? o : bm;
                }
                if (bm < rank_okey(r[0])) continue;
            }
            for (int i = b; i < end; i++) {
                if (l[i] != l[i]) continue;
                uint64_t key = rank_key(l[i], i);
                if (h < k) {
                    r[h] = key;
                    sift_up(r, h++);
                } else if (key < r[0]) {
                    r[0] = key;
                    sift_down(r, 0, h);
                }
            }
        }
    } else {
        for (int i = 0; i < n; i++)
            if (l[i] == l[i]) r[h++] = rank_key(l[i], i);
        if (h <= k) return h;
        select_keys(r, h, k);
        h = k;
    }
    if (h < k) return h;
    /* ties with the k-th: count them in the vocabulary, and bring in those the selection left out */
    int32_t vk = INT32_MAX;
    size_t in_set = 0;
    for (size_t j = 0; j < h; j++) vk = rank_okey(r[j]) < vk ? rank_okey(r[j]) : vk;
    for (size_t j = 0; j < h; j++) in_set += rank_okey(r[j]) == vk;
    int all_ties = 0;
    for (int i = 0; i < n; i++) all_ties += okey(l[i]) == vk;
    if ((size_t)all_ties == in_set) return h;
    size_t keep = 0;
    for (size_t j = 0; j < h; j++)
        if (rank_okey(r[j]) != vk) r[keep++] = r[j];
    for (int i = 0; i < n; i++)
        if (okey(l[i]) == vk) r[keep++] = rank_key(l[i], i);
    return keep;
}

/* Turns rank keys r[0..nr) into probability keys (e = exp((l - m) x inv)) in place, dropping zero probabilities
 * and those below floor_e. */
static size_t rank_to_keys(const float *l, uint64_t *r, size_t nr, float m, float inv, float floor_e)
{
    size_t nk = 0;
    for (size_t j = 0; j < nr; j++) {
        int32_t id = (int32_t)(uint32_t)r[j];
        float e = exp_neg((l[id] - m) * inv);
        if (e > 0 && e >= floor_e) r[nk++] = make_key(e, id);
    }
    return nk;
}

/* Tokens whose logit is at least lo, as rank keys (blocks with none are skipped after one vectorized test). */
static size_t logits_above(const float *l, int n, float lo, uint64_t *r)
{
    size_t nr = 0;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        int any = 0;
        for (int j = 0; j < LANES; j++) any |= isgreaterequal(l[i + j], lo);
        if (!any) continue;
        for (int j = i; j < i + LANES; j++)
            if (l[j] >= lo) r[nr++] = rank_key(l[j], j);
    }
    for (; i < n; i++)
        if (l[i] >= lo) r[nr++] = rank_key(l[i], i);
    return nr;
}

/* Probability of a key: its own bits, or e[id] when e is given (keys ordered by something else). */
static inline double kp(uint64_t k, const float *e) { return e ? e[key_id(k)] : key_p(k); }

/* Rearranges a[0..n) so that every key before the returned position is smaller than the key there, and returns
 * the position where the running sum of probabilities, in increasing key order, first reaches t (inclusive: sum
 * >= t; strict: sum > t); n - 1 when it never does. A quickselect that follows the mass instead of the rank:
 * linear on average, so top-p, typical-p and draws need no sort. Probabilities come from the keys (e NULL: keys
 * in decreasing probability) or from e[id]. */
static size_t weighted_select(uint64_t *a, size_t n, double t, int inclusive, const float *e)
{
    size_t base = 0;
    int depth = 0;
    for (size_t m = n; m > 1; m >>= 1) depth += 2;
    while (n > 32 && depth-- > 0) {
        size_t s = partition(a + base, n);
        double ml = 0;
        for (size_t i = 0; i < s; i++) ml += kp(a[base + i], e);
        if (inclusive ? t <= ml : t < ml) {
            n = s;
        } else {
            t -= ml;
            base += s;
            n -= s;
        }
    }
    sort_keys(a + base, n);
    double acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += kp(a[base + i], e);
        if (inclusive ? acc >= t : t < acc) return base + i;
    }
    return base + n - 1;
}

/* ---- typical-p -------------------------------------------------------------------------------------------- */

/* HF's TypicalLogitsWarper ranks tokens by |-log q - H|, with H = -sum q log q the entropy. With u = (l - max) / T
 * and q = e^u / Z, -log q - H = c - u where c = sum q u: the shift is |u - c|, no logarithm needed. It keeps the
 * shortest run of that ranking whose mass reaches typical_p, plus ties with its last score. */

static inline float shift_of(float l, float m, float inv, float c) { return fabsf((l - m) * inv - c); }

/* The mass of the tokens with e > 0 and |u - c| <= d[k], for NT bounds at once (vectorized). */
static void typical_levels(const float *l, const float *e, int n, float m, float inv, float c, const float *d,
                           double *mass)
{
    for (int k = 0; k < NT; k++) mass[k] = 0;
    int i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        for (int k = 0; k < NT; k++) {
            double s[LANES] = {0};
            for (int b = 0; b < BLOCK; b += LANES)
                for (int j = 0; j < LANES; j++) {
                    float x = (l[i + b + j] - m) * inv - c;
                    uint32_t in = -(uint32_t)islessequal(tsr_f32_from_bits(tsr_bits_from_f32(x) & 0x7FFFFFFFu), d[k]);
                    s[j] += tsr_f32_from_bits(tsr_bits_from_f32(e[i + b + j]) & in);
                }
            mass[k] += lanes_total(s);
        }
    for (; i < n; i++)
        for (int k = 0; k < NT; k++)
            if (e[i] > 0 && shift_of(l[i], m, inv, c) <= d[k]) mass[k] += e[i];
}

/* c = sum e u / z over the whole vocabulary (tokens of zero probability left out). */
static float typical_center(const float *l, const float *e, int n, float m, float inv, double z)
{
    double total = 0;
    int i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        double s[LANES] = {0};
        for (int b = 0; b < BLOCK; b += LANES)
            for (int j = 0; j < LANES; j++) {
                float x = e[i + b + j] * ((l[i + b + j] - m) * inv);
                uint32_t in = -(uint32_t)isgreater(e[i + b + j], 0.0f); /* 0 x -inf would be NaN */
                s[j] += tsr_f32_from_bits(tsr_bits_from_f32(x) & in);
            }
        total += lanes_total(s);
    }
    for (; i < n; i++)
        if (e[i] > 0) total += (double)e[i] * ((l[i] - m) * inv);
    return (float)(total / z);
}

/* Applies typical-p to the probability keys keys[0..nk) (e[id] holds each one's probability); every token
 * of the renormalized distribution the filter sees is in the list, with c and the list's mass zs given. */
static size_t typical_select(uint64_t *keys, size_t nk, const float *l, const float *e, float m, float inv,
                             float c, double target)
{
    for (size_t i = 0; i < nk; i++) { /* shift keys: the bits of a non-negative float order like the float */
        int32_t id = key_id(keys[i]);
        keys[i] = (uint64_t)tsr_bits_from_f32(shift_of(l[id], m, inv, c)) << 32 | (uint32_t)id;
    }
    uint64_t thr = keys[weighted_select(keys, nk, target, 1, e)] >> 32;
    size_t keep = 0;
    for (size_t i = 0; i < nk; i++)
        if (keys[i] >> 32 <= thr) {
            int32_t id = key_id(keys[i]);
            keys[keep++] = make_key(e[id], id);
        }
    return keep;
}

/* Steps 4-8 of sampler.h: probabilities at temperature p->temperature, then top-k, top-p, min-p, typical-p. Three
 * ways in: with top-k, the k best logits (and ties) are selected first and only they get an exponential; with
 * min-p alone (or with typical-p), a logit threshold just below min-p's bounds the candidates; otherwise (top-p,
 * typical-p alone, or no filter) every token needs its probability, and a threshold tau bounds what top-p and
 * min-p keep before anything is gathered. The kept keys come out in no particular order. */
static tsr_status truncate(const float *logits, int n, const tsr_sampling *p, kept *out)
{
    workspace *w = ws_get((size_t)n);
    if (!w) return TSR_ERR_NOMEM;
    int mi = argmax_of(logits, n);
    if (mi < 0 || logits[mi] == -INFINITY) return tsr_fail(TSR_ERR_ARG, "sampler: no token has a finite logit");
    float m = logits[mi];
    if (m == INFINITY) return tsr_fail(TSR_ERR_ARG, "sampler: logit of token %d is +inf", mi);
    float inv = 1.0f / p->temperature;
    if (!(inv <= FLT_MAX)) inv = FLT_MAX; /* a denormal temperature: still one-hot on the maximum (and its ties) */
    *out = (kept){w, w->e, 0, 0, 0, 0, NAN};

    int top_k = p->top_k > 0 && p->top_k < n ? p->top_k : 0;
    int top_p = p->top_p < 1;
    int min_p = p->min_p > 0;
    int typ = p->typical_p > 0 && p->typical_p < 1;
    uint64_t *keys = w->keys;
    size_t nk;
    double z = 0, typ_z = 0; /* typ_z: the mass typical-p renormalizes over, once known */
    float c = 0;             /* typical-p: the mean of u = (l - max) / T under the distribution it sees */
    if (top_k) {
        size_t nr = top_k_select(logits, n, (size_t)top_k, keys);
        nk = rank_to_keys(logits, keys, nr, m, inv, 0);
    } else if (min_p && !top_p) {
        /* e >= min_p means (l - m) / T >= log(min_p); the margin only widens the candidates */
        float lo = m + p->temperature * logf(p->min_p);
        lo -= 1e-3f + 1e-5f * fabsf(lo);
        size_t nr = logits_above(logits, n, lo, keys);
        nk = rank_to_keys(logits, keys, nr, m, inv, p->min_p);
    } else {
        z = exp_pass(logits, n, m, inv, w->e);
        out->z = z;
        if (p->temperature == 1) out->lse1 = (double)m + log(z);
        if (!top_p && !min_p && !typ) {
            out->all = 1;
            return TSR_OK;
        }
        /* every token below tau is dropped. top-p: the tokens below tau0 hold at most n x tau0 <= (1 - top_p) of
         * the mass, so top_p of it lies above (all of higher rank); one counting pass usually finds a tighter
         * tau. min-p: e >= min_p x e_max, and e_max is 1. */
        float tau = FLT_TRUE_MIN;
        if (top_p) {
            double need = (double)p->top_p * z * (1 + 1e-6);
            float tau0 = (float)((1 - (double)p->top_p) * z / n * (1 - 1e-6));
            static const float tries[NT] = {0x1p-2f, 0x1p-5f, 0x1p-9f, 0x1p-14f};
            double mass[NT];
            levels(w->e, n, tries, mass);
            tau = tau0 > FLT_TRUE_MIN ? tau0 : FLT_TRUE_MIN;
            for (int k = 0; k < NT; k++)
                if (mass[k] >= need) {
                    tau = tries[k] > tau ? tries[k] : tau;
                    break;
                }
        }
        if (min_p && p->min_p > tau) tau = p->min_p;
        if (typ && !top_p && !min_p) {
            /* typical-p alone: c over the whole vocabulary, then only the tokens within a shift bound that holds
             * typical_p of the mass are gathered (the kept ones all shift less) */
            c = typical_center(logits, w->e, n, m, inv, z);
            static const float d1[NT] = {0.5f, 1.0f, 2.0f, 4.0f}, d2[NT] = {8.0f, 16.0f, 32.0f, 64.0f};
            double need = (double)p->typical_p * z * (1 + 1e-6), mass[NT];
            float bound = INFINITY;
            for (int g = 0; g < 2 && bound == INFINITY; g++) {
                typical_levels(logits, w->e, n, m, inv, c, g ? d2 : d1, mass);
                for (int k = 0; k < NT; k++)
                    if (mass[k] >= need) {
                        bound = (g ? d2 : d1)[k];
                        break;
                    }
            }
            nk = 0;
            for (int i = 0; i < n; i++)
                if (w->e[i] > 0 && shift_of(logits[i], m, inv, c) <= bound) keys[nk++] = make_key(w->e[i], i);
            typ_z = z;
        } else {
            nk = gather(w->e, n, tau, keys);
        }
    }
    if (nk == 0) return tsr_fail(TSR_ERR_INTERNAL, "sampler: no candidate token");

    if (top_p) { /* the shortest prefix whose mass reaches top_p of what top-k kept (of everything without it) */
        double mass = z;
        if (top_k) {
            mass = 0;
            for (size_t i = 0; i < nk; i++) mass += key_p(keys[i]);
        }
        nk = weighted_select(keys, nk, (double)p->top_p * mass, 1, NULL) + 1;
    }
    if (min_p) {
        float top = 0;
        for (size_t i = 0; i < nk; i++) top = key_p(keys[i]) > top ? key_p(keys[i]) : top;
        double floor_p = (double)p->min_p * top;
        size_t keep = 0;
        for (size_t i = 0; i < nk; i++)
            if (key_p(keys[i]) >= floor_p) keys[keep++] = keys[i];
        nk = keep;
    }
    if (typ && nk > 1) {
        if (typ_z == 0) { /* over what the other filters kept: its own center and mass; e[] gets their values */
            double su = 0;
            for (size_t i = 0; i < nk; i++) {
                int32_t id = key_id(keys[i]);
                float e = key_p(keys[i]);
                w->e[id] = e;
                typ_z += e;
                su += (double)e * ((logits[id] - m) * inv);
            }
            c = (float)(su / typ_z);
        }
        nk = typical_select(keys, nk, logits, w->e, m, inv, c, (double)p->typical_p * typ_z);
    }
    double zk = 0;
    for (size_t i = 0; i < nk; i++) zk += key_p(keys[i]);
    out->nk = nk;
    out->zk = zk;
    return TSR_OK;
}

/* The token at u of the distribution in order of decreasing probability (ties: lower id first). */
static int32_t draw(kept *k, int n, double u)
{
    uint64_t *keys = k->w->keys;
    if (!k->all) return key_id(keys[weighted_select(keys, k->nk, u * k->zk, 0, NULL)]);
    /* every token: the first threshold whose upper set passes the target bounds a shell [tau_j, tau_j-1) that
     * holds the drawn token; only that shell is gathered */
    double target = u * k->z, above = 0, prev_mass = 0;
    int j = -1;
    for (int t0 = 0; t0 < N_TAU && j < 0; t0 += NT) {
        double mass[NT];
        levels(k->e, n, &tau_schedule[t0], mass);
        for (int i = 0; i < NT && t0 + i < N_TAU; i++) {
            if (mass[i] > target) {
                j = t0 + i;
                above = prev_mass;
                break;
            }
            prev_mass = mass[i];
        }
    }
    size_t nk = j < 0 ? 0 : gather_shell(k->e, n, tau_schedule[j], j ? tau_schedule[j - 1] : INFINITY, keys);
    if (nk == 0) { /* rounding: the target sits at the very end, or on a shell's edge */
        j = j < 0 ? N_TAU - 1 : j;
        nk = gather(k->e, n, tau_schedule[j], keys);
        above = 0;
    }
    return key_id(keys[weighted_select(keys, nk, target - above, 0, NULL)]);
}

static tsr_status check_call(const float *logits, int n, const tsr_sampling *p)
{
    if (n <= 0 || !logits) return tsr_fail(TSR_ERR_ARG, "sampler: empty vocabulary");
    return tsr_sampling_check(p);
}

tsr_status tsr_sample_u_lse(const float *logits, int n, const tsr_sampling *p, double u, int32_t *token,
                            double *lse)
{
    if (lse) *lse = NAN;
    TSR_TRY(check_call(logits, n, p));
    if (!(u >= 0 && u < 1)) return tsr_fail(TSR_ERR_ARG, "sampler: uniform draw %g outside [0, 1)", u);
    if (tsr_sampling_is_greedy(p)) {
        *token = tsr_argmax(logits, n);
        return TSR_OK;
    }
    kept k;
    TSR_TRY(truncate(logits, n, p, &k));
    *token = draw(&k, n, u);
    if (lse) *lse = k.lse1;
    return TSR_OK;
}

/* tsr_sample_u over the candidates alone, as an array in increasing id order (so ties break alike). */
static tsr_status sample_compact(const tsr_top_row *row, int n, const tsr_sampling *p, double u, int32_t *token)
{
    float l[TOP_ROW_MAX];
    int32_t id[TOP_ROW_MAX];
    for (int i = 0; i < n; i++) { /* insertion by id */
        int j = i;
        for (; j > 0 && id[j - 1] > row->ids[i]; j--) {
            id[j] = id[j - 1];
            l[j] = l[j - 1];
        }
        id[j] = row->ids[i];
        l[j] = row->vals[i];
    }
    int32_t at;
    TSR_TRY(tsr_sample_u(l, n, p, u, &at));
    *token = id[at];
    return TSR_OK;
}

tsr_status tsr_sample_top(const tsr_top_row *row, const tsr_sampling *p, double u, int32_t *token, int *decided)
{
    *decided = 0;
    TSR_TRY(tsr_sampling_check(p));
    if (!(u >= 0 && u < 1)) return tsr_fail(TSR_ERR_ARG, "sampler: uniform draw %g outside [0, 1)", u);
    const int n = row->n < TOP_ROW_MAX ? row->n : TOP_ROW_MAX;
    if (n < 1 || !isfinite(row->vals[0])) return TSR_OK; /* the row's own sampler reports it */
    if (tsr_sampling_is_greedy(p)) {
        *token = row->ids[0];
        *decided = 1;
        return TSR_OK;
    }
    tsr_sampling q = *p;
    const int complete = row->complete && row->n <= TOP_ROW_MAX;
    const int top_p = p->top_p < 1, min_p = p->min_p > 0, typ = p->typical_p > 0 && p->typical_p < 1;
    if (!complete && p->top_k > 0) {
        if (p->top_k >= n || !(row->vals[p->top_k - 1] > row->vals[n - 1])) return TSR_OK;
    } else if (!complete) {
        const float m = row->vals[0];
        float inv = 1.0f / p->temperature;
        if (!(inv <= FLT_MAX)) inv = FLT_MAX;
        if (!(row->z > 0) || !isfinite(row->z)) return TSR_OK;
        if (top_p) {
            /* the nucleus: the shortest prefix whose mass reaches top_p of z; then top-k of its length over the
             * candidates keeps the same set (min-p and typical-p act on that set either way) */
            const double need = (double)p->top_p * row->z;
            double acc = 0;
            int j = 0;
            for (; j < n; j++) {
                acc += exp_neg((row->vals[j] - m) * inv);
                if (acc >= need) break;
            }
            /* not on a tie, nor on the last candidate's value (entries equal to it may be missing) */
            if (j == n || (j + 1 < n && row->vals[j + 1] == row->vals[j]) || row->vals[j] == row->vals[n - 1])
                return TSR_OK;
            q.top_k = j + 1 < n ? j + 1 : 0;
            q.top_p = 1;
        } else if (min_p) {
            if (!(exp_neg((row->vals[n - 1] - m) * inv) < p->min_p)) return TSR_OK;
        } else if (typ) {
            return TSR_OK;
        } else {
            /* plain temperature: walk down from the top until the mass passes u z */
            const double target = u * row->z;
            double acc = 0;
            for (int j = 0; j < n; j++) {
                acc += exp_neg((row->vals[j] - m) * inv);
                if (target < acc) {
                    if (row->vals[j] == row->vals[n - 1]) return TSR_OK; /* its equals may be missing */
                    *token = row->ids[j];
                    *decided = 1;
                    return TSR_OK;
                }
            }
            return TSR_OK;
        }
    }
    TSR_TRY(sample_compact(row, n, &q, u, token));
    *decided = 1;
    return TSR_OK;
}

tsr_status tsr_sample_u(const float *logits, int n, const tsr_sampling *p, double u, int32_t *token)
{
    return tsr_sample_u_lse(logits, n, p, u, token, NULL);
}

tsr_status tsr_sampling_probs(const float *logits, int n, const tsr_sampling *p, float *probs)
{
    TSR_TRY(check_call(logits, n, p));
    if (tsr_sampling_is_greedy(p)) {
        memset(probs, 0, (size_t)n * sizeof *probs);
        probs[tsr_argmax(logits, n)] = 1;
        return TSR_OK;
    }
    kept k;
    TSR_TRY(truncate(logits, n, p, &k));
    if (k.all) {
        for (int i = 0; i < n; i++) probs[i] = (float)(k.e[i] / k.z);
        return TSR_OK;
    }
    memset(probs, 0, (size_t)n * sizeof *probs);
    for (size_t i = 0; i < k.nk; i++) probs[key_id(k.w->keys[i])] = (float)(key_p(k.w->keys[i]) / k.zk);
    return TSR_OK;
}

tsr_status tsr_sample(const float *logits, int n, const tsr_sampling *p, tsr_rng *rng, int32_t *token)
{
    TSR_TRY(check_call(logits, n, p));
    if (tsr_sampling_is_greedy(p)) {
        *token = tsr_argmax(logits, n);
        return TSR_OK;
    }
    return tsr_sample_u(logits, n, p, tsr_rng_uniform(rng), token);
}

/* ---- penalties and bias ---------------------------------------------------------------------------------- */

tsr_status tsr_apply_penalties(float *logits, int n, const tsr_sampling *p, const int32_t *hist, int n_hist,
                               int n_prompt)
{
    TSR_TRY(check_call(logits, n, p));
    if (n_hist < 0 || n_prompt < 0 || n_prompt > n_hist || (n_hist > 0 && !hist))
        return tsr_fail(TSR_ERR_ARG, "sampler: bad penalty history (%d tokens, %d of the prompt)", n_hist, n_prompt);
    int rep = rep_active(p);
    float fp = p->frequency_penalty, pp = p->presence_penalty;
    if (!rep && fp == 0 && pp == 0) return TSR_OK;
    for (int i = 0; i < n_hist; i++)
        if (hist[i] < 0) return tsr_fail(TSR_ERR_ARG, "sampler: history token %d (at %d) is negative", hist[i], i);
    workspace *w = ws_get((size_t)n);
    if (!w) return TSR_ERR_NOMEM;
    int32_t *cnt = w->cnt;
    if (rep) {
        float r = p->repetition_penalty;
        for (int i = 0; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t >= n || cnt[t]) continue;
            cnt[t] = 1;
            logits[t] = logits[t] < 0 ? logits[t] * r : logits[t] / r;
        }
        for (int i = 0; i < n_hist; i++)
            if (hist[i] < n) cnt[hist[i]] = 0;
    }
    if (fp != 0 || pp != 0) {
        for (int i = n_prompt; i < n_hist; i++)
            if (hist[i] < n) cnt[hist[i]]++;
        for (int i = n_prompt; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t >= n || !cnt[t]) continue;
            logits[t] -= (float)cnt[t] * fp;
            logits[t] -= pp;
            cnt[t] = 0;
        }
    }
    return TSR_OK;
}

tsr_status tsr_apply_logit_bias(float *logits, int n, const tsr_logit_bias *bias, int n_bias)
{
    if (n <= 0 || !logits) return tsr_fail(TSR_ERR_ARG, "sampler: empty vocabulary");
    if (n_bias < 0 || (n_bias > 0 && !bias)) return tsr_fail(TSR_ERR_ARG, "logit_bias: bad list (%d entries)", n_bias);
    for (int i = 0; i < n_bias; i++) {
        if (bias[i].token < 0 || bias[i].token >= n)
            return tsr_fail(TSR_ERR_ARG, "logit_bias: token %d is outside the vocabulary (%d tokens)",
                            (int)bias[i].token, n);
        if (!isfinite(bias[i].bias))
            return tsr_fail(TSR_ERR_ARG, "logit_bias: the bias of token %d is not finite", (int)bias[i].token);
    }
    for (int i = 0; i < n_bias; i++) logits[bias[i].token] += bias[i].bias;
    return TSR_OK;
}
