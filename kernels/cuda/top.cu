/* A sampled row's best candidates on the device (ops.h top_rows): the k largest logits of each row, in order, and
 * the row's softmax normalizer at the sequence's temperature, so that a sampled decode step copies back about
 * 0.5 KB per row instead of the whole vocabulary (513 KB for Llama 3).
 *
 * One block of TOP_THREADS per row. Values become order-preserving unsigned keys (NaN excluded, -0 below +0, as
 * the host sampler orders them). A radix selection finds the key of the k-th best in four passes over the row,
 * one byte at a time: each pass builds a 256-bucket histogram of the keys that share the prefix found so far
 * (lanes of a warp that fall in one bucket add once, __match_any_sync), and walks it from the top. Then one pass
 * takes every key above that threshold and, in index order (a block-wide count over consecutive tiles), as many
 * keys equal to it as are still needed, so ties go to the lower index. The at most k candidates are ranked
 * against each other in shared memory, and a last pass sums exp((x - max) * inv_temp) over the row. The row is
 * read six times; it stays in L2 between the head's GEMM and these passes. */
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/launch.cuh"

#include <math.h>

#define TOP_THREADS 1024
#define TOP_WARPS (TOP_THREADS / 32)

__device__ __forceinline__ unsigned top_key(float v)
{
    const unsigned u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u); /* -inf -> 0x007FFFFF: a valid key is never 0 */
}

__device__ __forceinline__ float top_value(unsigned key)
{
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7FFFFFFFu) : ~key);
}

__global__ void __launch_bounds__(TOP_THREADS) top_rows_kernel(const float *__restrict__ x, int n, int k,
                                                               const float *__restrict__ inv_temp,
                                                               int32_t *__restrict__ ids, float *__restrict__ vals,
                                                               float *__restrict__ z)
{
    tsr_pdl_wait();
    const int r = blockIdx.x, t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const float *row = x + (size_t)r * n;
    __shared__ int hist[256];
    __shared__ unsigned s_prefix, s_mask;
    __shared__ int s_want, s_left, s_taken, s_ties;
    __shared__ int warp_ties[TOP_WARPS];
    __shared__ unsigned cand_key[TSR_TOP_MAX];
    __shared__ int cand_id[TSR_TOP_MAX];
    __shared__ double warp_sum[TOP_WARPS];
    if (t == 0) {
        s_prefix = 0;
        s_mask = 0;
        s_want = k;
        s_taken = 0;
        s_ties = 0;
    }

    /* the threshold: the k-th best key (or the lowest valid one when the row has fewer valid entries) */
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < 256; b += TOP_THREADS) hist[b] = 0;
        __syncthreads();
        const unsigned prefix = s_prefix, mask = s_mask;
        for (int i = t; i < n; i += TOP_THREADS) {
            const float v = row[i];
            const unsigned key = top_key(v);
            const bool in = v == v && (key & mask) == prefix;
            const unsigned active = __activemask();
            const unsigned bucket = in ? (key >> shift) & 0xFFu : 0x100u;
            const unsigned peers = __match_any_sync(active, bucket);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bucket], __popc(peers));
        }
        __syncthreads();
        if (t == 0) {
            int total = 0;
            for (int b = 0; b < 256; b++) total += hist[b];
            if (shift == 24 && total < s_want) s_want = total; /* fewer valid entries than k: take them all */
            int want = shift == 24 ? s_want : s_left, above = 0, d = 255;
            for (; d > 0 && above + hist[d] < want; d--) above += hist[d];
            s_left = want - above; /* still to take from bucket d and below it in later passes */
            s_prefix = prefix | ((unsigned)d << shift);
            s_mask = mask | (0xFFu << shift);
        }
        __syncthreads();
    }
    const int want = s_want;
    const unsigned thr = s_prefix;
    const int n_above = want - s_left; /* keys strictly above thr; s_left of those equal to it follow */

    /* the candidates: every key above thr, and the first s_left keys equal to it in index order */
    if (want > 0) {
        for (int base = 0; base < n; base += TOP_THREADS) {
            const int i = base + t;
            const float v = i < n ? row[i] : NAN;
            const unsigned key = v == v ? top_key(v) : 0u;
            if (key > thr) {
                const int slot = atomicAdd(&s_taken, 1);
                cand_key[slot] = key;
                cand_id[slot] = i;
            }
            const bool tie = key == thr;
            const unsigned ballot = __ballot_sync(0xffffffffu, tie);
            if (lane == 0) warp_ties[warp] = __popc(ballot);
            __syncthreads();
            int before = s_ties;
            for (int w = 0; w < warp; w++) before += warp_ties[w];
            before += __popc(ballot & ((1u << lane) - 1u));
            if (tie && before < s_left) {
                cand_key[n_above + before] = key;
                cand_id[n_above + before] = i;
            }
            __syncthreads();
            if (t == 0)
                for (int w = 0; w < TOP_WARPS; w++) s_ties += warp_ties[w];
            __syncthreads();
            if (s_ties >= s_left && s_taken >= n_above) break; /* block-uniform */
        }
    }
    __syncthreads();

    /* rank the candidates: larger key first, then lower index */
    int32_t *out_id = ids + (size_t)r * k;
    float *out_v = vals + (size_t)r * k;
    if (t < want) {
        const unsigned key = cand_key[t];
        const int id = cand_id[t];
        int rank = 0;
        for (int j = 0; j < want; j++)
            rank += cand_key[j] > key || (cand_key[j] == key && cand_id[j] < id);
        out_id[rank] = id;
        out_v[rank] = top_value(key);
    } else if (t < k) {
        out_id[t] = -1;
        out_v[t] = NAN;
    }

    /* the normalizer at this row's temperature */
    float m = NAN;
    if (want > 0) {
        unsigned best = 0;
        for (int j = 0; j < want; j++) best = cand_key[j] > best ? cand_key[j] : best;
        m = top_value(best);
    }
    if (!isfinite(m)) {
        if (t == 0) z[r] = 0.0f;
        tsr_pdl_trigger();
        return;
    }
    const float inv = inv_temp[r];
    float sum = 0.0f;
    for (int i = t; i < n; i += TOP_THREADS) {
        const float v = row[i];
        if (v == v) sum += expf((v - m) * inv);
    }
    double d = sum;
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    if (lane == 0) warp_sum[warp] = d;
    __syncthreads();
    if (t == 0) {
        double total = 0;
        for (int w = 0; w < TOP_WARPS; w++) total += warp_sum[w];
        z[r] = (float)total;
    }
    tsr_pdl_trigger();
}

void tsr_cuda_top_rows(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals,
                       float *z)
{
    if (rows <= 0 || k <= 0) return;
    if (k > TSR_TOP_MAX) k = TSR_TOP_MAX; /* ops.h: callers never ask for more */
    tsr_launch(top_rows_kernel, dim3(rows), dim3(TOP_THREADS), x, n, k, inv_temp, ids, vals, z);
    TSR_CUDA_LAUNCHED();
}
