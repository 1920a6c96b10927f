/* Tensor-parallel shards (see shard.h): column slices gather, row slices re-pack EXL2 bit streams group by group.
 * A group larger than the model's KV head count replicates each KV head on the members that share it.
 *
 * Row re-packing moves each kept code from its place in the source group's stream (row j at bit j·b) to its place
 * in the new group's stream (row t at bit t·b), for every column; the work is split over column blocks with the
 * CPU thread pool, and each column block is walked row by row so that reads and writes stay sequential. */
#include "parallel/shard.h"

#include "kernels/cpu/threadpool.h"

#include <stdlib.h>
#include <string.h>

/* Whether the group replicates KV heads: more members than KV heads, each KV head on size / n_kv members. */
static int replicates_kv(const tsr_model_config *c, int size) { return size > c->n_kv_heads; }

tsr_status tsr_shard_check(const tsr_model_config *c, int size)
{
    if (size < 1) return tsr_fail(TSR_ERR_ARG, "tensor split: %d members", size);
    if (size == 1) return TSR_OK;
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "tensor split: %d query heads are not a multiple of %d key/value heads",
                        c->n_heads, c->n_kv_heads);
    if (replicates_kv(c, size) ? size % c->n_kv_heads || c->n_heads % size : c->n_kv_heads % size)
        return tsr_fail(TSR_ERR_UNSUPPORTED,
                        "tensor split: the model's %d key/value heads (%d query heads) neither split evenly over %d "
                        "workers nor replicate evenly on them (use a divisor of %d, or a multiple of it that divides "
                        "%d; or --split layers)",
                        c->n_kv_heads, c->n_heads, size, c->n_kv_heads, c->n_heads);
    if (c->intermediate % size)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "tensor split: the MLP's %d features do not split evenly over %d workers",
                        c->intermediate, size);
    if (c->vocab_size < 32 * size)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "tensor split: a vocabulary of %d is too small to split over %d workers",
                        c->vocab_size, size);
    return TSR_OK;
}

int tsr_shard_kv_heads(const tsr_model_config *c, int size)
{
    return replicates_kv(c, size) ? 1 : c->n_kv_heads / size;
}

void tsr_shard_range_of(const tsr_model_config *c, int rank, int size, tsr_shard_range *r)
{
    if (replicates_kv(c, size)) {
        /* size / n_kv consecutive members share a KV head and split its query heads */
        const int per = c->n_heads / size;
        r->kv0 = rank / (size / c->n_kv_heads);
        r->kv1 = r->kv0 + 1;
        r->h0 = per * rank;
        r->h1 = r->h0 + per;
    } else {
        const int group = c->n_heads / c->n_kv_heads;
        r->kv0 = c->n_kv_heads / size * rank;
        r->kv1 = r->kv0 + c->n_kv_heads / size;
        r->h0 = r->kv0 * group;
        r->h1 = r->kv1 * group;
    }
    r->i0 = c->intermediate / size * rank;
    r->i1 = r->i0 + c->intermediate / size;
    /* vocabulary: 32-column pieces, the last member takes the remainder */
    const int per = (c->vocab_size + 32 * size - 1) / (32 * size) * 32;
    r->v0 = per * rank < c->vocab_size ? per * rank : c->vocab_size;
    r->v1 = rank == size - 1 ? c->vocab_size : (r->v0 + per < c->vocab_size ? r->v0 + per : c->vocab_size);
}

/* ---- helpers ---- */

static void *own_alloc(tsr_model *m, size_t bytes, tsr_status *st)
{
    void *p = calloc(1, bytes ? bytes : 1);
    *st = tsr_model_own(m, p);
    return *st == TSR_OK ? p : NULL;
}

/* 4-bit codes of columns [n0, n0 + ns) of `rows` rows of src ([rows][src_words] words, 8 codes per word) into a new
 * [rows][np / 8] array (zero beyond ns). */
