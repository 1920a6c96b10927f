/* GPTQ matrices (runtime/gptq.c): random matrices are packed with the plain GPTQ definition (row k of column n
 * in bits 4(k%8) of word [k/8][n]; zero of (g, n) in nibble n%8 of qzeros[g][n/8]), written to a safetensors
 * file, loaded with tsr_gptq_load and checked against a straightforward reference W[k][n] = (q − zero) · scale
 * computed from the random arrays themselves: the reference dequantizer exactly (and h() of it with fp16
 * rounding), the CPU kernel against a double-precision matmul, sequential groups (qweight borrowed), act-order
 * g_idx (rows sorted by group and re-packed), a group size that is not a multiple of 8, F32 scales, v1 (stored
 * zero − 1) against gptq_v2 zeros, and the errors: bits other than 4 (config and tensor shape), g_idx out of
 * range, oversized groups, shape mismatches, missing tensors, and the quantization_config parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/ops.h"
#include "runtime/config.h"
#include "runtime/gptq.h"
#include "runtime/half.h"
#include "runtime/safetensors.h"
#include "tests/common/exl2_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int K, N, G;
    uint8_t *codes;        /* [K][N] in ORIGINAL row order */
    uint8_t *zcode;        /* [G][N] stored zero codes */
    float *scale;          /* [G][N] fp16-representable */
    int32_t *g_idx;        /* [K] group of each original row */
    uint16_t *bias;        /* [N] or NULL */
    /* packed */
    uint32_t *qweight;     /* [K/8][N] */
    uint32_t *qzeros;      /* [G][N/8] */
    uint16_t *scales16;    /* [G][N] */
    float *scales32;       /* [G][N] */
} gmat;

/* gs: rows per group; act_order: shuffle the group assignment over the rows. */
static void make(gmat *m, int K, int N, int gs, int act_order, int with_bias)
{
    memset(m, 0, sizeof *m);
    m->K = K;
    m->N = N;
    m->G = (K + gs - 1) / gs;
    m->codes = malloc((size_t)K * N);
    m->zcode = malloc((size_t)m->G * N);
    m->scale = malloc((size_t)m->G * N * sizeof(float));
    m->g_idx = malloc((size_t)K * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)K * N; i++) m->codes[i] = (uint8_t)(rnd() & 15);
    for (size_t i = 0; i < (size_t)m->G * N; i++) {
        m->zcode[i] = (uint8_t)(rnd() & 15); /* asymmetric zeros: any code */
        m->scale[i] = tsr_round_half((float)((int)(rnd() % 2001) - 1000) * 1.7e-5f);
    }
    for (int k = 0; k < K; k++) m->g_idx[k] = k / gs;
    if (act_order)
        for (int k = K - 1; k > 0; k--) {
            int j = (int)(rnd() % (uint32_t)(k + 1));
            int32_t t = m->g_idx[k];
            m->g_idx[k] = m->g_idx[j];
            m->g_idx[j] = t;
        }
    if (with_bias) {
        m->bias = malloc((size_t)N * sizeof(uint16_t));
        for (int n = 0; n < N; n++) m->bias[n] = tsr_float_to_half((float)((int)(rnd() % 200) - 100) * 0.01f);
    }
    m->qweight = calloc((size_t)K / 8 * N, sizeof(uint32_t));
    m->qzeros = calloc((size_t)m->G * (N / 8), sizeof(uint32_t));
    m->scales16 = malloc((size_t)m->G * N * sizeof(uint16_t));
    m->scales32 = malloc((size_t)m->G * N * sizeof(float));
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            m->qweight[(size_t)(k / 8) * N + n] |= (uint32_t)m->codes[(size_t)k * N + n] << (4 * (k % 8));
    for (int g = 0; g < m->G; g++)
        for (int n = 0; n < N; n++) {
            m->qzeros[(size_t)g * (N / 8) + n / 8] |= (uint32_t)m->zcode[(size_t)g * N + n] << (4 * (n % 8));
            m->scales16[(size_t)g * N + n] = tsr_float_to_half(m->scale[(size_t)g * N + n]);
            m->scales32[(size_t)g * N + n] = m->scale[(size_t)g * N + n];
        }
}

