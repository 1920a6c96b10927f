/* Attention over the paged KV cache on the GPU, for decode and prefill rows alike: the general kernels, the
 * dispatch to the tensor-core ones and the merge of split contexts.
 *
 * One warp handles one (row, head, split): the row's visible positions (causal, sliding window) are cut into
 * `n_splits` contiguous ranges so that short batches with long contexts still fill the chip. Each lane holds
 * head_dim/32 consecutive dims of q, of the running output and of each K/V row it reads (coalesced 32-lane
 * reads of one cache row); the fp16/fp32 kernel reads ATTN_UNROLL positions' rows per round before reducing
 * their scores, so loads overlap. Scores are reduced across the warp and folded into an online softmax, so no
 * score matrix is ever materialized. With several splits, a second kernel merges the partial (max, sum, output)
 * triples. KV storage is fp16 or fp32, or one of the quantized modes (runtime/kv_cache.h); math is fp32.
 *
 * Quantized caches are dequantized inside the loads, in the rotated domain (kernels/cpu/attention.c explains the
 * algebra): each warp rotates its query once (a Hadamard butterfly over the warp's slice of shared memory), each
 * K/V load decodes the lane's codes times their group scale, and the output accumulator is rotated back once at
 * the end. Positions whose exact fp16 K/V the preceding kv_store staged (the call's own rows) are read from the
 * staging area instead, into a second accumulator in the plain domain. (The quantized store is kv_store_quant.cu.) */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/kvq_tile.cuh"
#include "kernels/cuda/stage_ahead.cuh"

#include <math.h>
#include <stdlib.h>

__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(float v) { return v; }

/* Positions are split into ranges of at least ATTN_MIN_SPLIT, so a split count sized for the longest row (or,
 * in a CUDA graph, for the longest possible row) leaves the trailing splits of shorter rows empty rather than
 * giving each of them a handful of positions and a partial result to merge. */
#define ATTN_MIN_SPLIT 32
#define ATTN_UNROLL 4
#define ATTN_TARGET_WARPS 16384
#define ATTN_MAX_SPLITS 128

__device__ __forceinline__ void split_range(int lo, int p, int split, int n_splits, int *t0, int *t1)
{
    const int span = p - lo + 1;
    int per = (span + n_splits - 1) / n_splits;
    if (per < ATTN_MIN_SPLIT) per = ATTN_MIN_SPLIT;
    *t0 = lo + split * per;
    *t1 = min(p + 1, *t0 + per);
}

/* A warp's result for its (row, head, split): the normalized output when the context is not split, else the
 * partial (max, sum) and unnormalized output that attn_merge_kernel combines. */
template <int DPL>
__device__ __forceinline__ void store_result(const float *acc, float mx, float sum, size_t item, size_t warp, int lane,
                                             int d, int n_splits, float *out, float2 *part_ml, float *part_acc)
{
    if (n_splits == 1) {
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        float *o = out + item * d + lane * DPL;
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] = acc[i] * inv;
        return;
    }
    if (lane == 0) part_ml[warp] = make_float2(mx, sum);
    float *pa = part_acc + warp * d + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) pa[i] = acc[i];
}

