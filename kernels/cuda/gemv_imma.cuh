/* The one-row GEMV's 4-bit units on integer tensor cores (frag_gemv_kernel's IMMA instance, TSR_CUDA_GEMV_IMMA).
 *
 * In the fragment layout (exl2_frag.cuh) a lane's 4-bit word 2 ct + ks holds in its low nibbles A-row g's codes for
 * the unit rows 16 ks + 2t + {0, 8, 1, 9} (t = lane % 4; one byte each, in that order), and in its high nibbles A-row
 * g + 8's codes for the same rows. Masked by 0x0f0f0f0f the word is operand a0 (ks 0) or a2 (ks 1) of
 * mma.m16n8k32 with unsigned 8-bit A; masked by 0xf0f0f0f0 it is a1 or a3, A-row g + 8's codes times 16. A unit's
 * two column blocks so take 16 LOP3 and 4 IMMA per lane, where the fp16 path spends ~80 instructions decoding.
 *
 * B must be integer too. After staging, the block turns the exact activations (hi + lo halves) of its 4-bit units
 * into 23-bit fixed point X under one power-of-two scale (2^22 over the block's largest magnitude), offset to
 * X + 2^23 (24 bits, never negative), whose three bytes (digits) replace the staged entry. Digits 0, 1 and 2 take
 * B-columns 0, 1 and 4, and B-column 5 is all ones, so C-columns 0 and 1 (lane t = 0) hold digit 0's and 1's sums, C
 * 4 and 5 (lane t = 2) digit 2's and the codes' own sum. Lane 0 folds its two into one int (c0 + 256 c1, exact while
 * a flush covers at most FI_FLUSH_UNITS units); lane 2 takes the offset off (c0 − 128 c1: 2^23 = 65536 · 128) and
 * carries the weight 65536 in its scales; the final exchange of the fp16 path (fg_unpack adds lane t + 2 into lane
 * t, as it adds the hi and lo products there) adds the two. The codes are unsigned, so each flush removes the zero
 * point (EXL2: 8; GPTQ: per column) as zero times the sum of the flushed units' X, which the staging stores per unit.
 * The other lanes' C-columns see other words; their scales are zero, so they add nothing. */
#ifndef TSR_CUDA_GEMV_IMMA_CUH
#define TSR_CUDA_GEMV_IMMA_CUH

#include "kernels/cuda/gemv_warp.cuh"

#include <stdint.h>

/* Units per flush at most: codes ≤ 240 (A-row g + 8), digits ≤ 255 and 32 rows give < 2^21 per unit and C entry;
 * digits 0 and 1 folded as c0 + 256 c1 stay below 2^31 for 4 units. */
#define FI_FLUSH_UNITS 4
/* In a converted unit (32 words where its 8 staged entries were), entry (ks, t)'s words 0-2 are the digits of
 * rows 16 ks + 2t + {0, 8, 1, 9} (byte j: the j-th row of that list) and its word 3 is zero, except in entry (0, 0),
 * where it holds the unit's sum of X (a float). */
#define FI_WORD_SUM 3

