/* Copying a tile of K/V rows from the paged fp16 cache into shared memory, shared by the prefill and decode
 * attention kernels (attention_prefill.cu, attention_decode.cu).
 *
 * Positions t0 .. t0 + ROWS - 1 of KV head kvh are found through the sequence's page table (position t lives in
 * page table[t / page_size], slot t % page_size, rows `width` halves apart) and copied by cp.async, 16 bytes per
 * request, into [ROWS][D + 8] tiles (rows padded by 16 bytes so that the eight rows an ldmatrix or a vector load
 * reads fall in different banks). Rows r >= n are written as zeros and read nothing. The NT threads of the block
 * share the requests; the call commits them as one cp.async group, which the caller waits for. r0 and r1 restrict
 * the call to rows r0 .. r1 - 1 (decode attention copies the rows of earlier steps before its programmatic-launch
 * wait and the rest after it). */
#ifndef TSR_CUDA_KV_TILE_CUH
#define TSR_CUDA_KV_TILE_CUH

#include "kernels/cuda/mma.cuh"

template <int D, int ROWS, int NT>
__device__ __forceinline__ void kv_tile_gather(__half *ks, __half *vs, const __half *kc, const __half *vc,
                                               const int32_t *table, int page_size, int width, int kvh, int t0, int n,
                                               int r0 = 0, int r1 = ROWS)
{
    constexpr int DP = D + 8, VEC = D / 8;
    const __half *kh = kc + (size_t)kvh * D, *vh = vc + (size_t)kvh * D;
    /* a thread copies one 16-byte column of every RSTEP-th row: its page and slot advance by RSTEP rows per pass,
     * so one division finds them (dividing per request was a third of the prefill kernel's instructions: ncu,
     * NOTES.md stop 25) */
    static_assert(NT % VEC == 0, "each thread keeps one column of the tile");
    constexpr int RSTEP = NT / VEC;
    const int c8 = (int)(threadIdx.x % VEC) * 8;
    int r = r0 + (int)(threadIdx.x / VEC), pg = (t0 + r) / page_size, slot = t0 + r - pg * page_size;
    for (; r < r1; r += RSTEP) {
        const bool ok = r < n;
        const size_t off = ok ? ((size_t)table[pg] * page_size + slot) * width + c8 : 0;
        cp_async16_zfill(ks + r * DP + c8, kh + off, ok);
        cp_async16_zfill(vs + r * DP + c8, vh + off, ok);
        for (slot += RSTEP; slot >= page_size; slot -= page_size)
            pg++;
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

#endif
