/* Attention over the paged KV cache on the CPU, and the K/V store that fills it.
 *
 * One work item is one (query row, KV head), its query heads together. Each walks the cached positions its row may
 * see through its sequence's page table (causal, and within the sliding window if any), a block of positions at a
 * time, computing scores against the keys and accumulating values with an online softmax (running maximum and sum),
 * so no score buffer of context length is needed. fp32 throughout. Quantized caches (Q4/Q6/Q8) are read in their
 * rotated domain, through the same blocks (see attn_items). kv_store writes this call's rows, quantizing each
 * (token, head) vector on its own in the quantized modes, after staging the exact rows for this call's attention. */
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_vec.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/half.h"

#include <math.h>
#include <string.h>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

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

/* A walk over one sequence's cached positions in order, for one KV head: the element offset of each position's row
 * without a division per position (page and slot within it advanced by counting). */
typedef struct {
    const int32_t *table;
    size_t page_elems, slot_elems, head_off; /* elements per page, per slot; the head's offset within a slot */
    int page_size, page, slot;               /* the next position's page (index into table) and slot in it */
} kv_walk;

static inline kv_walk kv_walk_from(const tsr_kv_cache *kv, const int32_t *table, int t, int kvh)
{
    const size_t slot_elems = (size_t)kv->n_kv_heads * kv->head_dim;
    return (kv_walk){table, slot_elems * kv->page_size, slot_elems, (size_t)kvh * kv->head_dim, kv->page_size,
                     t / kv->page_size, t % kv->page_size};
}

/* The next position's row offset; the walk moves on by one position. */
static inline size_t kv_walk_next(kv_walk *w)
{
    const size_t off = (size_t)w->table[w->page] * w->page_elems + (size_t)w->slot * w->slot_elems + w->head_off;
    if (++w->slot == w->page_size) w->slot = 0, w->page++;
    return off;
}

/* The keys' and values' rows of a block, fp32, one per position. */
typedef float block_rows[MAX_HEAD_DIM];

/* Lane u of the result: q · k[u] over d elements, for VF rows k[0 .. VF-1]: each row's products in a vector sum,
 * then the VF sums' lanes added by one transposed sum (cpu_vec.h vf_sum_each). */
static inline __attribute__((always_inline)) vf dot_rows(const float *q, const block_rows *k, int d)
{
    vf part[VF];
    for (int u = 0; u < VF; u++) {
        vf s0 = {0}, s1 = {0};
        int i = 0;
        for (; i + 2 * VF <= d; i += 2 * VF) {
            s0 += vf_load(q + i) * vf_load(k[u] + i);
            s1 += vf_load(q + i + VF) * vf_load(k[u] + i + VF);
        }
        for (; i + VF <= d; i += VF) s0 += vf_load(q + i) * vf_load(k[u] + i);
        for (; i < d; i++) s1[0] += q[i] * k[u][i];
        part[u] = s0 + s1;
    }
    return vf_sum_each(part);
}

/* acc += sum over u < n of w[u] · v[u], d elements: the accumulator held in registers 4 · VF elements at a time,
 * even and odd positions in separate sums so that the multiply-adds' latency does not bound it. */
static inline __attribute__((always_inline)) void axpy_rows(const float *w, const block_rows *v, int n, float *acc,
                                                            int d)
{
    int i = 0;
    for (; i + 4 * VF <= d; i += 4 * VF) {
        vf a[4], b[4] = {{0}};
        for (int c = 0; c < 4; c++) a[c] = vf_load(acc + i + c * VF);
        int u = 0;
        for (; u + 2 <= n; u += 2)
            for (int c = 0; c < 4; c++) {
                a[c] += w[u] * vf_load(v[u] + i + c * VF);
                b[c] += w[u + 1] * vf_load(v[u + 1] + i + c * VF);
            }
        if (u < n)
            for (int c = 0; c < 4; c++) a[c] += w[u] * vf_load(v[u] + i + c * VF);
        for (int c = 0; c < 4; c++) vf_store(acc + i + c * VF, a[c] + b[c]);
    }
    for (; i + VF <= d; i += VF) {
        vf a = vf_load(acc + i);
        for (int u = 0; u < n; u++) a += w[u] * vf_load(v[u] + i);
        vf_store(acc + i, a);
    }
    for (; i < d; i++)
        for (int u = 0; u < n; u++) acc[i] += w[u] * v[u][i];
}

/* ---- quantized caches: rows decoded into the rotated domain ---- */