static uint32_t *gather_nibbles(tsr_model *m, const uint32_t *src, int rows, int src_words, int n0, int ns, int np,
                                tsr_status *st)
{
    uint32_t *d = own_alloc(m, (size_t)rows * (size_t)(np / 8) * 4, st);
    if (!d) return NULL;
    for (int r = 0; r < rows; r++) {
        const uint32_t *s = src + (size_t)r * (size_t)src_words;
        uint32_t *o = d + (size_t)r * (size_t)(np / 8);
        for (int n = 0; n < ns; n++) {
            int sn = n0 + n;
            uint32_t code = (s[sn / 8] >> (4 * (sn % 8))) & 0xfu;
            o[n / 8] |= code << (4 * (n % 8));
        }
    }
    return d;
}

static tsr_status copy_tables(const tsr_qmatrix *s, tsr_qmatrix *d)
{
    d->perm = malloc((size_t)s->K * sizeof *d->perm);
    d->groups = malloc((size_t)s->G * sizeof *d->groups);
    if (!d->perm || !d->groups) return tsr_fail(TSR_ERR_NOMEM, "out of memory slicing a matrix");
    memcpy(d->perm, s->perm, (size_t)s->K * sizeof *d->perm);
    memcpy(d->groups, s->groups, (size_t)s->G * sizeof *d->groups);
    return TSR_OK;
}

/* Bytes of a quantized matrix's arrays, counted like the loader counts the file's tensors. */
static uint64_t qmatrix_bytes(const tsr_qmatrix *q)
{
    uint64_t b = (uint64_t)q->Q * q->N * 4 + (uint64_t)q->K * 4;
    if (q->kind == TSR_QMATRIX_GPTQ)
        b += (uint64_t)q->G * (q->N / 8) * 4 + (uint64_t)q->G * q->N * (q->g_scales_f32 ? 4 : 2);
    else
        b += (uint64_t)q->G * (q->N / 8) * 4 + (uint64_t)q->G * 2 + (uint64_t)q->G * 4;
    if (q->bias) b += (uint64_t)q->N * 2;
    return b;
}

/* ---- column slices ---- */

static tsr_status slice_q_cols(tsr_model *m, const tsr_qmatrix *s, int n0, int n1, tsr_qmatrix *d)
{
    const int ns = n1 - n0, np = (ns + 31) / 32 * 32;
    tsr_status st = TSR_OK;
    memset(d, 0, sizeof *d);
    d->K = s->K;
    d->N = np;
    d->G = s->G;
    d->Q = s->Q;
    d->kind = s->kind;
    d->zero_add = s->zero_add;
    d->g_scales_f32 = s->g_scales_f32;
    if ((st = copy_tables(s, d)) != TSR_OK) return st;
    uint32_t *w = calloc((size_t)s->Q * (size_t)np, 4);
    if (!w) return tsr_fail(TSR_ERR_NOMEM, "out of memory slicing a matrix (%d x %d words)", s->Q, np);
    d->q_weight_owned = w;
    d->q_weight = w;
    for (int r = 0; r < s->Q; r++)
        memcpy(w + (size_t)r * np, s->q_weight + (size_t)r * s->N + n0, (size_t)ns * 4);
    if (s->kind == TSR_QMATRIX_GPTQ) {
        if (!(d->g_zeros = gather_nibbles(m, s->g_zeros, s->G, s->N / 8, n0, ns, np, &st))) return st;
        size_t el = s->g_scales_f32 ? 4 : 2;
        uint8_t *sc = own_alloc(m, (size_t)s->G * np * el, &st);
        if (!sc) return st;
        for (int g = 0; g < s->G; g++)
            memcpy(sc + (size_t)g * np * el, (const uint8_t *)s->g_scales + ((size_t)g * s->N + n0) * el,
                   (size_t)ns * el);
        d->g_scales = sc;
    } else {
        if (!(d->q_scale = gather_nibbles(m, s->q_scale, s->G, s->N / 8, n0, ns, np, &st))) return st;
    }
    if (s->bias) {
        uint16_t *b = own_alloc(m, (size_t)np * 2, &st);
        if (!b) return st;
        memcpy(b, s->bias + n0, (size_t)ns * 2);
        d->bias = b;
    }
    d->bytes = qmatrix_bytes(d);
    return TSR_OK;
}

