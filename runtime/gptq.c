/* GPTQ layer loading: validation, group assignment, act-order sorting and re-packing (see gptq.h, EXL2.md §8).
 *
 * The loader checks every tensor against K and N, decides the group of each original row (g_idx, or k / group
 * size), sorts rows stably by group with a counting sort (the identity for sequential files), and fills the
 * tsr_qmatrix group table with 4-bit groups whose scale and zero point come from `scales` and `qzeros`
 * (tsr_qmatrix_scale / tsr_qmatrix_zero in exl2.c read them). When the sorted order is the file's order and every
 * group starts on a word, qweight is used in place; otherwise the codes are re-packed group by group. */
#include "runtime/gptq.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tsr_status expect(const tsr_st_set *set, const char *key, const char *suffix, tsr_dtype dtype, int ndim,
                         const int64_t *shape, const tsr_st_tensor **out)
{
    char name[512];
    snprintf(name, sizeof name, "%s.%s", key, suffix);
    return tsr_st_expect(set, name, dtype, ndim, shape, out);
}

static const tsr_st_tensor *find(const tsr_st_set *set, const char *key, const char *suffix)
{
    char name[512];
    snprintf(name, sizeof name, "%s.%s", key, suffix);
    return tsr_st_find(set, name);
}

/* Fails (the message is formatted first: it may read the scratch arrays), then frees the partly built matrix and
 * the scratch arrays. */
#define FAIL(...)                                                                                                  \
    do {                                                                                                           \
        tsr_status fail_status_ = tsr_fail(__VA_ARGS__);                                                           \
        free(grp);                                                                                                 \
        free(start);                                                                                               \
        tsr_qmatrix_free(m);                                                                                       \
        memset(m, 0, sizeof *m);                                                                                   \
        return fail_status_;                                                                                       \
    } while (0)

