/* Synthetic EXL2 and GPTQ model writer (see synth.h; formats in EXL2.md §1, §3-§6, §8, §9).
 *
 * Three steps. (1) Plan: every linear layer gets a converter-style option (descending widths, group sizes
 * 32/64/128, the rows at each width); the decoder layers' options are solved one matrix at a time with error
 * diffusion so that the total stored bits over all decoder matrices land on bpw × sum(K·N), counted exactly as
 * tsr_qmatrix_bpw counts them; lm_head uses the fixed -hb table of EXL2.md §9.2. (2) Inventory: the tensor list
 * (names, dtypes, shapes, byte sizes) in converter (module) order, split greedily into shards by byte budget, then
 * sorted inside each shard the way safetensors' save_file orders a file (dtype, then name), which keeps every
 * tensor aligned to its element size. (3) Stream: per shard, declare the tensors, write the header, then
 * generate each tensor from its own random stream (seeded
 * by the model seed and the tensor name, so tensors straddling shards and the shard count do not change any byte)
 * and write it a group at a time. Codes follow a rounded, clamped normal distribution around the EXL2 offset
 * 2^(b-1) (symmetric, like real GPTQ codes); scale codes are uniform in 8..15 and q_scale_max is chosen per group
 * so that the dequantized weights have standard deviation ~1/sqrt(K). q/k/v share one row permutation and gate/up
 * another, as in converted models.
 *
 * GPTQ matrices need no plan (4 bits, one group size). Their values are generated without storing a matrix:
 * the zero points of group g come from their own random stream (seeded by the qzeros name and g), so the qzeros
 * writer and the qweight writer derive the same ones independently; qweight is written in blocks of 128
 * original rows, each code drawn around the zero point of its row's group (the same rounded normal as the EXL2
 * 4-bit codes, clamped to 0..15), and scales are fp16 values around the one that makes the weights' standard
 * deviation 1/sqrt(K). With act-order, g_idx is the desc_act assignment of a random row order (the K-entry array
 * is regenerated from its seed wherever it is needed); q/k/v share it and gate/up share another, as they share
 * a Hessian in a real quantization. */
#include "runtime/synth.h"

#include "runtime/half.h"
#include "runtime/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------- packing ---------------- */

void tsr_synth_pack(const uint8_t *codes, int rows, int bits, int N, uint32_t *words)
{
    const size_t n = (size_t)N;
    memset(words, 0, (size_t)rows * (size_t)bits / 32 * n * sizeof *words);
    for (int j = 0; j < rows; j++) {
        const long s = (long)j * bits;
        const size_t w = (size_t)(s >> 5);
        const int sh = (int)(s & 31);
        const uint8_t *c = codes + (size_t)j * n;
        uint32_t *lo = words + w * n;
        for (size_t k = 0; k < n; k++) lo[k] |= (uint32_t)c[k] << sh;
        if (sh + bits > 32) {
            uint32_t *hi = lo + n;
            for (size_t k = 0; k < n; k++) hi[k] |= (uint32_t)c[k] >> (32 - sh);
        }
    }
}

/* ---------------- plans ---------------- */

static int valid_width(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }

tsr_status tsr_synth_qplan_finish(tsr_synth_qplan *p)
{
    if (p->K <= 0 || p->K > 65535) return tsr_fail(TSR_ERR_ARG, "synth: K = %d is outside 1..65535 (EXL2 limit)", p->K);
    if (p->N <= 0 || p->N % 32) return tsr_fail(TSR_ERR_ARG, "synth: N = %d is not a positive multiple of 32", p->N);
    /* drop empty widths */
    int n = 0;
    for (int i = 0; i < p->n_widths; i++) {
        if (p->rows[i] < 0) return tsr_fail(TSR_ERR_ARG, "synth: negative row count");
        if (p->rows[i] == 0) continue;
        p->bits[n] = p->bits[i];
        p->rows[n] = p->rows[i];
        p->group_size[n] = p->group_size[i];
        n++;
    }
    p->n_widths = n;
    int rows = 0, G = 0, Q = 0, prev = 9;
    for (int i = 0; i < n; i++) {
        int b = p->bits[i], gs = p->group_size[i];
        if (!valid_width(b) || b >= prev)
            return tsr_fail(TSR_ERR_ARG, "synth: widths must be distinct, descending and in {8,6,5,4,3,2}");
        if (gs <= 0) return tsr_fail(TSR_ERR_ARG, "synth: group size %d", gs);
        prev = b;
        for (int r = 0; r < p->rows[i]; r += gs) {
            int gr = p->rows[i] - r < gs ? p->rows[i] - r : gs;
            if ((long)gr * b % 32)
                return tsr_fail(TSR_ERR_ARG, "synth: a group of %d rows at %d bits is not a whole number of words", gr,
                                b);
            Q += gr * b / 32;
            G++;
        }
        rows += p->rows[i];
    }
    if (rows != p->K) return tsr_fail(TSR_ERR_ARG, "synth: widths cover %d rows, K = %d", rows, p->K);
    p->G = G;
    p->Q = Q;
    return TSR_OK;
}

uint64_t tsr_synth_qplan_bits(const tsr_synth_qplan *p)
{
    const uint64_t N = (uint64_t)p->N;
    return (uint64_t)p->Q * N * 32                 /* q_weight */
           + (uint64_t)p->G * (N / 8) * 32         /* q_scale */
           + (uint64_t)p->G * 16                   /* q_scale_max */
           + (uint64_t)p->G * 2 * 16               /* q_groups */
           + (uint64_t)p->K * 32;                  /* q_invperm */
}

void tsr_synth_qplan_groups(const tsr_synth_qplan *p, int16_t *q_groups)
{
    int g = 0, q = 0;
    for (int i = 0; i < p->n_widths; i++)
        for (int r = 0; r < p->rows[i]; r += p->group_size[i]) {
            int gr = p->rows[i] - r < p->group_size[i] ? p->rows[i] - r : p->group_size[i];
            q_groups[2 * g] = (int16_t)p->bits[i];
            q_groups[2 * g + 1] = (int16_t)q;
            q += gr * p->bits[i] / 32;
            g++;
        }
}

tsr_status tsr_synth_qplan_props(int K, int N, int n, const int *bits, const double *prop, const int *gs,
                                 tsr_synth_qplan *p)
{
    memset(p, 0, sizeof *p);
    p->K = K;
    p->N = (N + 31) / 32 * 32;
    if (n < 1 || n > TSR_SYNTH_MAX_WIDTHS)
        return tsr_fail(TSR_ERR_ARG, "synth: %d widths (1..%d)", n, TSR_SYNTH_MAX_WIDTHS);
    int remaining = p->K;
    p->n_widths = n;
    for (int i = 0; i < n; i++) {
        double want = p->K * prop[i];
        if (want > remaining) want = remaining;
        long groups = (long)ceil(want / gs[i] - 1e-9);
        long rows = groups * gs[i];
        if (rows > remaining) rows = remaining;
        if (i == n - 1) rows = remaining;
        p->bits[i] = bits[i];
        p->group_size[i] = gs[i];
        p->rows[i] = (int)rows;
        remaining -= (int)rows;
    }
    return tsr_synth_qplan_finish(p);
}