static size_t dtype_bytes(tsr_dtype t)
{
    return tsr_dtype_size(t);
}

tsr_status tsr_slice_linear_cols(tsr_model *m, const tsr_linear *src, int n0, int n1, tsr_linear *dst)
{
    if (n0 < 0 || n1 > src->N || n0 >= n1)
        return tsr_fail(TSR_ERR_ARG, "slice: columns [%d, %d) of a %d-column matrix", n0, n1, src->N);
    memset(dst, 0, sizeof *dst);
    dst->kind = src->kind;
    dst->K = src->K;
    dst->N = n1 - n0;
    if (src->kind == TSR_LINEAR_EXL2) {
        tsr_status st = slice_q_cols(m, &src->q, n0, n1, &dst->q);
        if (st != TSR_OK) tsr_qmatrix_free(&dst->q);
        return st;
    }
    /* dense [N][K]: output columns are rows of the stored matrix, a view */
    dst->w = src->w;
    dst->w.rows = n1 - n0;
    dst->w.dev = NULL;
    dst->w.data = (const uint8_t *)src->w.data + (size_t)n0 * src->w.cols * dtype_bytes(src->w.dtype);
    if (src->bias.data) {
        dst->bias = src->bias;
        dst->bias.cols = n1 - n0;
        dst->bias.dev = NULL;
        dst->bias.data = (const uint8_t *)src->bias.data + (size_t)n0 * dtype_bytes(src->bias.dtype);
    }
    return TSR_OK;
}

/* ---- row slices ---- */

typedef struct {
    const tsr_qmatrix *s;
    const tsr_qgroup *ng;   /* new groups */
    const int *src_group;   /* [G'] source group of each new group */
    const int32_t *src_row; /* [K'] source stored row of each new stored row */
    int G;
    uint32_t *w; /* [Q'][N] */
} repack_job;

static void repack_range(void *ctx, int begin, int end)
{
    const repack_job *j = ctx;
    const tsr_qmatrix *s = j->s;
    const size_t N = (size_t)s->N;
    const size_t c0 = (size_t)begin * 32, c1 = (size_t)end * 32 < N ? (size_t)end * 32 : N;
    for (int g = 0; g < j->G; g++) {
        const tsr_qgroup *ng = &j->ng[g], *sg = &s->groups[j->src_group[g]];
        const int b = ng->bits;
        const uint32_t mask = (1u << b) - 1u;
        for (int t = 0; t < ng->rows; t++) {
            const long sbit = (long)(j->src_row[ng->row0 + t] - sg->row0) * b, dbit = (long)t * b;
            const int ssh = (int)(sbit & 31), dsh = (int)(dbit & 31);
            const uint32_t *r0 = s->q_weight + ((size_t)sg->qrow0 + (size_t)(sbit >> 5)) * N, *r1 = r0 + N;
            uint32_t *o0 = j->w + ((size_t)ng->qrow0 + (size_t)(dbit >> 5)) * N, *o1 = o0 + N;
            const int split_in = ssh + b > 32, split_out = dsh + b > 32;
            for (size_t n = c0; n < c1; n++) {
                uint32_t v = r0[n] >> ssh;
                if (split_in) v |= r1[n] << (32 - ssh);
                v &= mask;
                o0[n] |= v << dsh;
                if (split_out) o1[n] |= v >> (32 - dsh);
            }
        }
    }
}

