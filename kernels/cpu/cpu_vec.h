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

/* e^x in every lane, within about 2 ulp of expf for x in [-87, 88] (x is clamped there, so that very negative x give
 * about 1e-38 rather than 0): x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor series to r^7 (Horner), and
 * 2^n added to the exponent bits. */
static inline vf vf_exp(vf x)
{
    const vf lo = (vf){0} - 87.0f, hi = (vf){0} + 88.0f;
    vi m = x < lo; /* lanes all ones where true */
    x = (vf)(((vi)lo & m) | ((vi)x & ~m));
    m = x > hi;
    x = (vf)(((vi)hi & m) | ((vi)x & ~m));
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
