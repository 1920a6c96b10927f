/* The greedy pick of each logits row on the device (ops.h argmax_rows): the first index of the row's largest value,
 * NaN entries skipped, so that a greedy decode step copies back 8 bytes per row instead of the whole vocabulary
 * (513 KB per row for Llama 3).
 *
 * Two kernels. The first cuts each row into `splits` contiguous slices, one block per (slice, row): every thread
 * walks its elements in increasing index order, then the block reduces the candidates, and its (value, index)
 * lands in scratch slot 4. The second reduces a row's slices in one warp. Candidates combine by the larger value,
 * the lower index on ties, an empty candidate (index -1) losing to any other: the result is the first maximum,
 * whatever the slicing, exactly as the CPU's loop finds it. */
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/launch.cuh"

#include <math.h>

#define AM_THREADS 256
#define AM_MAX_SPLITS 256

struct pick {
    float v;
    int i; /* -1: nothing seen (every element NaN) */
};

__device__ __forceinline__ pick pick_better(pick a, pick b)
{
    if (b.i < 0) return a;
    if (a.i < 0) return b;
    return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
}

__device__ __forceinline__ pick pick_warp(pick p)
{
    for (int o = 16; o > 0; o >>= 1) {
        pick q = {__shfl_xor_sync(0xffffffffu, p.v, o), __shfl_xor_sync(0xffffffffu, p.i, o)};
        p = pick_better(p, q);
    }
    return p;
}

/* grid (splits, rows): block (s, r) picks within slice s of row r and writes part[r][s]. */
__global__ void __launch_bounds__(AM_THREADS) argmax_slice_kernel(const float *__restrict__ x, int n, int slice,
                                                                  pick *__restrict__ part)
{
    tsr_pdl_start();
    const int r = blockIdx.y, s = blockIdx.x;
    const float *row = x + (size_t)r * n;
    const int e = min(n, (s + 1) * slice);
    pick p = {0.0f, -1};
    for (int i = s * slice + threadIdx.x; i < e; i += AM_THREADS) {
        const float v = row[i];
        if (v == v && (p.i < 0 || v > p.v)) p = {v, i}; /* increasing i: the first maximum stays */
    }
    p = pick_warp(p);
    __shared__ pick warps[AM_THREADS / 32];
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = p;
    __syncthreads();
    if (threadIdx.x < 32) {
        p = threadIdx.x < AM_THREADS / 32 ? warps[threadIdx.x] : pick{0.0f, -1};
        p = pick_warp(p);
        if (threadIdx.x == 0) part[(size_t)r * gridDim.x + s] = p;
    }
}

/* one warp per row: the best of its `splits` parts */
__global__ void argmax_merge_kernel(const pick *__restrict__ part, int splits, int32_t *ids, float *vals)
{
    tsr_pdl_start();
    const int r = blockIdx.x;
    pick p = {0.0f, -1};
    for (int s = threadIdx.x; s < splits; s += 32) p = pick_better(p, part[(size_t)r * splits + s]);
    p = pick_warp(p);
    if (threadIdx.x == 0) {
        ids[r] = p.i < 0 ? 0 : p.i;
        vals[r] = p.i < 0 ? NAN : p.v;
    }
}

void tsr_cuda_argmax_rows(const float *x, int rows, int n, int32_t *ids, float *vals)
{
    if (rows <= 0) return;
    /* about two blocks per SM over all rows, each slice at least 4 elements per thread */
    static const int sms = tsr_cuda_device_attr(cudaDevAttrMultiProcessorCount, 132);
    int splits = (2 * sms + rows - 1) / rows;
    const int most = (n + 4 * AM_THREADS - 1) / (4 * AM_THREADS);
    splits = splits < most ? splits : most;
    splits = splits < 1 ? 1 : splits > AM_MAX_SPLITS ? AM_MAX_SPLITS : splits;
    const int slice = (n + splits - 1) / splits;
    pick *part = (pick *)tsr_cuda_scratch(4, (size_t)rows * splits * sizeof(pick));
    tsr_launch(argmax_slice_kernel, dim3(splits, rows), dim3(AM_THREADS), x, n, slice, part);
    TSR_CUDA_LAUNCHED();
    tsr_launch(argmax_merge_kernel, dim3(rows), dim3(32), (const pick *)part, splits, ids, vals);
    TSR_CUDA_LAUNCHED();
}