/* D += A · B for one m16n8k32 tile: unsigned 8-bit A and B, int32 accumulators. */
__device__ __forceinline__ void imma_16832(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                           uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The four values of a staged exact entry (hi + lo halves of rows c, c + 1, c + 8, c + 9), in the byte order of
 * the 4-bit words: rows c, c + 8, c + 1, c + 9. */
__device__ __forceinline__ void fi_entry_values(uint4 e, float (&v)[4])
{
    const float2 hx = __half22float2(bits_h2(e.x)), hy = __half22float2(bits_h2(e.y));
    const float2 lx = __half22float2(bits_h2(e.z)), ly = __half22float2(bits_h2(e.w));
    v[0] = hx.x + lx.x, v[1] = hy.x + ly.x, v[2] = hx.y + lx.y, v[3] = hy.y + ly.y;
}

/* Whether unit u of the matrix is converted when staged: GPTQ's all, EXL2's 4-bit ones. */
template <bool GPTQ> __device__ __forceinline__ bool fi_unit_is_int(const tsr_linear_dev &L, int u)
{
    return GPTQ || (int)(L.units[u].y >> 24) == 4;
}

/* Which of the thread's staged entries (i = threadIdx.x + k · blockDim.x, bit k; at most 32 per thread) belong
 * to converted units: read from the unit records, which do not depend on x, so before the PDL wait. */
template <bool GPTQ> __device__ __forceinline__ uint32_t fi_int_entries(const tsr_linear_dev &L, int u0, int nu)
{
    uint32_t mask = 0;
    for (int k = 0, i = threadIdx.x; i < nu * 8 && k < 32; k++, i += blockDim.x)
        if (fi_unit_is_int<GPTQ>(L, u0 + (i >> 3))) mask |= 1u << k;
    return mask;
}

/* Converts the block's staged 4-bit units [u0, u0 + nu) in place (every thread of the block; shared memory
 * settled before, a __syncthreads needed after; mask: fi_int_entries). red: one float per warp (scratch).
 * Returns the scale of the fixed point (value = fixed · scale), 0 when all those activations are zero (or below
 * 2^-100, or the largest is not finite: then the products are taken as zero). */
template <bool GPTQ> __device__ float fi_stage(int nu, uint32_t mask, uint4 *stage, float *red, int red_stride)
{
    const int items = nu * 8, warps = (int)blockDim.x >> 5, lane = threadIdx.x & 31;
    float m = 0.0f;
    for (int k = 0, i = threadIdx.x; i < items; k++, i += blockDim.x) {
        if (!(mask >> k & 1)) continue;
        float v[4];
        fi_entry_values(stage[i], v);
#pragma unroll
        for (int j = 0; j < 4; j++)
            m = fmaxf(m, fabsf(v[j]));
    }
    m = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(m))); /* magnitudes order as their bits */
    if (lane == 0) red[(threadIdx.x >> 5) * red_stride] = m;
    __syncthreads();
    for (int w = 0; w < warps; w++)
        m = fmaxf(m, red[w * red_stride]);
    int e = 0;
    (void)frexpf(m, &e); /* m < 2^e; below 2^-100 (or not finite) the activations count as zero */
    const bool scaled = m >= 0x1p-100f && m <= 0x1p100f;
    const float inv = scaled ? ldexpf(1.0f, 22 - e) : 0.0f;
    /* the 8 entries of a unit sit in 8 neighbouring lanes (blockDim.x is a multiple of 8), which add their sums */
    for (int k = 0, base = 0; base < items; k++, base += blockDim.x) {
        const int i = base + (int)threadIdx.x;
        const bool live = i < items && (mask >> k & 1);
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (live) fi_entry_values(stage[i], v);
        uint32_t u[4];
        int sum = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int x = __float2int_rn(v[j] * inv); /* |x| <= 2^22 */
            sum += x;
            u[j] = (uint32_t)(x + (1 << 23));
        }
        const uint32_t lo01 = __byte_perm(u[0], u[1], 0x5140), lo23 = __byte_perm(u[2], u[3], 0x5140); /* bytes 0, 1 */
        const uint32_t hi01 = __byte_perm(u[0], u[1], 0x0062), hi23 = __byte_perm(u[2], u[3], 0x0062); /* byte 2 */
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        sum += __shfl_xor_sync(0xffffffffu, sum, 4);
        if (live)
            stage[i] = make_uint4(__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                  __byte_perm(hi01, hi23, 0x5410), (i & 7) == 0 ? __float_as_uint((float)sum) : 0u);
    }
    return scaled ? ldexpf(1.0f, e - 22) : 0.0f;
}

/* A lane's constants: where it reads its B-column's digits, how its C entries combine, and its share of the
 * scales and zero points (see the head of the file). */
struct fi_lane {
    int boff;     /* word of entry (0, t) holding the lane's digit (words 0-2) or zero / the unit sum (word 3) */
    bool ones;    /* B-column 5: all ones instead of a word */
    int k1;       /* weight of C-column 2t + 1 in the lane's int: 256 (lane t = 0), −128 (t = 2) or 0 */
    float se, so; /* scale factor of A-rows g (even j) and g + 8 (odd j, whose codes are times 16) */
    float ze, zo; /* zero-point factor of the same rows: 1 and 16 in lane t = 0, else 0 */
};

__device__ __forceinline__ fi_lane fi_lane_of(int lane, float xscale)
{
    const int t = lane & 3, g = lane >> 2;
    fi_lane K;
    K.boff = 4 * t + (g == 0 ? 0 : g == 1 ? 1 : g == 4 ? 2 : FI_WORD_SUM);
    K.ones = g == 5;
    K.k1 = t == 0 ? 256 : t == 2 ? -128 : 0;
    K.se = t == 0 ? xscale : t == 2 ? 65536.0f * xscale : 0.0f;
    K.so = K.se * (1.0f / 16.0f);
    K.ze = t == 0 ? 1.0f : 0.0f;
    K.zo = t == 0 ? 16.0f : 0.0f;
    return K;
}

