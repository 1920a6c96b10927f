/* Attention over the paged KV cache on the CPU, and the K/V store that fills it.
 *
 * One work item is one (query row, head) pair (fp16 and fp32 caches: one (query row, KV head), its query heads
 * together). Each walks the cached positions its row may see through its
 * sequence's page table (causal, and within the sliding window if any), computing scores against the keys and
 * accumulating values with an online softmax (running maximum and sum), so no score buffer of context length is
 * needed. fp32 throughout.
 *
 * Quantized caches (Q4/Q6/Q8, runtime/kv_cache.h) are read in the rotated domain: a cached head vector is
 * k = R(k~)/32 with k~[e] = (code_e - m)·scale and R the per-chunk Hadamard transform, which is symmetric, so
 * q·k = (R(q)/32)·k~ and sum_t w_t·v_t = R(sum_t w_t·v~_t)/32. Each item rotates its query once, decodes codes
 * times scales on every load, and rotates its output once at the end: the same result as attending over the
 * dequantized vectors, without rebuilding them. Positions the preceding kv_store staged (this call's own rows,
 * runtime/kv_cache.h) are read exactly from the staging area into a second, plain-domain accumulator, as ExLlamaV2
 * lets a chunk attend to its own fp16 K/V. kv_store quantizes each (token, head) vector on its own. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_vec.h"
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
        tsr_halves_to_floats((const uint16_t *)base + off, d, dst);
    }
}

/* acc += w · v over d elements. */
static inline void axpy_row(float w, const float *v, float *acc, int d)
{
    int i = 0;
    for (; i + VF <= d; i += VF) vf_store(acc + i, vf_load(acc + i) + w * vf_load(v + i));
    for (; i < d; i++) acc[i] += w * v[i];
}

/* fp16 and fp32 caches. One work item is one (query row, KV head): the query heads that share the KV head (up to
 * ATTN_HEADS at a time) walk its cached positions together, ATTN_BT at a time, so each key and value row is read and
 * converted once for all of them; each head then takes the block's scores, its running maximum once per block, and
 * the block's weights through a vector exp (cpu_vec.h vf_exp). A 1B model with 4 query heads per KV head at 2048
 * positions, 2 cores: batch 1 decode 12.7 -> 13.7 tok/s by the grouping alone, -> 14.9-15.7 with the blocks;
 * prefill 33 -> 39 -> 42-43 (stop 45). Each head's arithmetic is what it would be alone. */
#define ATTN_HEADS 8
#define ATTN_BT    16 /* positions per block: a multiple of VF */
static void attn_range(void *ctx, int begin, int end)
{
    const attn_job *job = ctx;
    const tsr_batch_layout *b = job->b;
    const tsr_attn_args *a = job->a;
    const tsr_kv_cache *kv = job->kv;
    const int d = a->head_dim, group = a->n_heads / a->n_kv_heads;
    const int f32 = kv->dtype == TSR_F32;
    const void *kbase = kv->k[a->layer], *vbase = kv->v[a->layer];
    static _Thread_local float acc[ATTN_HEADS][MAX_HEAD_DIM], kt[ATTN_BT][MAX_HEAD_DIM], vt[ATTN_BT][MAX_HEAD_DIM];
    for (int item = begin; item < end; item++) {
        const int row = item / a->n_kv_heads, kvh = item % a->n_kv_heads;
        const int32_t *table = b->page_tables + (size_t)b->row_seq[row] * b->max_pages;
        const int p = b->positions[row];
        const int lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += ATTN_HEADS) {
            const int hn = (kvh + 1) * group - h0 < ATTN_HEADS ? (kvh + 1) * group - h0 : ATTN_HEADS;
            const float *qr = job->q + ((size_t)row * a->n_heads + h0) * d; /* head h0 + j at qr + j · d */
            float mx[ATTN_HEADS], sum[ATTN_HEADS];
            for (int j = 0; j < hn; j++) {
                mx[j] = -INFINITY, sum[j] = 0.0f;
                for (int i = 0; i < d; i++) acc[j][i] = 0.0f;
            }
            for (int t0 = lo; t0 <= p; t0 += ATTN_BT) {
                const int nt = p - t0 + 1 < ATTN_BT ? p - t0 + 1 : ATTN_BT;
                for (int u = 0; u < nt; u++) {
                    const size_t off = tsr_kv_slot_offset(kv, table, t0 + u) + (size_t)kvh * d;
                    load_row(kbase, off, d, f32, kt[u]);
                    load_row(vbase, off, d, f32, vt[u]);
                }
                for (int j = 0; j < hn; j++) {
                    float sc[ATTN_BT], w[ATTN_BT], bm = -INFINITY;
                    for (int u = 0; u < nt; u++) {
                        sc[u] = vf_dot(qr + (size_t)j * d, kt[u], d) * a->scale;
                        bm = sc[u] > bm ? sc[u] : bm;
                    }
                    if (bm > mx[j]) {
                        const float r = expf(mx[j] - bm);
                        sum[j] *= r;
                        for (int k = 0; k < d; k++) acc[j][k] *= r;
                        mx[j] = bm;
                    }
                    for (int u = nt; u < ATTN_BT; u++) sc[u] = mx[j];
                    for (int u = 0; u < ATTN_BT; u += VF) vf_store(w + u, vf_exp(vf_load(sc + u) - mx[j]));
                    for (int u = 0; u < nt; u++) {
                        sum[j] += w[u];
                        axpy_row(w[u], vt[u], acc[j], d);
                    }
                }
            }
            for (int j = 0; j < hn; j++) {
                float *o = job->out + ((size_t)row * a->n_heads + h0 + j) * d;
                const float inv = sum[j] > 0 ? 1.0f / sum[j] : 0.0f;
                for (int k = 0; k < d; k++) o[k] = acc[j][k] * inv;
            }
        }
    }
}