static void free_gmat(gmat *m)
{
    free(m->codes);
    free(m->zcode);
    free(m->scale);
    free(m->g_idx);
    free(m->bias);
    free(m->qweight);
    free(m->qzeros);
    free(m->scales16);
    free(m->scales32);
}

/* The reference: W[k][n] = (q − zero) · scale, zero = stored code + zero_add. Exact in fp32. */
static float ref_w(const gmat *m, int k, int n, int zero_add)
{
    int g = m->g_idx[k];
    int zero = m->zcode[(size_t)g * m->N + n] + zero_add;
    return (float)((int)m->codes[(size_t)k * m->N + n] - zero) * m->scale[(size_t)g * m->N + n];
}

typedef struct {
    int no_g_idx, zero_g_idx, f32_scales, qweight_rows, qzeros_cols; /* variations (0 = normal) */
    const char *skip;                                                    /* tensor suffix to leave out */
} file_opts;

static tsr_st_set *write_and_open(const gmat *m, const file_opts *o)
{
    char path[] = "/tmp/tsr_test_gptq_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    int32_t *zeros_idx = calloc((size_t)m->K, sizeof(int32_t));
    int qrows = o->qweight_rows ? o->qweight_rows : m->K / 8;
    int zcols = o->qzeros_cols ? o->qzeros_cols : m->N / 8;
    uint32_t *qw = calloc((size_t)qrows * m->N, sizeof(uint32_t));
    memcpy(qw, m->qweight, (size_t)(qrows < m->K / 8 ? qrows : m->K / 8) * m->N * sizeof(uint32_t));
    uint32_t *qz = calloc((size_t)m->G * zcols, sizeof(uint32_t));
    for (int g = 0; g < m->G; g++)
        for (int c = 0; c < zcols && c < m->N / 8; c++)
            qz[(size_t)g * zcols + c] = m->qzeros[(size_t)g * (m->N / 8) + c];
    const test_tensor t[] = {
        {"w.qweight", TSR_I32, 2, {qrows, m->N}, qw, (size_t)qrows * m->N * 4},
        {"w.qzeros", TSR_I32, 2, {m->G, zcols}, qz, (size_t)m->G * zcols * 4},
        {"w.scales", o->f32_scales ? TSR_F32 : TSR_F16, 2, {m->G, m->N},
         o->f32_scales ? (const void *)m->scales32 : (const void *)m->scales16,
         (size_t)m->G * m->N * (o->f32_scales ? 4 : 2)},
        {"w.g_idx", TSR_I32, 1, {m->K}, o->zero_g_idx ? zeros_idx : m->g_idx, (size_t)m->K * 4},
        {"w.bias", TSR_F16, 1, {m->N}, m->bias, (size_t)m->N * 2},
    };
    int use[5] = {1, 1, 1, !o->no_g_idx, m->bias != NULL};
    for (int i = 0; i < 5; i++)
        if (o->skip && !strcmp(t[i].name + 2, o->skip)) use[i] = 0;
    write_test_tensors(path, t, 5, use);
    free(zeros_idx);
    free(qw);
    free(qz);
    tsr_st_set *set = NULL;
    assert_int_equal(tsr_st_open_file(path, &set), TSR_OK);
    unlink(path);
    return set;
}

static tsr_quant_config gptq_cfg(int bits, int gs, int v2)
{
    tsr_quant_config c = {.bits = bits, .group_size = gs, .sym = 1, .gptq_v2 = v2};
    snprintf(c.method, sizeof c.method, "gptq");
    return c;
}