template <int DPL, typename T>
__global__ void attn_kernel(tsr_batch_layout b, tsr_attn_args a, const T *kc, const T *vc, int page_size,
                            const float *q, float *out, float2 *part_ml, float *part_acc, int n_splits)
{
    const int lane = threadIdx.x & 31;
    const size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const size_t items = (size_t)b.n_rows * a.n_heads;
    if (warp >= items * n_splits) return;
    const size_t item = warp / n_splits;
    const int split = (int)(warp % n_splits);
    const int row = (int)(item / a.n_heads), h = (int)(item % a.n_heads);
    const int d = a.head_dim, kvh = h / (a.n_heads / a.n_kv_heads);
    const int p = b.positions[row];
    const int lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    int t0, t1;
    split_range(lo, p, split, n_splits, &t0, &t1);
    const int32_t *table = b.page_tables + (size_t)b.row_seq[row] * b.max_pages;
    const int width = a.n_kv_heads * d;

    float qv[DPL], acc[DPL];
    const float *qr = q + item * d + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qv[i] = qr[i] * a.scale;
        acc[i] = 0.0f;
    }
    float mx = -INFINITY, sum = 0.0f;
    /* ATTN_UNROLL positions per round: their K and V rows are all requested before any score is reduced, so a
     * warp has that many independent loads in flight instead of one dependent chain per position */
    for (int t = t0; t < t1; t += ATTN_UNROLL) {
        float kv_k[ATTN_UNROLL][DPL], kv_v[ATTN_UNROLL][DPL], s[ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const int tt = min(t + u, t1 - 1); /* past the end: re-read the last row, its weight is zeroed below */
            const int page = table[tt / page_size];
            const size_t off = ((size_t)page * page_size + tt % page_size) * width + (size_t)kvh * d + lane * DPL;
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                kv_k[u][i] = to_f(kc[off + i]);
                kv_v[u][i] = to_f(vc[off + i]);
            }
        }
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            s[u] = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) s[u] += qv[i] * kv_k[u][i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; u++) s[u] += __shfl_xor_sync(0xffffffffu, s[u], o);
        float m_new = mx;
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            if (t + u >= t1) s[u] = -INFINITY;
            m_new = fmaxf(m_new, s[u]);
        }
        const float r = __expf(mx - m_new); /* 0 on the first round (mx = -inf) */
        sum *= r;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= r;
        mx = m_new;
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            const float w = __expf(s[u] - mx);
            sum += w;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] += w * kv_v[u][i];
        }
    }
    store_result<DPL>(acc, mx, sum, item, warp, lane, d, n_splits, out, part_ml, part_acc);
}

/* One thread per (item, dim), the splits in order: for up to MERGE_AT_ONCE splits, and where attn_merge_item_kernel
 * below does not serve (head sizes that are not a multiple of 32 or above MERGE_MAX_DPL · 32). The
 * splits' partials are read MERGE_AT_ONCE at a time, every load of a batch issued before any is used; empty
 * splits (sum 0) load nothing and add nothing. With uinv (o's inverse unit permutation; S its staging plan), the
 * value also goes to o's staged activations (stage_ahead_scatter), its place read before the PDL wait, which
 * spares o's GEMV its staging launch (8B at 4.0 bpw: +1-1.5 % at batches 2-8, none at 1). */
#define MERGE_AT_ONCE 8
__global__ void attn_merge_kernel(size_t items, int d, int n_splits, const float2 *part_ml, const float *part_acc,
                                  float *out, const int32_t *uinv, int n_heads,
                                  const __grid_constant__ tsr_stage_ahead S)
{
    tsr_pdl_trigger();
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = i < items * d;
    const size_t item = live ? i / d : 0;
    const int k = (int)(i % d);
    const int place = live && uinv ? uinv[(int)(item % n_heads) * d + k] : -1;
    tsr_pdl_wait();
    if (!live) return;
    const float2 *ml = part_ml + item * n_splits;
    const float *acc_k = part_acc + item * n_splits * d + k;
    float M = -INFINITY;
    for (int s0 = 0; s0 < n_splits; s0 += MERGE_AT_ONCE) {
        float m[MERGE_AT_ONCE];
#pragma unroll
        for (int j = 0; j < MERGE_AT_ONCE; j++)
            m[j] = s0 + j < n_splits ? ml[s0 + j].x : -INFINITY;
#pragma unroll
        for (int j = 0; j < MERGE_AT_ONCE; j++)
            M = fmaxf(M, m[j]);
    }
    float L = 0.0f, acc = 0.0f;
    for (int s0 = 0; s0 < n_splits; s0 += MERGE_AT_ONCE) {
        float2 v[MERGE_AT_ONCE];
        float a[MERGE_AT_ONCE];
#pragma unroll
        for (int j = 0; j < MERGE_AT_ONCE; j++)
            v[j] = s0 + j < n_splits ? ml[s0 + j] : make_float2(-INFINITY, 0.0f);
#pragma unroll
        for (int j = 0; j < MERGE_AT_ONCE; j++)
            a[j] = v[j].y != 0.0f ? acc_k[(size_t)(s0 + j) * d] : 0.0f;
#pragma unroll
        for (int j = 0; j < MERGE_AT_ONCE; j++)
            if (v[j].y != 0.0f) {
                const float f = __expf(v[j].x - M);
                L += v[j].y * f;
                acc += a[j] * f;
            }
    }
    const float y = L > 0.0f ? acc / L : 0.0f;
    out[i] = y;
    if (place >= 0) stage_ahead_scatter(S, place, (int)(item / n_heads), y);
}

