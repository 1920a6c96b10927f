/* Quantized KV-cache modes (Q4, Q6, Q8; EXL2.md §11.3): the quantizer against a straightforward fp32
 * reimplementation of the section written here (explicit Hadamard matrix, no butterflies, no fp16 rounding), codes
 * and scales of hand-made vectors (an all-zero group, saturation at +amax, the nibble order), the storage size per
 * token, the refusal of head dimensions that are not multiples of 64, that storing a token leaves every other
 * token's bytes alone, and attention over a quantized paged cache against attention over an FP32 cache holding the
 * dequantized vectors (several sequences, GQA, sliding window), including the rule that a call attends to its own
 * freshly stored rows exactly (fp16) and to everything else through the codes. */
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

static uint64_t seed = 1234;
static float frand(void)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static const tsr_dtype modes[] = {TSR_KV_Q4, TSR_KV_Q6, TSR_KV_Q8};

/* ---- the reference: §11.3 in plain fp32 ---- */

static int popcount(unsigned x)
{
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

/* v[e] for the head vector x[d]: per 64-chunk c and parity p,
 * v[c + 2j + p] = sum_i (-1)^popcount(i & j) x[c + 2i + p] */
static void ref_rotate(const float *x, int d, float *v)
{
    for (int c = 0; c < d; c += 64)
        for (int p = 0; p < 2; p++)
            for (int j = 0; j < 32; j++) {
                double s = 0;
                for (int i = 0; i < 32; i++) s += (popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[c + 2 * i + p];
                v[c + 2 * j + p] = (float)s;
            }
}

/* codes q[e] (one int each) and fp32 scales per 32-element group */
static void ref_quantize(const float *x, int d, int bits, int *q, float *scale)
{
    float v[512];
    ref_rotate(x, d, v);
    const float m = bits == 4 ? 8.0f : 128.0f;
    for (int g = 0; g < d / 32; g++) {
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[g * 32 + i]));
        scale[g] = amax / m;
        for (int i = 0; i < 32; i++) {
            float y = amax > 0 ? nearbyintf(v[g * 32 + i] / amax * m + m) : m;
            q[g * 32 + i] = (int)fminf(fmaxf(y, 0.0f), 2 * m - 1);
        }
    }
}

/* code of element e from packed storage */
static int code_at(const uint8_t *codes, int bits, int e)
{
    return bits == 4 ? (codes[e / 2] >> (4 * (e & 1))) & 15 : codes[e];
}

/* ---- quantizer ---- */

static void test_rotate_matches_matrix(void **state)
{
    (void)state;
    float x[128], v[128], r[128];
    for (int i = 0; i < 128; i++) x[i] = frand();
    ref_rotate(x, 128, v);
    memcpy(r, x, sizeof r);
    tsr_kv_rotate(r, 128);
    for (int i = 0; i < 128; i++) assert_true(fabsf(r[i] - v[i]) < 1e-5f);
    tsr_kv_rotate(r, 128); /* H·H = 32·I */
    for (int i = 0; i < 128; i++) assert_true(fabsf(r[i] / 32 - x[i]) < 1e-6f);
}