/* Loads m and checks codes, dequantization (exact, and fp16-rounded), bytes and the CPU kernel. */
static void check_roundtrip(const gmat *m, const file_opts *o, const tsr_quant_config *qc, int expect_repacked)
{
    tsr_st_set *set = write_and_open(m, o);
    tsr_qmatrix q;
    if (tsr_gptq_load(set, "w", m->K, m->N, m->bias != NULL, qc, &q) != TSR_OK) fail_msg("%s", tsr_last_error());
    const int zero_add = qc && qc->gptq_v2 ? 0 : 1;
    assert_int_equal(q.kind, TSR_QMATRIX_GPTQ);
    assert_int_equal(q.K, m->K);
    assert_int_equal(q.N, m->N);
    assert_int_equal(q.G, m->G);
    assert_int_equal(q.q_weight_owned != NULL, expect_repacked);
    /* the sorted order: a permutation, groups ascending, stable inside a group */
    int *seen = calloc((size_t)m->K, sizeof(int));
    for (int g = 0; g < q.G; g++)
        for (int j = 0; j < q.groups[g].rows; j++) {
            int i = q.groups[g].row0 + j, k = q.perm[i];
            assert_true(k >= 0 && k < m->K && !seen[k]);
            seen[k] = 1;
            int want_g =
                o->no_g_idx || o->zero_g_idx ? k / (qc && qc->group_size > 0 ? qc->group_size : 128) : m->g_idx[k];
            assert_int_equal(want_g, g);
            if (j) assert_true(q.perm[i - 1] < k);
            /* codes read back through the (possibly re-packed) stream equal the file's codes */
            for (int n = 0; n < m->N; n += 5)
                assert_int_equal(tsr_qmatrix_code(&q, &q.groups[g], j, n), m->codes[(size_t)k * m->N + n]);
        }
    free(seen);
    /* dequantization, original row order */
    float *W = malloc((size_t)m->K * m->N * sizeof(float)), *Wh = malloc((size_t)m->K * m->N * sizeof(float));
    tsr_qmatrix_dequant_ref(&q, 0, W);
    tsr_qmatrix_dequant_ref(&q, 1, Wh);
    for (int k = 0; k < m->K; k++)
        for (int n = 0; n < m->N; n++) {
            float want = ref_w(m, k, n, zero_add);
            if (W[(size_t)k * m->N + n] != want || Wh[(size_t)k * m->N + n] != tsr_round_half(want))
                fail_msg("W[%d][%d] = %g (fp16 %g), want %g", k, n, W[(size_t)k * m->N + n], Wh[(size_t)k * m->N + n],
                         want);
        }
    /* bytes: qweight + qzeros + scales (+ g_idx) (+ bias) as stored; bpw excludes the bias */
    uint64_t bytes = (uint64_t)m->K / 8 * m->N * 4 + (uint64_t)m->G * m->N / 8 * 4 +
                     (uint64_t)m->G * m->N * (o->f32_scales ? 4 : 2) + (o->no_g_idx ? 0 : (uint64_t)m->K * 4) +
                     (m->bias ? (uint64_t)m->N * 2 : 0);
    assert_int_equal(q.bytes, bytes);
    double bpw = (double)(bytes - (m->bias ? (uint64_t)m->N * 2 : 0)) * 8.0 / ((double)m->K * m->N);
    assert_true(fabs(tsr_qmatrix_bpw(&q) - bpw) < 1e-12);
    /* the CPU kernel against a double-precision matmul with the reference weights */
    const int Ms[] = {1, 3, 17};
    for (size_t t = 0; t < 3; t++) {
        int M = Ms[t];
        float *x = malloc((size_t)M * m->K * sizeof(float)), *y = malloc((size_t)M * m->N * sizeof(float));
        for (int i = 0; i < M * m->K; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        for (int i = 0; i < M * m->N; i++) y[i] = NAN;
        tsr_linear L = {.kind = TSR_LINEAR_EXL2, .K = m->K, .N = m->N, .q = q};
        tsr_ops_cpu()->linear(&L, x, M, y);
        for (int r = 0; r < M; r++)
            for (int n = 0; n < m->N; n++) {
                double acc = m->bias ? tsr_half_to_float(m->bias[n]) : 0.0;
                for (int k = 0; k < m->K; k++) acc += (double)x[(size_t)r * m->K + k] * ref_w(m, k, n, zero_add);
                double got = y[(size_t)r * m->N + n];
                if (!(fabs(got - acc) <= 1e-4 * (1 + fabs(acc))))
                    fail_msg("M=%d row %d col %d: %g vs %g", M, r, n, got, acc);
            }
        free(x);
        free(y);
    }
    free(W);
    free(Wh);
    tsr_qmatrix_free(&q);
    tsr_st_set_free(set);
}

static void test_sequential(void **state)
{
    (void)state;
    gmat m;
    make(&m, 256, 96, 64, 0, 1);
    tsr_quant_config qc = gptq_cfg(4, 64, 0);
    check_roundtrip(&m, &(file_opts){0}, &qc, 0);              /* g_idx = k / 64: qweight used in place */
    check_roundtrip(&m, &(file_opts){.no_g_idx = 1}, &qc, 0);  /* no g_idx */
    check_roundtrip(&m, &(file_opts){.zero_g_idx = 1}, &qc, 0); /* all-zero g_idx means "absent" */
    check_roundtrip(&m, &(file_opts){.f32_scales = 1}, &qc, 0);
    free_gmat(&m);
    /* the group size derived from the tensors (no config): smallest power of two covering K in G groups */
    make(&m, 384, 40, 128, 0, 0);
    check_roundtrip(&m, &(file_opts){.no_g_idx = 1}, NULL, 0);
    free_gmat(&m);
}

static void test_act_order(void **state)
{
    (void)state;
    gmat m;
    make(&m, 384, 40, 128, 1, 1); /* N = 40: a partial 32-column tile */
    tsr_quant_config qc = gptq_cfg(4, 128, 0);
    check_roundtrip(&m, &(file_opts){0}, &qc, 1);
    check_roundtrip(&m, &(file_opts){.f32_scales = 1}, &qc, 1);
    free_gmat(&m);
    /* groups of 36 rows (not whole words): re-packed with each group on a fresh word, even without act-order */
    make(&m, 144, 16, 36, 0, 0);
    qc = gptq_cfg(4, 36, 0);
    check_roundtrip(&m, &(file_opts){.no_g_idx = 1}, &qc, 1);
    free_gmat(&m);
    make(&m, 144, 16, 36, 1, 0);
    check_roundtrip(&m, &(file_opts){0}, &qc, 1);
    free_gmat(&m);
}

static void test_v1_v2_zeros(void **state)
{
    (void)state;
    gmat m;
    make(&m, 128, 32, 32, 1, 0);
    tsr_quant_config v1 = gptq_cfg(4, 32, 0), v2 = gptq_cfg(4, 32, 1);
    check_roundtrip(&m, &(file_opts){0}, &v1, 1); /* zero = stored + 1 */
    check_roundtrip(&m, &(file_opts){0}, &v2, 1); /* zero = stored */
    /* the same file read both ways differs by exactly one scale step everywhere */
    tsr_st_set *set = write_and_open(&m, &(file_opts){0});
    tsr_qmatrix a, b;
    assert_int_equal(tsr_gptq_load(set, "w", m.K, m.N, 0, &v1, &a), TSR_OK);
    assert_int_equal(tsr_gptq_load(set, "w", m.K, m.N, 0, &v2, &b), TSR_OK);
    float *Wa = malloc((size_t)m.K * m.N * sizeof(float)), *Wb = malloc((size_t)m.K * m.N * sizeof(float));
    tsr_qmatrix_dequant_ref(&a, 0, Wa);
    tsr_qmatrix_dequant_ref(&b, 0, Wb);
    for (int k = 0; k < m.K; k++)
        for (int n = 0; n < m.N; n++) {
            assert_int_equal(tsr_qmatrix_zero(&a, m.g_idx[k], n), m.zcode[(size_t)m.g_idx[k] * m.N + n] + 1);
            assert_int_equal(tsr_qmatrix_zero(&b, m.g_idx[k], n), m.zcode[(size_t)m.g_idx[k] * m.N + n]);
            assert_true(Wb[(size_t)k * m.N + n] - Wa[(size_t)k * m.N + n] == m.scale[(size_t)m.g_idx[k] * m.N + n]);
        }
    free(Wa);
    free(Wb);
    tsr_qmatrix_free(&a);
    tsr_qmatrix_free(&b);
    tsr_st_set_free(set);
    free_gmat(&m);
}

static void expect_error(const gmat *m, const file_opts *o, const tsr_quant_config *qc, tsr_status want,
                         const char *fragment)
{
    tsr_st_set *set = write_and_open(m, o);
    tsr_qmatrix q;
    tsr_status st = tsr_gptq_load(set, "w", m->K, m->N, m->bias != NULL, qc, &q);
    if (st == TSR_OK) tsr_qmatrix_free(&q);
    tsr_st_set_free(set);
    if (st != want || !strstr(tsr_last_error(), fragment))
        fail_msg("expected status %d with '%s', got %d: %s", want, fragment, st, tsr_last_error());
}

static void test_bits_not_4(void **state)
{
    (void)state;
    gmat m;
    make(&m, 128, 32, 64, 0, 0);
    tsr_quant_config c8 = gptq_cfg(8, 64, 0), c4 = gptq_cfg(4, 64, 0);
    expect_error(&m, &(file_opts){0}, &c8, TSR_ERR_UNSUPPORTED, "8-bit");
    /* no config, but qweight has K/4 packed rows: an 8-bit file, refused rather than misread */
    expect_error(&m, &(file_opts){.qweight_rows = 32}, NULL, TSR_ERR_UNSUPPORTED, "8-bit GPTQ is not supported");
    expect_error(&m, &(file_opts){.qweight_rows = 12}, &c4, TSR_ERR_UNSUPPORTED, "3-bit");
    free_gmat(&m);
}

static void test_bad_tensors(void **state)
{
    (void)state;
    gmat m;
    make(&m, 128, 32, 32, 1, 1);
    tsr_quant_config qc = gptq_cfg(4, 32, 0);
    int32_t saved = m.g_idx[5];
    m.g_idx[5] = m.G; /* out of range */
    expect_error(&m, &(file_opts){0}, &qc, TSR_ERR_FORMAT, "'w.g_idx': entry 5 = 4 is outside");
    m.g_idx[5] = -1;
    expect_error(&m, &(file_opts){0}, &qc, TSR_ERR_FORMAT, "'w.g_idx': entry 5 = -1");
    m.g_idx[5] = saved;
    /* group 0 oversized: move a row of another group into it */
    for (int k = 0; k < m.K; k++)
        if (m.g_idx[k] != 0) {
            saved = m.g_idx[k];
            m.g_idx[k] = 0;
            expect_error(&m, &(file_opts){0}, &qc, TSR_ERR_FORMAT,
                         "group 0 holds 33 rows, more than the group size 32");
            m.g_idx[k] = saved;
            break;
        }
    expect_error(&m, &(file_opts){.qzeros_cols = 3}, &qc, TSR_ERR_FORMAT, "'w.qzeros' has shape");
    expect_error(&m, &(file_opts){.skip = "scales"}, &qc, TSR_ERR_MISSING, "w.scales");
    expect_error(&m, &(file_opts){.skip = "qzeros"}, &qc, TSR_ERR_MISSING, "w.qzeros");
    expect_error(&m, &(file_opts){.skip = "bias"}, &qc, TSR_ERR_MISSING, "w.bias"); /* has_bias requires it */
    /* 4 groups in the file, but a group size of 64 gives 2 for 128 rows (no g_idx to go by) */
    tsr_quant_config q64 = gptq_cfg(4, 64, 0);
    expect_error(&m, &(file_opts){.no_g_idx = 1}, &q64, TSR_ERR_FORMAT, "'w.scales' has 4 groups");
    /* the layer's K or N disagreeing with the file */
    tsr_st_set *set = write_and_open(&m, &(file_opts){0});
    tsr_qmatrix q;
    assert_int_equal(tsr_gptq_load(set, "w", m.K + 8, m.N, 1, &qc, &q), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "w.qweight"));
    assert_int_equal(tsr_gptq_load(set, "w", m.K, m.N + 8, 1, &qc, &q), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "w.qweight"));
    assert_int_equal(tsr_gptq_load(set, "w", m.K + 4, m.N, 1, &qc, &q), TSR_ERR_FORMAT); /* K not a multiple of 8 */
    tsr_st_set_free(set);
    free_gmat(&m);
}