/* A block per (row, head) item, the splits spread over its warps. The kernel above walks an item's splits one
 * batch after another in every thread: 8 batches of (max, sum) pairs and 8 of partial outputs for the 64 splits of
 * a batch-1 decode at 8 KV heads, each an L2 round trip, 11 us per layer (ncu, NOTES.md stop 39) against ~2 us of
 * bytes. Here the pairs are read once, a thread per split, and reduced across the block to the common maximum and
 * the total weight; each warp then adds the outputs of every MERGE_WARPS-th split (lane: dims lane + 32 i, all of
 * a warp's loads issued before they are used), and the warps' sums meet in shared memory. Three round trips
 * whatever the split count: at 8 K positions +12 % batch-1 decode on the 8B shape, none lost at 512 (stop 33's
 * block per item, which looped over the splits in each thread, lost 2.6 % there). The additions run in a fixed
 * order (per warp by split, then warp by warp), so the result does not change from run to run; it differs from
 * the kernel above only by rounding. TSR_CUDA_MERGE_ITEM=0 leaves it out. */
#define MERGE_WARPS 8
#define MERGE_MAX_DPL 8 /* head sizes up to 256 */
#define MERGE_UNROLL 4  /* splits per warp whose loads are in flight together */
template <int DPL>
__global__ void __launch_bounds__(MERGE_WARPS * 32)
    attn_merge_item_kernel(int n_splits, const float2 *part_ml, const float *part_acc, float *out,
                           const int32_t *uinv, int n_heads, const __grid_constant__ tsr_stage_ahead S)
{
    constexpr int D = DPL * 32, NT = MERGE_WARPS * 32;
    static_assert(D <= NT, "a thread per output value at the end");
    extern __shared__ float mg_smem[];
    float *fac = mg_smem;                  /* [n_splits] exp(m_s - M), 0 for empty splits */
    float *wsum = fac + n_splits;          /* [MERGE_WARPS][D] */
    float *red = wsum + MERGE_WARPS * D;   /* [MERGE_WARPS] max, then [MERGE_WARPS] weight */
    tsr_pdl_trigger();
    const size_t item = blockIdx.x;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int place = uinv && tid < D ? uinv[(int)(item % n_heads) * D + tid] : -1;
    tsr_pdl_wait();
    const float2 *ml = part_ml + item * n_splits;
    float m = -INFINITY;
    for (int s = tid; s < n_splits; s += NT) {
        const float2 v = ml[s];
        if (v.y != 0.0f) m = fmaxf(m, v.x);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    float M = red[0];
#pragma unroll
    for (int w = 1; w < MERGE_WARPS; w++) M = fmaxf(M, red[w]);
    float l = 0.0f;
    for (int s = tid; s < n_splits; s += NT) {
        const float2 v = ml[s]; /* from L1 */
        const float f = v.y != 0.0f ? __expf(v.x - M) : 0.0f;
        fac[s] = f;
        l += v.y * f;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) red[MERGE_WARPS + warp] = l;
    __syncthreads();

    float acc[DPL] = {};
    const float *pa = part_acc + item * n_splits * D + lane;
    for (int s0 = warp; s0 < n_splits; s0 += MERGE_WARPS * MERGE_UNROLL) {
        float v[MERGE_UNROLL][DPL], f[MERGE_UNROLL];
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; u++) {
            const int s = s0 + u * MERGE_WARPS;
            f[u] = s < n_splits ? fac[s] : 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) v[u][i] = f[u] != 0.0f ? pa[(size_t)s * D + 32 * i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; u++)
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] = fmaf(v[u][i], f[u], acc[i]);
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) wsum[warp * D + lane + 32 * i] = acc[i];
    __syncthreads();
    float L = 0.0f;