/* ---- quantized caches ---- */

/* score = sum_i qr[i]·(code_i - m)·scale_g, with qsum[g] = sum of qr over group g (so the offset m is applied
 * once per group). */
static inline float q_dot(const float *qr, const float *qsum, const uint8_t *codes, const uint16_t *scales, int d,
                          int bits)
{
    float score = 0.0f;
    for (int g = 0; g < d / TSR_KV_QGROUP; g++) {
        const float *x = qr + g * TSR_KV_QGROUP;
        float dot = 0.0f;
        if (bits == 4) {
            const uint8_t *c = codes + g * TSR_KV_QGROUP / 2;
            for (int i = 0; i < TSR_KV_QGROUP / 2; i++)
                dot += x[2 * i] * (float)(c[i] & 15) + x[2 * i + 1] * (float)(c[i] >> 4);
            score += tsr_half_to_float(scales[g]) * (dot - 8.0f * qsum[g]);
        } else {
            const uint8_t *c = codes + g * TSR_KV_QGROUP;
            for (int i = 0; i < TSR_KV_QGROUP; i++) dot += x[i] * (float)c[i];
            score += tsr_half_to_float(scales[g]) * (dot - 128.0f * qsum[g]);
        }
    }
    return score;
}

/* acc[i] += w·(code_i - m)·scale_g */
static inline void q_axpy(float w, const uint8_t *codes, const uint16_t *scales, int d, int bits, float *acc)
{
    for (int g = 0; g < d / TSR_KV_QGROUP; g++) {
        const float ws = w * tsr_half_to_float(scales[g]);
        float *a = acc + g * TSR_KV_QGROUP;
        if (bits == 4) {
            const uint8_t *c = codes + g * TSR_KV_QGROUP / 2;
            for (int i = 0; i < TSR_KV_QGROUP / 2; i++) {
                a[2 * i] += ws * (float)((c[i] & 15) - 8);
                a[2 * i + 1] += ws * (float)((c[i] >> 4) - 8);
            }
        } else {
            const uint8_t *c = codes + g * TSR_KV_QGROUP;
            for (int i = 0; i < TSR_KV_QGROUP; i++) a[i] += ws * (float)(c[i] - 128);
        }
    }
}

/* The staged fp16 K/V row for position t of the row's own chunk (r0, p0: the chunk's first row and position), or
 * -1 when position t is not staged for this layer and slot. */
static inline long staged_row(const tsr_kv_cache *kv, int layer, int r0, int p0, int t, size_t slot_off)
{
    const long fr = (long)r0 + (t - p0), staged = (long)kv->stage_key[kv->stage_rows];
    const int64_t slot = (int64_t)(slot_off / ((size_t)kv->n_kv_heads * kv->head_dim));
    return fr < staged && kv->stage_key[fr] == tsr_kv_stage_key(layer, slot) ? fr : -1;
}

