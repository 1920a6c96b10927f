/* A sampled row's best candidates on the device (ops.h top_rows): the k largest logits of each row, in order, and
 * the row's softmax normalizer at the sequence's temperature, so that a sampled decode step copies back about
 * 0.5 KB per row instead of the whole vocabulary (513 KB for Llama 3).
 *
 * One block of TOP_THREADS per row; values become order-preserving unsigned keys (NaN excluded, -0 below +0, as the
 * host sampler orders them). Pass 1 gives each thread its best key and its share of the normalizer (an online
 * sum against its own running maximum, brought to the row's maximum at the end). The k-th best of the threads'
 * best keys is a threshold with at least k entries at or above it; pass 2 gathers those into shared memory, where
 * a bitonic sort orders them (the larger key, then the lower index) and the first k are the answer. When more than
 * TOP_CAP entries pass the threshold (long runs of ties, rows of few valid entries), a radix selection over the
 * row takes over: four passes of one byte each (256-bucket histograms of the keys sharing the prefix found so
 * far), then a pass that takes every key above the k-th and, in index order, as many equal to it as needed. */
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/launch.cuh"

#include <math.h>

#define TOP_THREADS 1024
#define TOP_WARPS (TOP_THREADS / 32)
#define TOP_CAP 2048 /* entries at or above the threshold the fast path sorts in shared memory */

__device__ __forceinline__ unsigned top_key(float v)
{
    const unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* -inf -> 0x007FFFFF: a valid key is never 0 */
}

__device__ __forceinline__ float top_value(unsigned key)
{
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

/* a before b: the larger key, then the lower index */
__device__ __forceinline__ bool top_before(unsigned ka, int ia, unsigned kb, int ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

/* Sorts keys[0..P) with their ids in place, best first (P a power of two, at most 2 * TOP_THREADS). */
__device__ void top_bitonic(unsigned *keys, int *ids, int P)
{
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            for (int p = threadIdx.x; p < P / 2; p += TOP_THREADS) {
                const int i = 2 * p - (p & (stride - 1)), j = i + stride;
                const bool up = (i & size) == 0; /* this run ends best first */
                const bool swap = up ? top_before(keys[j], ids[j], keys[i], ids[i])
                                     : top_before(keys[i], ids[i], keys[j], ids[j]);
                if (swap) {
                    const unsigned k = keys[i];
                    keys[i] = keys[j], keys[j] = k;
                    const int d = ids[i];
                    ids[i] = ids[j], ids[j] = d;
                }
            }
        }
    __syncthreads();
}

/* The slow path (more than TOP_CAP entries at or above the threshold: many ties, or few valid entries): the k best
 * by radix selection over the whole row, into ckey/cid[0..*want), unordered. */
__device__ void top_radix(const float *__restrict__ row, int n, int k, unsigned *ckey, int *cid, int *hist,
                          int *want_out)
{
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    __shared__ unsigned s_prefix, s_mask;
    __shared__ int s_want, s_left, s_taken, s_ties;
    __shared__ int warp_ties[TOP_WARPS];
    if (t == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_want = k;
        s_taken = 0;
        s_ties = 0;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += TOP_THREADS) hist[b] = 0;
        __syncthreads();
        const unsigned prefix = s_prefix, mask = s_mask;
        for (int i = t; i < n; i += TOP_THREADS) {
            const float v = row[i];
            const unsigned key = top_key(v);
            if (v == v && (key & mask) == prefix) { /* lanes of one bucket add once */
                const unsigned bucket = (key >> shift) & 0xFFu;
                const unsigned peers = __match_any_sync(__activemask(), bucket);
                if (lane == __ffs(peers) - 1) atomicAdd(&hist[bucket], __popc(peers));
            }
        }
        __syncthreads();
        if (t == 0) {
            int total = 0;
            for (int b = 0; b < 256; b++) total += hist[b];
            if (shift == 24 && total < s_want) s_want = total;
            int want = shift == 24 ? s_want : s_left, above = 0, d = 255;
            for (; d > 0 && above + hist[d] < want; d--) above += hist[d];
            s_left = want - above;
            s_prefix = prefix | ((unsigned)d << shift);
            s_mask = mask | (0xFFu << shift);
        }
        __syncthreads();
    }
    const int want = s_want;
    const unsigned thr = s_prefix;
    const int n_above = want - s_left; /* keys above thr; then s_left of those equal to it, lowest index first */
    if (want > 0)
        for (int base = 0; base < n; base += TOP_THREADS) {
            const int i = base + t;
            const float v = i < n ? row[i] : NAN;
            const unsigned key = v == v ? top_key(v) : 0u;
            if (key > thr) {
                const int slot = atomicAdd(&s_taken, 1);
                ckey[slot] = key;
                cid[slot] = i;
            }
            const bool tie = key == thr;
            const unsigned ballot = __ballot_sync(0xffffffffu, tie);
            if (lane == 0) warp_ties[warp] = __popc(ballot);
            __syncthreads();
            int before = s_ties;
            for (int w = 0; w < warp; w++) before += warp_ties[w];
            before += __popc(ballot & ((1u << lane) - 1u));
            if (tie && before < s_left) {
                ckey[n_above + before] = key;
                cid[n_above + before] = i;
            }
            __syncthreads();
            if (t == 0)
                for (int w = 0; w < TOP_WARPS; w++) s_ties += warp_ties[w];
            __syncthreads();
            if (s_ties >= s_left && s_taken >= n_above) break; /* block-uniform */
        }
    __syncthreads();
    *want_out = want;
}