tsr_status tsr_synth_head_plan(int K, int N, int head_bits, tsr_synth_qplan *p)
{
    static const struct {
        int hb, n, bits[2], gs;
        double prop[2];
    } opts[] = {
        {2, 2, {4, 2}, 32, {0.3, 0.7}},   {3, 2, {4, 3}, 32, {0.15, 0.85}},  {4, 2, {6, 4}, 32, {0.15, 0.85}},
        {5, 2, {6, 5}, 128, {0.15, 0.85}}, {6, 2, {8, 6}, 128, {0.15, 0.85}}, {8, 1, {8, 0}, 128, {1.0, 0.0}},
    };
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (opts[i].hb == head_bits) {
            int gs[2] = {opts[i].gs, opts[i].gs};
            return tsr_synth_qplan_props(K, N, opts[i].n, opts[i].bits, opts[i].prop, gs, p);
        }
    return tsr_fail(TSR_ERR_ARG, "synth: --head-bits %d is not a converter head option (2, 3, 4, 5, 6, 8)", head_bits);
}

/* Bits of a two-width option (plus an optional 32-row 8-bit group first) without building it. */
static uint64_t option_bits(int K, int N, int top, int hi, int rows_hi, int gs_hi, int lo, int rows_lo, int gs_lo)
{
    uint64_t G =
        (uint64_t)(top ? 1 : 0) + (uint64_t)((rows_hi + gs_hi - 1) / gs_hi) + (uint64_t)((rows_lo + gs_lo - 1) / gs_lo);
    uint64_t Q = (uint64_t)(top * 8 + rows_hi * hi + rows_lo * lo) / 32;
    return Q * (uint64_t)N * 32 + G * ((uint64_t)N / 8) * 32 + G * 48 + (uint64_t)K * 32;
}

typedef struct {
    double err;
    int top, hi, rows_hi, gs_hi, lo, gs_lo;
} option_pick;

static option_pick search_option(int K, int N, double target_bits, int top8, int gs_hi, int gs_lo)
{
    static const int pairs[][2] = {{8, 6}, {6, 5}, {5, 4}, {4, 3}, {3, 2}};
    option_pick best = {INFINITY, 0, 0, 0, 0, 0, 0};
    for (size_t pi = 0; pi < sizeof pairs / sizeof pairs[0]; pi++) {
        int hi = pairs[pi][0], lo = pairs[pi][1];
        int top = top8 && hi < 8 && K > 32 ? 32 : 0;
        for (int n_hi = 0; n_hi * gs_hi <= K - top; n_hi++) {
            int rows_hi = n_hi * gs_hi, rows_lo = K - top - rows_hi;
            double e = (double)option_bits(K, N, top, hi, rows_hi, gs_hi, lo, rows_lo, gs_lo) - target_bits;
            if (fabs(e) < fabs(best.err)) best = (option_pick){e, top, hi, rows_hi, gs_hi, lo, gs_lo};
        }
    }
    return best;
}

/* ---------------- random numbers ---------------- */

typedef struct {
    uint64_t s;
} rng_t;