/* VF codes as floats: 8-bit codes c[0 .. VF-1]; 4-bit codes two to a byte (low nibble first), VF/2 bytes. With
 * AVX-512 or AVX2, bytes widen to words in one instruction (the vector extensions' conversion of a byte vector had
 * GCC assemble it piece by piece); 4-bit codes have each byte doubled first, then shifted by 0 or 4 per lane. Only
 * the codes' own bytes are read. */
#if VF == 16 || (VF == 8 && defined(__AVX2__))
#define CODES_WIDEN 1
#endif

static inline vf codes8(const uint8_t *c)
{
#if defined(CODES_WIDEN) && VF == 16
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)c)));
#elif defined(CODES_WIDEN)
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)c)));
#else
    vf r;
    for (int l = 0; l < VF; l++) r[l] = (float)c[l];
    return r;
#endif
}

static inline vf codes4(const uint8_t *c)
{
#if defined(CODES_WIDEN)
    __m128i x;
#if VF == 16
    x = _mm_loadl_epi64((const __m128i *)c); /* 8 bytes */
#else
    int32_t four;
    memcpy(&four, c, sizeof four);
    x = _mm_cvtsi32_si128(four);
#endif
    x = _mm_unpacklo_epi8(x, x); /* each byte twice */
#if VF == 16
    const vi w = (vi)_mm512_cvtepu8_epi32(x);
#else
    const vi w = (vi)_mm256_cvtepu8_epi32(x);
#endif
    return __builtin_convertvector((w >> ((vi_lanes() & 1) * 4)) & 15, vf);
#else
    vf r;
    for (int l = 0; l < VF; l++) r[l] = (float)(c[l / 2] >> 4 * (l & 1) & 15);
    return r;
#endif
}

