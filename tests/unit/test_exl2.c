/* EXL2 matrices: bit unpacking of every width on random data against a straightforward bit-stream packer, the
 * EXL2.md §5.1 test vectors, scale rounding (§6 reference values), group tables and permutations, the CPU matmul
 * kernel against a double-precision reference, and the load-time validation errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/ops.h"
#include "runtime/exl2.h"
#include "runtime/half.h"
#include "runtime/safetensors.h"
#include "tests/common/exl2_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_unpack_every_width(void **state)
{
    (void)state;
    /* descending widths, mixed group sizes, a short last group */
    const int bits[] = {8, 8, 6, 5, 4, 4, 3, 2, 2};
    const int rows[] = {32, 64, 48, 32, 128, 40, 96, 64, 16};
    synth_matrix m;
    make_matrix(&m, 96, 9, bits, rows, 1);
    tsr_st_set *set;
    tsr_qmatrix q;
    if (load(&m, NULL, &set, &q) != TSR_OK) fail_msg("%s", tsr_last_error());
    assert_int_equal(q.K, m.K);
    assert_int_equal(q.G, 9);
    for (int g = 0; g < q.G; g++) {
        assert_int_equal(q.groups[g].bits, bits[g]);
        assert_int_equal(q.groups[g].rows, rows[g]);
        for (int j = 0; j < q.groups[g].rows; j++)
            for (int n = 0; n < q.N; n++)
                assert_int_equal(tsr_qmatrix_code(&q, &q.groups[g], j, n),
                                 m.codes[(size_t)(q.groups[g].row0 + j) * q.N + n]);
    }
    /* permutation: perm = argsort(invperm) */
    for (int k = 0; k < q.K; k++) assert_int_equal(q.perm[m.invperm[k]], k);
    tsr_qmatrix_free(&q);
    tsr_st_set_free(set);
    free_matrix(&m);
}

static void test_vectors_5_1(void **state)
{
    (void)state;
    /* one column group of 32 rows with codes (7j+3) mod 2^b must pack to EXL2.md §5.1's words */
    const exl2_pack_vector *v = exl2_pack_vectors;
    for (size_t i = 0; i < sizeof exl2_pack_vectors / sizeof exl2_pack_vectors[0]; i++) {
        synth_matrix m;
        const int bits[] = {v[i].bits}, rows[] = {32};
        make_matrix(&m, 32, 1, bits, rows, 0);
        for (int j = 0; j < 32; j++)
            for (int n = 0; n < 32; n++) m.codes[(size_t)j * 32 + n] = (uint32_t)(7 * j + 3) % (1u << v[i].bits);
        free(m.q_weight);
        pack(&m);
        for (int w = 0; w < v[i].bits; w++) assert_int_equal(m.q_weight[(size_t)w * 32 + 5], v[i].words[w]);
        /* and the loader reads them back */
        tsr_st_set *set;
        tsr_qmatrix q;
        assert_int_equal(load(&m, NULL, &set, &q), TSR_OK);
        for (int j = 0; j < 32; j++)
            assert_int_equal(tsr_qmatrix_code(&q, &q.groups[0], j, 5), (uint32_t)(7 * j + 3) % (1u << v[i].bits));
        tsr_qmatrix_free(&q);
        tsr_st_set_free(set);
        free_matrix(&m);
    }
}

static void test_scale_rounding(void **state)
{
    (void)state;
    /* EXL2.md §6 reference values: q_scale_max bits, code, m, S */
    static const struct {
        uint16_t qsm;
        int code;
        double m, S;
    } v[] = {
        {0x224C, 5, 4.8041343689e-05, 0.0017299652},
        {0x0E68, 15, 1.5497207642e-06, 0.0003967285},
        {0x0E68, 3, 1.5497207642e-06, 2.4795532227e-05},
        {0x2A66, 15, 1.9526481628e-04, 0.0499877930},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        float m = tsr_round_half(tsr_half_to_float(v[i].qsm) * (1.0f / 256.0f));
        float S = tsr_round_half((float)((v[i].code + 1) * (v[i].code + 1)) * m);
        assert_true(fabs(m - v[i].m) <= 1e-9 * fabs(v[i].m) + 1e-16);
        assert_true(fabs(S - v[i].S) <= 1e-7 * fabs(v[i].S) + 1e-14);
    }
    /* fp16 conversion: every half round-trips, and RNE ties go to even */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue; /* nan payloads */
        assert_int_equal(tsr_float_to_half(tsr_half_to_float((uint16_t)h)), h);
    }
    assert_int_equal(tsr_float_to_half(1.0f + 1.0f / 2048.0f), 0x3C00);        /* tie → even */
    assert_int_equal(tsr_float_to_half(1.0f + 3.0f / 2048.0f), 0x3C02);        /* tie → even (up) */
    assert_int_equal(tsr_float_to_half(65520.0f), 0x7C00);                     /* overflow */
    assert_int_equal(tsr_float_to_half(5.9604644775390625e-08f * 0.5f), 0);    /* tie to even zero */
    assert_int_equal(tsr_float_to_half(5.9604644775390625e-08f * 1.5f), 2);    /* subnormal tie → even */
}