static void test_random_against_reference(void **state)
{
    (void)state;
    const int d = 128, n = 200;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
        for (int which = 0; which < 2; which++) {
            int kb, vb;
            tsr_kv_mode_bits(modes[mi], &kb, &vb);
            const int bits = which ? vb : kb, m = bits == 4 ? 8 : 128;
            long flips = 0, total = 0;
            double err_ours = 0, err_ref = 0, energy = 0;
            for (int it = 0; it < n; it++) {
                float x[128], v[128], back[128], rot[128], sref[4];
                int qref[128];
                uint8_t codes[128];
                uint16_t scales[4];
                /* fp16 inputs (the cache quantizes fp16 K/V), with one outlier in some vectors */
                for (int i = 0; i < d; i++) x[i] = tsr_round_half(frand() * (it % 3 ? 1.0f : 4.0f));
                if (it % 5 == 0) x[it % d] = tsr_round_half(12.0f * frand());
                tsr_kv_quantize(x, d, bits, codes, scales);
                ref_quantize(x, d, bits, qref, sref);
                ref_rotate(x, d, v);
                tsr_kv_dequantize_rotated(codes, scales, d, bits, rot);
                for (int g = 0; g < d / 32; g++) {
                    /* scale: the fp32 one rounded to fp16, give or take 1 ulp of the fp16 rotation's amax */
                    float s = tsr_half_to_float(scales[g]);
                    if (!(fabsf(s - sref[g]) <= 2e-3f * sref[g] + 1e-7f))
                        fail_msg("%s bits %d: scale %g vs reference %g", tsr_kv_dtype_name(modes[mi]), bits, s,
                                 sref[g]);
                    for (int i = 0; i < 32; i++) {
                        const int e = g * 32 + i, q = code_at(codes, bits, e);
                        /* fp16 butterflies may move a value across a rounding boundary: one code at most */
                        if (abs(q - qref[e]) > 1)
                            fail_msg("%s bits %d: element %d code %d vs reference %d", tsr_kv_dtype_name(modes[mi]),
                                     bits, e, q, qref[e]);
                        flips += q != qref[e];
                        total++;
                        if (fabsf(rot[e] - (float)(q - m) * s) > 0) fail_msg("rotated dequantization is not (q - m)·s");
                    }
                }
                tsr_kv_dequantize(codes, scales, d, bits, back);
                float refback[128], rv[128];
                for (int e = 0; e < d; e++) rv[e] = (float)(qref[e] - m) * sref[e / 32];
                ref_rotate(rv, d, refback);
                for (int e = 0; e < d; e++) {
                    refback[e] /= 32;
                    err_ours += ((double)back[e] - x[e]) * ((double)back[e] - x[e]);
                    err_ref += ((double)refback[e] - x[e]) * ((double)refback[e] - x[e]);
                    energy += (double)x[e] * x[e];
                }
            }
            const double rel_ours = sqrt(err_ours / energy), rel_ref = sqrt(err_ref / energy);
            print_message("  %s %d-bit codes: %.2f%% differ by one from the fp32 reference; round-trip rel. error %.4f "
                          "(reference %.4f)\n",
                          tsr_kv_dtype_name(modes[mi]), bits, 100.0 * (double)flips / (double)total, rel_ours, rel_ref);
            /* fp16 rounding only nudges codes at boundaries: a few percent of 4-bit codes, more of the finer 8-bit */
            assert_true((double)flips < (bits == 4 ? 0.02 : 0.15) * (double)total);
            assert_true(fabs(rel_ours - rel_ref) < 0.05 * rel_ref + 1e-4);
            /* and the round trip is as good as the format allows: about 1/16 (4-bit) and 1/256 (8-bit) of amax */
            assert_true(rel_ours < (bits == 4 ? 0.15 : 0.01));
        }
}

/* x = R(v)/32 for a rotated-domain vector v with entries that keep everything exact */
static void from_rotated(const float *v, int d, float *x)
{
    ref_rotate(v, d, x);
    for (int i = 0; i < d; i++) x[i] /= 32;
}