static void attn_range_q(void *ctx, int begin, int end)
{
    const attn_job *job = ctx;
    const tsr_batch_layout *b = job->b;
    const tsr_attn_args *a = job->a;
    const tsr_kv_cache *kv = job->kv;
    const int d = a->head_dim, group = a->n_heads / a->n_kv_heads, kb = kv->k_bits, vb = kv->v_bits;
    const uint8_t *kbase = kv->k[a->layer], *vbase = kv->v[a->layer];
    const uint16_t *ksc = kv->k_scale[a->layer], *vsc = kv->v_scale[a->layer];
    /* acc: rotated-domain values (codes), acc_x: exact values (staged rows) */
    float acc[MAX_HEAD_DIM], acc_x[MAX_HEAD_DIM], qr[MAX_HEAD_DIM], qsum[MAX_HEAD_DIM / TSR_KV_QGROUP];
    float kf[MAX_HEAD_DIM], vrow[MAX_HEAD_DIM];
    for (int item = begin; item < end; item++) {
        const int row = item / a->n_heads, h = item % a->n_heads, kvh = h / group;
        const int32_t *table = b->page_tables + (size_t)b->row_seq[row] * b->max_pages;
        const float *qx = job->q + ((size_t)row * a->n_heads + h) * d;
        float *o = job->out + ((size_t)row * a->n_heads + h) * d;
        const int p = b->positions[row], r0 = b->seq_row0[b->row_seq[row]], p0 = b->positions[r0];
        const int lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        /* the query in the keys' rotated domain, with the 1/32 of the inverse rotation and the score scale */
        memcpy(qr, qx, (size_t)d * sizeof(float));
        tsr_kv_rotate(qr, d);
        for (int i = 0; i < d; i++) qr[i] *= a->scale * (1.0f / 32.0f);
        for (int g = 0; g < d / TSR_KV_QGROUP; g++) {
            qsum[g] = 0.0f;
            for (int i = 0; i < TSR_KV_QGROUP; i++) qsum[g] += qr[g * TSR_KV_QGROUP + i];
        }
        float mx = -INFINITY, sum = 0.0f;
        for (int i = 0; i < d; i++) acc[i] = acc_x[i] = 0.0f;
        for (int t = lo; t <= p; t++) {
            const size_t slot_off = tsr_kv_slot_offset(kv, table, t), off = slot_off + (size_t)kvh * d;
            const long fr = t >= p0 ? staged_row(kv, a->layer, r0, p0, t, slot_off) : -1;
            float score;
            if (fr >= 0) {
                const size_t so = ((size_t)fr * kv->n_kv_heads + kvh) * d;
                tsr_halves_to_floats(kv->stage_k + so, d, kf);
                tsr_halves_to_floats(kv->stage_v + so, d, vrow);
                score = vf_dot(qx, kf, d) * a->scale;
            } else {
                score = q_dot(qr, qsum, kbase + off * kb / 8, ksc + off / TSR_KV_QGROUP, d, kb);
            }
            if (score > mx) {
                const float r = expf(mx - score);
                sum *= r;
                for (int k = 0; k < d; k++) acc[k] *= r, acc_x[k] *= r;
                mx = score;
            }
            const float w = expf(score - mx);
            sum += w;
            if (fr >= 0)
                axpy_row(w, vrow, acc_x, d);
            else
                q_axpy(w, vbase + off * vb / 8, vsc + off / TSR_KV_QGROUP, d, vb, acc);
        }
        /* back from the values' rotated domain */
        tsr_kv_rotate(acc, d);
        const float inv = sum > 0 ? 1.0f / sum : 0.0f;
        for (int k = 0; k < d; k++) o[k] = (acc[k] * (1.0f / 32.0f) + acc_x[k]) * inv;
    }
}

void tsr_cpu_attention(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                       float *out)
{
    attn_job job = {b, a, kv, q, out};
    if (tsr_kv_is_quant(kv->dtype))
        tsr_parallel_for(b->n_rows * a->n_heads, attn_range_q, &job);
    else
        tsr_parallel_for(b->n_rows * a->n_kv_heads, attn_range, &job);
}

void tsr_cpu_kv_store(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v)
{
    const size_t width = (size_t)kv->n_kv_heads * kv->head_dim;
    if (tsr_kv_is_quant(kv->dtype)) kv->stage_key[kv->stage_rows] = b->n_rows < kv->stage_rows ? b->n_rows : kv->stage_rows;
    for (int t = 0; t < b->n_rows; t++) {
        const int32_t *table = b->page_tables + (size_t)b->row_seq[t] * b->max_pages;
        const size_t off = tsr_kv_slot_offset(kv, table, b->positions[t]);
        const float *ks = k + (size_t)t * width, *vs = v + (size_t)t * width;
        if (tsr_kv_is_quant(kv->dtype)) {
            /* each (token, head) vector quantized on its own: no other token's codes change */
            const int d = kv->head_dim;
            if (t < kv->stage_rows) {
                /* the exact (fp16) row for this call's attention */
                for (size_t i = 0; i < width; i++) {
                    kv->stage_k[(size_t)t * width + i] = tsr_float_to_half(ks[i]);
                    kv->stage_v[(size_t)t * width + i] = tsr_float_to_half(vs[i]);
                }
                kv->stage_key[t] = tsr_kv_stage_key(layer, (int64_t)(off / width));
            }
            for (int h = 0; h < kv->n_kv_heads; h++) {
                const size_t e = off + (size_t)h * d;
                tsr_kv_quantize(ks + (size_t)h * d, d, kv->k_bits, (uint8_t *)kv->k[layer] + e * kv->k_bits / 8,
                                kv->k_scale[layer] + e / TSR_KV_QGROUP);
                tsr_kv_quantize(vs + (size_t)h * d, d, kv->v_bits, (uint8_t *)kv->v[layer] + e * kv->v_bits / 8,
                                kv->v_scale[layer] + e / TSR_KV_QGROUP);
            }
            continue;
        }
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
