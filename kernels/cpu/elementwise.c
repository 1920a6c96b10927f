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
        for (int k = 0; k < dim; k++)
            out[(size_t)i * dim + k] = tsr_dense_get(table->dtype, table->data, base + (size_t)k);
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

/* Floats as integers in the same order, -0 below +0 (the sampler's order for top-k). */
static int32_t order_key(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (int32_t)(u ^ ((uint32_t)((int32_t)u >> 31) & 0x7FFFFFFFu));
}

void tsr_cpu_top_rows(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals,
                      float *z)
{
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * n;
        int32_t *id = ids + (size_t)r * k;
        float *v = vals + (size_t)r * k;
        int have = 0;
        for (int i = 0; i < n; i++) { /* insertion into the sorted best-so-far; increasing i keeps ties in order */
            if (row[i] != row[i]) continue;
            const int32_t key = order_key(row[i]);
            if (have == k && key <= order_key(v[k - 1])) continue;
            int j = have < k ? have++ : k - 1;
            for (; j > 0 && order_key(v[j - 1]) < key; j--) {
                v[j] = v[j - 1];
                id[j] = id[j - 1];
            }
            v[j] = row[i];
            id[j] = i;
        }
        for (int j = have; j < k; j++) {
            id[j] = -1;
            v[j] = NAN;
        }
        double sum = 0;
        if (have > 0 && isfinite(v[0]))
            for (int i = 0; i < n; i++)
                if (row[i] == row[i]) sum += exp((double)(row[i] - v[0]) * inv_temp[r]);
        z[r] = (float)sum;
    }
}

void tsr_cpu_argmax_rows(const float *x, int rows, int n, int32_t *ids, float *vals)
{
    for (int r = 0; r < rows; r++) {
        const float *row = x + (size_t)r * n;
        ids[r] = tsr_argmax(row, n); /* 0 when the row is all NaN, whose value is then NaN */
        vals[r] = row[ids[r]];
    }
}
