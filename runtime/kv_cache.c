/* Paged KV cache pool and the host reference of the quantized storage format (see kv_cache.h).
 *
 * The quantizer follows EXL2.md §11.3 operation by operation in fp16 arithmetic (each fp32 result rounded to fp16,
 * which is the correctly rounded fp16 result for +, -, ×, ÷ because fp32 carries more than 2·11 + 2 bits), so that
 * fp16 K/V give the codes ExLlamaV2 stores. Dequantization is fp32: the attention kernels never rebuild the fp16
 * vectors, they work in the rotated domain (kernels/cpu/attention.c says how). */
#include "runtime/kv_cache.h"

#include "kernels/ops.h"
#include "runtime/half.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void tsr_kv_mode_bits(tsr_dtype dtype, int *k_bits, int *v_bits)
{
    *k_bits = dtype == TSR_KV_Q4 ? 4 : dtype == TSR_KV_Q6 || dtype == TSR_KV_Q8 ? 8 : 0;
    *v_bits = dtype == TSR_KV_Q4 || dtype == TSR_KV_Q6 ? 4 : dtype == TSR_KV_Q8 ? 8 : 0;
}

const char *tsr_kv_dtype_name(tsr_dtype dtype)
{
    switch (dtype) {
    case TSR_F16: return "f16";
    case TSR_F32: return "f32";
    case TSR_KV_Q4: return "q4";
    case TSR_KV_Q6: return "q6";
    case TSR_KV_Q8: return "q8";
    default: return "?";
    }
}

size_t tsr_kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, tsr_dtype dtype)
{
    const size_t heads = (size_t)n_layers * (size_t)n_kv_heads, d = (size_t)head_dim;
    if (!tsr_kv_is_quant(dtype)) return 2 * heads * d * tsr_dtype_size(dtype);
    int kb, vb;
    tsr_kv_mode_bits(dtype, &kb, &vb);
    const size_t scales = (d + TSR_KV_QGROUP - 1) / TSR_KV_QGROUP * sizeof(uint16_t);
    return heads * (d * (size_t)kb / 8 + scales + d * (size_t)vb / 8 + scales);
}

long tsr_kv_expand_positions(int max_tokens, long max_context, int page_size)
{
    const long rows = (long)TSR_KV_EXPAND_ROWS * (max_tokens > 0 ? max_tokens : 0);
    const long page = page_size > 0 ? page_size : 1;
    const long context = max_context > 0 ? (max_context + page - 1) / page * page : 0;
    return rows > context ? rows : context;
}

size_t tsr_kv_expand_bytes(int n_kv_heads, int head_dim, tsr_dtype dtype, long positions)
{
    if (!tsr_kv_is_quant(dtype) || positions <= 0) return 0;
    return (size_t)positions * (size_t)n_kv_heads * (size_t)head_dim * 2 * sizeof(uint16_t); /* K and V, fp16 */
}

void tsr_kv_free(tsr_kv_cache *kv)
{
    if (!kv) return;
    void **arrays[] = {kv->k, kv->v, (void **)kv->k_scale, (void **)kv->v_scale};
    for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
        for (int l = 0; arrays[a] && l < kv->n_layers; l++)
            if (arrays[a][l]) kv->ops->release(arrays[a][l]);
        free(arrays[a]);
    }
    if (kv->stage_k) kv->ops->release(kv->stage_k);
    if (kv->stage_v) kv->ops->release(kv->stage_v);
    if (kv->stage_key) kv->ops->release(kv->stage_key);
    free(kv->free_list);
    memset(kv, 0, sizeof *kv);
}

