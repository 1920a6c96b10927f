/* Rows of a quantized KV cache (Q4/Q6/Q8, runtime/kv_cache.h) turned back into plain fp16 head vectors by one warp,
 * for the kernels that work on fp16 tiles: the decode attention's tile fill (attention_decode.cu) and the expansion
 * of a prefill's context into an fp16 cache (attention_kvq.cu), so that both reuse the tensor-core kernels of the
 * fp16 cache.
 *
 * A row is one (token slot, KV head) vector of D elements, D = 64 or 128. Lane l holds EPL = D / 32 consecutive
 * elements: its codes are one 1-, 2- or 4-byte load (from global memory, or from a copy of the row in shared memory),
 * its group's scale one fp16 load (a 32-element group spans 8 or 16 lanes). Dequantized in the rotated domain,
 * (code - m)·scale in fp32, the values are rotated back by the per-chunk, per-parity 32-point Walsh-Hadamard
 * transform: element e of a 64-element chunk is point e / 2 of parity e % 2's transform, so with EPL = 4 a lane
 * holds points 2L and 2L + 1 of both parities (L = l % 16; the first butterfly stage stays in the lane, the other
 * four are shuffles within the chunk's 16 lanes) and with EPL = 2 it holds point l of both (five shuffle stages).
 * The result times 1/32 is rounded to fp16 once.
 *
 * Numerics: kernels/cpu/attention.c (and attention.cu's exact kernel) attend in the rotated domain in fp32, so the
 * fp16 rounding of the rebuilt vectors is the only difference (relative ~2^-12 per element, far below the codes'
 * own error). ExLlamaV2 also rebuilds fp16 K/V before its attention, with fp16 butterflies.
 *
 * The rows a forward call stored itself are read from the staging area instead (exact fp16, the rule of
 * runtime/kv_cache.h): kvq_staged_row says whether batch row `fr` staged this (layer, slot). */
#ifndef TSR_CUDA_KVQ_TILE_CUH
#define TSR_CUDA_KVQ_TILE_CUH

#include "kernels/cuda/cuda_common.cuh"

#include <stdint.h>
#include <type_traits>

/* A quantized cache's layer as the kernels read it. */
struct kvq_view {
    const uint8_t *kc, *vc;          /* codes of the layer */
    const __half *ks, *vs;           /* scales of the layer */
    const __half *stage_k, *stage_v; /* the last kv_store call's rows, fp16 */
    const int64_t *stage_key;        /* [stage_rows + 1] */
    int stage_rows;
    int k_bits, v_bits; /* 4 or 8 */
};

/* f(KB, VB) with the code widths of a quantized mode as std::integral_constant values: (4, 4) for Q4, (8, 4) for
 * Q6, (8, 8) for Q8 (runtime/kv_cache.h), so that one call site instantiates a template for each. Host launchers and
 * device code both call it, each with a functor of its own side (the pragma lets nvcc instantiate it for either). */
#pragma nv_exec_check_disable
template <class F> __host__ __device__ __forceinline__ void kvq_with_bits(int k_bits, int v_bits, F &&f)
{
    if (k_bits == 4)
        f(std::integral_constant<int, 4>{}, std::integral_constant<int, 4>{});
    else if (v_bits == 4)
        f(std::integral_constant<int, 8>{}, std::integral_constant<int, 4>{});
    else
        f(std::integral_constant<int, 8>{}, std::integral_constant<int, 8>{});
}

/* The lane's codes and scale of a row whose codes start at `codes` and scales at `scales` (global or shared). */
template <int D, int BITS>
__device__ __forceinline__ void kvq_row_load(const uint8_t *codes, const __half *scales, int lane, uint32_t &w,
                                             float &scale)
{
    constexpr int EPL = D / 32, BYTES = EPL * BITS / 8;
    static_assert(D == 64 || D == 128, "quantized rows of 64 or 128 elements");
    const uint8_t *p = codes + EPL * lane * BITS / 8;
    if constexpr (BYTES == 4)
        w = *(const uint32_t *)p;
    else if constexpr (BYTES == 2)
        w = *(const uint16_t *)p;
    else
        w = *p;
    scale = __half2float(scales[(EPL * lane) / 32]);
}

/* N = 4, 8 or 16 bytes global → shared by cp.async (the caller commits). */
template <int N> __device__ __forceinline__ void cp_async_small(void *smem, const void *gmem)
{
    static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(N));
}