static void test_hand_made_codes(void **state)
{
    (void)state;
    const int d = 128;
    float v[128] = {0}, x[128], back[128];
    /* chunk 0: even j=0: +32 (the group's amax: saturates), even j=1: +16, odd j=0: -32 (-amax: code 0);
     * group 1 of chunk 0 (j = 16..31) all zero; chunk 1: one value -3 at even j=20 (group 3) */
    v[0] = 32, v[2] = 16, v[1] = -32, v[64 + 40] = -3;
    from_rotated(v, d, x);
    for (int bits = 4; bits <= 8; bits += 4) {
        uint8_t codes[128];
        uint16_t scales[4];
        memset(codes, 0xaa, sizeof codes);
        tsr_kv_quantize(x, d, bits, codes, scales);
        const int m = bits == 4 ? 8 : 128, top = 2 * m - 1;
        /* scales: amax/8 or amax/128 in fp16; the all-zero groups get 0 */
        assert_int_equal(scales[0], tsr_float_to_half(32.0f / (float)m));
        assert_int_equal(scales[1], 0);
        assert_int_equal(scales[2], 0);
        assert_int_equal(scales[3], tsr_float_to_half(3.0f / (float)m));
        assert_int_equal(code_at(codes, bits, 0), top);           /* +amax saturates: 16 → 15, 256 → 255 */
        assert_int_equal(code_at(codes, bits, 2), m + m / 2);     /* +amax/2 */
        assert_int_equal(code_at(codes, bits, 1), 0);             /* -amax */
        assert_int_equal(code_at(codes, bits, 64 + 40), 0);       /* the only value of group 3, negative */
        for (int e = 0; e < d; e++)
            if (e != 0 && e != 1 && e != 2 && e != 64 + 40) assert_int_equal(code_at(codes, bits, e), m); /* zeros */
        if (bits == 4) {
            assert_int_equal(codes[0], 0x0f);          /* element 0 low nibble (15), element 1 high nibble (0) */
            assert_int_equal(codes[1], 0x8c);          /* element 2: 12, element 3: 8 */
        }
        /* dequantized: +amax comes back as 7/8 (127/128) of it, the rest exactly */
        tsr_kv_dequantize(codes, scales, d, bits, back);
        float vq[128] = {0}, want[128];
        vq[0] = 32.0f * (float)(top - m) / (float)m, vq[2] = 16, vq[1] = -32, vq[64 + 40] = -3;
        from_rotated(vq, d, want);
        for (int e = 0; e < d; e++)
            if (fabsf(back[e] - want[e]) > 1e-6f)
                fail_msg("%d-bit: element %d dequantizes to %g, want %g", bits, e, back[e], want[e]);
    }
    /* an all-zero vector: zero scales, zero codes, zeros back */
    float z[64] = {0}, zb[64];
    uint8_t codes[64];
    uint16_t scales[2];
    tsr_kv_quantize(z, 64, 4, codes, scales);
    assert_int_equal(scales[0], 0);
    assert_int_equal(codes[5], 0x88);
    tsr_kv_dequantize(codes, scales, 64, 4, zb);
    for (int i = 0; i < 64; i++) assert_true(zb[i] == 0.0f);
}

/* ---- the pool ---- */

static void test_sizes_and_refusals(void **state)
{
    (void)state;
    /* per layer and KV head of dim 64: codes + 2 fp16 scales for K, the same for V */
    assert_int_equal(tsr_kv_bytes_per_token(1, 1, 64, TSR_KV_Q4), 32 + 4 + 32 + 4);
    assert_int_equal(tsr_kv_bytes_per_token(1, 1, 64, TSR_KV_Q6), 64 + 4 + 32 + 4);
    assert_int_equal(tsr_kv_bytes_per_token(1, 1, 64, TSR_KV_Q8), 64 + 4 + 64 + 4);
    assert_int_equal(tsr_kv_bytes_per_token(1, 1, 64, TSR_F16), 256);
    assert_int_equal(tsr_kv_bytes_per_token(32, 8, 128, TSR_KV_Q4), (size_t)32 * 8 * (2 * (64 + 8)));
    /* the fp16 rebuild a backend may make for attention: TSR_KV_EXPAND_ROWS positions per step row, or one
     * sequence's whole context in pages, whichever is more; K and V in fp16 */
    assert_int_equal(tsr_kv_expand_positions(2048, 8192, 16), TSR_KV_EXPAND_ROWS * 2048);
    assert_int_equal(tsr_kv_expand_positions(2048, 131072, 16), 131072);
    assert_int_equal(tsr_kv_expand_positions(1, 100, 16), 112); /* 100 positions take 7 pages */
    assert_int_equal(tsr_kv_expand_positions(0, 0, 16), 0);
    assert_int_equal(tsr_kv_expand_bytes(8, 128, TSR_KV_Q4, 65536), (size_t)65536 * 8 * 128 * 4);
    assert_int_equal(tsr_kv_expand_bytes(8, 128, TSR_KV_Q8, 1), (size_t)8 * 128 * 4);
    assert_int_equal(tsr_kv_expand_bytes(8, 128, TSR_F16, 65536), 0);
    assert_int_equal(tsr_kv_expand_bytes(8, 128, TSR_F32, 65536), 0);
    /* the KV modes are not element types */
    assert_int_equal(tsr_dtype_size(TSR_KV_Q4), 0);
    assert_int_equal(tsr_dtype_parse("KV_Q8"), TSR_DTYPE_INVALID);
    assert_string_equal(tsr_kv_dtype_name(TSR_KV_Q6), "q6");
    tsr_kv_cache kv;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        assert_int_equal(tsr_kv_init(&kv, tsr_ops_cpu(), 2, 2, 96, 4, 3, modes[mi]), TSR_ERR_UNSUPPORTED);
        assert_non_null(strstr(tsr_last_error(), "divisible by 64"));
        assert_int_equal(tsr_kv_init(&kv, tsr_ops_cpu(), 2, 2, 192, 4, 3, modes[mi]), TSR_OK);
        assert_non_null(kv.k_scale);
        tsr_kv_free(&kv);
    }
}