#pragma unroll
    for (int w = 0; w < MERGE_WARPS; w++) L += red[MERGE_WARPS + w];
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    if (tid < D) {
        float y = 0.0f;
#pragma unroll
        for (int w = 0; w < MERGE_WARPS; w++) y += wsum[w * D + tid];
        y *= inv;
        out[item * D + tid] = y;
        if (place >= 0) stage_ahead_scatter(S, place, (int)(item / n_heads), y);
    }
}

template <int DPL>
static void merge_item_launch(size_t items, size_t smem, int n_splits, const float2 *part_ml, const float *part_acc,
                              float *out, const int32_t *uinv, int n_heads, const tsr_stage_ahead &plan)
{
    tsr_launch_smem(attn_merge_item_kernel<DPL>, dim3((unsigned)items), dim3(MERGE_WARPS * 32), smem, n_splits,
                    part_ml, part_acc, out, uinv, n_heads, plan);
}

/* ---- quantized caches ---- */

/* In place on a warp's d floats in shared memory: the per-chunk, per-parity 32-point Hadamard transform. */
__device__ __forceinline__ void warp_rotate(float *sm, int d, int lane)
{
    __syncwarp();
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        for (int k = lane; k < d / 2; k += 32) {
            const int c = k >> 5, m = k & 31, p = m & 1, r = m >> 1;
            const int jlo = ((r & ~(s - 1)) << 1) | (r & (s - 1));
            const int lo = c * 64 + 2 * jlo + p, hi = lo + 2 * s;
            const float x = sm[lo], y = sm[hi];
            sm[lo] = x + y;
            sm[hi] = x - y;
        }
        __syncwarp();
    }
}

/* NB bytes at p (aligned to their size when NB is a power of two) */
template <int NB> __device__ __forceinline__ void load_bytes(const uint8_t *p, uint8_t (&o)[NB])
{
    if constexpr (NB == 2) {
        const uint32_t w = *(const uint16_t *)p;
        o[0] = (uint8_t)w, o[1] = (uint8_t)(w >> 8);
    } else if constexpr (NB == 4) {
        const uint32_t w = *(const uint32_t *)p;
#pragma unroll
        for (int i = 0; i < 4; i++) o[i] = (uint8_t)(w >> (8 * i));
    } else if constexpr (NB == 8) {
        const uint2 w = *(const uint2 *)p;
#pragma unroll
        for (int i = 0; i < 4; i++) o[i] = (uint8_t)(w.x >> (8 * i)), o[i + 4] = (uint8_t)(w.y >> (8 * i));
    } else {
#pragma unroll
        for (int i = 0; i < NB; i++) o[i] = p[i];
    }
}

/* The lane's DPL rotated-domain values (code - m)·scale of the head vector at element offset head_off. */
template <int DPL, int BITS>
__device__ __forceinline__ void load_q(const uint8_t *codes, const __half *scales, size_t head_off, int lane,
                                       float (&x)[DPL])
{
    constexpr int NB = DPL * BITS / 8;
    const size_t e = head_off + (size_t)lane * DPL;
    uint8_t b[NB];
    load_bytes<NB>(codes + e * BITS / 8, b);
    const int g0 = (lane * DPL) / 32;
    const float s0 = __half2float(scales[head_off / 32 + g0]);
    const float s1 = __half2float(scales[head_off / 32 + (lane * DPL + DPL - 1) / 32]);
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int q = BITS == 4 ? (b[i / 2] >> (4 * (i & 1))) & 15 : b[i];
        const float sc = (lane * DPL + i) / 32 == g0 ? s0 : s1;
        x[i] = (float)(q - (BITS == 4 ? 8 : 128)) * sc;
    }
}