/* The lane's EPL plain-domain fp16 values of a row from its codes (kvq_row_load), stored at dst[EPL · lane ...].
 * Every lane of the warp must call it (shuffles). */
template <int D, int BITS>
__device__ __forceinline__ void kvq_row_decode(uint32_t w, float scale, int lane, __half *dst)
{
    constexpr int EPL = D / 32, JPL = EPL / 2;
    constexpr float M = BITS == 4 ? 8.0f : 128.0f;
    float v[EPL]; /* v[2 jj + p]: point JPL · L + jj of parity p */
#pragma unroll
    for (int k = 0; k < EPL; k++) {
        const uint32_t code = BITS == 4 ? (w >> (4 * k)) & 15u : (w >> (8 * k)) & 255u;
        v[k] = ((float)code - M) * scale;
    }
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        if (s < JPL) { /* points jj and jj + s of the lane itself */
#pragma unroll
            for (int p = 0; p < 2; p++) {
                const float a = v[p], b = v[2 * s + p];
                v[p] = a + b, v[2 * s + p] = a - b;
            }
        } else {
            const int x = s / JPL;
            const bool upper = lane & x;
#pragma unroll
            for (int k = 0; k < EPL; k++) {
                const float y = __shfl_xor_sync(0xffffffffu, v[k], x);
                v[k] = upper ? y - v[k] : v[k] + y;
            }
        }
    }
    __half2 *out = (__half2 *)(dst + EPL * lane);
#pragma unroll
    for (int k = 0; k < EPL; k += 2)
        out[k / 2] = __floats2half2_rn(v[k] * (1.0f / 32.0f), v[k + 1] * (1.0f / 32.0f));
}

/* The lane's EPL fp16 values of a staged row (element offset `off` in the staging area) copied to dst. */
template <int D> __device__ __forceinline__ void kvq_row_staged(const __half *stage, size_t off, int lane, __half *dst)
{
    constexpr int EPL = D / 32;
    if constexpr (EPL == 4)
        *(uint2 *)(dst + EPL * lane) = *(const uint2 *)(stage + off + EPL * lane);
    else
        *(uint32_t *)(dst + EPL * lane) = *(const uint32_t *)(stage + off + EPL * lane);
}

/* The lane's EPL values of a row set to zero. */
template <int D> __device__ __forceinline__ void kvq_row_zero(int lane, __half *dst)
{
    constexpr int EPL = D / 32;
    if constexpr (EPL == 4)
        *(uint2 *)(dst + EPL * lane) = make_uint2(0u, 0u);
    else
        *(uint32_t *)(dst + EPL * lane) = 0u;
}

/* Whether batch row fr (-1: none) staged the slot of `layer` in the last kv_store (warp-uniform). */
__device__ __forceinline__ bool kvq_staged_row(const kvq_view &c, int64_t fr, int layer, int64_t slot)
{
    return fr >= 0 && fr < c.stage_rows && fr < c.stage_key[c.stage_rows] &&
           c.stage_key[fr] == tsr_kv_stage_key(layer, slot);
}

/* K and V of one (slot, KV head) into fp16 rows kdst and vdst, from the staging area where batch row fr staged
 * them, else from the codes; the whole warp calls it. */
template <int D, int KB, int VB>
__device__ __forceinline__ void kvq_row_pair(const kvq_view &c, int64_t slot, int kvh, int width, int64_t fr, int layer,
                                             int lane, __half *kdst, __half *vdst)
{
    if (kvq_staged_row(c, fr, layer, slot)) {
        const size_t off = (size_t)fr * width + (size_t)kvh * D;
        kvq_row_staged<D>(c.stage_k, off, lane, kdst);
        kvq_row_staged<D>(c.stage_v, off, lane, vdst);
        return;
    }
    const size_t off = (size_t)slot * width + (size_t)kvh * D;
    uint32_t kw, vw;
    float ksc, vsc;
    kvq_row_load<D, KB>(c.kc + off * KB / 8, c.ks + off / 32, lane, kw, ksc);
    kvq_row_load<D, VB>(c.vc + off * VB / 8, c.vs + off / 32, lane, vw, vsc);
    kvq_row_decode<D, KB>(kw, ksc, lane, kdst);
    kvq_row_decode<D, VB>(vw, vsc, lane, vdst);
}

#endif