/* Stores n rows of one sequence at positions pos0.. through the kv_store op. */
static void store(tsr_kv_cache *kv, const int32_t *table, int pos0, int n, const float *k, const float *v)
{
    int32_t row_seq[32] = {0}, positions[32], seq_row0[] = {0, n};
    for (int i = 0; i < n; i++) positions[i] = pos0 + i;
    tsr_batch_layout b = {1, n, 4, pos0 + n - 1, row_seq, positions, seq_row0, table, NULL, NULL, 0, NULL, NULL};
    tsr_ops_cpu()->kv_store(&b, kv, 0, k, v);
}

static size_t layer_bytes(const tsr_kv_cache *kv, int bits)
{
    return (size_t)kv->n_pages * kv->page_size * kv->n_kv_heads * kv->head_dim * bits / 8;
}

/* Writing one token changes only that token's codes and scales. */
static void test_store_is_per_token(void **state)
{
    (void)state;
    const int nkv = 2, d = 64, page = 4;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        tsr_kv_cache kv;
        assert_int_equal(tsr_kv_init(&kv, tsr_ops_cpu(), 1, nkv, d, page, 2, modes[mi]), TSR_OK);
        int32_t table[] = {1, 0};
        float k[8 * 128], v[8 * 128];
        for (int i = 0; i < 8 * nkv * d; i++) k[i] = frand(), v[i] = frand();
        store(&kv, table, 0, 5, k, v);
        const size_t kbytes = layer_bytes(&kv, kv.k_bits), vbytes = layer_bytes(&kv, kv.v_bits);
        const size_t sbytes = (size_t)kv.n_pages * page * nkv * d / 32 * 2;
        uint8_t *before[4], *after[4];
        const void *arrays[4] = {kv.k[0], kv.v[0], kv.k_scale[0], kv.v_scale[0]};
        const size_t sizes[4] = {kbytes, vbytes, sbytes, sbytes};
        for (int a = 0; a < 4; a++) before[a] = malloc(sizes[a]), memcpy(before[a], arrays[a], sizes[a]);
        /* rewrite position 5 (page 0, slot 1: between positions 4 and 6's slots) with other values */
        for (int i = 0; i < nkv * d; i++) k[5 * nkv * d + i] = 3 * frand(), v[5 * nkv * d + i] = 3 * frand();
        store(&kv, table, 5, 1, k + 5 * nkv * d, v + 5 * nkv * d);
        const size_t slot = tsr_kv_slot_offset(&kv, table, 5);
        for (int a = 0; a < 4; a++) {
            after[a] = malloc(sizes[a]);
            memcpy(after[a], arrays[a], sizes[a]);
            const int bits = a == 0 ? kv.k_bits : a == 1 ? kv.v_bits : 0;
            const size_t lo = bits ? slot * bits / 8 : slot / 32 * 2;
            const size_t hi = lo + (bits ? (size_t)nkv * d * bits / 8 : (size_t)nkv * d / 32 * 2);
            long changed_inside = 0;
            for (size_t i = 0; i < sizes[a]; i++) {
                if (i >= lo && i < hi) changed_inside += before[a][i] != after[a][i];
                else if (before[a][i] != after[a][i])
                    fail_msg("%s: byte %zu of array %d changed", tsr_kv_dtype_name(modes[mi]), i, a);
            }
            assert_true(changed_inside > 0);
            free(before[a]), free(after[a]);
        }
        /* and the token reads back as its own quantize-dequantize */
        float rk[128], rv[128], want[64];
        tsr_kv_read(&kv, 0, table, 5, rk, rv);
        for (int h = 0; h < nkv; h++) {
            uint8_t codes[64];
            uint16_t scales[2];
            tsr_kv_quantize(k + 5 * nkv * d + h * d, d, kv.k_bits, codes, scales);
            tsr_kv_dequantize(codes, scales, d, kv.k_bits, want);
            for (int i = 0; i < d; i++) assert_true(rk[h * d + i] == want[i]);
        }
        tsr_kv_free(&kv);
    }
}