tsr_status tsr_kv_init(tsr_kv_cache *kv, const tsr_ops *ops, int n_layers, int n_kv_heads, int head_dim,
                       int page_size, int n_pages, tsr_dtype dtype)
{
    memset(kv, 0, sizeof *kv);
    const int quant = tsr_kv_is_quant(dtype);
    if (dtype != TSR_F16 && dtype != TSR_F32 && !quant)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "KV cache: storage type %s is not supported (F16, F32, Q4, Q6, Q8)",
                        tsr_dtype_name(dtype));
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || page_size <= 0 || n_pages <= 0)
        return tsr_fail(TSR_ERR_ARG, "KV cache: invalid geometry (%d layers, %d heads, dim %d, page %d, %d pages)",
                        n_layers, n_kv_heads, head_dim, page_size, n_pages);
    if (quant && head_dim % TSR_KV_QCHUNK)
        return tsr_fail(TSR_ERR_UNSUPPORTED,
                        "KV cache: the %s mode needs a head dimension divisible by %d (this model's is %d); use f16",
                        tsr_kv_dtype_name(dtype), TSR_KV_QCHUNK, head_dim);
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    kv->page_size = page_size;
    kv->n_pages = n_pages;
    kv->dtype = dtype;
    kv->ops = ops;
    tsr_kv_mode_bits(dtype, &kv->k_bits, &kv->v_bits);
    const size_t per_layer = (size_t)n_pages * (size_t)page_size * (size_t)n_kv_heads * (size_t)head_dim;
    const size_t k_bytes = quant ? per_layer * (size_t)kv->k_bits / 8 : per_layer * tsr_dtype_size(dtype);
    const size_t v_bytes = quant ? per_layer * (size_t)kv->v_bits / 8 : per_layer * tsr_dtype_size(dtype);
    const size_t s_bytes = per_layer / TSR_KV_QGROUP * sizeof(uint16_t);
    kv->k = calloc((size_t)n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)n_layers, sizeof *kv->v);
    kv->free_list = malloc((size_t)n_pages * sizeof *kv->free_list);
    if (!kv->k || !kv->v || !kv->free_list) goto oom;
    if (quant) {
        kv->k_scale = calloc((size_t)n_layers, sizeof *kv->k_scale);
        kv->v_scale = calloc((size_t)n_layers, sizeof *kv->v_scale);
        if (!kv->k_scale || !kv->v_scale) goto oom;
    }
    for (int l = 0; l < n_layers; l++) {
        /* zero-filled: pages never written read as zeros (quantized: scale 0), never as garbage */
        kv->k[l] = ops->alloc(k_bytes);
        kv->v[l] = ops->alloc(v_bytes);
        if (!kv->k[l] || !kv->v[l]) goto oom;
        if (quant) {
            kv->k_scale[l] = ops->alloc(s_bytes);
            kv->v_scale[l] = ops->alloc(s_bytes);
            if (!kv->k_scale[l] || !kv->v_scale[l]) goto oom;
        }
    }
    if (quant) {
        /* zero-filled keys name layer 0, slot 0 but the count ([stage_rows]) is 0: nothing is staged yet */
        const long pool = (long)n_pages * page_size;
        kv->stage_rows = pool < TSR_KV_STAGE_ROWS ? (int)pool : TSR_KV_STAGE_ROWS;
        const size_t row = (size_t)n_kv_heads * (size_t)head_dim * sizeof(uint16_t);
        kv->stage_k = ops->alloc((size_t)kv->stage_rows * row);
        kv->stage_v = ops->alloc((size_t)kv->stage_rows * row);
        kv->stage_key = ops->alloc(((size_t)kv->stage_rows + 1) * sizeof(int64_t));
        if (!kv->stage_k || !kv->stage_v || !kv->stage_key) goto oom;
    }
    for (int i = 0; i < n_pages; i++) kv->free_list[i] = n_pages - 1 - i; /* pop gives page 0 first */
    kv->n_free = n_pages;
    return TSR_OK;
oom:
    tsr_kv_free(kv);
    return tsr_fail(TSR_ERR_NOMEM, "KV cache: cannot allocate %d pages of %d tokens", n_pages, page_size);
}

int32_t tsr_kv_alloc_page(tsr_kv_cache *kv)
{
    if (kv->n_free == 0) return -1;
    return kv->free_list[--kv->n_free];
}

void tsr_kv_release_page(tsr_kv_cache *kv, int32_t page)
{
    if (page >= 0 && page < kv->n_pages && kv->n_free < kv->n_pages) kv->free_list[kv->n_free++] = page;
}

/* ---- quantized format ---- */

void tsr_kv_rotate(float *x, int d)
{
    for (int c = 0; c < d; c += TSR_KV_QCHUNK)
        for (int p = 0; p < 2; p++) {
            float *u = x + c + p; /* u[2j] is element j of this parity's 32-vector */
            for (int s = 1; s < 32; s <<= 1)
                for (int j = 0; j < 32; j++)
                    if (!(j & s)) {
                        const float a = u[2 * j], b = u[2 * (j + s)];
                        u[2 * j] = a + b;
                        u[2 * (j + s)] = a - b;
                    }
        }
}

/* One code: v/amax in fp16, then ·m + m as one fp16 fma, rounded half to even and clamped (m = 8 or 128). */
static inline int quant_code(float v, float amax, int bits)
{
    const float m = bits == 4 ? 8.0f : 128.0f, top = 2.0f * m - 1.0f;
    if (!(amax > 0.0f)) return (int)m; /* all-zero group: any code decodes to 0; store the zero code */
    float y = tsr_round_half(fmaf(tsr_round_half(v / amax), m, m));
    if (!(y >= 0.0f)) y = 0.0f; /* also catches NaN (infinite inputs) */
    if (y > top) y = top;
    return (int)rintf(y);
}