/* A cached row in the rotated domain: k~[e] = (code_e - m)·scale of e's group (exact in fp32). */
static inline __attribute__((always_inline)) void dequant_row(const uint8_t *codes, const uint16_t *scales, int d,
                                                              int bits, float *dst)
{
    for (int g = 0; g < d / TSR_KV_QGROUP; g++) {
        const vf sc = (vf){0} + tsr_half_to_float(scales[g]);
        float *o = dst + g * TSR_KV_QGROUP;
        for (int i = 0; i < TSR_KV_QGROUP; i += VF) {
            const vf c = bits == 4 ? codes4(codes + (g * TSR_KV_QGROUP + i) / 2) - 8.0f
                                   : codes8(codes + g * TSR_KV_QGROUP + i) - 128.0f;
            vf_store(o + i, c * sc);
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

/* One position's key and value rows of a quantized cache: for a position this call's kv_store staged, its exact
 * fp16 rows (returns 1); else the rows decoded from the codes, in the rotated domain (returns 0). */
static inline __attribute__((always_inline)) int load_rows_q(const tsr_kv_cache *kv, int layer, int kvh, int r0, int p0,
                                                             int t, size_t off, size_t slot_off, float *k, float *v)
{
    const int d = kv->head_dim;
    const long fr = t >= p0 ? staged_row(kv, layer, r0, p0, t, slot_off) : -1;
    if (fr >= 0) {
        const size_t so = ((size_t)fr * kv->n_kv_heads + kvh) * d;
        tsr_halves_to_floats(kv->stage_k + so, d, k);
        tsr_halves_to_floats(kv->stage_v + so, d, v);
        return 1;
    }
    dequant_row((const uint8_t *)kv->k[layer] + off * kv->k_bits / 8, kv->k_scale[layer] + off / TSR_KV_QGROUP, d,
                kv->k_bits, k);
    dequant_row((const uint8_t *)kv->v[layer] + off * kv->v_bits / 8, kv->v_scale[layer] + off / TSR_KV_QGROUP, d,
                kv->v_bits, v);
    return 0;
}

/* Lane u of the result: the scores of VF rows, in the rotated domain (against qrot) where bit u of staged is clear
 * and in the plain one (against q) where it is set; each kind of score only computed where some lane needs it. */
static inline __attribute__((always_inline)) vf dot_rows_mixed(const float *q, const float *qrot, const block_rows *k,
                                                               int d, uint32_t staged)
{
    const uint32_t all = (1u << VF) - 1u; /* VF < 32 */
    if (!(staged & all)) return dot_rows(qrot, k, d);
    if ((staged & all) == all) return dot_rows(q, k, d);
    const vi set = (((vi){0} + (int32_t)staged) >> vi_lanes() & 1) != 0;
    return vf_select(set, dot_rows(q, k, d), dot_rows(qrot, k, d));
}

/* ---- the attention ---- */

/* One work item is one (query row, KV head): the query heads that share the KV head (up to ATTN_HEADS at a time)
 * walk its cached positions together, ATTN_BT at a time, so each key and value row is read and converted once for
 * all of them; each head then takes the block's scores VF at a time (dot_rows), its running maximum once per block,
 * the block's weights through a vector exp (cpu_vec.h vf_exp), and adds the block's values with its accumulator in
 * registers (axpy_rows). Each head's arithmetic is what it would be alone.
 *
 * Quantized caches (Q4/Q6/Q8, runtime/kv_cache.h) go through the same blocks in the rotated domain: a cached head
 * vector is k = R(k~)/32 with k~[e] = (code_e - m)·scale and R the per-chunk Hadamard transform, which is symmetric,
 * so q·k = (R(q)/32)·k~ and sum_t w_t·v_t = R(sum_t w_t·v~_t)/32. Each head's query is rotated once, rows are
 * decoded once per block (load_rows_q), and each head's output rotated once at the end: the same result as
 * attending over the dequantized vectors. Positions the preceding kv_store staged (this call's own rows) are read
 * from their exact fp16 rows, as ExLlamaV2 lets a chunk attend to its own fp16 K/V: scored against the plain query
 * and accumulated in a second, plain-domain sum (accx), so that a prefill, whose positions are mostly its own, does
 * not rotate every row it reads.
 *
 * A 1B model (4 query heads per KV head, head size 64) at 2048 positions, 2 cores, the attention of one decode
 * step (16 layers): fp16 12.9 -> 5.8-6.0 ms (transposed score sums, whole-vector conversion stores, the head size
 * unrolled), Q4 25.6 -> 4.7 ms and Q8 22.1 -> 4.2-4.4 ms (one item per KV head instead of per head, codes widened
 * by vectors); BENCHMARKS.md, CPU decode, stop 46. */
#define ATTN_HEADS 8
#define ATTN_BT    16 /* positions per block: a multiple of VF */
static inline __attribute__((always_inline)) void attn_items(const attn_job *job, int begin, int end, const int d,
                                                              const int quant)
{
    const tsr_batch_layout *b = job->b;
    const tsr_attn_args *a = job->a;
    const tsr_kv_cache *kv = job->kv;
    const int group = a->n_heads / a->n_kv_heads;
    const int f32 = kv->dtype == TSR_F32;
    const void *kbase = kv->k[a->layer], *vbase = kv->v[a->layer];
    /* rows past a short block's end keep earlier blocks' (finite or not) values: their lanes are never used */
    static _Thread_local _Alignas(64) float acc[ATTN_HEADS][MAX_HEAD_DIM], qrot[ATTN_HEADS][MAX_HEAD_DIM],
        accx[ATTN_HEADS][MAX_HEAD_DIM];
    static _Thread_local _Alignas(64) block_rows kt[ATTN_BT], vt[ATTN_BT];
    const vi lane = vi_lanes();
    for (int item = begin; item < end; item++) {
        const int row = item / a->n_kv_heads, kvh = item % a->n_kv_heads;
        const int32_t *table = b->page_tables + (size_t)b->row_seq[row] * b->max_pages;
        const int p = b->positions[row], r0 = b->seq_row0[b->row_seq[row]], p0 = b->positions[r0];
        const int lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
        for (int h0 = kvh * group; h0 < (kvh + 1) * group; h0 += ATTN_HEADS) {
            const int hn = (kvh + 1) * group - h0 < ATTN_HEADS ? (kvh + 1) * group - h0 : ATTN_HEADS;
            const float *qr = job->q + ((size_t)row * a->n_heads + h0) * d; /* head h0 + j at qr + j · d */
            if (quant)
                /* the queries in the keys' rotated domain, with the 1/32 of the inverse rotation */
                for (int j = 0; j < hn; j++) {
                    for (int i = 0; i < d; i++) qrot[j][i] = qr[(size_t)j * d + i] * (1.0f / 32.0f);
                    tsr_kv_rotate(qrot[j], d);
                }
            float mx[ATTN_HEADS];
            vf sum[ATTN_HEADS];
            for (int j = 0; j < hn; j++) {
                mx[j] = -INFINITY, sum[j] = (vf){0};
                for (int i = 0; i < d; i++) acc[j][i] = 0.0f;
                if (quant)
                    for (int i = 0; i < d; i++) accx[j][i] = 0.0f;
            }
            kv_walk walk = kv_walk_from(kv, table, lo, kvh);
            for (int t0 = lo; t0 <= p; t0 += ATTN_BT) {
                const int nt = p - t0 + 1 < ATTN_BT ? p - t0 + 1 : ATTN_BT;
                uint32_t staged = 0; /* bit u: position t0 + u read from its exact staged rows */
                for (int u = 0; u < nt; u++) {
                    const size_t off = kv_walk_next(&walk);
                    if (quant) {
                        staged |= (uint32_t)load_rows_q(kv, a->layer, kvh, r0, p0, t0 + u, off, off - walk.head_off,
                                                        kt[u], vt[u]) << u;
                    } else {
                        load_row(kbase, off, d, f32, kt[u]);
                        load_row(vbase, off, d, f32, vt[u]);
                    }
                }
                for (int j = 0; j < hn; j++) {
                    const vf none = (vf){0} - INFINITY;
                    vf sc[ATTN_BT / VF], bm = none;
                    for (int g = 0; g * VF < nt; g++) {
                        const vi live = lane < nt - g * VF;
                        const vf dots = quant ? dot_rows_mixed(qr + (size_t)j * d, qrot[j], kt + g * VF, d,
                                                               staged >> (g * VF))
                                              : dot_rows(qr + (size_t)j * d, kt + g * VF, d);
                        sc[g] = vf_select(live, dots * a->scale, none);
                        bm = vf_max(bm, sc[g]);
                    }
                    const float m = vf_max_all(bm);
                    if (m > mx[j]) {
                        const float r = expf(mx[j] - m);
                        sum[j] *= r;
                        for (int k = 0; k < d; k++) acc[j][k] *= r;
                        if (quant)
                            for (int k = 0; k < d; k++) accx[j][k] *= r;
                        mx[j] = m;
                    }
                    float w[ATTN_BT];
                    for (int g = 0; g * VF < nt; g++) {
                        const vf e = vf_select(lane < nt - g * VF, vf_exp(sc[g] - mx[j]), (vf){0});
                        sum[j] += e;
                        vf_store(w + g * VF, e);
                    }
                    if (!staged) {
                        axpy_rows(w, vt, nt, acc[j], d);
                    } else if (staged == (1u << nt) - 1u) {
                        axpy_rows(w, vt, nt, accx[j], d);
                    } else {
                        float wr[ATTN_BT], wx[ATTN_BT];
                        for (int u = 0; u < nt; u++) {
                            const int x = staged >> u & 1;
                            wr[u] = x ? 0.0f : w[u], wx[u] = x ? w[u] : 0.0f;
                        }
                        axpy_rows(wr, vt, nt, acc[j], d);
                        axpy_rows(wx, vt, nt, accx[j], d);
                    }
                }
            }
            for (int j = 0; j < hn; j++) {
                float *o = job->out + ((size_t)row * a->n_heads + h0 + j) * d;
                const float total = vf_sum(sum[j]), inv = total > 0 ? 1.0f / total : 0.0f;
                if (quant) {
                    tsr_kv_rotate(acc[j], d); /* back from the values' rotated domain */
                    for (int k = 0; k < d; k++) o[k] = (acc[j][k] * (1.0f / 32.0f) + accx[j][k]) * inv;
                } else {
                    for (int k = 0; k < d; k++) o[k] = acc[j][k] * inv;
                }
            }
        }
    }
}

/* The usual head sizes get their own copies, with the loops over a row's elements unrolled. */
static void attn_range(void *ctx, int begin, int end)
{
    const attn_job *job = ctx;
    const int quant = tsr_kv_is_quant(job->kv->dtype);
    switch (job->a->head_dim) {
    case 64: quant ? attn_items(job, begin, end, 64, 1) : attn_items(job, begin, end, 64, 0); break;
    case 128: quant ? attn_items(job, begin, end, 128, 1) : attn_items(job, begin, end, 128, 0); break;
    default:
        quant ? attn_items(job, begin, end, job->a->head_dim, 1) : attn_items(job, begin, end, job->a->head_dim, 0);
        break;
    }
}

void tsr_cpu_attention(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                       float *out)
{
    attn_job job = {b, a, kv, q, out};
    tsr_parallel_for(b->n_rows * a->n_kv_heads, attn_range, &job);
}

void tsr_cpu_kv_store(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v)
{
    const size_t width = (size_t)kv->n_kv_heads * kv->head_dim;
    if (tsr_kv_is_quant(kv->dtype))
        kv->stage_key[kv->stage_rows] = b->n_rows < kv->stage_rows ? b->n_rows : kv->stage_rows;
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