static tsr_status parse(const char *qc_json, tsr_model_config *cfg)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":1,"
             "\"num_attention_heads\":2,\"intermediate_size\":128,\"vocab_size\":100,\"rms_norm_eps\":1e-5%s%s}",
             qc_json ? ",\"quantization_config\":" : "", qc_json ? qc_json : "");
    return tsr_config_parse(text, strlen(text), NULL, 0, "m", cfg);
}

static void test_config(void **state)
{
    (void)state;
    tsr_model_config c;
    assert_int_equal(parse(NULL, &c), TSR_OK);
    assert_string_equal(c.quant.method, "");
    assert_int_equal(parse("{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,\"desc_act\":true,\"sym\":false,"
                           "\"checkpoint_format\":\"gptq_v2\"}",
                           &c),
                     TSR_OK);
    assert_string_equal(c.quant.method, "gptq");
    assert_int_equal(c.quant.bits, 4);
    assert_int_equal(c.quant.group_size, 128);
    assert_int_equal(c.quant.desc_act, 1);
    assert_int_equal(c.quant.sym, 0);
    assert_int_equal(c.quant.gptq_v2, 1);
    assert_int_equal(parse("{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":-1}", &c), TSR_OK);
    assert_int_equal(c.quant.group_size, -1);
    assert_int_equal(c.quant.gptq_v2, 0);
    assert_int_equal(c.quant.sym, 1);
    /* EXL2's block (float bits) is only named, never interpreted */
    assert_int_equal(parse("{\"quant_method\":\"exl2\",\"version\":\"0.3.2\",\"bits\":2.5,\"head_bits\":6}", &c),
                     TSR_OK);
    assert_string_equal(c.quant.method, "exl2");
    assert_int_equal(c.quant.bits, 0);
    /* bits other than 4: a clear refusal */
    assert_int_equal(parse("{\"quant_method\":\"gptq\",\"bits\":8,\"group_size\":128}", &c), TSR_ERR_UNSUPPORTED);
    assert_non_null(strstr(tsr_last_error(), "8-bit"));
    assert_non_null(strstr(tsr_last_error(), "m/config.json"));
    assert_int_equal(parse("{\"quant_method\":\"gptq\",\"bits\":3}", &c), TSR_ERR_UNSUPPORTED);
    assert_int_equal(parse("{\"quant_method\":\"gptq\",\"group_size\":128}", &c), TSR_ERR_FORMAT); /* no bits */
    assert_int_equal(parse("{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":0}", &c), TSR_ERR_FORMAT);
    assert_int_equal(parse("{\"quant_method\":\"gptq\",\"bits\":4,\"checkpoint_format\":\"marlin\"}", &c),
                     TSR_ERR_UNSUPPORTED);
    assert_int_equal(parse("[1]", &c), TSR_ERR_FORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential), cmocka_unit_test(test_act_order),   cmocka_unit_test(test_v1_v2_zeros),
        cmocka_unit_test(test_bits_not_4), cmocka_unit_test(test_bad_tensors), cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