void tsr_kv_quantize(const float *x, int d, int bits, uint8_t *codes, uint16_t *scales)
{
    float r[TSR_KV_QCHUNK];
    for (int c = 0; c < d; c += TSR_KV_QCHUNK) {
        for (int i = 0; i < TSR_KV_QCHUNK; i++) r[i] = tsr_round_half(x[c + i]);
        for (int p = 0; p < 2; p++) {
            float *u = r + p;
            for (int s = 1; s < 32; s <<= 1)
                for (int j = 0; j < 32; j++)
                    if (!(j & s)) {
                        const float a = u[2 * j], b = u[2 * (j + s)];
                        u[2 * j] = tsr_round_half(a + b);
                        u[2 * (j + s)] = tsr_round_half(a - b);
                    }
        }
        for (int g = 0; g < TSR_KV_QCHUNK; g += TSR_KV_QGROUP) {
            const float *v = r + g;
            float amax = 0.0f;
            for (int i = 0; i < TSR_KV_QGROUP; i++) amax = fmaxf(amax, fabsf(v[i]));
            const int e0 = c + g;
            scales[e0 / TSR_KV_QGROUP] = tsr_float_to_half(amax * (bits == 4 ? 0.125f : 1.0f / 128.0f));
            if (bits == 4)
                for (int i = 0; i < TSR_KV_QGROUP; i += 2)
                    codes[(e0 + i) / 2] = (uint8_t)(quant_code(v[i], amax, 4) | quant_code(v[i + 1], amax, 4) << 4);
            else
                for (int i = 0; i < TSR_KV_QGROUP; i++) codes[e0 + i] = (uint8_t)quant_code(v[i], amax, 8);
        }
    }
}

void tsr_kv_dequantize_rotated(const uint8_t *codes, const uint16_t *scales, int d, int bits, float *out)
{
    for (int g = 0; g < d; g += TSR_KV_QGROUP) {
        const float s = tsr_half_to_float(scales[g / TSR_KV_QGROUP]);
        for (int i = g; i < g + TSR_KV_QGROUP; i++) {
            const int q = bits == 4 ? (codes[i / 2] >> (4 * (i & 1))) & 15 : codes[i];
            out[i] = (float)(q - (bits == 4 ? 8 : 128)) * s;
        }
    }
}

void tsr_kv_dequantize(const uint8_t *codes, const uint16_t *scales, int d, int bits, float *out)
{
    tsr_kv_dequantize_rotated(codes, scales, d, bits, out);
    tsr_kv_rotate(out, d);
    for (int i = 0; i < d; i++) out[i] *= 1.0f / 32.0f;
}

/* Copies `bytes` bytes at byte offset off of backend array base to host dst. */
static void fetch(const tsr_kv_cache *kv, const void *base, size_t off, size_t bytes, void *dst)
{
    kv->ops->to_host(dst, (const uint8_t *)base + off, bytes);
}

void tsr_kv_read(const tsr_kv_cache *kv, int layer, const int32_t *page_table, int t, float *k, float *v)
{
    const size_t off = tsr_kv_slot_offset(kv, page_table, t), n = (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
    const int d = kv->head_dim;
    if (kv->dtype == TSR_F32) {
        fetch(kv, kv->k[layer], off * sizeof(float), n * sizeof(float), k);
        fetch(kv, kv->v[layer], off * sizeof(float), n * sizeof(float), v);
        return;
    }
    if (kv->dtype == TSR_F16) {
        uint16_t *h = malloc(n * sizeof *h);
        if (!h) return;
        for (int which = 0; which < 2; which++) {
            fetch(kv, which ? kv->v[layer] : kv->k[layer], off * sizeof *h, n * sizeof *h, h);
            for (size_t i = 0; i < n; i++) (which ? v : k)[i] = tsr_half_to_float(h[i]);
        }
        free(h);
        return;
    }
    uint8_t *codes = malloc(n);
    uint16_t *scales = malloc(n / TSR_KV_QGROUP * sizeof *scales);
    for (int which = 0; codes && scales && which < 2; which++) {
        const int bits = which ? kv->v_bits : kv->k_bits;
        fetch(kv, which ? kv->v[layer] : kv->k[layer], off * (size_t)bits / 8, n * (size_t)bits / 8, codes);
        fetch(kv, which ? kv->v_scale[layer] : kv->k_scale[layer], off / TSR_KV_QGROUP * sizeof *scales,
              n / TSR_KV_QGROUP * sizeof *scales, scales);
        for (int h = 0; h < kv->n_kv_heads; h++)
            tsr_kv_dequantize(codes + (size_t)h * d * bits / 8, scales + (size_t)h * d / TSR_KV_QGROUP, d, bits,
                              (which ? v : k) + (size_t)h * d);
    }
    free(codes);
    free(scales);
}
