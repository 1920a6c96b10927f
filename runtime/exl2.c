/* EXL2 matrix loading, validation and reference dequantization (see exl2.h and EXL2.md §3-§7). */
#include "runtime/exl2.h"

#include "runtime/half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tsr_status find(const tsr_st_set *set, const char *key, const char *suffix, tsr_dtype dtype, int ndim,
                       const int64_t *shape, const tsr_st_tensor **out)
{
    char name[512];
    snprintf(name, sizeof name, "%s.%s", key, suffix);
    return tsr_st_expect(set, name, dtype, ndim, shape, out);
}

void tsr_qmatrix_free(tsr_qmatrix *m)
{
    if (!m) return;
    free(m->perm);
    free(m->groups);
    free(m->q_weight_owned);
    m->perm = NULL;
    m->groups = NULL;
    m->q_weight_owned = NULL;
}

tsr_status tsr_qmatrix_load(const tsr_st_set *set, const char *key, int K, int N, int has_bias, float prescale,
                            tsr_qmatrix *m)
{
    memset(m, 0, sizeof *m);
    int Np = (N + 31) / 32 * 32;
    const tsr_st_tensor *tw, *ts, *tsm, *tg, *tip, *tb = NULL;
    TSR_TRY(find(set, key, "q_weight", TSR_I32, 2, (int64_t[]){-1, Np}, &tw));
    TSR_TRY(find(set, key, "q_groups", TSR_I16, 1, NULL, &tg));
    if (tg->shape[0] < 2 || tg->shape[0] % 2)
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s.q_groups' has odd or zero length %lld", tg->file, key,
                        (long long)tg->shape[0]);
    int G = (int)(tg->shape[0] / 2);
    TSR_TRY(find(set, key, "q_scale", TSR_I32, 2, (int64_t[]){G, Np / 8}, &ts));
    TSR_TRY(find(set, key, "q_scale_max", TSR_F16, 1, (int64_t[]){G}, &tsm));
    TSR_TRY(find(set, key, "q_invperm", TSR_I32, 1, (int64_t[]){K}, &tip));
    if (has_bias) TSR_TRY(find(set, key, "bias", TSR_F16, 1, (int64_t[]){Np}, &tb));

    m->K = K;
    m->N = Np;
    m->G = G;
    m->Q = (int)tw->shape[0];
    m->q_weight = tw->data;
    m->q_scale = ts->data;
    m->bias = tb ? tb->data : NULL;
    m->bytes = tw->nbytes + ts->nbytes + tsm->nbytes + tg->nbytes + tip->nbytes + (tb ? tb->nbytes : 0);

    const int16_t *qg = tg->data;
    const uint16_t *qsm = tsm->data;
    m->groups = calloc((size_t)G, sizeof *m->groups);
    m->perm = malloc((size_t)K * sizeof *m->perm);
    if (!m->groups || !m->perm) {
        tsr_qmatrix_free(m);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory loading '%s'", key);
    }

    /* group table: widths known, packed rows increasing, whole words, rows covering K exactly */
    int row = 0, prev_bits = 8;
    for (int g = 0; g < G; g++) {
        int bits = qg[2 * g], q0 = (uint16_t)qg[2 * g + 1];
        int q1 = g + 1 < G ? (uint16_t)qg[2 * g + 3] : m->Q;
        if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) {
            tsr_qmatrix_free(m);
            return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s.q_groups': group %d has unknown bit width %d", tg->file,
                            key, g, bits);
        }
        if (bits > prev_bits) {
            tsr_qmatrix_free(m);
            return tsr_fail(TSR_ERR_FORMAT,
                            "%s: tensor '%s.q_groups': group %d widens to %d bits after %d (widths must not increase)",
                            tg->file, key, g, bits, prev_bits);
        }
        prev_bits = bits;
        if (q1 <= q0 || q1 > m->Q || (g == 0 && q0 != 0)) {
            tsr_qmatrix_free(m);
            return tsr_fail(TSR_ERR_FORMAT,
                            "%s: tensor '%s.q_groups': group %d spans packed rows [%d, %d) outside [0, %d)", tg->file,
                            key, g, q0, q1, m->Q);
        }
        long bitsum = (long)(q1 - q0) * 32;
        if (bitsum % bits) {
            tsr_qmatrix_free(m);
            return tsr_fail(
                TSR_ERR_FORMAT,
                "%s: tensor '%s.q_groups': group %d (%d packed rows) is not a whole number of %d-bit values", tg->file,
                key, g, q1 - q0, bits);
        }
        int rows = (int)(bitsum / bits);
        if (row + rows > K) {
            tsr_qmatrix_free(m);
            return tsr_fail(TSR_ERR_FORMAT,
                            "%s: tensor '%s.q_groups': groups cover more than the %d rows of the matrix", tg->file, key,
                            K);
        }
        tsr_qgroup *gr = &m->groups[g];
        gr->bits = bits;
        gr->row0 = row;
        gr->rows = rows;
        gr->qrow0 = q0;
        gr->scale_m = tsr_round_half(tsr_half_to_float(qsm[g]) * (float)(prescale / 256.0));
        row += rows;
    }
    if (row != K) {
        tsr_qmatrix_free(m);
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s.q_groups': groups cover %d rows, the matrix has %d", tg->file,
                        key, row, K);
    }

    /* perm = argsort(q_invperm); q_invperm must be a permutation */
    const int32_t *inv = tip->data;
    for (int i = 0; i < K; i++) m->perm[i] = -1;
    for (int k = 0; k < K; k++) {
        int32_t s = inv[k];
        if (s < 0 || s >= K || m->perm[s] != -1) {
            tsr_qmatrix_free(m);
            return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s.q_invperm' is not a permutation of 0..%d (entry %d = %d)",
                            tip->file, key, K - 1, k, (int)s);
        }
        m->perm[s] = k;
    }
    return TSR_OK;
}

