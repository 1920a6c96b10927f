/* Paged KV cache: page allocation, page-table addressing, and attention over scattered pages equal to a
 * straightforward dense computation (causal, GQA, sliding window, several sequences in one call). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "kernels/ops.h"
#include "runtime/half.h"
#include "runtime/kv_cache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t seed = 99;
static float frand(void)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void test_page_pool(void **state)
{
    (void)state;
    tsr_kv_cache kv;
    assert_int_equal(tsr_kv_init(&kv, tsr_ops_cpu(), 2, 2, 8, 4, 3, TSR_F16), TSR_OK);
    int a = tsr_kv_alloc_page(&kv), b = tsr_kv_alloc_page(&kv), c = tsr_kv_alloc_page(&kv);
    assert_true(a >= 0 && b >= 0 && c >= 0 && a != b && b != c && a != c);
    assert_int_equal(tsr_kv_alloc_page(&kv), -1); /* exhausted */
    tsr_kv_release_page(&kv, b);
    assert_int_equal(tsr_kv_alloc_page(&kv), b);
    int32_t table[] = {c, a};
    /* position 5 = page table[1] (a), slot 1 */
    assert_int_equal(tsr_kv_slot_offset(&kv, table, 5), ((size_t)a * 4 + 1) * 2 * 8);
    tsr_kv_free(&kv);
    assert_int_equal(tsr_kv_init(&kv, tsr_ops_cpu(), 1, 1, 8, 4, 0, TSR_F16), TSR_ERR_ARG);
    assert_int_equal(tsr_kv_init(&kv, tsr_ops_cpu(), 1, 1, 8, 4, 2, TSR_I32), TSR_ERR_UNSUPPORTED);
}

/* Dense reference attention for one sequence with all K/V in arrays [T][nkv][d]. */
static void reference(const float *q, const float *k, const float *v, int pos0, int n, int nh, int nkv, int d,
                      int window, float *out)
{
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nh; h++) {
            int p = pos0 + t, kvh = h / (nh / nkv), lo = window && p - window + 1 > 0 ? p - window + 1 : 0;
            double *s = malloc((size_t)(p + 1) * sizeof(double)), mx = -1e300, sum = 0;
            for (int j = lo; j <= p; j++) {
                double acc = 0;
                for (int i = 0; i < d; i++)
                    acc += (double)q[((size_t)t * nh + h) * d + i] * k[((size_t)j * nkv + kvh) * d + i];
                s[j] = acc / sqrt((double)d);
                if (s[j] > mx) mx = s[j];
            }
            for (int j = lo; j <= p; j++) sum += (s[j] = exp(s[j] - mx));
            for (int i = 0; i < d; i++) {
                double acc = 0;
                for (int j = lo; j <= p; j++) acc += s[j] * v[((size_t)j * nkv + kvh) * d + i];
                out[((size_t)t * nh + h) * d + i] = (float)(acc / sum);
            }
            free(s);
        }
}

/* Stores n rows of one sequence at positions pos0.. through the kv_store op. */
static void store(tsr_kv_cache *kv, const int32_t *table, int pos0, int n, const float *k, const float *v)
{
    int32_t row_seq[48] = {0}, positions[48], seq_row0[] = {0, n};
    assert_true(n <= 48);
    for (int i = 0; i < n; i++) positions[i] = pos0 + i;
    tsr_batch_layout b = {1, n, 12, pos0 + n - 1, row_seq, positions, seq_row0, table, NULL, NULL, 0, NULL, NULL};
    tsr_ops_cpu()->kv_store(&b, kv, 0, k, v);
}

/* T0: positions of sequence 0 (at most 48); with more than 16 its queries walk several of the CPU kernel's blocks of
 * positions (kernels/cpu/attention.c), the running maximum changing between them. d: the head size (the kernel has
 * unrolled copies for 64 and 128, and tails for sizes that are not multiples of its vectors); nh query heads over 2
 * KV heads. */