static tsr_status slice_q_rows(tsr_model *m, const tsr_qmatrix *s, int k0, int k1, int keep_bias, tsr_qmatrix *d)
{
    const int ks = k1 - k0;
    tsr_status st = TSR_OK;
    memset(d, 0, sizeof *d);
    d->K = ks;
    d->N = s->N;
    d->kind = s->kind;
    d->zero_add = s->zero_add;
    d->g_scales_f32 = s->g_scales_f32;
    d->groups = calloc((size_t)s->G, sizeof *d->groups);
    d->perm = malloc((size_t)ks * sizeof *d->perm);
    int *src_group = malloc((size_t)s->G * sizeof *src_group);
    int32_t *src_row = malloc((size_t)ks * sizeof *src_row);
    if (!d->groups || !d->perm || !src_group || !src_row) {
        st = tsr_fail(TSR_ERR_NOMEM, "out of memory slicing a matrix");
        goto out;
    }
    /* the kept rows of each group, in stored order; their packed size */
    int G = 0, rows = 0, words = 0;
    for (int g = 0; g < s->G; g++) {
        const tsr_qgroup *sg = &s->groups[g];
        int kept = 0;
        for (int i = sg->row0; i < sg->row0 + sg->rows; i++) {
            int k = s->perm[i];
            if (k < k0 || k >= k1) continue;
            if (rows + kept >= ks) {
                st = tsr_fail(TSR_ERR_INTERNAL, "slice: the permutation keeps more than %d rows", ks);
                goto out;
            }
            src_row[rows + kept] = i;
            d->perm[rows + kept] = k - k0;
            kept++;
        }
        if (!kept) continue;
        d->groups[G] = (tsr_qgroup){sg->bits, rows, kept, words, sg->scale_m};
        src_group[G++] = g;
        rows += kept;
        words += (kept * sg->bits + 31) / 32;
    }
    if (rows != ks) {
        st = tsr_fail(TSR_ERR_INTERNAL, "slice: the permutation keeps %d rows of [%d, %d)", rows, k0, k1);
        goto out;
    }
    d->G = G;
    d->Q = words;
    uint32_t *w = calloc((size_t)words * (size_t)s->N + 1, 4);
    if (!w) {
        st = tsr_fail(TSR_ERR_NOMEM, "out of memory slicing a matrix (%d x %d words)", words, s->N);
        goto out;
    }
    d->q_weight_owned = w;
    d->q_weight = w;
    repack_job job = {s, d->groups, src_group, src_row, G, w};
    tsr_parallel_for((s->N + 31) / 32, repack_range, &job);
    /* each kept group keeps its scale row (EXL2 codes, or GPTQ zeros and scales) */
    const size_t sw = (size_t)s->N / 8;
    if (s->kind == TSR_QMATRIX_GPTQ) {
        uint32_t *z = own_alloc(m, (size_t)G * sw * 4, &st);
        size_t el = s->g_scales_f32 ? 4 : 2;
        uint8_t *sc = z ? own_alloc(m, (size_t)G * s->N * el, &st) : NULL;
        if (!sc) goto out;
        for (int g = 0; g < G; g++) {
            memcpy(z + g * sw, s->g_zeros + (size_t)src_group[g] * sw, sw * 4);
            memcpy(sc + (size_t)g * s->N * el, (const uint8_t *)s->g_scales + (size_t)src_group[g] * s->N * el,
                   (size_t)s->N * el);
        }
        d->g_zeros = z;
        d->g_scales = sc;
    } else {
        uint32_t *q = own_alloc(m, (size_t)G * sw * 4, &st);
        if (!q) goto out;
        for (int g = 0; g < G; g++)
            memcpy(q + g * sw, s->q_scale + (size_t)src_group[g] * sw, sw * 4);
        d->q_scale = q;
    }
    d->bias = keep_bias ? s->bias : NULL; /* same columns: the source's (mapped) bias serves */
    d->bytes = qmatrix_bytes(d);
out:
    free(src_group);
    free(src_row);
    return st;
}

