/* Bulk copies and transaction barriers of sm_90 (the tensor memory accelerator's 1-D form), as thin inline-PTX
 * wrappers.
 *
 * A bulk copy moves a contiguous piece of global memory (16-byte aligned, a multiple of 16 bytes) into shared
 * memory without any thread's registers; one thread issues it and it completes on an mbarrier in shared memory.
 * The usual ring: a "full" barrier per slot (count 1) that the producer arms with the bytes it expects
 * (mbar_expect_tx) before issuing the copies, and an "empty" barrier per slot (count: the consumer warps) on which
 * each consumer warp arrives once it has read the slot. Waiting is by phase parity: the k-th completion of a
 * barrier (k = 0, 1, ...) is awaited with parity k & 1.
 *
 * Only for device code compiled for sm_90 and later (callers guard with __CUDA_ARCH__ >= 900). */
#ifndef TSR_CUDA_BULK_CUH
#define TSR_CUDA_BULK_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

/* Makes initialized barriers visible to the copy engine; then a __syncthreads() before anyone uses them. */
__device__ __forceinline__ void mbar_init_fence(void)
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* The producer's arrival on a full barrier, announcing the bytes its copies will deliver. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     " selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}

/* bytes from global src to shared dst, completing on bar (which must expect them). */
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

#endif
#endif
