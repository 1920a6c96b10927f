/* IEEE binary16 and bfloat16 conversions (round to nearest even, subnormals kept, no flush to zero).
 *
 * EXL2 scales must be rounded to fp16 exactly as ExLlamaV2 does (EXL2.md §6), so these are exact software
 * conversions, not approximations. Header-only so that every kernel can inline them. */
#ifndef TSR_HALF_H
#define TSR_HALF_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if (defined(__F16C__) || defined(__AVX512F__)) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

static inline float tsr_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t tsr_bits_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float tsr_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in fp32 */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    if (exp == 31) return tsr_f32_from_bits(sign | 0x7f800000u | (man << 13));
    return tsr_f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t tsr_float_to_half(float f)
{
    uint32_t u = tsr_bits_from_f32(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
    if (abs >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {
        /* result is subnormal or zero: value = abs * 2^24 rounded to an integer mantissa */
        float v = tsr_f32_from_bits(abs) * 16777216.0f; /* exact scaling by 2^24 */
        /* round half to even on the integer */
        uint32_t iv = (uint32_t)v;
        float frac = v - (float)iv;
        if (frac > 0.5f || (frac == 0.5f && (iv & 1u))) iv++;
        return (uint16_t)(sign | iv);
    }
    /* normal: drop 13 mantissa bits with round to nearest even */
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}

/* n fp16 values to fp32: sixteen at a time with AVX-512, eight with F16C, where the build targets them, else one at a
 * time; the conversion is exact either way (the same values as tsr_half_to_float). Whole 64-byte stores matter
 * where the floats are read back at once as 64-byte vectors: a load that spans two smaller stores still in the
 * store buffer waits for them to retire (the CPU attention's blocks of rows). */
static inline void tsr_halves_to_floats(const uint16_t *s, size_t n, float *dst)
{
    size_t k = 0;
#if defined(__AVX512F__) && !defined(__CUDACC__)
    for (; k + 16 <= n; k += 16)
        _mm512_storeu_ps(dst + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + k))));
#endif
#if defined(__F16C__) && !defined(__CUDACC__)
    for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + k))));
#endif
    for (; k < n; k++) dst[k] = tsr_half_to_float(s[k]);
}

/* Rounds an fp32 value to the nearest fp16 value, returned as fp32 (the h() of EXL2.md). */
static inline float tsr_round_half(float f) { return tsr_half_to_float(tsr_float_to_half(f)); }

static inline float tsr_bf16_to_float(uint16_t b) { return tsr_f32_from_bits((uint32_t)b << 16); }

static inline uint16_t tsr_float_to_bf16(float f)
{
    uint32_t u = tsr_bits_from_f32(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet nan */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