template <int DPL, int KB, int VB>
__global__ void attn_q_kernel(tsr_batch_layout b, tsr_attn_args a, kvq_view c, int page_size, const float *q,
                              float *out, float2 *part_ml, float *part_acc, int n_splits)
{
    __shared__ float rot[4][256]; /* one head vector per warp of the 128-thread block */
    const int lane = threadIdx.x & 31;
    const size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const size_t items = (size_t)b.n_rows * a.n_heads;
    if (warp >= items * n_splits) return; /* whole warps only: the shuffles and __syncwarp below see full warps */
    float *sm = rot[threadIdx.x >> 5];
    const size_t item = warp / n_splits;
    const int split = (int)(warp % n_splits);
    const int row = (int)(item / a.n_heads), h = (int)(item % a.n_heads);
    const int d = a.head_dim, kvh = h / (a.n_heads / a.n_kv_heads);
    const int p = b.positions[row], r0 = b.seq_row0[b.row_seq[row]], p0 = b.positions[r0];
    const int lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    int t0, t1;
    split_range(lo, p, split, n_splits, &t0, &t1);
    const int32_t *table = b.page_tables + (size_t)b.row_seq[row] * b.max_pages;
    const int width = a.n_kv_heads * d;
    const int64_t staged = c.stage_key[c.stage_rows];

    /* qx: the query (plain domain, for staged rows); qr: rotated, with the inverse rotation's 1/32 */
    float qx[DPL], qr[DPL], acc[DPL], accx[DPL];
    const float *qp = q + item * d + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qx[i] = qp[i] * a.scale;
        sm[lane * DPL + i] = qx[i];
        acc[i] = accx[i] = 0.0f;
    }
    warp_rotate(sm, d, lane);
#pragma unroll
    for (int i = 0; i < DPL; i++) qr[i] = sm[lane * DPL + i] * (1.0f / 32.0f);
    float mx = -INFINITY, sum = 0.0f;
    for (int t = t0; t < t1; t++) {
        const int page = table[t / page_size];
        const int64_t slot = (int64_t)page * page_size + t % page_size;
        const size_t head_off = (size_t)slot * width + (size_t)kvh * d;
        /* warp-uniform: is this position one of the rows the last kv_store staged for this layer? */
        const int64_t fr = t >= p0 ? (int64_t)r0 + (t - p0) : -1;
        const bool fresh = fr >= 0 && fr < staged && c.stage_key[fr] == tsr_kv_stage_key(a.layer, slot);
        float kx[DPL];
        float s = 0.0f;
        if (fresh) {
            const __half *sk = c.stage_k + (size_t)fr * width + (size_t)kvh * d + lane * DPL;
#pragma unroll
            for (int i = 0; i < DPL; i++) s += qx[i] * __half2float(sk[i]);
        } else {
            load_q<DPL, KB>(c.kc, c.ks, head_off, lane, kx);
#pragma unroll
            for (int i = 0; i < DPL; i++) s += qr[i] * kx[i];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (s > mx) {
            const float r = __expf(mx - s);
            sum *= r;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] *= r, accx[i] *= r;
            mx = s;
        }
        const float w = __expf(s - mx);
        sum += w;
        if (fresh) {
            const __half *sv = c.stage_v + (size_t)fr * width + (size_t)kvh * d + lane * DPL;
#pragma unroll
            for (int i = 0; i < DPL; i++) accx[i] += w * __half2float(sv[i]);
        } else {
            float vx[DPL];
            load_q<DPL, VB>(c.vc, c.vs, head_off, lane, vx);
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] += w * vx[i];
        }
    }
    /* the codes' accumulator back to the plain domain, joined with the staged rows' one */
#pragma unroll
    for (int i = 0; i < DPL; i++) sm[lane * DPL + i] = acc[i];
    warp_rotate(sm, d, lane);
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = sm[lane * DPL + i] * (1.0f / 32.0f) + accx[i];
    store_result<DPL>(acc, mx, sum, item, warp, lane, d, n_splits, out, part_ml, part_acc);
}