static inline uint64_t rng_next(rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static rng_t rng_for(uint64_t seed, const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    rng_t r = {h};
    rng_next(&r);
    return r;
}

/* An independent stream per row (or group) of a tensor, so one row can be regenerated without the others. */
static rng_t rng_for_row(uint64_t seed, const char *name, uint64_t row)
{
    rng_t r = rng_for(seed, name);
    r.s ^= (row + 1) * 0xd1b54a32d192ed03ull;
    rng_next(&r);
    return r;
}

/* Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms. */
static inline float rng_gauss(rng_t *r)
{
    uint64_t x = rng_next(r);
    double s = (double)(x & 0xffff) + (double)((x >> 16) & 0xffff) + (double)((x >> 32) & 0xffff) + (double)(x >> 48);
    return (float)((s - 2.0 * 65535.0) / (65536.0 * 0.5773502691896258));
}

static inline uint32_t rng_below(rng_t *r, uint32_t n) { return (uint32_t)(((rng_next(r) >> 32) * (uint64_t)n) >> 32); }

/* ---------------- model inventory ---------------- */

typedef enum {
    TK_EMBED, TK_NORM, TK_QWEIGHT, TK_INVPERM, TK_SCALE, TK_SCALEMAX, TK_GROUPS, TK_BIAS, /* EXL2 (and shared) */
    TK_GQWEIGHT, TK_GZEROS, TK_GSCALES, TK_GIDX, TK_DENSE                                 /* GPTQ */
} tkind;

#define GPTQ_BLOCK 128 /* original rows of a GPTQ qweight generated at a time */

typedef struct {
    char name[160];
    tkind kind;
    tsr_dtype dtype;
    int ndim;
    int64_t shape[2];
    uint64_t nbytes;
    int mat;   /* matrix index for quantized tensors and biases */
    int shard;
} stensor;

typedef struct {
    char key[96];
    char perm_key[96]; /* matrices with the same perm_key share q_invperm */
    int K, Nreal;
    tsr_synth_qplan plan; /* EXL2; for GPTQ only K and N (unpadded) are set */
    int has_bias;
    int gs, G;            /* GPTQ: rows per group (K for one group) and groups; 0 for EXL2 */
} smatrix;

typedef struct {
    const tsr_synth_opts *o;
    smatrix *mats;
    int n_mats, cap_mats;
    stensor *tens;
    int n_tens, cap_tens;
    uint8_t *ctab[9];   /* per width: 16-bit uniform → code */
    double code_var[9]; /* E[(code - offset)^2] per width */
    double scale_sq;    /* E[((s+1)^2/256)^2] for scale codes s uniform in 8..15 */
    double gptq_var;    /* E[(code - zero)^2] of the GPTQ codes, over the zero points used */
    uint8_t *codes;
    uint32_t *words;
    uint8_t *zrow;      /* GPTQ: zero points of one group row [N] */
    int32_t *gidx;      /* GPTQ act-order: g_idx of one matrix [K] */
    void *buf;
    size_t buf_bytes;
} synth_ctx;

static tsr_status add_tensor(synth_ctx *c, const char *name, tkind kind, tsr_dtype dt, int ndim, int64_t d0, int64_t d1,
                             int mat)
{
    if (c->n_tens == c->cap_tens) {
        int cap = c->cap_tens ? 2 * c->cap_tens : 256;
        stensor *g = realloc(c->tens, (size_t)cap * sizeof *g);
        if (!g) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        c->tens = g;
        c->cap_tens = cap;
    }
    stensor *t = &c->tens[c->n_tens++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->dtype = dt;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->nbytes = tsr_dtype_size(dt) * (uint64_t)d0 * (uint64_t)(ndim == 2 ? d1 : 1);
    t->mat = mat;
    return TSR_OK;
}

/* Appends a matrix record (no tensors). */
static tsr_status add_matrix_entry(synth_ctx *c, const char *key, const char *perm_key, int K, int N, int has_bias,
                                   const tsr_synth_qplan *plan)
{
    if (c->n_mats == c->cap_mats) {
        int cap = c->cap_mats ? 2 * c->cap_mats : 64;
        smatrix *g = realloc(c->mats, (size_t)cap * sizeof *g);
        if (!g) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        c->mats = g;
        c->cap_mats = cap;
    }
    int mi = c->n_mats++;
    smatrix *m = &c->mats[mi];
    memset(m, 0, sizeof *m);
    snprintf(m->key, sizeof m->key, "%s", key);
    snprintf(m->perm_key, sizeof m->perm_key, "%s", perm_key);
    m->K = K;
    m->Nreal = N;
    m->plan = *plan;
    m->has_bias = has_bias;
    return TSR_OK;
}

/* Appends an EXL2 matrix and its tensors. */
static tsr_status add_matrix(synth_ctx *c, const char *key, const char *perm_key, int K, int N, int has_bias,
                             const tsr_synth_qplan *plan)
{
    TSR_TRY(add_matrix_entry(c, key, perm_key, K, N, has_bias, plan));
    const int mi = c->n_mats - 1;
    const tsr_synth_qplan *p = &c->mats[mi].plan;
    char name[160];
#define T(suffix, kind, dt, nd, d0, d1)                                                                            \
    do {                                                                                                           \
        snprintf(name, sizeof name, "%s.%s", key, suffix);                                                         \
        TSR_TRY(add_tensor(c, name, kind, dt, nd, d0, d1, mi));                                                    \
    } while (0)
    T("q_weight", TK_QWEIGHT, TSR_I32, 2, p->Q, p->N);
    T("q_invperm", TK_INVPERM, TSR_I32, 1, p->K, 0);
    T("q_scale", TK_SCALE, TSR_I32, 2, p->G, p->N / 8);
    T("q_scale_max", TK_SCALEMAX, TSR_F16, 1, p->G, 0);
    T("q_groups", TK_GROUPS, TSR_I16, 1, 2 * p->G, 0);
    if (has_bias) T("bias", TK_BIAS, TSR_F16, 1, p->N, 0);
#undef T
    return TSR_OK;
}

/* Rows per group of a K-row GPTQ matrix: the option (0 = 128), K for -1 (one group). */
static int gptq_group_rows(const tsr_synth_opts *o, int K)
{
    const int gs = o->group_size ? o->group_size : 128;
    return gs == -1 ? K : gs;
}

/* Stored bits of a GPTQ matrix as tsr_qmatrix_bpw counts them (qweight, qzeros, scales, g_idx; no bias). */
static uint64_t gptq_bits(int K, int N, int G)
{
    return (uint64_t)K * N * 4 + (uint64_t)G * N * 4 + (uint64_t)G * N * 16 + (uint64_t)K * 32;
}

static tsr_status add_gptq_matrix(synth_ctx *c, const char *key, const char *perm_key, int K, int N, int has_bias)
{
    tsr_synth_qplan plan;
    memset(&plan, 0, sizeof plan);
    plan.K = K;
    plan.N = N;
    TSR_TRY(add_matrix_entry(c, key, perm_key, K, N, has_bias, &plan));
    const int mi = c->n_mats - 1;
    smatrix *m = &c->mats[mi];
    m->gs = gptq_group_rows(c->o, K);
    m->G = (K + m->gs - 1) / m->gs;
    char name[160];
#define T(suffix, kind, dt, nd, d0, d1)                                                                            \
    do {                                                                                                           \
        snprintf(name, sizeof name, "%s.%s", key, suffix);                                                         \
        TSR_TRY(add_tensor(c, name, kind, dt, nd, d0, d1, mi));                                                    \
    } while (0)
    T("qweight", TK_GQWEIGHT, TSR_I32, 2, K / 8, N);
    T("qzeros", TK_GZEROS, TSR_I32, 2, m->G, N / 8);
    T("scales", TK_GSCALES, TSR_F16, 2, m->G, N);
    T("g_idx", TK_GIDX, TSR_I32, 1, K, 0);
    if (has_bias) T("bias", TK_BIAS, TSR_F16, 1, N, 0);
#undef T
    return TSR_OK;
}

/* Plans one decoder matrix against target_bits; the variant (group sizes, 8-bit top slice) comes from rng, the
 * group sizes of both widths from gs instead where it is not 0. */
static tsr_status plan_layer_matrix(int K, int N, double target_bits, int gs, rng_t *rng, tsr_synth_qplan *p)
{
    uint64_t r = rng_next(rng);
    int top8 = (int)(r & 1), gs_hi = gs ? gs : (r >> 1) & 1 ? 64 : 32, gs_lo = gs ? gs : (r >> 2) & 1 ? 64 : 128;
    option_pick best = search_option(K, N, target_bits, top8, gs_hi, gs_lo);
    if (fabs(best.err) > 0.02 * (double)K * N) /* the random variant cannot get close: try them all */
        for (int v = 0; v < 8; v++) {
            const int vh = gs ? gs : (v >> 1) & 1 ? 64 : 32, vl = gs ? gs : (v >> 2) & 1 ? 64 : 128;
            option_pick o = search_option(K, N, target_bits, v & 1, vh, vl);
            if (fabs(o.err) < fabs(best.err)) best = o;
        }
    memset(p, 0, sizeof *p);
    p->K = K;
    p->N = N;
    int n = 0;
    if (best.top) {
        p->bits[n] = 8;
        p->rows[n] = best.top;
        p->group_size[n++] = 32;
    }
    p->bits[n] = best.hi;
    p->rows[n] = best.rows_hi;
    p->group_size[n++] = best.gs_hi;
    p->bits[n] = best.lo;
    p->rows[n] = K - best.top - best.rows_hi;
    p->group_size[n++] = best.gs_lo;
    p->n_widths = n;
    return tsr_synth_qplan_finish(p);
}

static const char *arch_class(tsr_arch a)
{
    return a == TSR_ARCH_QWEN2 ? "Qwen2ForCausalLM" : a == TSR_ARCH_MISTRAL ? "MistralForCausalLM" : "LlamaForCausalLM";
}

static const char *arch_type(tsr_arch a)
{
    return a == TSR_ARCH_QWEN2 ? "qwen2" : a == TSR_ARCH_MISTRAL ? "mistral" : "llama";
}

static tsr_status check_gptq_opts(const tsr_synth_opts *o)
{
    const int qd = o->heads * o->head_dim, kvd = o->kv_heads * o->head_dim;
    if (o->hidden % 8 || o->intermediate % 8 || qd % 8 || kvd % 8)
        return tsr_fail(TSR_ERR_ARG,
                        "synth: hidden (%d), intermediate (%d), heads*head_dim (%d) and kv_heads*head_dim (%d) must be "
                        "multiples of 8 for GPTQ (qweight packs 8 rows, qzeros 8 columns, per int32)",
                        o->hidden, o->intermediate, qd, kvd);
    const int gs = o->group_size;
    if (gs != 0 && gs != -1 && (gs < 8 || gs > 65536 || (gs & (gs - 1))))
        return tsr_fail(TSR_ERR_ARG,
                        "synth: --group-size %d: use a power of two from 8 to 65536 (ExLlamaV2 assumes one), or -1 for "
                        "one group per matrix",
                        gs);
    return TSR_OK;
}

static tsr_status check_opts(const tsr_synth_opts *o)
{
    const int qd = o->heads * o->head_dim;
    if (o->hidden <= 0 || o->layers <= 0 || o->heads <= 0 || o->kv_heads <= 0 || o->head_dim <= 0 ||
        o->intermediate <= 0 || o->vocab <= 0)
        return tsr_fail(TSR_ERR_ARG, "synth: every dimension must be positive");
    if (o->heads % o->kv_heads)
        return tsr_fail(TSR_ERR_ARG, "synth: --heads %d is not a multiple of --kv-heads %d", o->heads, o->kv_heads);
    if (o->head_dim % 2) return tsr_fail(TSR_ERR_ARG, "synth: --head-dim %d must be even", o->head_dim);
    if (o->vocab < 3) return tsr_fail(TSR_ERR_ARG, "synth: --vocab must be at least 3 (bos 1, eos 2)");
    if (o->max_pos <= 0) return tsr_fail(TSR_ERR_ARG, "synth: --max-pos must be positive");
    if (o->format == TSR_SYNTH_GPTQ) return check_gptq_opts(o);
    if (o->format != TSR_SYNTH_EXL2) return tsr_fail(TSR_ERR_ARG, "synth: unknown format %d", (int)o->format);
    if (o->act_order || o->sym)
        return tsr_fail(TSR_ERR_ARG, "synth: act-order and sym are GPTQ options (EXL2 was asked for)");
    if (o->group_size && o->group_size != 32 && o->group_size != 64 && o->group_size != 128)
        return tsr_fail(TSR_ERR_ARG, "synth: EXL2 group size %d: the converter's are 32, 64 and 128 rows",
                        o->group_size);
    if (o->hidden % 32 || o->intermediate % 32 || qd % 32)
        return tsr_fail(TSR_ERR_ARG,
                        "synth: hidden (%d), intermediate (%d) and heads*head_dim (%d) must be multiples of 32 (EXL2 "
                        "groups hold whole 32-row words)",
                        o->hidden, o->intermediate, qd);
    if (o->hidden > 65535 || o->intermediate > 65535 || qd > 65535)
        return tsr_fail(TSR_ERR_ARG, "synth: input widths above 65535 cannot be stored in EXL2 (16-bit permutation)");
    if (!(o->bpw >= 2.0 && o->bpw <= 8.5)) return tsr_fail(TSR_ERR_ARG, "synth: --bpw %g is outside 2..8.5", o->bpw);
    return TSR_OK;
}

/* Builds the plans and the tensor list in converter order. */
static tsr_status build_inventory(synth_ctx *c, tsr_synth_result *res)
{
    const tsr_synth_opts *o = c->o;
    const int H = o->hidden, qd = o->heads * o->head_dim, kvd = o->kv_heads * o->head_dim, I = o->intermediate;
    const int bias = o->arch == TSR_ARCH_QWEN2, gptq = o->format == TSR_SYNTH_GPTQ;
    rng_t prng = rng_for(o->seed, "plan");
    TSR_TRY(add_tensor(c, "model.embed_tokens.weight", TK_EMBED, TSR_F16, 2, o->vocab, H, -1));
    double carry = 0, layer_bits = 0, layer_numel = 0;
    for (int l = 0; l < o->layers; l++) {
        static const struct {
            const char *name, *perm;
            int kind; /* 0 q, 1 kv, 2 o, 3 gate/up, 4 down */
        } lin[] = {{"self_attn.q_proj", "attn_in", 0}, {"self_attn.k_proj", "attn_in", 1},
                   {"self_attn.v_proj", "attn_in", 1}, {"self_attn.o_proj", "o_in", 2},
                   {"mlp.gate_proj", "mlp_in", 3},     {"mlp.up_proj", "mlp_in", 3},
                   {"mlp.down_proj", "down_in", 4}};
        char name[160], key[96], pkey[96];
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        TSR_TRY(add_tensor(c, name, TK_NORM, TSR_F16, 1, H, 0, -1));
        for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
            int K = lin[i].kind == 2 ? qd : lin[i].kind == 4 ? I : H;
            int N = lin[i].kind == 0 ? qd : lin[i].kind == 1 ? kvd : lin[i].kind == 3 ? I : H;
            snprintf(key, sizeof key, "model.layers.%d.%s", l, lin[i].name);
            snprintf(pkey, sizeof pkey, "model.layers.%d.%s", l, lin[i].perm);
            if (gptq) {
                const int gs = gptq_group_rows(o, K);
                layer_bits += (double)gptq_bits(K, N, (K + gs - 1) / gs);
                layer_numel += (double)K * N;
                TSR_TRY(add_gptq_matrix(c, key, pkey, K, N, bias && lin[i].kind <= 1));
            } else {
                int Np = (N + 31) / 32 * 32;
                double target = o->bpw * (double)K * Np + carry;
                tsr_synth_qplan p;
                TSR_TRY(plan_layer_matrix(K, Np, target, o->group_size, &prng, &p));
                double bits = (double)tsr_synth_qplan_bits(&p);
                carry = target - bits;
                layer_bits += bits;
                layer_numel += (double)K * Np;
                TSR_TRY(add_matrix(c, key, pkey, K, N, bias && lin[i].kind <= 1, &p));
            }
            if (i == 3) {
                snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
                TSR_TRY(add_tensor(c, name, TK_NORM, TSR_F16, 1, H, 0, -1));
            }
        }
    }
    TSR_TRY(add_tensor(c, "model.norm.weight", TK_NORM, TSR_F16, 1, H, 0, -1));
    res->n_params = (uint64_t)o->vocab * H + (uint64_t)(2 * o->layers + 1) * H;
    if (gptq) {
        TSR_TRY(add_tensor(c, "lm_head.weight", TK_DENSE, TSR_F16, 2, o->vocab, H, -1));
        res->layers_bpw = layer_bits / layer_numel;
        res->head_bpw = 16.0;
        for (int i = 0; i < c->n_mats; i++) res->n_params += (uint64_t)c->mats[i].K * c->mats[i].plan.N;
        res->n_params += (uint64_t)o->vocab * H;
        return TSR_OK;
    }
    tsr_synth_qplan hp;
    TSR_TRY(tsr_synth_head_plan(H, o->vocab, o->head_bits, &hp));
    TSR_TRY(add_matrix(c, "lm_head", "lm_head", H, o->vocab, 0, &hp));
    res->layers_bpw = layer_bits / layer_numel;
    res->head_bpw = (double)tsr_synth_qplan_bits(&hp) / ((double)hp.K * hp.N);
    if (fabs(res->layers_bpw - o->bpw) > 0.05)
        return tsr_fail(TSR_ERR_ARG,
                        "synth: --bpw %.3f is not reachable for this geometry: the closest layout averages %.3f bpw "
                        "(index overhead of q_invperm/q_scale is large for small matrices)",
                        o->bpw, res->layers_bpw);
    for (int i = 0; i < c->n_mats; i++) res->n_params += (uint64_t)c->mats[i].K * c->mats[i].plan.N;
    return TSR_OK;
}

/* ---------------- value tables ---------------- */

/* GPTQ zero point from a random byte: 6..10, centred on 8 */
static inline int gptq_zero_of_byte(unsigned byte) { return 6 + (int)((byte * 5u) >> 8); }

/* GPTQ code around zero point z from a 4-bit code of the shared table (centred on 8) */
static inline int gptq_code(int z, int code)
{
    const int q = z + code - 8;
    return q < 0 ? 0 : q > 15 ? 15 : q;
}

static tsr_status build_tables(synth_ctx *c)
{
    for (int b = 2; b <= 8; b++) {
        if (!valid_width(b)) continue;
        c->ctab[b] = malloc(65536);
        if (!c->ctab[b]) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        const int off = 1 << (b - 1), top = (1 << b) - 1;
        const double sigma = ((1 << b) - 1) / 2.0 / 2.5;
        int k = 0;
        double var = 0;
        for (int u = 0; u < 65536; u++) {
            double p = (u + 0.5) / 65536.0;
            /* smallest code k whose CDF exceeds p: P(code <= k) = Phi((k - off + 0.5) / sigma), clamped */
            while (k < top && 0.5 * erfc(-((k - off + 0.5) / sigma) / sqrt(2.0)) <= p) k++;
            c->ctab[b][u] = (uint8_t)k;
            var += (double)(k - off) * (k - off);
        }
        c->code_var[b] = var / 65536.0;
    }
    /* GPTQ: code = clamp(zero + 4-bit code - 8, 0, 15); zero 8, or 6 + (byte * 5 >> 8) for random zero points */
    double var_z[16] = {0}, gv = 0;
    for (int z = 1; z < 16; z++) {
        for (int u = 0; u < 65536; u++) {
            const int d = gptq_code(z, c->ctab[4][u]) - z;
            var_z[z] += (double)d * d;
        }
        var_z[z] /= 65536.0;
    }
    for (int byte = 0; byte < 256; byte++) gv += var_z[gptq_zero_of_byte((unsigned)byte)];
    c->gptq_var = c->o->sym ? var_z[8] : gv / 256.0;
    double s = 0;
    for (int q = 8; q <= 15; q++) {
        double v = (q + 1.0) * (q + 1.0) / 256.0;
        s += v * v;
    }
    c->scale_sq = s / 8.0;
    return TSR_OK;
}

/* ---------------- tensor data ---------------- */

static tsr_status ensure_buf(synth_ctx *c, size_t bytes)
{
    if (bytes <= c->buf_bytes) return TSR_OK;
    void *g = realloc(c->buf, bytes);
    if (!g) return tsr_fail(TSR_ERR_NOMEM, "synth: out of memory (%zu bytes)", bytes);
    c->buf = g;
    c->buf_bytes = bytes;
    return TSR_OK;
}

static tsr_status write_qweight(synth_ctx *c, tsr_st_writer *w, const stensor *t, const smatrix *m)
{
    const tsr_synth_qplan *p = &m->plan;
    const size_t N = (size_t)p->N;
    rng_t r = rng_for(c->o->seed, t->name);
    for (int i = 0; i < p->n_widths; i++) {
        const int b = p->bits[i];
        const uint8_t *tab = c->ctab[b];
        const uint8_t off = (uint8_t)(1 << (b - 1));
        for (int r0 = 0; r0 < p->rows[i]; r0 += p->group_size[i]) {
            int gr = p->rows[i] - r0 < p->group_size[i] ? p->rows[i] - r0 : p->group_size[i];
            for (int j = 0; j < gr; j++) {
                uint8_t *row = c->codes + (size_t)j * N;
                size_t n = 0;
                for (; n + 4 <= (size_t)m->Nreal; n += 4) {
                    uint64_t x = rng_next(&r);
                    row[n] = tab[x & 0xffff];
                    row[n + 1] = tab[(x >> 16) & 0xffff];
                    row[n + 2] = tab[(x >> 32) & 0xffff];
                    row[n + 3] = tab[x >> 48];
                }
                for (; n < (size_t)m->Nreal; n++) row[n] = tab[rng_next(&r) & 0xffff];
                for (; n < N; n++) row[n] = off; /* padded columns quantize to zero */
            }
            tsr_synth_pack(c->codes, gr, b, (int)N, c->words);
            TSR_TRY(tsr_st_writer_write(w, c->words, (size_t)gr * b / 32 * N * sizeof(uint32_t)));
        }
    }
    return TSR_OK;
}

/* ---------------- GPTQ tensor data ---------------- */

/* True zero points (1..15; stored as zero - 1) of group g of a GPTQ matrix, [N]: from the group's own stream. */
static void gptq_zero_row(const synth_ctx *c, const smatrix *m, int g, uint8_t *z)
{
    const int N = m->Nreal;
    if (c->o->sym) {
        memset(z, 8, (size_t)N);
        return;
    }
    char name[160];
    snprintf(name, sizeof name, "%s.qzeros", m->key);
    rng_t r = rng_for_row(c->o->seed, name, (uint64_t)g);
    for (int n = 0; n < N; n += 8) { /* N is a multiple of 8 */
        const uint64_t x = rng_next(&r);
        for (int i = 0; i < 8; i++) z[n + i] = (uint8_t)gptq_zero_of_byte((unsigned)(x >> (8 * i)) & 0xffu);
    }
}

/* g_idx of a GPTQ matrix [K]: k / gs, or with act-order the desc_act assignment of a random row order (row k at
 * position pos[k] of the order falls in group pos[k] / gs), seeded by the shared permutation key. */
static void gptq_fill_gidx(const synth_ctx *c, const smatrix *m, int32_t *gidx)
{
    const int K = m->K;
    for (int k = 0; k < K; k++) gidx[k] = k;
    if (c->o->act_order && m->G > 1) {
        rng_t pr = rng_for(c->o->seed, m->perm_key);
        for (int k = K - 1; k > 0; k--) {
            uint32_t j = rng_below(&pr, (uint32_t)k + 1);
            int32_t tmp = gidx[k];
            gidx[k] = gidx[j];
            gidx[j] = tmp;
        }
    }
    for (int k = 0; k < K; k++) gidx[k] /= m->gs;
}

/* qweight [K/8][N]: blocks of GPTQ_BLOCK original rows, codes around their group's zero points, packed along K
 * (row k in bits 4(k%8) of word [k/8][n], the 4-bit EXL2 column stream). */
static tsr_status write_gptq_qweight(synth_ctx *c, tsr_st_writer *w, const stensor *t, const smatrix *m)
{
    const int K = m->K, N = m->Nreal;
    const uint8_t *tab = c->ctab[4];
    const int act = c->o->act_order && m->G > 1;
    rng_t r = rng_for(c->o->seed, t->name);
    if (act) gptq_fill_gidx(c, m, c->gidx);
    int zg = -1;
    for (int k0 = 0; k0 < K; k0 += GPTQ_BLOCK) {
        const int rows = K - k0 < GPTQ_BLOCK ? K - k0 : GPTQ_BLOCK; /* a multiple of 8 */
        for (int j = 0; j < rows; j++) {
            const int k = k0 + j, g = act ? c->gidx[k] : k / m->gs;
            if (g != zg) {
                gptq_zero_row(c, m, g, c->zrow);
                zg = g;
            }
            uint8_t *row = c->codes + (size_t)j * (size_t)N;
            for (int n = 0; n < N; n += 4) {
                const uint64_t x = rng_next(&r);
                for (int i = 0; i < 4; i++)
                    row[n + i] = (uint8_t)gptq_code(c->zrow[n + i], tab[(x >> (16 * i)) & 0xffff]);
            }
        }
        tsr_synth_pack(c->codes, rows, 4, N, c->words);
        TSR_TRY(tsr_st_writer_write(w, c->words, (size_t)rows / 8 * (size_t)N * sizeof(uint32_t)));
    }
    return TSR_OK;
}

/* qzeros [G][N/8]: v1 convention, zero - 1 in nibble n%8 of word [g][n/8]. */
static tsr_status write_gptq_qzeros(synth_ctx *c, tsr_st_writer *w, const smatrix *m)
{
    const int N = m->Nreal;
    for (int g = 0; g < m->G; g++) {
        gptq_zero_row(c, m, g, c->zrow);
        memset(c->words, 0, (size_t)N / 8 * sizeof(uint32_t));
        for (int n = 0; n < N; n++) c->words[n / 8] |= (uint32_t)(c->zrow[n] - 1) << (4 * (n % 8));
        TSR_TRY(tsr_st_writer_write(w, c->words, (size_t)N / 8 * sizeof(uint32_t)));
    }
    return TSR_OK;
}

/* scales [G][N] fp16: base · U(0.75, 1.25), base such that E[W^2] = 1/K. */
static tsr_status write_gptq_scales(synth_ctx *c, tsr_st_writer *w, const stensor *t, const smatrix *m)
{
    const int N = m->Nreal;
    const double jitter_sq = 1.0 + 0.5 * 0.5 / 12.0; /* E[U(0.75, 1.25)^2] */
    const double base = 1.0 / sqrt((double)m->K) / sqrt(c->gptq_var * jitter_sq);
    rng_t r = rng_for(c->o->seed, t->name);
    TSR_TRY(ensure_buf(c, (size_t)N * 2));
    uint16_t *v = c->buf;
    for (int g = 0; g < m->G; g++) {
        for (int n = 0; n < N; n++) {
            const double u = (double)(rng_next(&r) >> 11) / 9007199254740992.0;
            v[n] = tsr_float_to_half((float)(base * (0.75 + 0.5 * u)));
        }
        TSR_TRY(tsr_st_writer_write(w, v, (size_t)N * 2));
    }
    return TSR_OK;
}

/* A dense fp16 matrix [rows][cols] (the GPTQ model's lm_head), row by row, std 1/sqrt(cols). */
static tsr_status write_dense(synth_ctx *c, tsr_st_writer *w, const stensor *t)
{
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const float sd = (float)(1.0 / sqrt((double)cols));
    rng_t r = rng_for(c->o->seed, t->name);
    TSR_TRY(ensure_buf(c, (size_t)cols * 2));
    uint16_t *row = c->buf;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < cols; j++) row[j] = tsr_float_to_half(sd * rng_gauss(&r));
        TSR_TRY(tsr_st_writer_write(w, row, (size_t)cols * 2));
    }
    return TSR_OK;
}