tsr_status tsr_slice_linear_rows(tsr_model *m, const tsr_linear *src, int k0, int k1, int keep_bias, tsr_linear *dst)
{
    if (k0 < 0 || k1 > src->K || k0 >= k1)
        return tsr_fail(TSR_ERR_ARG, "slice: rows [%d, %d) of a %d-row matrix", k0, k1, src->K);
    memset(dst, 0, sizeof *dst);
    dst->kind = src->kind;
    dst->K = k1 - k0;
    dst->N = src->N;
    if (src->kind == TSR_LINEAR_EXL2) {
        tsr_status st = slice_q_rows(m, &src->q, k0, k1, keep_bias, &dst->q);
        if (st != TSR_OK) tsr_qmatrix_free(&dst->q);
        return st;
    }
    /* dense [N][K]: copy columns [k0, k1) of every stored row */
    const size_t el = dtype_bytes(src->w.dtype), ks = (size_t)(k1 - k0);
    tsr_status st;
    uint8_t *w = own_alloc(m, (size_t)src->w.rows * ks * el, &st);
    if (!w) return st;
    for (int n = 0; n < src->w.rows; n++)
        memcpy(w + (size_t)n * ks * el, (const uint8_t *)src->w.data + ((size_t)n * src->w.cols + (size_t)k0) * el,
               ks * el);
    dst->w = (tsr_dense){src->w.dtype, src->w.rows, (int)ks, w, NULL};
    if (keep_bias && src->bias.data) {
        dst->bias = src->bias;
        dst->bias.dev = NULL;
    }
    return TSR_OK;
}

/* ---- the whole model ---- */

static tsr_status replace(tsr_linear *L, tsr_status st, tsr_linear *fresh)
{
    if (st != TSR_OK) return st;
    tsr_qmatrix_free(&L->q);
    *L = *fresh;
    return TSR_OK;
}

tsr_status tsr_shard_model(tsr_model *m, int rank, int size)
{
    if (m->part.tp_size != 1) return tsr_fail(TSR_ERR_ARG, "shard: the model is already a shard");
    if (rank < 0 || rank >= size) return tsr_fail(TSR_ERR_ARG, "shard: member %d of %d", rank, size);
    if (size == 1) return TSR_OK;
    TSR_TRY(tsr_shard_check(&m->cfg, size));
    tsr_shard_range r;
    tsr_shard_range_of(&m->cfg, rank, size, &r);
    const int d = m->cfg.head_dim;
    tsr_linear t;
    for (int l = m->part.layer0; l < m->part.layer1; l++) {
        tsr_layer *ly = &m->layers[l];
        const char *what = "q_proj";
        tsr_status st = replace(&ly->q, tsr_slice_linear_cols(m, &ly->q, r.h0 * d, r.h1 * d, &t), &t);
        if (st == TSR_OK)
            what = "k_proj", st = replace(&ly->k, tsr_slice_linear_cols(m, &ly->k, r.kv0 * d, r.kv1 * d, &t), &t);
        if (st == TSR_OK)
            what = "v_proj", st = replace(&ly->v, tsr_slice_linear_cols(m, &ly->v, r.kv0 * d, r.kv1 * d, &t), &t);
        if (st == TSR_OK)
            what = "o_proj",
            st = replace(&ly->o, tsr_slice_linear_rows(m, &ly->o, r.h0 * d, r.h1 * d, rank == 0, &t), &t);
        if (st == TSR_OK)
            what = "gate_proj", st = replace(&ly->gate, tsr_slice_linear_cols(m, &ly->gate, r.i0, r.i1, &t), &t);
        if (st == TSR_OK)
            what = "up_proj", st = replace(&ly->up, tsr_slice_linear_cols(m, &ly->up, r.i0, r.i1, &t), &t);
        if (st == TSR_OK)
            what = "down_proj",
            st = replace(&ly->down, tsr_slice_linear_rows(m, &ly->down, r.i0, r.i1, rank == 0, &t), &t);
        if (st != TSR_OK)
            return tsr_fail_context(st, "%s: tensor shard %d of %d: layer %d %s", m->dir, rank, size, l, what);
    }
    if (m->part.head) {
        tsr_status st = replace(&m->head, tsr_slice_linear_cols(m, &m->head, r.v0, r.v1, &t), &t);
        if (st != TSR_OK) return tsr_fail_context(st, "%s: tensor shard %d of %d: head", m->dir, rank, size);
    }
    m->part.tp_rank = rank;
    m->part.tp_size = size;
    m->local = (tsr_model_local){r.h1 - r.h0, r.kv1 - r.kv0, r.i1 - r.i0, r.v0, r.v1 - r.v0};
    return TSR_OK;
}