template <int DPL, int KB, int VB>
static void launch_q(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                     float *out, float2 *ml, float *pacc, int n_splits)
{
    const int l = a->layer;
    kvq_view c = {(const uint8_t *)kv->k[l], (const uint8_t *)kv->v[l], (const __half *)kv->k_scale[l],
                  (const __half *)kv->v_scale[l], (const __half *)kv->stage_k, (const __half *)kv->stage_v,
                  kv->stage_key, kv->stage_rows, kv->k_bits, kv->v_bits};
    size_t warps = (size_t)b->n_rows * a->n_heads * n_splits;
    attn_q_kernel<DPL, KB, VB><<<tsr_div_up(warps * 32, 128), 128, 0, tsr_cuda_stream()>>>(*b, *a, c, kv->page_size, q,
                                                                                             out, ml, pacc, n_splits);
    TSR_CUDA_LAUNCHED();
}

template <int DPL>
static void launch_q_bits(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                          float *out, float2 *ml, float *pacc, int n_splits)
{
    kvq_with_bits(kv->k_bits, kv->v_bits, [&](auto kb, auto vb) {
        launch_q<DPL, decltype(kb)::value, decltype(vb)::value>(b, a, kv, q, out, ml, pacc, n_splits);
    });
}

template <int DPL>
static void launch(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                   float *out, float2 *ml, float *pacc, int n_splits)
{
    size_t warps = (size_t)b->n_rows * a->n_heads * n_splits;
    unsigned blocks = tsr_div_up(warps * 32, 128);
    if (kv->dtype == TSR_F32)
        attn_kernel<DPL, float><<<blocks, 128, 0, tsr_cuda_stream()>>>(*b, *a, (const float *)kv->k[a->layer],
                                                                       (const float *)kv->v[a->layer], kv->page_size, q,
                                                                       out, ml, pacc, n_splits);
    else
        attn_kernel<DPL, __half><<<blocks, 128, 0, tsr_cuda_stream()>>>(
            *b, *a, (const __half *)kv->k[a->layer], (const __half *)kv->v[a->layer], kv->page_size, q, out, ml, pacc,
            n_splits);
    TSR_CUDA_LAUNCHED();
}

void tsr_cuda_attention(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                        float *out)
{
    if (b->n_rows <= 0) return;
    const int d = a->head_dim;
    const int quant = tsr_kv_is_quant(kv->dtype);
    if (d % 32 || d > 256) tsr_cuda_fatal(__FILE__, __LINE__, "head_dim must be a multiple of 32 up to 256");
    if (quant && d % 64) tsr_cuda_fatal(__FILE__, __LINE__, "quantized KV caches need head_dim % 64 == 0");
    /* batches with prefill rows (more than two rows per sequence on average) go to the tensor-core kernel of
     * attention_prefill.cu when the cache and head size allow it (TSR_CUDA_FLASH=0 passes them on below) */
    static const bool flash = !tsr_cuda_env_off("TSR_CUDA_FLASH");
    /* quantized caches take the fp16 kernels over rebuilt fp16 rows (kvq_tile.cuh: a prefill's context expanded into
     * an fp16 cache first, attention_kvq.cu; decode tiles filled from the codes); TSR_CUDA_ATTN_KVQ=0 keeps them in
     * this file's kernel, which attends in the codes' rotated domain in fp32 as the CPU does */
    static const bool kvq_fast = !tsr_cuda_env_off("TSR_CUDA_ATTN_KVQ");
    const bool prefill = b->n_rows >= 2 * b->n_seqs;
    if (flash && prefill && !quant && tsr_cuda_attention_prefill(b, a, kv, q, out)) return;
    if (flash && prefill && quant && kvq_fast && tsr_cuda_attention_prefill_kvq(b, a, kv, q, out)) return;
    /* the rest, over an fp16 cache with head_dim 64 or 128, go to attention_decode.cu's block per (row, KV head,
     * split) (TSR_CUDA_ATTN_DECODE=0 keeps them here) */
    static const bool fast_decode = !tsr_cuda_env_off("TSR_CUDA_ATTN_DECODE");
    if (fast_decode && (!quant || kvq_fast) && tsr_cuda_attention_decode(b, a, kv, q, out)) return;
    /* split the context when rows × heads alone would leave the chip idle: enough splits for about
     * ATTN_TARGET_WARPS warps, none shorter than ATTN_MIN_SPLIT positions of the longest row */
    size_t items = (size_t)b->n_rows * a->n_heads;
    const int ctx = b->max_position + 1;
    int n_splits = (int)(ATTN_TARGET_WARPS / items);
    if (n_splits > ATTN_MAX_SPLITS) n_splits = ATTN_MAX_SPLITS;
    if (n_splits > (ctx + ATTN_MIN_SPLIT - 1) / ATTN_MIN_SPLIT) n_splits = (ctx + ATTN_MIN_SPLIT - 1) / ATTN_MIN_SPLIT;
    if (n_splits < 1) n_splits = 1;
    float2 *ml = NULL;
    float *pacc = NULL;
    if (n_splits > 1) {
        ml = (float2 *)tsr_cuda_scratch(1, items * n_splits * sizeof(float2));
        pacc = (float *)tsr_cuda_scratch(2, items * n_splits * d * sizeof(float));
    }
    if (quant) {
        switch (d / 32) {
        case 2: launch_q_bits<2>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 4: launch_q_bits<4>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 6: launch_q_bits<6>(b, a, kv, q, out, ml, pacc, n_splits); break;
        default: launch_q_bits<8>(b, a, kv, q, out, ml, pacc, n_splits); break;
        }
    } else {
        switch (d / 32) {
        case 1: launch<1>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 2: launch<2>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 3: launch<3>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 4: launch<4>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 5: launch<5>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 6: launch<6>(b, a, kv, q, out, ml, pacc, n_splits); break;
        case 7: launch<7>(b, a, kv, q, out, ml, pacc, n_splits); break;
        default: launch<8>(b, a, kv, q, out, ml, pacc, n_splits); break;
        }
    }
    if (n_splits > 1) tsr_cuda_attn_merge(items, d, n_splits, ml, pacc, out, a, b->n_rows);
}