static tsr_status write_tensor(synth_ctx *c, tsr_st_writer *w, const stensor *t)
{
    const tsr_synth_opts *o = c->o;
    const smatrix *m = t->mat >= 0 ? &c->mats[t->mat] : NULL;
    rng_t r = rng_for(o->seed, t->name);
    switch (t->kind) {
    case TK_EMBED: {
        TSR_TRY(ensure_buf(c, (size_t)o->hidden * 2));
        uint16_t *row = c->buf;
        for (int v = 0; v < o->vocab; v++) {
            for (int h = 0; h < o->hidden; h++) row[h] = tsr_float_to_half(0.02f * rng_gauss(&r));
            TSR_TRY(tsr_st_writer_write(w, row, (size_t)o->hidden * 2));
        }
        return TSR_OK;
    }
    case TK_NORM: {
        TSR_TRY(ensure_buf(c, (size_t)t->shape[0] * 2));
        uint16_t *v = c->buf;
        for (int64_t i = 0; i < t->shape[0]; i++) v[i] = tsr_float_to_half(1.0f + 0.02f * rng_gauss(&r));
        return tsr_st_writer_write(w, v, t->nbytes);
    }
    case TK_BIAS: {
        TSR_TRY(ensure_buf(c, t->nbytes));
        uint16_t *v = c->buf;
        for (int64_t i = 0; i < t->shape[0]; i++) v[i] = i < m->Nreal ? tsr_float_to_half(0.05f * rng_gauss(&r)) : 0;
        return tsr_st_writer_write(w, v, t->nbytes);
    }
    case TK_QWEIGHT: return write_qweight(c, w, t, m);
    case TK_INVPERM: {
        /* shared by the matrices reading the same input (q/k/v, gate/up) */
        rng_t pr = rng_for(o->seed, m->perm_key);
        TSR_TRY(ensure_buf(c, t->nbytes));
        int32_t *perm = c->buf;
        for (int k = 0; k < m->K; k++) perm[k] = k;
        for (int k = m->K - 1; k > 0; k--) {
            uint32_t j = rng_below(&pr, (uint32_t)k + 1);
            int32_t tmp = perm[k];
            perm[k] = perm[j];
            perm[j] = tmp;
        }
        return tsr_st_writer_write(w, perm, t->nbytes);
    }
    case TK_SCALE: {
        const size_t words = (size_t)m->plan.N / 8;
        TSR_TRY(ensure_buf(c, words * 4));
        uint32_t *s = c->buf;
        for (int g = 0; g < m->plan.G; g++) {
            for (size_t i = 0; i < words; i++) {
                uint32_t x = (uint32_t)rng_next(&r);
                /* eight 4-bit codes 8..15: set the top bit of every nibble */
                s[i] = (x & 0x77777777u) | 0x88888888u;
            }
            TSR_TRY(tsr_st_writer_write(w, s, words * 4));
        }
        return TSR_OK;
    }
    case TK_SCALEMAX: {
        TSR_TRY(ensure_buf(c, t->nbytes));
        uint16_t *v = c->buf;
        int g = 0;
        for (int i = 0; i < m->plan.n_widths; i++) {
            const int b = m->plan.bits[i];
            double base = 1.0 / sqrt((double)m->K) / sqrt(c->scale_sq * c->code_var[b]);
            for (int r0 = 0; r0 < m->plan.rows[i]; r0 += m->plan.group_size[i]) {
                double jitter = 0.85 + 0.3 * (double)(rng_next(&r) >> 11) / 9007199254740992.0;
                v[g++] = tsr_float_to_half((float)(base * jitter));
            }
        }
        return tsr_st_writer_write(w, v, t->nbytes);
    }
    case TK_GROUPS: {
        TSR_TRY(ensure_buf(c, t->nbytes));
        tsr_synth_qplan_groups(&m->plan, c->buf);
        return tsr_st_writer_write(w, c->buf, t->nbytes);
    }
    case TK_GQWEIGHT: return write_gptq_qweight(c, w, t, m);
    case TK_GZEROS: return write_gptq_qzeros(c, w, m);
    case TK_GSCALES: return write_gptq_scales(c, w, t, m);
    case TK_GIDX:
        gptq_fill_gidx(c, m, c->gidx);
        return tsr_st_writer_write(w, c->gidx, (size_t)m->K * sizeof(int32_t));
    case TK_DENSE: return write_dense(c, w, t);
    }
    return tsr_fail(TSR_ERR_INTERNAL, "synth: unknown tensor kind");
}