/* ---- attention ---- */

/* T0: sequence 0's positions; with more than 16 (pages of 8 then) its queries walk several of the CPU kernel's
 * blocks of positions. */
static void check_attention(tsr_dtype mode, int d, int window, int T0)
{
    const int nh = 4, nkv = 2, page = T0 > 16 ? 8 : 4, T1 = 6;
    const tsr_ops *ops = tsr_ops_cpu();
    tsr_kv_cache kq, kf;
    assert_int_equal(tsr_kv_init(&kq, ops, 1, nkv, d, page, 16, mode), TSR_OK);
    assert_int_equal(tsr_kv_init(&kf, ops, 1, nkv, d, page, 16, TSR_F32), TSR_OK);
    int32_t tables[2][4] = {{9, 2, 14, 5}, {0, 11, 0, 0}};
    const int len[2] = {T0, T1};
    float *k = malloc((size_t)T0 * nkv * d * sizeof(float)), *v = malloc((size_t)T0 * nkv * d * sizeof(float));
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < len[s] * nkv * d; i++) k[i] = 2 * frand(), v[i] = frand();
        /* sequence 0 in two steps, sequence 1 in one */
        if (s == 0) {
            store(&kq, tables[0], 0, T0 - 3, k, v);
            store(&kq, tables[0], T0 - 3, 3, k + (T0 - 3) * nkv * d, v + (T0 - 3) * nkv * d);
        } else {
            store(&kq, tables[1], 0, T1, k, v);
        }
        /* the FP32 cache holds the dequantized vectors */
        for (int t = 0; t < len[s]; t++) {
            tsr_kv_read(&kq, 0, tables[s], t, k + (size_t)t * nkv * d, v + (size_t)t * nkv * d);
            store(&kf, tables[s], t, 1, k + (size_t)t * nkv * d, v + (size_t)t * nkv * d);
        }
    }
    const int n0 = 3, rows = n0 + T1;
    const size_t n = (size_t)rows * nh * d;
    float *q = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) q[i] = 2 * frand(), got[i] = NAN;
    int32_t row_seq[9], positions[9], seq_row0[] = {0, n0, rows};
    for (int r = 0; r < rows; r++) {
        row_seq[r] = r < n0 ? 0 : 1;
        positions[r] = r < n0 ? T0 - n0 + r : r - n0;
    }
    tsr_batch_layout b = {2, rows, 4, T0 - 1, row_seq, positions, seq_row0, &tables[0][0], NULL, NULL, 0, NULL, NULL};
    tsr_attn_args a = {nh, nkv, d, 1.0f / sqrtf((float)d), window, 0, NULL};
    ops->attention(&b, &a, &kq, q, got);
    ops->attention(&b, &a, &kf, q, want);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= 2e-5))
            fail_msg("%s d%d window %d: element %zu %g vs %g", tsr_kv_dtype_name(mode), d, window, i, got[i], want[i]);
        if (e > worst) worst = e;
    }
    print_message("  %s d%d window %d: max |quantized - dequantized FP32| %.2e\n", tsr_kv_dtype_name(mode), d, window,
                  worst);
    free(k), free(v), free(q), free(got), free(want);
    tsr_kv_free(&kq);
    tsr_kv_free(&kf);
}

