/* Row-wise and elementwise CPU kernels: embedding gather, RMSNorm, rotary embedding, SiLU gate, residual add, the
 * greedy pick of each logits row.
 * fp32 math; norms accumulate their sum of squares in double. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/sampler.h"

#include <math.h>
#include <string.h>

#define MAX_ROT_HALF 512

void tsr_cpu_embed(const tsr_dense *table, const int32_t *ids, int n, float *out)
{
    const int dim = table->cols;
    for (int i = 0; i < n; i++) {
        const size_t base = (size_t)ids[i] * (size_t)dim;
        for (int k = 0; k < dim; k++) out[(size_t)i * dim + k] = tsr_dense_get(table->dtype, table->data, base + (size_t)k);
    }
}

void tsr_cpu_rmsnorm(const float *x, const tsr_dense *w, float eps, int rows, int dim, float *out)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double ss = 0.0;
        for (int k = 0; k < dim; k++) ss += (double)xr[k] * xr[k];
        const float inv = (float)(1.0 / sqrt(ss / dim + eps));
        for (int k = 0; k < dim; k++) o[k] = tsr_dense_get(w->dtype, w->data, (size_t)k) * (xr[k] * inv);
    }
}

void tsr_cpu_rope(const tsr_batch_layout *b, float *x, int n_heads, int head_dim, int rot_dim)
{
    const int half = rot_dim / 2;
    float c[MAX_ROT_HALF], s[MAX_ROT_HALF];
    for (int t = 0; t < b->n_rows; t++) {
        const int seq = b->row_seq[t];
        const float *inv_freq = b->inv_freq + (size_t)seq * half, af = b->attn_factor[seq];
        for (int i = 0; i < half; i++) {
            const float angle = (float)b->positions[t] * inv_freq[i]; /* fp32 product, as HF */
            c[i] = (float)cos((double)angle) * af;
            s[i] = (float)sin((double)angle) * af;
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                const float p = v[i], q = v[i + half];
                v[i] = p * c[i] - q * s[i];
                v[i + half] = q * c[i] + p * s[i];
            }
        }
    }
}

void tsr_cpu_silu_mul(const float *gate, const float *up, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void tsr_cpu_add(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

void tsr_cpu_gather_rows(const float *x, const int32_t *index, int n, int dim, float *out)
{
    for (int i = 0; i < n; i++) memmove(out + (size_t)i * dim, x + (size_t)index[i] * dim, (size_t)dim * sizeof(float));
}

void tsr_cpu_argmax_rows(const float *x, int rows, int n, int32_t *ids, float *vals)
{
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * n;
        ids[r] = tsr_argmax(row, n); /* 0 when the row is all NaN, whose value is then NaN */
        vals[r] = row[ids[r]];
    }
}
