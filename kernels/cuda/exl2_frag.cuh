/* The device layout of EXL2 and GPTQ matrices: packed codes in the register order of tensor-core fragments.
 *
 * At model preparation (exl2_pack.cu) every quantized matrix is cut into units of 32 stored rows (the rows of a
 * unit share one group, hence one width and one scale row; a group's last unit may hold fewer real rows and is
 * padded, its padding rows carrying activation 0) and column blocks of 32. The b-bit codes of one (unit, column
 * block), 1024 of them, are stored as b 32-bit words per lane of a warp, arranged so that the lane's words decode
 * straight into its A operands of four mma.m16n8k16 instructions: two 16-column tiles (ct) × two 16-row steps (ks).
 *
 * Lane l (g = l / 4, c = 2 (l % 4)) holds 16 half2 registers p = 4 f + r for fragment f = 2 ct + ks, register r:
 * its two elements are A-row g + 8 (r & 1) (that is, column 32 cb + 16 ct + g + 8 (r & 1)) and A-columns (stored
 * rows of the unit) 16 ks + c + 8 (r >> 1) + e, e = 0 for the low half, 1 for the high half. Each element is a
 * b-bit field of its half-word: with 2, 4 and 8 bits, register p sits in word p / (16 / b) at bit b · (p % (16 / b));
 * with 3 and 5 bits likewise for p < 15, five or three fields per half filling 15 bits, and register 15 takes the
 * spare top bit of each half of the b words (frag_spare_bits); with 6 bits two fields per half (bits 0 and 6), and
 * registers 12-15 gather their codes from the spare bits 12-15 of the six words (frag_field6). (Codes split into a
 * low and a high plane, as before stop 21, took two masks and two FMAs per register.) Decoding masks a field in
 * place (after a shift by 8 or 4 for fields above bit 9) and ORs in the exponent 0x6400, which makes both halves the
 * fp16 value 1024 + field · 2^position; one HFMA2 scales that back and removes the offsets (frag_reg).
 *
 * Memory order: unit by unit (units[u].x is its first word), then column block (32 · b words each), then for
 * each lane its first nA = min(b, 4) words (b = 3: 2) contiguous, followed by the other b − nA words of all
 * lanes: every load of a warp is one contiguous 256-, 512- or 128-byte piece. */
#ifndef TSR_CUDA_EXL2_FRAG_CUH
#define TSR_CUDA_EXL2_FRAG_CUH

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/mma.cuh"

#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

/* Zero words after a matrix's last unit (one column block of width 8), so that a copy of a column-block pair whose
 * second block is past the matrix stays inside the allocation. */
#define FRAG_PAD_WORDS (32 * 8)

/* Words per lane loaded first (one vector load), and after them. */
__host__ __device__ constexpr int frag_na(int b) { return b >= 4 ? 4 : 2; }
__host__ __device__ constexpr int frag_nb(int b) { return b - frag_na(b); }

/* One load of a lane's words: streamed from global memory past L1 (STREAM), or plain (a copy in shared memory). */
template <bool STREAM, typename T> __device__ __forceinline__ T frag_ld(const T *p)
{
    if constexpr (STREAM)
        return __ldcs(p);
    else
        return *p;
}

/* The b words of one lane of the (unit, column block) whose words start at p: a vector load of the first nA words,
 * and of the rest. From global memory they are streamed once (STREAM), so they bypass L1. */
template <int B, bool STREAM> __device__ __forceinline__ void frag_words(const uint32_t *p, int lane, uint32_t (&w)[B])
{
    const uint32_t *a = p + (size_t)lane * frag_na(B);
    if constexpr (frag_na(B) == 4) {
        const uint4 v = frag_ld<STREAM>((const uint4 *)a);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
        const uint2 v = frag_ld<STREAM>((const uint2 *)a);
        w[0] = v.x, w[1] = v.y;
    }
    const uint32_t *b = p + 32 * frag_na(B) + (size_t)lane * frag_nb(B);
    if constexpr (frag_nb(B) == 4) {
        const uint4 v = frag_ld<STREAM>((const uint4 *)b);
        w[4] = v.x, w[5] = v.y, w[6] = v.z, w[7] = v.w;
    } else if constexpr (frag_nb(B) == 2) {
        const uint2 v = frag_ld<STREAM>((const uint2 *)b);
        w[frag_na(B)] = v.x, w[frag_na(B) + 1] = v.y;
    } else if constexpr (frag_nb(B) == 1) {
        w[frag_na(B)] = frag_ld<STREAM>(b);
    }
}