tsr_status tsr_gptq_load(const tsr_st_set *set, const char *key, int K, int N, int has_bias,
                         const tsr_quant_config *qc, tsr_qmatrix *m)
{
    memset(m, 0, sizeof *m);
    int bits = 4, gs = 0, v2 = 0;
    if (qc && !strcmp(qc->method, "gptq")) {
        bits = qc->bits;
        gs = qc->group_size;
        v2 = qc->gptq_v2;
    }
    if (bits != 4)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "'%s': GPTQ with %d-bit weights is not supported (only 4-bit GPTQ is)",
                        key, bits);

    const tsr_st_tensor *tw, *tz, *ts, *ti = NULL, *tb = NULL;
    TSR_TRY(expect(set, key, "qweight", TSR_I32, 2, NULL, &tw));
    if (K <= 0 || N <= 0 || K % 8 || N % 8)
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s.qweight': a %d x %d GPTQ layer needs K and N multiples of 8",
                        tw->file, key, K, N);
    if (tw->shape[1] == N && tw->shape[0] != K / 8 && tw->shape[0] > 0 && ((int64_t)tw->shape[0] * 32) % K == 0)
        return tsr_fail(TSR_ERR_UNSUPPORTED,
                        "%s: tensor '%s.qweight' has %lld packed rows for %d inputs: %lld-bit GPTQ is not supported "
                        "(only 4-bit GPTQ is)",
                        tw->file, key, (long long)tw->shape[0], K, (long long)(tw->shape[0] * 32 / K));
    TSR_TRY(expect(set, key, "qweight", TSR_I32, 2, (int64_t[]){K / 8, N}, &tw));

    const tsr_st_tensor *sc = find(set, key, "scales");
    TSR_TRY(expect(set, key, "scales", sc && sc->dtype == TSR_F32 ? TSR_F32 : TSR_F16, 2, (int64_t[]){-1, N}, &ts));
    if (ts->shape[0] < 1 || ts->shape[0] > K)
        return tsr_fail(TSR_ERR_FORMAT, "%s: tensor '%s.scales' has %lld groups for %d rows", ts->file, key,
                        (long long)ts->shape[0], K);
    const int G = (int)ts->shape[0];
    TSR_TRY(expect(set, key, "qzeros", TSR_I32, 2, (int64_t[]){G, N / 8}, &tz));
    if (find(set, key, "g_idx")) TSR_TRY(expect(set, key, "g_idx", TSR_I32, 1, (int64_t[]){K}, &ti));
    if (has_bias || find(set, key, "bias")) TSR_TRY(expect(set, key, "bias", TSR_F16, 1, (int64_t[]){N}, &tb));

    /* group size: from the config (-1: one group), else the smallest power of two covering K in G groups */
    if (gs == -1) gs = K;
    if (gs <= 0) {
        gs = 1;
        while ((int64_t)gs * G < K) gs *= 2;
    }

    m->kind = TSR_QMATRIX_GPTQ;
    m->K = K;
    m->N = N;
    m->G = G;
    m->g_zeros = tz->data;
    m->zero_add = v2 ? 0 : 1;
    m->g_scales = ts->data;
    m->g_scales_f32 = ts->dtype == TSR_F32;
    m->bias = tb ? tb->data : NULL;
    m->bytes = tw->nbytes + tz->nbytes + ts->nbytes + (ti ? ti->nbytes : 0) + (tb ? tb->nbytes : 0);

    int32_t *grp = malloc((size_t)K * sizeof *grp);  /* group of original row k */
    int *start = calloc((size_t)G + 1, sizeof *start); /* counts, then first sorted row of each group */
    m->perm = malloc((size_t)K * sizeof *m->perm);
    m->groups = calloc((size_t)G, sizeof *m->groups);
    if (!grp || !start || !m->perm || !m->groups) FAIL(TSR_ERR_NOMEM, "out of memory loading '%s'", key);

    const int32_t *gidx = ti ? ti->data : NULL;
    int trivial = 1;
    for (int k = 0; gidx && k < K && trivial; k++) trivial = gidx[k] == 0;
    if (trivial) {
        if ((K + gs - 1) / gs != G)
            FAIL(TSR_ERR_FORMAT, "%s: tensor '%s.scales' has %d groups, but %d rows in groups of %d make %d", ts->file,
                 key, G, K, gs, (K + gs - 1) / gs);
        for (int k = 0; k < K; k++) grp[k] = k / gs;
    } else {
        for (int k = 0; k < K; k++) {
            if (gidx[k] < 0 || gidx[k] >= G)
                FAIL(TSR_ERR_FORMAT, "%s: tensor '%s.g_idx': entry %d = %d is outside the %d groups", ti->file, key, k,
                     (int)gidx[k], G);
            grp[k] = gidx[k];
        }
    }
    for (int k = 0; k < K; k++) start[grp[k] + 1]++;
    for (int g = 0; g < G; g++)
        if (start[g + 1] > gs)
            FAIL(TSR_ERR_FORMAT, "%s: tensor '%s.g_idx': group %d holds %d rows, more than the group size %d",
                 ti ? ti->file : ts->file, key, g, start[g + 1], gs);
    for (int g = 0; g < G; g++) start[g + 1] += start[g];

    /* stable counting sort of the rows by group; groups start on a fresh packed word */
    int in_place = 1, qrow = 0;
    for (int g = 0; g < G; g++) {
        tsr_qgroup *gr = &m->groups[g];
        gr->bits = 4;
        gr->row0 = start[g];
        gr->rows = start[g + 1] - start[g];
        gr->qrow0 = qrow;
        gr->scale_m = 0.0f;
        in_place = in_place && start[g] % 8 == 0 && gr->qrow0 == start[g] / 8;
        qrow += (gr->rows + 7) / 8;
    }
    for (int k = 0; k < K; k++) {
        int pos = start[grp[k]]++;
        m->perm[pos] = k;
        in_place = in_place && pos == k;
    }
    m->Q = qrow;
    free(grp);
    free(start);
    grp = NULL;
    start = NULL;

    const uint32_t *qw = tw->data;
    if (in_place) {
        m->q_weight = qw;
        return TSR_OK;
    }
    /* act-order: re-pack the 4-bit codes in sorted order (the packed data only, K·N/2 bytes) */
    m->q_weight_owned = calloc((size_t)m->Q * (size_t)N, sizeof(uint32_t));
    if (!m->q_weight_owned) FAIL(TSR_ERR_NOMEM, "out of memory re-packing '%s'", key);
    for (int g = 0; g < G; g++) {
        const tsr_qgroup *gr = &m->groups[g];
        for (int j = 0; j < gr->rows; j++) {
            const int k = m->perm[gr->row0 + j], sh_in = 4 * (k % 8), sh_out = 4 * (j % 8);
            const uint32_t *src = qw + (size_t)(k / 8) * (size_t)N;
            uint32_t *dst = m->q_weight_owned + (size_t)(gr->qrow0 + j / 8) * (size_t)N;
            for (int n = 0; n < N; n++) dst[n] |= ((src[n] >> sh_in) & 0xfu) << sh_out;
        }
    }
    m->q_weight = m->q_weight_owned;
    return TSR_OK;
}