void tsr_cuda_attn_merge(size_t items, int d, int n_splits, const float2 *part_ml, const float *part_acc, float *out,
                         const tsr_attn_args *a, int rows)
{
    /* o's GEMV activations staged here where it would take them (a quantized matrix over exactly these values,
     * with its inverse unit permutation: backend.cu add_unit_inverse) */
    const tsr_linear_dev *L = a->reader ? (const tsr_linear_dev *)a->reader->dev : NULL;
    tsr_stage_ahead plan = {};
    const bool ahead = L && L->uinv && L->K == a->n_heads * d && (size_t)rows * a->n_heads == items &&
                       tsr_cuda_gemv_stage_plan(&L, 1, rows, &plan);
    const int32_t *uinv = ahead ? L->uinv : (const int32_t *)NULL;
    const size_t smem = ((size_t)n_splits + (size_t)MERGE_WARPS * d + 2 * MERGE_WARPS) * sizeof(float);
    static const bool by_item = !tsr_cuda_env_off("TSR_CUDA_MERGE_ITEM");
    /* up to MERGE_AT_ONCE splits the kernel of a thread per value needs two round trips, as the item kernel does,
     * and keeps every thread busy, where most of the item kernel's warps would have no split (batch 32 at 8 KV
     * heads has 2 splits) */
    const bool item = by_item && n_splits > MERGE_AT_ONCE && d % 32 == 0 && d <= 32 * MERGE_MAX_DPL &&
                      smem <= 48 * 1024;
    const int dpl = item ? d / 32 : 0;
    switch (dpl) {
    case 2: merge_item_launch<2>(items, smem, n_splits, part_ml, part_acc, out, uinv, a->n_heads, plan); break;
    case 4: merge_item_launch<4>(items, smem, n_splits, part_ml, part_acc, out, uinv, a->n_heads, plan); break;
    case 8: merge_item_launch<8>(items, smem, n_splits, part_ml, part_acc, out, uinv, a->n_heads, plan); break;
    default:
        tsr_launch(attn_merge_kernel, dim3(tsr_div_up(items * d, 256)), dim3(256), items, d, n_splits, part_ml,
                   part_acc, out, uinv, a->n_heads, plan);
    }
    if (ahead) tsr_cuda_gemv_stage_done(&L, 1, out, &plan);
}