__global__ void __launch_bounds__(TOP_THREADS) top_rows_kernel(const float *__restrict__ x, int n, int k,
                                                               const float *__restrict__ inv_temp,
                                                               int32_t *__restrict__ ids, float *__restrict__ vals,
                                                               float *__restrict__ z)
{
    tsr_pdl_start();
    const int r = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const float *row = x + (size_t)r * n;
    const float inv = inv_temp[r];
    __shared__ unsigned ckey[TOP_CAP];
    __shared__ int cid[TOP_CAP];
    __shared__ int hist[256];
    __shared__ unsigned s_best;
    __shared__ int s_count;
    __shared__ double warp_sum[TOP_WARPS];
    if (t == 0) {
        s_best = 0;
        s_count = 0;
    }
    __syncthreads();

    /* pass 1: each thread's best key, and its share of the normalizer, online (its own running maximum) */
    unsigned best = 0;
    float mt = -INFINITY, st = 0.0f;
    for (int i = t; i < n; i += TOP_THREADS) {
        const float v = row[i];
        if (v != v) continue;
        const unsigned key = top_key(v);
        best = key > best ? key : best;
        if (v > mt) {
            st = st * expf((mt - v) * inv) + 1.0f;
            mt = v;
        } else if (v > -INFINITY) {
            st += expf((v - mt) * inv);
        }
    }
    atomicMax(&s_best, best);
    /* the threshold: the k-th best of the threads' best keys; at least k entries lie at or above it */
    ckey[t] = best;
    cid[t] = t;
    top_bitonic(ckey, cid, TOP_THREADS);
    const unsigned thr = ckey[k - 1] > 0 ? ckey[k - 1] : 1u;
    const float m = top_value(s_best);
    __syncthreads();

    /* the normalizer: the threads' sums brought to the row's maximum */
    double d = s_best && isfinite(m) && st > 0.0f ? (double)st * (double)expf((mt - m) * inv) : 0.0;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) warp_sum[warp] = d;

    /* pass 2: every entry at or above the threshold */
    for (int i = t; i < n; i += TOP_THREADS) {
        const float v = row[i];
        if (v == v && top_key(v) >= thr) {
            const int slot = atomicAdd(&s_count, 1);
            if (slot < TOP_CAP) {
                ckey[slot] = top_key(v);
                cid[slot] = i;
            }
        }
    }
    __syncthreads();
    int want;
    const int count = s_count;
    if (count <= TOP_CAP) {
        int P = 64;
        while (P < count) P <<= 1;
        for (int i = count + t; i < P; i += TOP_THREADS) {
            ckey[i] = 0;
            cid[i] = 0x7FFFFFFF;
        }
        top_bitonic(ckey, cid, P);
        want = count < k ? count : k;
        if (t < want) {
            ids[(size_t)r * k + t] = cid[t];
            vals[(size_t)r * k + t] = top_value(ckey[t]);
        }
    } else {
        __syncthreads();
        top_radix(row, n, k, ckey, cid, hist, &want);
        if (t < want) { /* rank against the others: the larger key, then the lower index */
            int rank = 0;
            for (int j = 0; j < want; j++) rank += top_before(ckey[j], cid[j], ckey[t], cid[t]);
            ids[(size_t)r * k + rank] = cid[t];
            vals[(size_t)r * k + rank] = top_value(ckey[t]);
        }
    }
    if (t >= want && t < k) {
        ids[(size_t)r * k + t] = -1;
        vals[(size_t)r * k + t] = NAN;
    }
    __syncthreads();
    if (t == 0) {
        double total = 0;
        for (int w = 0; w < TOP_WARPS; w++) total += warp_sum[w];
        z[r] = s_best && isfinite(m) ? (float)total : 0.0f;
    }
}

void tsr_cuda_top_rows(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals,
                       float *z)
{
    if (rows <= 0 || k <= 0) return;
    if (k > TSR_TOP_MAX) k = TSR_TOP_MAX; /* ops.h: callers never ask for more */
    tsr_launch(top_rows_kernel, dim3(rows), dim3(TOP_THREADS), x, n, k, inv_temp, ids, vals, z);
    TSR_CUDA_LAUNCHED();
}