/* ---------------- files ---------------- */

static tsr_status write_json(const char *dir, const char *file, json_t *root)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (rc != 0) return tsr_fail(TSR_ERR_IO, "%s: cannot write", path);
    return TSR_OK;
}

/* The GPTQ quantization settings, as AutoGPTQ / transformers write them (v1 checkpoint format: zero - 1). */
static json_t *gptq_quant_config(const tsr_synth_opts *o)
{
    json_t *q = json_object();
    json_object_set_new(q, "quant_method", json_string("gptq"));
    json_object_set_new(q, "bits", json_integer(4));
    json_object_set_new(q, "group_size", json_integer(o->group_size ? o->group_size : 128));
    json_object_set_new(q, "damp_percent", json_real(0.01));
    json_object_set_new(q, "desc_act", json_boolean(o->act_order));
    json_object_set_new(q, "static_groups", json_false());
    json_object_set_new(q, "sym", json_boolean(o->sym));
    json_object_set_new(q, "true_sequential", json_true());
    json_object_set_new(q, "checkpoint_format", json_string("gptq"));
    return q;
}

static tsr_status write_configs(const tsr_synth_opts *o, const char *dir)
{
    json_t *c = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(arch_class(o->arch)));
    json_object_set_new(c, "architectures", archs);
    json_object_set_new(c, "model_type", json_string(arch_type(o->arch)));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(o->hidden));
    json_object_set_new(c, "intermediate_size", json_integer(o->intermediate));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->layers));
    json_object_set_new(c, "num_attention_heads", json_integer(o->heads));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->kv_heads));
    json_object_set_new(c, "head_dim", json_integer(o->head_dim));
    json_object_set_new(c, "vocab_size", json_integer(o->vocab));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->max_pos));
    json_object_set_new(c, "rms_norm_eps", json_real(o->arch == TSR_ARCH_QWEN2 ? 1e-6 : 1e-5));
    json_object_set_new(c, "rope_theta", json_real(o->arch == TSR_ARCH_LLAMA ? 500000.0 : 1000000.0));
    json_object_set_new(c, "tie_word_embeddings", json_false());
    json_object_set_new(c, "attention_bias", json_boolean(o->arch == TSR_ARCH_QWEN2));
    json_object_set_new(c, "mlp_bias", json_false());
    if (o->arch == TSR_ARCH_MISTRAL) json_object_set_new(c, "sliding_window", json_null());
    if (o->arch == TSR_ARCH_QWEN2) {
        json_object_set_new(c, "use_sliding_window", json_false());
        json_object_set_new(c, "sliding_window", json_integer(o->max_pos));
        json_object_set_new(c, "max_window_layers", json_integer(o->layers));
    }
    json_object_set_new(c, "bos_token_id", json_integer(1));
    json_object_set_new(c, "eos_token_id", json_integer(2));
    json_object_set_new(c, "torch_dtype", json_string("float16"));
    json_t *q;
    if (o->format == TSR_SYNTH_GPTQ) {
        q = gptq_quant_config(o);
        /* AutoGPTQ's own file too, as GPTQ repositories ship it (config.json's block takes precedence) */
        json_t *qf = gptq_quant_config(o);
        json_object_set_new(qf, "model_name_or_path", json_string("(synthetic: tessera synth)"));
        json_object_set_new(qf, "model_file_base_name", json_string("model"));
        TSR_TRY(write_json(dir, "quantize_config.json", qf));
    } else {
        q = json_object();
        json_object_set_new(q, "quant_method", json_string("exl2"));
        json_object_set_new(q, "version", json_string("0.3.2"));
        json_object_set_new(q, "bits", json_real(o->bpw));
        json_object_set_new(q, "head_bits", json_integer(o->head_bits));
        json_t *cal = json_object();
        json_object_set_new(cal, "rows", json_integer(0));
        json_object_set_new(cal, "length", json_integer(0));
        json_object_set_new(cal, "dataset", json_string("(synthetic: tessera synth)"));
        json_object_set_new(q, "calibration", cal);
    }
    json_object_set_new(c, "quantization_config", q);
    json_t *syn = json_object();
    json_object_set_new(syn, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(syn, "note", json_string("random weights written by tessera synth; not a trained model"));
    json_object_set_new(c, "tessera_synth", syn);
    TSR_TRY(write_json(dir, "config.json", c));

    json_t *g = json_object();
    json_object_set_new(g, "bos_token_id", json_integer(1));
    json_object_set_new(g, "eos_token_id", json_integer(2));
    json_object_set_new(g, "do_sample", json_false());
    return write_json(dir, "generation_config.json", g);
}