/* (a & MASK) | 0x64006400 in one LOP3 (C would split it in two: one immediate per instruction). */
template <uint32_t MASK> __device__ __forceinline__ uint32_t and_exp(uint32_t a)
{
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "n"(MASK), "n"(0x64006400u));
    return d;
}

/* Scales and zero points of one column block for a lane: s[j] for columns 32 cb + 8 j + g (j = 2 ct + h); GPTQ
 * also keeps, per column, the two fp16 constants that subtract its zero point from a code masked at bit 0 or 4:
 * zc[j][0] = −(1024 + zero), zc[j][1] = −(64 + zero). h[j]: s[j] in both fp16 halves, where a kernel multiplies
 * the scales into its A operands (the GEMV's FOLD) instead of into fp32 sums per group. */
struct frag_scales {
    float s[4];
    float z[4]; /* GPTQ's zero points (code + zero_add), for the integer path (gemv_imma.cuh); EXL2: unset */
    __half2 zc[4][2];
    __half2 h[4];
};

/* Where register p of FB-bit fields sits (FB = 2, 4, 8, and 3 or 5 for p < 15): word p / (16 / FB), and bit
 * position after an optional shift by 8 that keeps (field << position) below 1024, so that
 * 0x6400 | (field << position) is the fp16 value 1024 + field · 2^position exactly. */
template <int FB, int P> struct frag_field {
    static constexpr int per = 16 / FB, word = P / per, pos = FB * (P % per), shift = pos + FB > 10 ? 8 : 0,
                         at = pos - shift;
    static constexpr uint32_t mask = (((1u << FB) - 1u) * 0x10001u) << at;
};

/* 3 and 5 bits, whose 16 / b fields per half-word fill 15 bits: registers 0-14 as frag_field, register 15 in the
 * spare top bit of each half of the b words. */
__host__ __device__ constexpr bool frag_spare15(int b) { return b == 3 || b == 5; }

/* Register 15 of a 3- or 5-bit layout: its code bits gathered from bit 15 of each half of the B words (code bit i
 * in word i), at bit 0. */
template <int B> __device__ __forceinline__ uint32_t frag_spare_bits(const uint32_t (&w)[B])
{
    uint32_t r = 0x64006400u;
#pragma unroll
    for (int i = 0; i < B; i++) r |= (w[i] >> (15 - i)) & (0x10001u << i);
    return r;
}

/* Register P of the 6-bit layout: P < 12 is field P % 2 of word P / 2 (bits 0 and 6 of each half, the second
 * reached by a shift by 4); registers 12 + m take their low 4 bits from bits 12-15 of word m and their high 2 bits
 * from bits 12 + 2 (m % 2) of word 4 + m / 2, each half alike. Returns the fp16 pattern 1024 + code · 2^at | 0x6400
 * in both halves (at: 2 for the second field, else 0). */
template <int P> __device__ __forceinline__ uint32_t frag_field6(const uint32_t (&w)[6])
{
    if constexpr (P < 12) {
        return (P & 1) ? and_exp<(63u * 0x10001u) << 2>(w[P / 2] >> 4) : and_exp<63u * 0x10001u>(w[P / 2]);
    } else {
        constexpr int m = P - 12;
        return and_exp<0x000f000fu>(w[m] >> 12) | ((w[4 + m / 2] >> (8 + 2 * (m & 1))) & 0x00300030u);
    }
}

/* Register P (A-row h = P & 1) of the lane's words as code − zero in fp16, exact: the field(s) masked in place and
 * scaled back by FMA with constants that also remove the 1024 offsets and the zero point (all exact in fp16). */
