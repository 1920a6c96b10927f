/* Tensor-core and async-copy primitives shared by the CUDA kernels, as thin inline-PTX wrappers.
 *
 * mma_16816: D += A · B for one m16n8k16 tile (fp16 operands, fp32 accumulators), in the register layout of the
 * PTX ISA ("Matrix fragments for mma.m16n8k16"): lane l holds A rows l/4 and l/4 + 8, B column l/4, and C/D rows
 * l/4, l/4 + 8 at columns 2 (l % 4) and 2 (l % 4) + 1. ldsm_x4 / ldsm_x4_t load four 8 × 8 fp16 matrices from
 * shared memory (lane l gives the address of row l % 8 of matrix l / 8), plain or transposed, straight into those
 * operand layouts. cp_async16_zfill copies 16 bytes global → shared without the registers, or writes zeros when
 * `valid` is false. h2_bits / bits_h2 view a half2 as the 32-bit register an operand takes, and back. fa_exp2 and
 * FA_LOG2E serve the flash-attention kernels' softmax (attention_prefill.cu, attention_prefill_wgmma.cu). */
#ifndef TSR_CUDA_MMA_CUH
#define TSR_CUDA_MMA_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#define FA_LOG2E 1.4426950408889634f

/* 2^x by the hardware's approximation alone: exp2f adds a range check and two multiplies per call for results
 * below 2^-126, which the probabilities' rounding to fp16 (and the output's rescale) cannot tell from 0 */
__device__ __forceinline__ float fa_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t h2_bits(__half2 h) { return *(uint32_t *)&h; }
__device__ __forceinline__ __half2 bits_h2(uint32_t u) { return *(__half2 *)&u; }

__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    /* not volatile: the compiler may interleave independent mma's */
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *smem_row)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *smem_row)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem_row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, bool valid)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}

#endif