/* EXL2: output.safetensors / output-0000i-of-0000N (the converter's names); GPTQ: model.safetensors /
 * model-0000i-of-0000N (transformers' names). */
static void shard_name(char *buf, size_t n, const char *dir, int i, int n_shards, tsr_synth_format f)
{
    const char *base = f == TSR_SYNTH_GPTQ ? "model" : "output";
    if (n_shards == 1)
        snprintf(buf, n, "%s/%s.safetensors", dir, base);
    else
        snprintf(buf, n, "%s/%s-%05d-of-%05d.safetensors", dir, base, i + 1, n_shards);
}

/* model.safetensors.index.json of a sharded GPTQ model: total size and the file of every tensor. */
static tsr_status write_index(const synth_ctx *c, const char *dir, int n_shards)
{
    json_t *root = json_object(), *meta = json_object(), *map = json_object();
    uint64_t total = 0;
    for (int i = 0; i < c->n_tens; i++) {
        char path[4096];
        shard_name(path, sizeof path, "", c->tens[i].shard, n_shards, c->o->format);
        json_object_set_new(map, c->tens[i].name, json_string(path + 1));
        total += c->tens[i].nbytes;
    }
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    json_object_set_new(root, "metadata", meta);
    json_object_set_new(root, "weight_map", map);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc = json_dump_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    if (rc != 0) return tsr_fail(TSR_ERR_IO, "%s: cannot write", path);
    return TSR_OK;
}