template <int B, bool GPTQ, int P>
__device__ __forceinline__ uint32_t frag_reg(const uint32_t (&w)[B], const __half2 (&zc)[2])
{
    if constexpr (B == 6) { /* EXL2 only: zero point 32 */
        constexpr int at = P < 12 && (P & 1) ? 2 : 0;
        return h2_bits(__hfma2(bits_h2(frag_field6<P>(w)), __float2half2_rn(1.0f / (float)(1 << at)),
                               __float2half2_rn(-(1024.0f / (float)(1 << at) + 32.0f))));
    } else if constexpr (frag_spare15(B) && P == 15) { /* EXL2 only (GPTQ is 4-bit): zero point 2^(B - 1) */
        return h2_bits(__hadd2(bits_h2(frag_spare_bits<B>(w)), __float2half2_rn(-(1024.0f + (float)(1 << (B - 1))))));
    } else { /* 16 / B fields per half-word */
        using L = frag_field<B, P>;
        const uint32_t r = and_exp<L::mask>(L::shift ? w[L::word] >> 8 : w[L::word]);
        const __half2 c = GPTQ ? zc[L::at ? 1 : 0]
                               : __float2half2_rn(-(1024.0f / (float)(1 << L::at) + (float)(1 << (B - 1))));
        return h2_bits(__hfma2(bits_h2(r), __float2half2_rn(1.0f / (float)(1 << L::at)), c));
    }
}

/* The A operand (4 registers) of fragment F = 2 ct + ks: codes minus the zero point, exact in fp16. */
template <int B, bool GPTQ, int F>
__device__ __forceinline__ void frag_a(const uint32_t (&w)[B], const frag_scales &sc, uint32_t (&a)[4])
{
    constexpr int j0 = 2 * (F >> 1); /* column index j of A-row g; A-row g + 8 is j0 + 1 */
    a[0] = frag_reg<B, GPTQ, 4 * F + 0>(w, sc.zc[j0]);
    a[1] = frag_reg<B, GPTQ, 4 * F + 1>(w, sc.zc[j0 + 1]);
    a[2] = frag_reg<B, GPTQ, 4 * F + 2>(w, sc.zc[j0]);
    a[3] = frag_reg<B, GPTQ, 4 * F + 3>(w, sc.zc[j0 + 1]);
}

/* Scales and zero points of one column block: nibble g of code word j is column 8 j + g's code; tab: GPTQ, the
 * block's 32 fp16 scales, EXL2, the group's 16-entry scale table in fp32 (frag_group_params and the GEMV's ring
 * header). */
__device__ __forceinline__ void frag_scales_decode(uint4 q, const void *tab, bool gptq, int zero_add, int g,
                                                   frag_scales &out)
{
    const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int code = (int)((wq[j] >> (4 * g)) & 0xfu);
        if (gptq) {
            const float zero = (float)(code + zero_add);
            out.z[j] = zero;
            out.s[j] = __half2float(((const __half *)tab)[8 * j + g]);
            out.zc[j][0] = __float2half2_rn(-(1024.0f + zero));
            out.zc[j][1] = __float2half2_rn(-(64.0f + zero));
        } else {
            out.s[j] = ((const float *)tab)[code];
            out.zc[j][0] = out.zc[j][1] = __float2half2_rn(0.0f);
        }
    }
}

/* Scales (fp16-rounded, as ExLlamaV2 evaluates them) and zero points of group grp for the four columns a lane
 * owns in column block cb: columns 32 cb + 8 j + g, j = 2 ct + h. EXL2: 4-bit scale codes, 8 per word, so the
 * four columns sit in nibble g of four consecutive words, and the group's 16-entry scale table; GPTQ: the zero
 * codes laid out the same, and the fp16 scales. */
__device__ __forceinline__ void frag_group_params(const tsr_linear_dev &L, int grp, int cb, int g, frag_scales *out)
{
    const uint32_t *codes = L.gptq ? L.g_zeros : L.q_scale;
    const uint4 q = __ldg((const uint4 *)(codes + (size_t)grp * (L.Npad / 8) + 4 * cb));
    const void *tab = L.gptq ? (const void *)(L.g_scales + (size_t)grp * L.Npad + 32 * cb)
                             : (const void *)(L.s_table + (size_t)grp * 16);
    frag_scales_decode(q, tab, L.gptq, L.zero_add, g, *out);
}

/* Calls f(std::integral_constant<int, B>{}) for a unit's width B = bits: 2, 3, 4, 5, 6, anything else 8. */
template <class F> __device__ __forceinline__ void frag_with_width(int bits, F &&f)
{
    switch (bits) {
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    case 5: f(std::integral_constant<int, 5>{}); break;
    case 6: f(std::integral_constant<int, 6>{}); break;
    default: f(std::integral_constant<int, 8>{}); break;
    }
}

#endif