/* GPTQ's fp16 scale and zero point of group g, column n (the one reading of their layout, inlined below). */
static inline float gptq_scale(const tsr_qmatrix *m, int g, int n)
{
    size_t i = (size_t)g * (size_t)m->N + (size_t)n;
    if (m->g_scales_f32) return tsr_round_half(((const float *)m->g_scales)[i]);
    return tsr_half_to_float(((const uint16_t *)m->g_scales)[i]);
}
static inline int gptq_zero(const tsr_qmatrix *m, int g, int n)
{
    return (int)((m->g_zeros[(size_t)g * (size_t)(m->N / 8) + (size_t)(n / 8)] >> (4 * (n % 8))) & 0xfu) + m->zero_add;
}

void tsr_qmatrix_gptq_params(const tsr_qmatrix *m, int g, int n0, int n, float *scale, float *zero)
{
    if (m->g_scales_f32)
        for (int c = 0; c < n; c++) scale[c] = gptq_scale(m, g, n0 + c);
    else /* the same values, converted eight at a time where the build has F16C */
        tsr_halves_to_floats((const uint16_t *)m->g_scales + (size_t)g * (size_t)m->N + (size_t)n0, (size_t)n, scale);
    for (int c = 0; c < n; c++) zero[c] = (float)gptq_zero(m, g, n0 + c);
}

float tsr_qmatrix_scale(const tsr_qmatrix *m, int g, int n)
{
    if (m->kind == TSR_QMATRIX_GPTQ) return gptq_scale(m, g, n);
    uint32_t code = (m->q_scale[(size_t)g * (m->N / 8) + n / 8] >> (4 * (n % 8))) & 0xfu;
    return tsr_qmatrix_code_scale(m, g, code);
}

float tsr_qmatrix_code_scale(const tsr_qmatrix *m, int g, uint32_t code)
{
    float q = (float)((code + 1) * (code + 1));
    return tsr_round_half(q * m->groups[g].scale_m);
}

int tsr_qmatrix_zero(const tsr_qmatrix *m, int g, int n)
{
    if (m->kind == TSR_QMATRIX_GPTQ) return gptq_zero(m, g, n);
    return 1 << (m->groups[g].bits - 1);
}

uint32_t tsr_qmatrix_code(const tsr_qmatrix *m, const tsr_qgroup *g, int j, int n)
{
    long s = (long)j * g->bits;
    size_t w = (size_t)g->qrow0 + (size_t)(s >> 5);
    int sh = (int)(s & 31);
    uint64_t v = m->q_weight[w * (size_t)m->N + (size_t)n];
    if (sh + g->bits > 32) v |= (uint64_t)m->q_weight[(w + 1) * (size_t)m->N + (size_t)n] << 32;
    return (uint32_t)(v >> sh) & ((1u << g->bits) - 1u);
}

void tsr_qmatrix_dequant_ref(const tsr_qmatrix *m, int round_fp16, float *W)
{
    for (int g = 0; g < m->G; g++) {
        const tsr_qgroup *gr = &m->groups[g];
        for (int n = 0; n < m->N; n++) {
            int off = tsr_qmatrix_zero(m, g, n);
            float S = tsr_qmatrix_scale(m, g, n);
            for (int j = 0; j < gr->rows; j++) {
                float v = (float)((int)tsr_qmatrix_code(m, gr, j, n) - off) * S;
                if (round_fp16) v = tsr_round_half(v);
                W[(size_t)m->perm[gr->row0 + j] * m->N + n] = v;
            }
        }
    }
}

double tsr_qmatrix_bpw(const tsr_qmatrix *m)
{
    return (double)(m->bytes - (m->bias ? (uint64_t)m->N * 2 : 0)) * 8.0 / ((double)m->K * m->N);
}