static void test_attention_matches_dequantized(void **state)
{
    (void)state;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        check_attention(modes[mi], 64, 0, 13);
        check_attention(modes[mi], 128, 5, 13);
        check_attention(modes[mi], 256, 0, 13);
        check_attention(modes[mi], 64, 0, 29);
        check_attention(modes[mi], 192, 11, 31);
    }
}

/* Right after its kv_store, a call attends to its own rows exactly (fp16) and to earlier positions through their
 * codes: two sequences, each with a cached past and a new chunk in one call (as the forward pass does), against
 * an FP32 cache holding dequantized past and fp16-rounded chunk values. A different layout, or another layer,
 * finds nothing staged. */
static void check_own_chunk(tsr_dtype mode, int d, int window)
{
    const int nh = 4, nkv = 2, page = 4, past[2] = {7, 3}, n_new[2] = {5, 1}, rows = 6;
    const tsr_ops *ops = tsr_ops_cpu();
    tsr_kv_cache kq, kf;
    assert_int_equal(tsr_kv_init(&kq, ops, 2, nkv, d, page, 16, mode), TSR_OK);
    assert_int_equal(tsr_kv_init(&kf, ops, 2, nkv, d, page, 16, TSR_F32), TSR_OK);
    int32_t tables[2][4] = {{9, 2, 14, 5}, {0, 11, 3, 0}};
    const size_t w = (size_t)nkv * d;
    float *k = malloc(16 * w * sizeof(float)), *v = malloc(16 * w * sizeof(float));
    float *nk = malloc(rows * w * sizeof(float)), *nv = malloc(rows * w * sizeof(float));
    /* the past of each sequence, stored earlier (layer 1 of kq) */
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < past[s] * w; i++) k[i] = 2 * frand(), v[i] = frand();
        int32_t row_seq[16] = {0}, positions[16], seq_row0[] = {0, past[s]};
        for (int i = 0; i < past[s]; i++) positions[i] = i;
        tsr_batch_layout bp = {1, past[s], 4, past[s] - 1, row_seq, positions, seq_row0, tables[s], NULL, NULL,
                               0, NULL, NULL};
        ops->kv_store(&bp, &kq, 1, k, v);
        for (int t = 0; t < past[s]; t++) {
            tsr_kv_read(&kq, 1, tables[s], t, k + t * w, v + t * w);
            store(&kf, tables[s], t, 1, k + t * w, v + t * w);
        }
    }
    /* the new chunks of both sequences in one call */
    int32_t row_seq[6], positions[6], seq_row0[] = {0, n_new[0], rows}, flat[2][4];
    memcpy(flat, tables, sizeof flat);
    for (int r = 0; r < rows; r++) {
        row_seq[r] = r < n_new[0] ? 0 : 1;
        positions[r] = r < n_new[0] ? past[0] + r : past[1] + r - n_new[0];
    }
    tsr_batch_layout b = {2, rows, 4, past[0] + n_new[0] - 1, row_seq, positions, seq_row0, &flat[0][0], NULL, NULL,
                          0, NULL, NULL};
    for (size_t i = 0; i < rows * w; i++) nk[i] = 2 * frand(), nv[i] = frand();
    ops->kv_store(&b, &kq, 1, nk, nv);
    for (int r = 0; r < rows; r++) {
        float hk[512], hv[512];
        for (size_t i = 0; i < w; i++) hk[i] = tsr_round_half(nk[r * w + i]), hv[i] = tsr_round_half(nv[r * w + i]);
        store(&kf, tables[row_seq[r]], positions[r], 1, hk, hv);
    }
    const size_t n = (size_t)rows * nh * d;
    float *q = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) q[i] = 2 * frand();
    tsr_attn_args a = {nh, nkv, d, 1.0f / sqrtf((float)d), window, 1, NULL}, a0 = a;
    ops->attention(&b, &a, &kq, q, got);
    a0.layer = 0;
    ops->attention(&b, &a0, &kf, q, want);
    for (size_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= 2e-5f))
            fail_msg("%s d%d: own chunk exact, element %zu %g vs %g", tsr_kv_dtype_name(mode), d, i, got[i], want[i]);
    /* the same query read entirely through the codes differs (the chunk's quantization error shows) */
    for (int r = 0; r < rows; r++) {
        float dk[512], dv[512];
        tsr_kv_read(&kq, 1, tables[row_seq[r]], positions[r], dk, dv);
        store(&kf, tables[row_seq[r]], positions[r], 1, dk, dv);
    }
    ops->attention(&b, &a0, &kf, q, want);
    double diff = 0;
    for (size_t i = 0; i < n; i++) diff = fmax(diff, fabs((double)got[i] - want[i]));
    assert_true(diff > 1e-3);
    /* another layer (0: never stored) or a layout whose rows do not line up with the stored ones reads codes only */
    float *got2 = malloc(n * sizeof(float));
    tsr_kv_cache kz;
    assert_int_equal(tsr_kv_init(&kz, ops, 2, nkv, d, page, 16, TSR_F32), TSR_OK);
    ops->attention(&b, &a0, &kq, q, got2);
    ops->attention(&b, &a0, &kz, q, want); /* layer 0 of kq is all zero codes: attention gives zeros */
    for (size_t i = 0; i < n; i++) assert_true(got2[i] == 0.0f && want[i] == 0.0f);
    int32_t seq_row0_b[] = {0, 1, 1 + n_new[1]}, row_seq_b[2] = {0, 1}, pos_b[2] = {past[0] + n_new[0] - 1, past[1]};
    tsr_batch_layout b2 = {2, 2, 4, past[0] + n_new[0] - 1, row_seq_b, pos_b, seq_row0_b, &flat[0][0], NULL, NULL,
                           0, NULL, NULL};
    ops->attention(&b2, &a, &kq, q, got2); /* row 0 = sequence 0's last new token, now alone in its "chunk" */
    ops->attention(&b2, &a0, &kf, q, want); /* kf now holds dequantized values everywhere */
    for (size_t i = 0; i < (size_t)2 * nh * d; i++)
        if (!(fabsf(got2[i] - want[i]) <= 2e-5f))
            fail_msg("%s d%d: other layout, element %zu %g vs %g", tsr_kv_dtype_name(mode), d, i, got2[i], want[i]);
    free(k), free(v), free(nk), free(nv), free(q), free(got), free(got2), free(want);
    tsr_kv_free(&kq);
    tsr_kv_free(&kf);
    tsr_kv_free(&kz);
}

static void test_attention_own_chunk_exact(void **state)
{
    (void)state;
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++) {
        check_own_chunk(modes[mi], 64, 0);
        check_own_chunk(modes[mi], 128, 4);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotate_matches_matrix),     cmocka_unit_test(test_random_against_reference),
        cmocka_unit_test(test_hand_made_codes),           cmocka_unit_test(test_sizes_and_refusals),
        cmocka_unit_test(test_store_is_per_token),        cmocka_unit_test(test_attention_matches_dequantized),
        cmocka_unit_test(test_attention_own_chunk_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
