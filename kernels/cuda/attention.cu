/* Attention over the paged KV cache on the GPU, for decode and prefill rows alike.
 *
 * One warp handles one (row, head, split): the row's visible positions (causal, sliding window) are cut into
 * `n_splits` contiguous ranges so that short batches with long contexts still fill the chip. Each lane holds
 * head_dim/32 consecutive dims of q, of the running output and of each K/V row it reads (coalesced 32-lane
 * reads of one cache row); scores are reduced across the warp and folded into an online softmax, so no score
 * matrix is ever materialized. With several splits, a second kernel merges the partial (max, sum, output) triples.
 * KV storage is fp16 (or fp32); math is fp32. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

#include <math.h>

__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(float v) { return v; }

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
    const int span = p - lo + 1, per = (span + n_splits - 1) / n_splits;
    const int t0 = lo + split * per, t1 = min(p + 1, t0 + per);
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
    for (int t = t0; t < t1; t++) {
        const int page = table[t / page_size];
        const size_t off = ((size_t)page * page_size + t % page_size) * width + (size_t)kvh * d + lane * DPL;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) s += qv[i] * to_f(kc[off + i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (s > mx) {
            const float r = __expf(mx - s);
            sum *= r;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] *= r;
            mx = s;
        }
        const float w = __expf(s - mx);
        sum += w;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] += w * to_f(vc[off + i]);
    }
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

__global__ void attn_merge_kernel(size_t items, int d, int n_splits, const float2 *part_ml, const float *part_acc, float *out)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= items * d) return;
    size_t item = i / d;
    int k = (int)(i % d);
    float M = -INFINITY;
    for (int s = 0; s < n_splits; s++) M = fmaxf(M, part_ml[item * n_splits + s].x);
    float L = 0.0f, acc = 0.0f;
    for (int s = 0; s < n_splits; s++) {
        float2 ml = part_ml[item * n_splits + s];
        if (ml.y == 0.0f) continue;
        float f = __expf(ml.x - M);
        L += ml.y * f;
        acc += part_acc[(item * n_splits + s) * d + k] * f;
    }
    out[i] = L > 0.0f ? acc / L : 0.0f;
}

template <int DPL>
static void launch(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q, float *out,
                   float2 *ml, float *pacc, int n_splits)
{
    size_t warps = (size_t)b->n_rows * a->n_heads * n_splits;
    unsigned blocks = tsr_div_up(warps * 32, 128);
    if (kv->dtype == TSR_F32)
        attn_kernel<DPL, float><<<blocks, 128, 0, tsr_cuda_stream()>>>(
            *b, *a, (const float *)kv->k[a->layer], (const float *)kv->v[a->layer], kv->page_size, q, out, ml, pacc, n_splits);
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
    if (d % 32 || d > 256) tsr_cuda_fatal(__FILE__, __LINE__, "head_dim must be a multiple of 32 up to 256");
    /* split the context only when rows × heads alone would leave the chip idle */
    size_t items = (size_t)b->n_rows * a->n_heads;
    int ctx = b->max_position + 1;
    int n_splits = 1;
    if (items < 2048 && ctx > 256) {
        n_splits = (int)((2048 + items - 1) / items);
        int by_len = (ctx + 255) / 256;
        if (n_splits > by_len) n_splits = by_len;
        if (n_splits > 64) n_splits = 64;
    }
    float2 *ml = NULL;
    float *pacc = NULL;
    if (n_splits > 1) {
        ml = (float2 *)tsr_cuda_scratch(1, items * n_splits * sizeof(float2));
        pacc = (float *)tsr_cuda_scratch(2, items * n_splits * d * sizeof(float));
    }
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
    if (n_splits > 1) {
        attn_merge_kernel<<<tsr_div_up(items * d, 256), 256, 0, tsr_cuda_stream()>>>(items, d, n_splits, ml, pacc, out);
        TSR_CUDA_LAUNCHED();
    }
}
