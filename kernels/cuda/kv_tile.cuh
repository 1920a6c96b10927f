/* Copying a tile of K/V rows from the paged fp16 cache into shared memory, shared by the prefill and decode
 * attention kernels (attention_prefill.cu, attention_decode.cu).
 *
 * Positions t0 .. t0 + ROWS - 1 of KV head kvh are found through the sequence's page table (position t lives in
 * page table[t / page_size], slot t % page_size, rows `width` halves apart) and copied by cp.async, 16 bytes per
 * request, into [ROWS][D + 8] tiles (rows padded by 16 bytes so that the eight rows an ldmatrix or a vector load
 * reads fall in different banks). Rows r >= n are written as zeros and read nothing. The NT threads of the block
 * share the requests; the call commits them as one cp.async group, which the caller waits for.
 *
 * kv_tile_gather reads each row's table entry just before its copies. The decode kernel instead splits a gather in
 * two: kv_tile_pages reads the page-table entries of the thread's rows (all of them issued before any is used),
 * kv_tile_copy issues the copies with them, so that it can read the next round's entries while it computes on the
 * current one and no table round trip stands before its copies; kv_tile_copy's r0 and r1 restrict it to rows
 * r0 .. r1 - 1 (the decode kernel copies the rows of earlier steps before its programmatic-launch wait and the rest
 * after it). */
#ifndef TSR_CUDA_KV_TILE_CUH
#define TSR_CUDA_KV_TILE_CUH

#include "kernels/cuda/mma.cuh"

/* How the NT threads share a tile's requests: a thread copies one 16-byte column (c8) of rows rt + i · RSTEP,
 * i < NP, rt = threadIdx.x / VEC. Its page and slot advance by RSTEP positions from one of its rows to the next,
 * so one division finds them (dividing per request was a third of the prefill kernel's instructions: ncu,
 * NOTES.md stop 25). */
template <int D, int ROWS, int NT> struct kv_tile_share {
    static constexpr int VEC = D / 8, RSTEP = NT / VEC, NP = ROWS / RSTEP;
    static_assert(NT % VEC == 0 && ROWS % RSTEP == 0, "each thread keeps one column of the tile, NP rows of it");
};

/* Row r's 16-byte column c8 of K and of V at (page, slot) into the tiles, or zeros where !ok (page unread). */
template <int D>
__device__ __forceinline__ void kv_row_copy(__half *ks, __half *vs, const __half *kh, const __half *vh, int r, int c8,
                                            int page, int slot, int page_size, int width, bool ok)
{
    const size_t off = ok ? ((size_t)page * page_size + slot) * width + c8 : 0;
    cp_async16_zfill(ks + r * (D + 8) + c8, kh + off, ok);
    cp_async16_zfill(vs + r * (D + 8) + c8, vh + off, ok);
}

/* The page-table entries of the thread's rows of the tile at position t0 (0 for rows r >= n, never read). */
template <int D, int ROWS, int NT>
__device__ __forceinline__ void kv_tile_pages(const int32_t *table, int page_size, int t0, int n,
                                              int32_t (&pages)[kv_tile_share<D, ROWS, NT>::NP])
{
    using S = kv_tile_share<D, ROWS, NT>;
    const int rt = (int)(threadIdx.x / S::VEC);
    int idx[S::NP];
    int pg = (t0 + rt) / page_size, slot = t0 + rt - pg * page_size;
#pragma unroll
    for (int i = 0; i < S::NP; i++) {
        idx[i] = pg;
        for (slot += S::RSTEP; slot >= page_size; slot -= page_size) pg++;
    }
#pragma unroll
    for (int i = 0; i < S::NP; i++) pages[i] = rt + i * S::RSTEP < n ? table[idx[i]] : 0;
}

/* The copies of the tile at t0 for rows r0 .. r1 - 1, with the entries kv_tile_pages read for the same t0 and n;
 * commits them as one cp.async group. */
template <int D, int ROWS, int NT>
__device__ __forceinline__ void kv_tile_copy(__half *ks, __half *vs, const __half *kc, const __half *vc,
                                             const int32_t (&pages)[kv_tile_share<D, ROWS, NT>::NP], int page_size,
                                             int width, int kvh, int t0, int n, int r0 = 0, int r1 = ROWS)
{
    using S = kv_tile_share<D, ROWS, NT>;
    const __half *kh = kc + (size_t)kvh * D, *vh = vc + (size_t)kvh * D;
    const int c8 = (int)(threadIdx.x % S::VEC) * 8, rt = (int)(threadIdx.x / S::VEC);
    int slot = (t0 + rt) % page_size;
#pragma unroll
    for (int i = 0; i < S::NP; i++) {
        const int r = rt + i * S::RSTEP;
        if (r >= r0 && r < r1) kv_row_copy<D>(ks, vs, kh, vh, r, c8, pages[i], slot, page_size, width, r < n);
        slot += S::RSTEP;
        while (slot >= page_size) slot -= page_size;
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

/* One tile without look-ahead, a table read before each row's copies (the prefill kernel, at 255 registers, spilled
 * more when it held a tile's NP entries at once: stop 40, 32K-token prefill -4.5 %). */
template <int D, int ROWS, int NT>
__device__ __forceinline__ void kv_tile_gather(__half *ks, __half *vs, const __half *kc, const __half *vc,
                                               const int32_t *table, int page_size, int width, int kvh, int t0, int n)
{
    using S = kv_tile_share<D, ROWS, NT>;
    const __half *kh = kc + (size_t)kvh * D, *vh = vc + (size_t)kvh * D;
    const int c8 = (int)(threadIdx.x % S::VEC) * 8;
    int r = (int)(threadIdx.x / S::VEC), pg = (t0 + r) / page_size, slot = t0 + r - pg * page_size;
    for (; r < ROWS; r += S::RSTEP) {
        const bool ok = r < n;
        kv_row_copy<D>(ks, vs, kh, vh, r, c8, ok ? table[pg] : 0, slot, page_size, width, ok);
        for (slot += S::RSTEP; slot >= page_size; slot -= page_size) pg++;
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

#endif
