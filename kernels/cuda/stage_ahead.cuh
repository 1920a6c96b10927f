/* Activations staged ahead: the launch that produces a decode GEMV's input (the residual pass that ends with a norm,
 * and silu_mul, elementwise.cu; the attention merge, attention.cu) also writes that GEMV's pre-staged activation
 * entries, so that the GEMV (q/k/v after the attention norm, gate/up after the MLP norm, down after silu_mul, o after
 * the merge) starts without a staging launch of its own. That takes one dependent launch and one round trip through
 * L2 off every GEMV chain of a layer (8B at 4.0 bpw: +3.5 % decode at batch 1, +6-7 % at 2-8; kernels/cuda/NOTES.md,
 * stops 32-33). The merge, whose threads own one value each, scatters it through o's inverse permutation instead.
 *
 * The entries are those fg_prestage_kernel writes (gemv.cu): for row `tok` of M and unit-step uk (16 input rows in
 * the matrix's unit order), lane quarter q holds the values at unit rows 16 uk + 2 q + {0, 1, 8, 9}, read through
 * the matrix's unit permutation (uperm, -1 for padding), as fp16 hi + lo halves (exact rows, 16 bytes) or fp16
 * (8 bytes). Matrices with one unit order (q, k and v usually share theirs) share one set of entries. gemv.cu plans
 * the set (tsr_cuda_gemv_stage_plan) and hands it to the GEMV only when no launch came between (a launch count);
 * this header holds what the producing kernel needs. */
#ifndef TSR_CUDA_STAGE_AHEAD_CUH
#define TSR_CUDA_STAGE_AHEAD_CUH

#include "kernels/cuda/mma.cuh"

#include <cuda_fp16.h>
#include <stdint.h>

#define TSR_STAGE_MAX_ORDERS 3

/* One staging: `n` distinct unit orders, the entries of order i at xs[i] (n_units · 8 per row, rows M). */
struct tsr_stage_ahead {
    const int32_t *uperm[TSR_STAGE_MAX_ORDERS];
    uint2 *xs[TSR_STAGE_MAX_ORDERS];
    int n, n_units, M, exact;
    int part_order[TSR_STAGE_MAX_ORDERS]; /* host side: the order of each matrix of the GEMV */
};

/* A value of an exact row as fp16 hi and what remains of it after hi, lo. */
__device__ __forceinline__ void hi_lo(float v, __half &hi, __half &lo)
{
    hi = __float2half_rn(v);
    lo = __float2half_rn(v - __half2float(hi));
}

/* One staged entry of exact rows: the four values' fp16 hi halves, then their lo halves (hi_lo). */
__device__ __forceinline__ uint4 fg_hi_lo(const float (&v)[4])
{
    __half hi[4], lo[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        hi_lo(v[j], hi[j], lo[j]);
    return make_uint4(h2_bits(__halves2half2(hi[0], hi[1])), h2_bits(__halves2half2(hi[2], hi[3])),
                      h2_bits(__halves2half2(lo[0], lo[1])), h2_bits(__halves2half2(lo[2], lo[3])));
}

/* The four unit rows of a row's entry e (of n_units · 8, unit-step e / 4, lane quarter e % 4) through the unit
 * permutation uperm: their source rows, -1 for padding. */
__device__ __forceinline__ int4 stage_entry_src(const int32_t *uperm, int e)
{
    const int32_t *p = uperm + (e >> 2) * 16 + 2 * (e & 3);
    return make_int4(p[0], p[1], p[8], p[9]);
}

/* Where entry e of row tok lies among the entries of all M rows. */
__device__ __forceinline__ size_t stage_entry_index(int e, int tok, int M)
{
    return ((size_t)(e >> 2) * M + tok) * 4 + (e & 3);
}

/* Stores entry i (of all M rows: stage_entry_index) of the four values v: fp16 hi + lo halves (exact, 16 bytes) or
 * fp16 (8 bytes). */
__device__ __forceinline__ void stage_entry_store(uint2 *xs, size_t i, bool exact, const float (&v)[4])
{
    if (exact)
        ((uint4 *)xs)[i] = fg_hi_lo(v);
    else
        xs[i] = make_uint2(h2_bits(__floats2half2_rn(v[0], v[1])), h2_bits(__floats2half2_rn(v[2], v[3])));
}

/* The sources of entry e of order o. */
__device__ __forceinline__ int4 stage_ahead_src(const tsr_stage_ahead &S, int o, int e)
{
    return stage_entry_src(S.uperm[o], e);
}

/* Writes entry e of row tok of order o from the row's values h (shared memory) and the entry's sources. */
__device__ __forceinline__ void stage_ahead_put(const tsr_stage_ahead &S, int o, int e, int tok, const float *h,
                                                int4 src)
{
    const float v[4] = {src.x >= 0 ? h[src.x] : 0.0f, src.y >= 0 ? h[src.y] : 0.0f, src.z >= 0 ? h[src.z] : 0.0f,
                        src.w >= 0 ? h[src.w] : 0.0f};
    stage_entry_store(S.xs[o], stage_entry_index(e, tok, S.M), S.exact, v);
}

/* For a producer whose threads own one value each (the attention merge): writes value y of row tok, which sits at
 * unit row `place` of order 0 (the inverse unit permutation's entry for its input row), as its half of its entry:
 * entry (place / 16) · 4 + place / 2 % 4 (unit-step, lane quarter), half (place & 1) + 2 · (place / 8 & 1) among the
 * hi halves, its lo half 4 further (fg_hi_lo's layout). */
__device__ __forceinline__ void stage_ahead_scatter(const tsr_stage_ahead &S, int place, int tok, float y)
{
    const int e = (place >> 4) * 4 + ((place >> 1) & 3), half = (place & 1) | ((place >> 2) & 2);
    __half *h = (__half *)S.xs[0] + stage_entry_index(e, tok, S.M) * (S.exact ? 8 : 4);
    if (S.exact)
        hi_lo(y, h[half], h[4 + half]);
    else
        h[half] = __float2half_rn(y);
}

#endif