static void test_matmul_kernel(void **state)
{
    (void)state;
    const int bits[] = {8, 6, 5, 4, 3, 2};
    const int rows[] = {32, 32, 64, 128, 96, 48};
    synth_matrix m;
    make_matrix(&m, 160, 6, bits, rows, 1);
    tsr_st_set *set;
    tsr_qmatrix q;
    assert_int_equal(load(&m, NULL, &set, &q), TSR_OK);
    float *W = malloc((size_t)q.K * q.N * sizeof(float));
    tsr_qmatrix_dequant_ref(&q, 0, W);
    /* spot-check the reference dequantizer against the §6 formula in original row order */
    for (int g = 0, row = 0; g < q.G; row += m.rows[g], g++)
        for (int j = 0; j < m.rows[g]; j += 7)
            for (int n = 0; n < q.N; n += 13) {
                float S = tsr_qmatrix_scale(&q, g, n);
                float want = (float)((int)m.codes[(size_t)(row + j) * q.N + n] - (1 << (bits[g] - 1))) * S;
                assert_true(W[(size_t)q.perm[row + j] * q.N + n] == want);
            }
    const int Ms[] = {1, 3, 17};
    for (size_t t = 0; t < 3; t++) {
        int M = Ms[t], Nout = 150; /* fewer columns than stored: the padded ones are not computed */
        float *x = malloc((size_t)M * q.K * sizeof(float)), *y = malloc((size_t)M * Nout * sizeof(float));
        for (int i = 0; i < M * q.K; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        for (int i = 0; i < M * Nout; i++) y[i] = NAN; /* poisoned */
        tsr_linear L = {.kind = TSR_LINEAR_EXL2, .K = q.K, .N = Nout, .q = q};
        tsr_ops_cpu()->linear(&L, x, M, y);
        float *want = malloc((size_t)M * Nout * sizeof(float));
        qmatrix_ref_product(&q, x, M, Nout, want);
        for (int r = 0; r < M; r++)
            for (int n = 0; n < Nout; n++) {
                const double got = y[(size_t)r * Nout + n], acc = want[(size_t)r * Nout + n];
                if (!(fabs(got - acc) <= 1e-4 * (1 + fabs(acc))))
                    fail_msg("M=%d row %d col %d: %g vs %g", M, r, n, got, acc);
            }
        free(want);
        /* each row alone gives the same bits as in the batch (the kernel's paths for one row and for several) */
        float *y1 = malloc((size_t)Nout * sizeof(float));
        for (int r = 0; r < M; r++) {
            tsr_ops_cpu()->linear(&L, x + (size_t)r * q.K, 1, y1);
            if (memcmp(y1, y + (size_t)r * Nout, (size_t)Nout * sizeof(float)))
                fail_msg("M=%d row %d differs from the same row alone", M, r);
        }
        free(y1);
        free(x);
        free(y);
    }
    free(W);
    tsr_qmatrix_free(&q);
    tsr_st_set_free(set);
    free_matrix(&m);
}

static void expect_load_error(synth_matrix *m, const char *skip, tsr_status want, const char *fragment)
{
    tsr_st_set *set;
    tsr_qmatrix q;
    tsr_status st = load(m, skip, &set, &q);
    if (st == TSR_OK) tsr_qmatrix_free(&q);
    tsr_st_set_free(set);
    if (st != want || !strstr(tsr_last_error(), fragment))
        fail_msg("expected status %d with '%s', got %d: %s", want, fragment, st, tsr_last_error());
}

static void test_validation(void **state)
{
    (void)state;
    const int bits[] = {4, 3}, rows[] = {64, 32};
    synth_matrix m;
    make_matrix(&m, 32, 2, bits, rows, 0);
    expect_load_error(&m, "q_scale_max", TSR_ERR_MISSING, "w.q_scale_max");
    m.q_groups[0] = 7;
    expect_load_error(&m, NULL, TSR_ERR_FORMAT, "unknown bit width 7");
    m.q_groups[0] = 4;
    m.q_groups[2] = 8; /* 4 then 8: widths increase */
    expect_load_error(&m, NULL, TSR_ERR_FORMAT, "widen");
    m.q_groups[2] = 3;
    m.q_groups[3] = 100; /* second group starts beyond the packed rows */
    expect_load_error(&m, NULL, TSR_ERR_FORMAT, "outside");
    m.q_groups[3] = 9; /* 9 packed rows for 4 bits = 72 rows, then 3 rows of 3 bits: not whole values */
    expect_load_error(&m, NULL, TSR_ERR_FORMAT, "whole number");
    m.q_groups[3] = 8;
    int saved = m.invperm[3];
    m.invperm[3] = m.invperm[4];
    expect_load_error(&m, NULL, TSR_ERR_FORMAT, "not a permutation");
    m.invperm[3] = 1000;
    expect_load_error(&m, NULL, TSR_ERR_FORMAT, "not a permutation");
    m.invperm[3] = saved;
    /* groups covering fewer rows than K: claim K larger through a longer invperm */
    tsr_st_set *set;
    tsr_qmatrix q;
    assert_int_equal(load(&m, NULL, &set, &q), TSR_OK);
    tsr_qmatrix_free(&q);
    assert_int_equal(tsr_qmatrix_load(set, "w", m.K + 32, m.N, 0, 1.0f, &q), TSR_ERR_FORMAT);
    assert_non_null(strstr(tsr_last_error(), "w.q_invperm"));
    assert_int_equal(tsr_qmatrix_load(set, "w", m.K, m.N + 32, 0, 1.0f, &q), TSR_ERR_FORMAT); /* q_weight width */
    assert_non_null(strstr(tsr_last_error(), "w.q_weight"));
    tsr_st_set_free(set);
    free_matrix(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unpack_every_width), cmocka_unit_test(test_vectors_5_1),
        cmocka_unit_test(test_scale_rounding),     cmocka_unit_test(test_matmul_kernel),
        cmocka_unit_test(test_validation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