/* safetensors' save_file order inside a file: dtype descending in its enum order (I32 > F16 > I16), then name;
 * it keeps every tensor aligned to its element size, which readers may require. */
static int dtype_rank(tsr_dtype t) { return t == TSR_I32 ? 3 : t == TSR_F16 ? 2 : t == TSR_I16 ? 1 : 0; }

static int cmp_tensor(const void *pa, const void *pb)
{
    const stensor *a = pa, *b = pb;
    if (a->shard != b->shard) return a->shard < b->shard ? -1 : 1;
    if (dtype_rank(a->dtype) != dtype_rank(b->dtype)) return dtype_rank(a->dtype) > dtype_rank(b->dtype) ? -1 : 1;
    return strcmp(a->name, b->name);
}

/* Refuses a directory holding other *.safetensors files (the loader would read them too). */
static tsr_status check_dir(const char *dir, int n_shards, tsr_synth_format f)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return tsr_fail(TSR_ERR_IO, "%s: cannot create: %s", dir, strerror(errno));
    DIR *d = opendir(dir);
    if (!d) return tsr_fail(TSR_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    struct dirent *e;
    tsr_status st = TSR_OK;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 12 || strcmp(e->d_name + len - 12, ".safetensors")) continue;
        int ours = 0;
        for (int i = 0; i < n_shards && !ours; i++) {
            char p[4096], full[4096];
            shard_name(p, sizeof p, "", i, n_shards, f);
            snprintf(full, sizeof full, "/%s", e->d_name);
            ours = !strcmp(p, full);
        }
        if (!ours) {
            st = tsr_fail(TSR_ERR_ARG, "%s already holds %s (from another run?); use an empty directory", dir,
                          e->d_name);
            break;
        }
    }
    closedir(d);
    return st;
}

/* ---------------- writing shards, in parallel ---------------- */

/* The per-writer buffers: one group (EXL2) or one GPTQ_BLOCK-row block (GPTQ) of the widest matrix; GPTQ also a
 * zero row and g_idx. A writer is a copy of the shared context (read-only tables and inventory) with its own. */
static tsr_status writer_buffers(synth_ctx *c)
{
    int maxN = 0, maxK = 0, maxrows = 0;
    for (int i = 0; i < c->n_mats; i++) {
        if (c->mats[i].plan.N > maxN) maxN = c->mats[i].plan.N;
        if (c->mats[i].K > maxK) maxK = c->mats[i].K;
        if (c->mats[i].gs && maxrows < GPTQ_BLOCK) maxrows = GPTQ_BLOCK;
        for (int k = 0; k < c->mats[i].plan.n_widths; k++)
            if (c->mats[i].plan.group_size[k] > maxrows) maxrows = c->mats[i].plan.group_size[k];
    }
    c->codes = malloc((size_t)maxrows * maxN);
    c->words = malloc((size_t)maxrows * 8 / 32 * maxN * sizeof(uint32_t));
    if (c->o->format == TSR_SYNTH_GPTQ) {
        c->zrow = malloc((size_t)maxN);
        c->gidx = malloc((size_t)maxK * sizeof(int32_t));
    }
    if (!c->codes || !c->words || (c->o->format == TSR_SYNTH_GPTQ && (!c->zrow || !c->gidx)))
        return tsr_fail(TSR_ERR_NOMEM, "synth: out of memory for a group buffer");
    return TSR_OK;
}

