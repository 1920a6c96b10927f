/* Random EXL2 matrices for the tests (see exl2_synth.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tests/common/exl2_synth.h"

#include "runtime/half.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state = 12345;
uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33);
}

/* Packs codes with the plain definition: value j of a group at stream bits [j*b, j*b+b), LSB first. */
void pack(synth_matrix *m)
{
    int Q = 0;
    for (int g = 0; g < m->G; g++) Q += m->rows[g] * m->bits[g] / 32;
    m->Q = Q;
    m->q_weight = calloc((size_t)Q * m->N, sizeof(uint32_t));
    int row = 0, qrow = 0;
    for (int g = 0; g < m->G; g++) {
        m->q_groups[2 * g] = (int16_t)m->bits[g];
        m->q_groups[2 * g + 1] = (int16_t)qrow;
        for (int n = 0; n < m->N; n++)
            for (int j = 0; j < m->rows[g]; j++) {
                uint32_t c = m->codes[(size_t)(row + j) * m->N + n];
                for (int b = 0; b < m->bits[g]; b++) {
                    long s = (long)j * m->bits[g] + b;
                    if (c >> b & 1) m->q_weight[(size_t)(qrow + s / 32) * m->N + n] |= 1u << (s % 32);
                }
            }
        row += m->rows[g];
        qrow += m->rows[g] * m->bits[g] / 32;
    }
}

void make_matrix(synth_matrix *m, int N, int G, const int *bits, const int *rows, int with_bias)
{
    memset(m, 0, sizeof *m);
    m->N = N;
    m->G = G;
    assert_true(G <= SYNTH_MAX_GROUPS);
    for (int g = 0; g < G; g++) {
        m->bits[g] = bits[g];
        m->rows[g] = rows[g];
        m->K += rows[g];
    }
    m->codes = malloc((size_t)m->K * N * sizeof(uint32_t));
    int row = 0;
    for (int g = 0; g < G; g++)
        for (int j = 0; j < rows[g]; j++, row++)
            for (int n = 0; n < N; n++) m->codes[(size_t)row * N + n] = rnd() & ((1u << bits[g]) - 1);
    pack(m);
    m->q_scale = malloc((size_t)G * (N / 8) * sizeof(uint32_t));
    for (int i = 0; i < G * (N / 8); i++) m->q_scale[i] = rnd();
    for (int g = 0; g < G; g++) m->q_scale_max[g] = tsr_float_to_half(0.002f + (float)(rnd() % 1000) * 1e-4f);
    m->q_scale_max[0] = 0x0E68; /* a value whose /256 is subnormal in fp16 (§6) */
    m->invperm = malloc((size_t)m->K * sizeof(int32_t));
    for (int k = 0; k < m->K; k++) m->invperm[k] = k;
    for (int k = m->K - 1; k > 0; k--) {
        int j = (int)(rnd() % (uint32_t)(k + 1)), t = m->invperm[k];
        m->invperm[k] = m->invperm[j];
        m->invperm[j] = t;
    }
    if (with_bias) {
        m->bias = malloc((size_t)N * sizeof(uint16_t));
        for (int n = 0; n < N; n++) m->bias[n] = tsr_float_to_half((float)((int)(rnd() % 200) - 100) * 0.01f);
    }
}

void free_matrix(synth_matrix *m)
{
    free(m->codes);
    free(m->q_weight);
    free(m->q_scale);
    free(m->invperm);
    free(m->bias);
}

/* Writes the matrix as tensors `w.*` to a temporary safetensors file; `skip` omits one tensor name suffix. */
const exl2_pack_vector exl2_pack_vectors[6] = {
    {2, {0x1B1B1B1B, 0x1B1B1B1B}},
    {3, {0x53977053, 0x70539770, 0x97705397}},
    {4, {0x4D6F81A3, 0xC5E7092B, 0x4D6F81A3, 0xC5E7092B}},
    {5, {0x4DFC4543, 0x78245BA3, 0x0753617D, 0x4B276CF4, 0xE55C7066}},
    {6, {0x9F611283, 0x90BBD2D9, 0xB2579740, 0x8F201EB3, 0x9CAB91D5, 0x71538703}},
    {8, {0x18110A03, 0x342D261F, 0x5049423B, 0x6C655E57, 0x88817A73, 0xA49D968F, 0xC0B9B2AB, 0xDCD5CEC7}},
};

void write_test_tensors(const char *path, const test_tensor *t, int n, const int *use)
{
    tsr_st_writer *w;
    assert_int_equal(tsr_st_writer_open(path, &w), TSR_OK);
    for (int i = 0; i < n; i++)
        if (!use || use[i]) assert_int_equal(tsr_st_writer_declare(w, t[i].name, t[i].dt, t[i].nd, t[i].shape), TSR_OK);
    assert_int_equal(tsr_st_writer_begin_data(w), TSR_OK);
    for (int i = 0; i < n; i++)
        if (!use || use[i]) assert_int_equal(tsr_st_writer_write(w, t[i].data, t[i].bytes), TSR_OK);
    assert_int_equal(tsr_st_writer_close(w), TSR_OK);
}

/* Writes the matrix as tensors `w.*` to a temporary safetensors file; `skip` omits one tensor name suffix. */
static void write_file(const synth_matrix *m, const char *path, const char *skip, tsr_dtype scale_dtype)
{
    int G = m->G;
    const test_tensor t[] = {
        {"w.q_weight", TSR_I32, 2, {m->Q, m->N}, m->q_weight, (size_t)m->Q * m->N * 4},
        {"w.q_invperm", TSR_I32, 1, {m->K}, m->invperm, (size_t)m->K * 4},
        {"w.q_scale", scale_dtype, 2, {G, m->N / 8}, m->q_scale, (size_t)G * m->N / 8 * 4},
        {"w.q_scale_max", TSR_F16, 1, {G}, m->q_scale_max, (size_t)G * 2},
        {"w.q_groups", TSR_I16, 1, {2 * G}, m->q_groups, (size_t)G * 4},
        {"w.bias", TSR_F16, 1, {m->N}, m->bias, (size_t)m->N * 2},
    };
    int use[6];
    for (int i = 0; i < 6; i++) use[i] = (i < 5 || m->bias) && (!skip || strcmp(t[i].name + 2, skip));
    write_test_tensors(path, t, 6, use);
}

tsr_status load(const synth_matrix *m, const char *skip, tsr_st_set **set, tsr_qmatrix *q)
{
    char path[] = "/tmp/tsr_test_exl2_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    write_file(m, path, skip, TSR_I32);
    assert_int_equal(tsr_st_open_file(path, set), TSR_OK);
    unlink(path);
    return tsr_qmatrix_load(*set, "w", m->K, m->N, m->bias != NULL, 1.0f, q);
}

void qmatrix_ref_product(const tsr_qmatrix *q, const float *x, int M, int N, float *y)
{
    float *W = malloc((size_t)q->K * q->N * sizeof *W);
    double *acc = malloc((size_t)N * sizeof *acc);
    assert_non_null(W);
    assert_non_null(acc);
    tsr_qmatrix_dequant_ref(q, 0, W);
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) acc[n] = q->bias ? tsr_half_to_float(q->bias[n]) : 0.0;
        for (int k = 0; k < q->K; k++) {
            const double xk = x[(size_t)m * q->K + k];
            const float *row = W + (size_t)k * q->N;
            for (int n = 0; n < N; n++) acc[n] += xk * row[n];
        }
        for (int n = 0; n < N; n++) y[(size_t)m * N + n] = (float)acc[n];
    }
    free(W), free(acc);
}
