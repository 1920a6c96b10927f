/* Attention over the paged FP16 KV cache on the CPU, and the K/V store that fills it.
 *
 * One work item is one (query row, head) pair. Each walks the cached positions its row may see through its
 * sequence's page table (causal, and
 * within the sliding window if any), computing scores against the fp16 keys and accumulating values with an
 * online softmax (running maximum and sum), so no score buffer of context length is needed. fp32 throughout. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/half.h"

#include <math.h>
#include <string.h>

#define MAX_HEAD_DIM 512

typedef struct {
    const tsr_batch_layout *b;
    const tsr_attn_args *a;
    const tsr_kv_cache *kv;
    const float *q;
    float *out;
} attn_job;

/* Reads d cached elements at element offset off as fp32. */
static inline void load_row(const void *base, size_t off, int d, int f32, float *dst)
{
    if (f32) {
        const float *src = (const float *)base + off;
        for (int i = 0; i < d; i++) dst[i] = src[i];
    } else {
        const uint16_t *src = (const uint16_t *)base + off;
        for (int i = 0; i < d; i++) dst[i] = tsr_half_to_float(src[i]);
    }
}

static void attn_range(void *ctx, int begin, int end)
{
    const attn_job *job = ctx;
    const tsr_batch_layout *b = job->b;
    const tsr_attn_args *a = job->a;
    const tsr_kv_cache *kv = job->kv;
    const int d = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int f32 = kv->dtype == TSR_F32;
    const void *kbase = kv->k[a->layer], *vbase = kv->v[a->layer];
    float acc[MAX_HEAD_DIM], kf[MAX_HEAD_DIM], vf[MAX_HEAD_DIM];
    for (int item = begin; item < end; item++) {
        const int row = item / a->n_heads, h = item % a->n_heads, kvh = h / group;
        const int32_t *table = b->page_tables + (size_t)b->row_seq[row] * b->max_pages;
        const float *qr = job->q + ((size_t)row * a->n_heads + h) * d;
        float *o = job->out + ((size_t)row * a->n_heads + h) * d;
        const int p = b->positions[row];
        const int lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        float mx = -INFINITY, sum = 0.0f;
        for (int i = 0; i < d; i++) acc[i] = 0.0f;
        for (int t = lo; t <= p; t++) {
            const size_t off = tsr_kv_slot_offset(kv, table, t) + (size_t)kvh * d;
            load_row(kbase, off, d, f32, kf);
            float lane[8] = {0};
            int i = 0;
            for (; i + 8 <= d; i += 8)
                for (int l = 0; l < 8; l++) lane[l] += qr[i + l] * kf[i + l];
            float score = 0.0f;
            for (; i < d; i++) score += qr[i] * kf[i];
            for (int l = 0; l < 8; l++) score += lane[l];
            score *= a->scale;
            if (score > mx) {
                const float r = expf(mx - score);
                sum *= r;
                for (int k = 0; k < d; k++) acc[k] *= r;
                mx = score;
            }
            const float w = expf(score - mx);
            sum += w;
            load_row(vbase, off, d, f32, vf);
            for (int k = 0; k < d; k++) acc[k] += w * vf[k];
        }
        const float inv = sum > 0 ? 1.0f / sum : 0.0f;
        for (int k = 0; k < d; k++) o[k] = acc[k] * inv;
    }
}

void tsr_cpu_attention(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                       float *out)
{
    attn_job job = {b, a, kv, q, out};
    tsr_parallel_for(b->n_rows * a->n_heads, attn_range, &job);
}

void tsr_cpu_kv_store(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v)
{
    const size_t width = (size_t)kv->n_kv_heads * kv->head_dim;
    for (int t = 0; t < b->n_rows; t++) {
        const int32_t *table = b->page_tables + (size_t)b->row_seq[t] * b->max_pages;
        const size_t off = tsr_kv_slot_offset(kv, table, b->positions[t]);
        const float *ks = k + (size_t)t * width, *vs = v + (size_t)t * width;
        if (kv->dtype == TSR_F32) {
            memcpy((float *)kv->k[layer] + off, ks, width * sizeof(float));
            memcpy((float *)kv->v[layer] + off, vs, width * sizeof(float));
            continue;
        }
        uint16_t *kd = (uint16_t *)kv->k[layer] + off, *vd = (uint16_t *)kv->v[layer] + off;
        for (size_t i = 0; i < width; i++) {
            kd[i] = tsr_float_to_half(ks[i]);
            vd[i] = tsr_float_to_half(vs[i]);
        }
    }
}