/* A group's scales and zero points as the lane applies them: column 32 cb + 8 j + g of column block c, already
 * times the lane's factors (fi_lane). */
struct fi_scales {
    float s[2][4], z[2][4];
};

template <bool GPTQ>
__device__ __forceinline__ void fi_group(const uint32_t *hdr, int zero_add, float *scratch, int lane, const fi_lane &K,
                                         fi_scales &S)
{
    frag_scales sc[2];
    fg_group_from_hdr<4, GPTQ>(hdr, zero_add, scratch, lane, sc);
#pragma unroll
    for (int c = 0; c < 2; c++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float z = GPTQ ? sc[c].z[j] : 8.0f; /* EXL2's 4-bit zero point */
            S.s[c][j] = sc[c].s[j] * (j & 1 ? K.so : K.se);
            S.z[c][j] = z * (j & 1 ? K.zo : K.ze);
        }
}

/* tot += the flushed units' products (token 0: C entries 0 and 2 of each tile), the zero points removed with xs,
 * the units' sum of fixed-point activations; the int sums start again at zero. */
__device__ __forceinline__ void fi_flush(int (&acc)[4][4], float (&tot)[4][4], const fi_scales &S, float xs, int k1)
{
#pragma unroll
    for (int t = 0; t < 4; t++) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = t >> 1, j = 2 * (t & 1) + h;
            const int v = acc[t][2 * h + 1] * k1 + acc[t][2 * h];
            tot[t][2 * h] = fmaf(S.s[c][j], fmaf(-S.z[c][j], xs, (float)v), tot[t][2 * h]);
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[t][i] = 0;
    }
}

/* One 4-bit unit: both column blocks' words from the ring slot, the lane's digits and the unit's sum from the
 * converted stage (dig: the unit's 32 words). */
__device__ __forceinline__ void fi_unit(const uint32_t *words, const uint32_t *dig, int lane, const fi_lane &K,
                                        int (&acc)[4][4], float &xs)
{
    const uint4 v0 = *(const uint4 *)(words + lane * 4), v1 = *(const uint4 *)(words + 128 + lane * 4);
    const uint32_t w[2][4] = {{v0.x, v0.y, v0.z, v0.w}, {v1.x, v1.y, v1.z, v1.w}};
    const uint32_t b0 = K.ones ? 0x01010101u : dig[K.boff], b1 = K.ones ? 0x01010101u : dig[16 + K.boff];
    xs += __uint_as_float(dig[FI_WORD_SUM]);
#pragma unroll
    for (int c = 0; c < 2; c++)
#pragma unroll
        for (int ct = 0; ct < 2; ct++) {
            const uint32_t k0 = w[c][2 * ct], k1 = w[c][2 * ct + 1];
            imma_16832(acc[2 * c + ct], k0 & 0x0f0f0f0fu, k0 & 0xf0f0f0f0u, k1 & 0x0f0f0f0fu, k1 & 0xf0f0f0f0u, b0, b1);
        }
}

/* fg_run for a run of 4-bit units [ra, rb) at one row on integer tensor cores: the same ring, its groups flushed
 * into tot as they end, every FI_FLUSH_UNITS units and at the end of the run. dig: the block's converted stage. */
template <bool GPTQ>
__device__ __forceinline__ void fi_run(const tsr_linear_dev &L, const fg_warp &W, int ra, int rb, bool issued,
                                       const uint32_t *dig, const fi_lane &K, float (&tot)[4][4])
{
    int acc[4][4] = {};
    fi_scales S = {};
    float xs = 0.0f;
    int cur = -1, since = 0;
    fg_walk<4>(W, ra, rb, issued, [&](const uint32_t *slot, int uu, int i) {
        const int grp = (int)(W.meta[i - W.wa].y & 0xffffffu);
        if (grp != cur || since == FI_FLUSH_UNITS) {
            if (cur >= 0) fi_flush(acc, tot, S, xs, K.k1);
            xs = 0.0f, since = 0;
            if (grp != cur)
                fi_group<GPTQ>(slot + FG_SLOT_WORDS + uu * FG_HDR_WORDS, L.zero_add, W.scratch, W.lane, K, S);
            cur = grp;
        }
        fi_unit(slot + uu * 2 * 32 * 4, dig + (i - W.u0) * 32, W.lane, K, acc, xs);
        since++;
    });
    if (cur >= 0) fi_flush(acc, tot, S, xs, K.k1);
}

#endif
