/* The rotary embedding's arithmetic, shared by every kernel that rotates q or k (elementwise.cu's rope and
 * rope_store, kv_store_quant.cu's fused store): the angle's cos and sin with the sequence's attention factor, and the
 * rotation of one pair with its roundings spelled out (explicit fma and multiply intrinsics, which the compiler does
 * not contract on its own), so that all of them produce the same bits from the same input: a fused kernel's keys
 * quantize to the codes that rope, then kv_store give (test_cuda checks it byte for byte). */
#ifndef TSR_CUDA_ROPE_CUH
#define TSR_CUDA_ROPE_CUH

#include "kernels/ops.h"

/* cos and sin of rotary pair j (of half) of sequence seq at position pos, times the sequence's attention factor. */
__device__ __forceinline__ void tsr_rope_cos_sin(const tsr_batch_layout &b, int seq, int pos, int half, int j,
                                                 float &c, float &s)
{
    sincosf((float)pos * b.inv_freq[(size_t)seq * half + j], &s, &c);
    const float af = b.attn_factor[seq];
    c *= af, s *= af;
}

/* (x0, x1), elements j and j + half of a head, rotated by the angle whose cos and sin are c and s. */
__device__ __forceinline__ void tsr_rope_rotate(float x0, float x1, float c, float s, float &r0, float &r1)
{
    r0 = __fmaf_rn(x0, c, -__fmul_rn(x1, s));
    r1 = __fmaf_rn(x1, c, __fmul_rn(x0, s));
}

/* Rotary pair i of x ([n_rows][n_heads][head_dim], pairs numbered row by row, head by head) rotated in place: a
 * thread per pair, i below n_rows · n_heads · half. */
__device__ __forceinline__ void tsr_rope_pair(const tsr_batch_layout &b, float *x, int n_heads, int head_dim, int half,
                                              size_t i)
{
    const size_t per_row = (size_t)n_heads * half;
    const int row = (int)(i / per_row), h = (int)(i % per_row) / half, j = (int)(i % half);
    float c, s;
    tsr_rope_cos_sin(b, b.row_seq[row], b.positions[row], half, j, c, s);
    float *v = x + ((size_t)row * n_heads + h) * head_dim;
    tsr_rope_rotate(v[j], v[j + half], c, s, v[j], v[j + half]);
}

#endif