static void check_attention(tsr_dtype dtype, int window, int T0, int d, int nh)
{
    const int nkv = 2, page = 4, T1 = 6;
    tsr_kv_cache kv;
    assert_int_equal(tsr_kv_init(&kv, tsr_ops_cpu(), 1, nkv, d, page, 16, dtype), TSR_OK);
    /* two sequences with interleaved, out-of-order pages */
    int32_t table0[12] = {9, 2, 14, 5, 3, 7, 12, 1, 4, 6, 8, 10}, table1[] = {0, 11};
    float *k0 = malloc(T0 * nkv * d * sizeof(float)), *v0 = malloc(T0 * nkv * d * sizeof(float));
    float *k1 = malloc(T1 * nkv * d * sizeof(float)), *v1 = malloc(T1 * nkv * d * sizeof(float));
    for (int i = 0; i < T0 * nkv * d; i++) {
        k0[i] = dtype == TSR_F16 ? tsr_round_half(frand()) : frand();
        v0[i] = dtype == TSR_F16 ? tsr_round_half(frand()) : frand();
    }
    for (int i = 0; i < T1 * nkv * d; i++) {
        k1[i] = dtype == TSR_F16 ? tsr_round_half(frand()) : frand();
        v1[i] = dtype == TSR_F16 ? tsr_round_half(frand()) : frand();
    }
    const tsr_ops *ops = tsr_ops_cpu();
    /* sequence 0 cached in two steps (prefill T0 - 3, then 3), sequence 1 in one */
    store(&kv, table0, 0, T0 - 3, k0, v0);
    store(&kv, table0, T0 - 3, 3, k0 + (size_t)(T0 - 3) * nkv * d, v0 + (size_t)(T0 - 3) * nkv * d);
    store(&kv, table1, 0, T1, k1, v1);
    /* query: last 3 tokens of seq 0 and all 6 of seq 1, in one call */
    const int n0 = 3, rows = n0 + T1;
    float *q = malloc((size_t)rows * nh * d * sizeof(float)), *out = malloc((size_t)rows * nh * d * sizeof(float));
    float *want = malloc((size_t)rows * nh * d * sizeof(float));
    for (int i = 0; i < rows * nh * d; i++) q[i] = frand();
    for (int i = 0; i < rows * nh * d; i++) out[i] = NAN;
    int32_t tables[2][12] = {{0}}, row_seq[9], positions[9], seq_row0[] = {0, n0, rows};
    memcpy(tables[0], table0, sizeof table0);
    memcpy(tables[1], table1, sizeof table1);
    for (int r = 0; r < rows; r++) {
        row_seq[r] = r < n0 ? 0 : 1;
        positions[r] = r < n0 ? T0 - n0 + r : r - n0;
    }
    tsr_batch_layout b = {2, rows, 12, T0 - 1, row_seq, positions, seq_row0, &tables[0][0], NULL, NULL, 0, NULL, NULL};
    tsr_attn_args a = {nh, nkv, d, 1.0f / sqrtf((float)d), window, 0, NULL};
    ops->attention(&b, &a, &kv, q, out);
    reference(q, k0, v0, T0 - n0, n0, nh, nkv, d, window, want);
    reference(q + (size_t)n0 * nh * d, k1, v1, 0, T1, nh, nkv, d, window, want + (size_t)n0 * nh * d);
    for (int i = 0; i < rows * nh * d; i++)
        if (!(fabsf(out[i] - want[i]) < 1e-5f))
            fail_msg("dtype %d window %d: element %d %g vs %g", dtype, window, i, out[i], want[i]);
    free(k0), free(v0), free(k1), free(v1), free(q), free(out), free(want);
    tsr_kv_free(&kv);
}

static void test_paged_attention(void **state)
{
    (void)state;
    check_attention(TSR_F16, 0, 13, 16, 4);
    check_attention(TSR_F32, 0, 13, 16, 4);
    check_attention(TSR_F32, 5, 13, 16, 4);
    check_attention(TSR_F16, 0, 45, 16, 4);
    check_attention(TSR_F32, 21, 45, 16, 4);
    check_attention(TSR_F16, 0, 45, 64, 8);
    check_attention(TSR_F16, 7, 33, 128, 2);
    check_attention(TSR_F32, 0, 45, 72, 6);
    check_attention(TSR_F16, 0, 20, 36, 20); /* 10 query heads per KV head: two passes of the kernel's 8 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page_pool),
        cmocka_unit_test(test_paged_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
