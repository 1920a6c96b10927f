/* Vector values for the CPU kernels: VF floats (or 32-bit words) as one value, one vector register of the target
 * (GCC and Clang vector extensions: 16 floats with AVX-512, 8 with AVX, 4 otherwise: SSE, NEON), so that sums held
 * in them stay in registers. Values wider than the target's registers spill: with 16-float values on AVX2 the EXL2
 * kernel ran slower than the scalar version it replaced (BENCHMARKS.md, CPU decode, stop 44). Loads and stores are
 * unaligned, through memcpy. Internal to kernels/cpu. */
#ifndef TSR_CPU_VEC_H
#define TSR_CPU_VEC_H

#include "runtime/half.h"

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VF 16
#elif defined(__AVX__)
#define VF 8
#else
#define VF 4
#endif

typedef float vf __attribute__((vector_size(VF * sizeof(float))));
typedef uint32_t vu __attribute__((vector_size(VF * sizeof(uint32_t))));
typedef int32_t vi __attribute__((vector_size(VF * sizeof(int32_t))));

/* Words below 2^31 as floats (one signed conversion instruction; exact for values of at most 24 significant
 * bits). */
static inline vf vu_to_vf(vu v) { return __builtin_convertvector((vi)v, vf); }

static inline vf vf_load(const float *p)
{
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void vf_store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vu vu_load(const uint32_t *p)
{
    vu v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Lane-wise select (m: all ones where a is wanted) and maximum. */
static inline vf vf_select(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }
static inline vf vf_max(vf a, vf b) { return vf_select(a > b, a, b); }

/* e^x in every lane, within about 2 ulp of expf for x in [-87, 88] (x is clamped there, so that very negative x give
 * about 1e-38 rather than 0): x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor series to r^7 (Horner), and
 * 2^n added to the exponent bits. */
static inline vf vf_exp(vf x)
{
    const vf lo = (vf){0} - 87.0f, hi = (vf){0} + 88.0f;
    x = vf_select(x < lo, lo, x);
    x = vf_select(x > hi, hi, x);
    const vf round = (vf){0} + 12582912.0f; /* 1.5 · 2^23: adding it rounds to an integer */
    const vf n = (x * 1.44269504088896341f + round) - round;
    const vf r = (x - n * 0.693359375f) - n * -2.12194440e-4f; /* ln 2 in two parts: the first exact in n · it */
    vf p = (vf){0} + (1.0f / 5040.0f);
    p = p * r + (1.0f / 720.0f);
    p = p * r + (1.0f / 120.0f);
    p = p * r + (1.0f / 24.0f);
    p = p * r + (1.0f / 6.0f);
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const vi e = __builtin_convertvector(n, vi) << 23;
    return (vf)((vi)p + e);
}

/* The sum of a value's lanes, in lane order. */
static inline float vf_sum(vf v)
{
    float s = 0.0f;
    for (int l = 0; l < VF; l++) s += v[l];
    return s;
}

/* VF_LANES(F, h) lists F(l, h) for every lane l, as the constant indices of __builtin_shufflevector. */
#define VF_L4(F, h, o) F((o), h), F((o) + 1, h), F((o) + 2, h), F((o) + 3, h)
#if VF == 16
#define VF_LANES(F, h) VF_L4(F, h, 0), VF_L4(F, h, 4), VF_L4(F, h, 8), VF_L4(F, h, 12)
#elif VF == 8
#define VF_LANES(F, h) VF_L4(F, h, 0), VF_L4(F, h, 4)
#else
#define VF_LANES(F, h) VF_L4(F, h, 0)
#endif

/* Folding two values a, b whose lanes form blocks of 2h, each block belonging to one sum: block m of the result's
 * blocks of h lanes is the folded block m / 2 of a (m even) or of b (m odd), folded meaning its two halves added. */
#define VF_FOLD_LO(l, h) ((((l) / (h)) & 1 ? VF : 0) + (l) / (h) / 2 * 2 * (h) + (l) % (h))
#define VF_FOLD_HI(l, h) (VF_FOLD_LO(l, h) + (h))
#define VF_FOLD(a, b, h)                                                                                               \
    (__builtin_shufflevector(a, b, VF_LANES(VF_FOLD_LO, h)) + __builtin_shufflevector(a, b, VF_LANES(VF_FOLD_HI, h)))
#define VF_XOR(l, h) ((l) ^ (h))

/* Lane u of the result is the sum of v[u]'s lanes, for VF values v[0 .. VF-1] (overwritten): log2(VF) rounds that
 * pair v[k] with v[k + h] and fold them, two shuffles and an add per pair, VF - 1 adds in all instead of the VF · (VF
 * - 1) scalar adds (in one dependent chain each) of VF calls of vf_sum. The order of the additions is fixed. */
static inline vf vf_sum_each(vf *v)
{
#if VF == 16
    for (int k = 0; k < 8; k++) v[k] = VF_FOLD(v[k], v[k + 8], 8);
#endif
#if VF >= 8
    for (int k = 0; k < 4; k++) v[k] = VF_FOLD(v[k], v[k + 4], 4);
#endif
    for (int k = 0; k < 2; k++) v[k] = VF_FOLD(v[k], v[k + 2], 2);
    return VF_FOLD(v[0], v[1], 1);
}

/* The largest lane (a butterfly: every lane ends with the maximum). */
static inline float vf_max_all(vf v)
{
#if VF == 16
    v = vf_max(v, __builtin_shufflevector(v, v, VF_LANES(VF_XOR, 8)));
#endif
#if VF >= 8
    v = vf_max(v, __builtin_shufflevector(v, v, VF_LANES(VF_XOR, 4)));
#endif
    v = vf_max(v, __builtin_shufflevector(v, v, VF_LANES(VF_XOR, 2)));
    v = vf_max(v, __builtin_shufflevector(v, v, VF_LANES(VF_XOR, 1)));
    return v[0];
}

/* The lane numbers 0, 1, ..., VF - 1. */
#define VF_ID(l, h) (l)
static inline vi vi_lanes(void) { return (vi){VF_LANES(VF_ID, 0)}; }

/* a · b over n floats in four vector sums, so that the multiply-adds' latency does not bound it; the order of the
 * additions depends only on n, so every row that goes through it gets the same arithmetic. */
static inline float vf_dot(const float *a, const float *b, int n)
{
    vf acc[4] = {{0}};
    int k = 0;
    for (; k + 4 * VF <= n; k += 4 * VF)
        for (int u = 0; u < 4; u++) acc[u] += vf_load(a + k + u * VF) * vf_load(b + k + u * VF);
    for (; k + VF <= n; k += VF) acc[0] += vf_load(a + k) * vf_load(b + k);
    float total = vf_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    for (; k < n; k++) total += a[k] * b[k];
    return total;
}

#endif