static void free_writer_buffers(synth_ctx *c)
{
    free(c->codes);
    free(c->words);
    free(c->zrow);
    free(c->gidx);
    free(c->buf);
}

/* Writes shard s (its tensors are c->tens[first..], sorted by shard); *bytes gets the file's size. */
static tsr_status write_shard(synth_ctx *c, const char *dir, int s, int n_shards, int first, uint64_t *bytes)
{
    char path[4096];
    shard_name(path, sizeof path, dir, s, n_shards, c->o->format);
    tsr_st_writer *w = NULL;
    tsr_status st = tsr_st_writer_open(path, &w);
    int end = first;
    while (end < c->n_tens && c->tens[end].shard == s) end++;
    for (int i = first; st == TSR_OK && i < end; i++)
        st = tsr_st_writer_declare(w, c->tens[i].name, c->tens[i].dtype, c->tens[i].ndim, c->tens[i].shape);
    if (st == TSR_OK) st = tsr_st_writer_begin_data(w);
    uint64_t data = 0;
    for (int i = first; st == TSR_OK && i < end; i++) {
        st = write_tensor(c, w, &c->tens[i]);
        data += c->tens[i].nbytes;
    }
    if (st == TSR_OK) {
        st = tsr_st_writer_close(w);
        w = NULL;
    }
    if (w) tsr_st_writer_abort(w);
    if (st != TSR_OK) return st;
    struct stat sb;
    *bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    if (c->o->verbose)
        fprintf(stderr, "synth: wrote %s (%d tensors, %.1f MiB)\n", path, end - first, (double)data / 1048576.0);
    return TSR_OK;
}

typedef struct {
    synth_ctx ctx;           /* this writer's copy */
    const char *dir;
    int n_shards;
    const int *shard_first;  /* [n_shards] index of each shard's first tensor */
    atomic_int *next;        /* next shard to take */
    uint64_t *bytes;         /* [n_shards] file sizes */
    int started;             /* a thread of its own was created (writer 0 is the caller) */
    tsr_status st;
    char error[512];         /* the failure's message (errors are per thread) */
} shard_writer;

static void *shard_writer_main(void *arg)
{
    shard_writer *sw = arg;
    sw->st = writer_buffers(&sw->ctx);
    for (int s; sw->st == TSR_OK && (s = atomic_fetch_add(sw->next, 1)) < sw->n_shards;)
        sw->st = write_shard(&sw->ctx, sw->dir, s, sw->n_shards, sw->shard_first[s], &sw->bytes[s]);
    if (sw->st != TSR_OK) snprintf(sw->error, sizeof sw->error, "%s", tsr_last_error());
    free_writer_buffers(&sw->ctx);
    return NULL;
}

/* Every shard, by up to o->threads writers (default: the cores, at most one per shard). Each tensor's data comes
 * from its own random stream, so the files are the same whatever the number of writers. */
static tsr_status write_shards(synth_ctx *c, const char *dir, int n_shards, tsr_synth_result *res)
{
    int n_threads = c->o->threads > 0 ? c->o->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads > n_shards) n_threads = n_shards;
    if (n_threads < 1) n_threads = 1;
    int *first = calloc((size_t)n_shards, sizeof *first);
    uint64_t *bytes = calloc((size_t)n_shards, sizeof *bytes);
    shard_writer *sw = calloc((size_t)n_threads, sizeof *sw);
    pthread_t *tid = calloc((size_t)n_threads, sizeof *tid);
    if (!first || !bytes || !sw || !tid) {
        free(first), free(bytes), free(sw), free(tid);
        return tsr_fail(TSR_ERR_NOMEM, "synth: out of memory");
    }
    for (int i = c->n_tens - 1; i >= 0; i--) first[c->tens[i].shard] = i;
    atomic_int next = 0;
    for (int t = 0; t < n_threads; t++) {
        sw[t] = (shard_writer){.ctx = *c, .dir = dir, .n_shards = n_shards, .shard_first = first, .next = &next,
                               .bytes = bytes};
        sw[t].ctx.codes = NULL, sw[t].ctx.words = NULL, sw[t].ctx.zrow = NULL, sw[t].ctx.gidx = NULL;
        sw[t].ctx.buf = NULL, sw[t].ctx.buf_bytes = 0;
        sw[t].started = t > 0 && pthread_create(&tid[t], NULL, shard_writer_main, &sw[t]) == 0;
    }
    shard_writer_main(&sw[0]); /* the calling thread is writer 0 */
    tsr_status st = sw[0].st;
    const char *err = sw[0].error;
    for (int t = 1; t < n_threads; t++) {
        if (!sw[t].started) continue;
        pthread_join(tid[t], NULL);
        if (st == TSR_OK && sw[t].st != TSR_OK) st = sw[t].st, err = sw[t].error;
    }
    if (st != TSR_OK) tsr_fail(st, "%s", err);
    for (int s = 0; st == TSR_OK && s < n_shards; s++) {
        res->total_bytes += bytes[s];
        res->n_files++;
    }
    free(first), free(bytes), free(sw), free(tid);
    return st;
}

tsr_status tsr_synth_write(const tsr_synth_opts *o, const char *dir, tsr_synth_result *res)
{
    TSR_TRY(check_opts(o));
    memset(res, 0, sizeof *res);
    synth_ctx c = {.o = o};
    tsr_status st = build_inventory(&c, res);
    if (st == TSR_OK) st = build_tables(&c);

    /* shards: greedy by tensor bytes */
    int n_shards = 1;
    if (st == TSR_OK) {
        uint64_t used = 0;
        for (int i = 0; i < c.n_tens; i++) {
            if (o->shard_bytes && used > 0 && used + c.tens[i].nbytes > o->shard_bytes) {
                n_shards++;
                used = 0;
            }
            c.tens[i].shard = n_shards - 1;
            used += c.tens[i].nbytes;
        }
        qsort(c.tens, (size_t)c.n_tens, sizeof *c.tens, cmp_tensor);
        st = check_dir(dir, n_shards, o->format);
    }
    if (st == TSR_OK) st = write_configs(o, dir);
    if (st == TSR_OK) st = write_shards(&c, dir, n_shards, res);
    if (st == TSR_OK && o->format == TSR_SYNTH_GPTQ && n_shards > 1) st = write_index(&c, dir, n_shards);
    if (st != TSR_OK) { /* remove the shards already finished: a partial model must not look loadable */
        for (int s = 0; s < n_shards; s++) {
            char path[4096];
            shard_name(path, sizeof path, dir, s, n_shards, o->format);
            remove(path);
        }
        if (o->format == TSR_SYNTH_GPTQ && n_shards > 1) {
            char path[4096];
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
            remove(path);
        }
    }
    for (int b = 0; b < 9; b++) free(c.ctab[b]);
    free(c.mats);
    free(c.tens);
    return st;
}
