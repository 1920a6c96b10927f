/* Prefill attention on Hopper's warpgroup tensor cores (wgmma, code for sm_90a), for fp16 KV caches at head sizes 64
 * and 128: the flash-attention scheme of attention_prefill.cu with each product issued by a whole warpgroup.
 *
 * One block of two warpgroups takes 128 consecutive query rows of one sequence and one head, 64 rows per warpgroup.
 * The block writes its queries, scaled, as fp16 into shared memory in the 128-byte swizzle that wgmma reads
 * (wgmma.cuh). It walks the rows' visible positions in tiles of BKV; the K and V rows of each tile are copied by
 * cp.async into the same swizzle, the next tile's copies in flight while the current one is used. The copies take
 * each row's cache slot from a small table in shared memory (srow) that the block's first BKV threads fill one tile
 * ahead, a page-table read each, issued at the start of an iteration and stored at its end: the page arithmetic
 * and the table's round trips are off the copies' path (measured against every thread reading the table for its own
 * rows: 126 -> 110 us per layer of the 8B model's 2048-token prefill; NOTES.md, stop 41).
 *
 * Per tile a warpgroup computes S = Q·Kᵀ (64 × BKV, fp32, D / 16 wgmma's with both operands in shared memory),
 * masks it, folds it into the per-row online softmax (running max in fp32, exp2 with log2 e folded in;
 * probabilities rounded to fp16 as attention_prefill.cu does), rescales its output accumulators and adds P·V (BKV / 16
 * wgmma's with P from registers, V in shared memory read transposed). Each row's sum of the rounded probabilities
 * comes from the tensor cores too, as the product of P with a column of ones (m64n8k16 beside each P·V step), so
 * the weights sum to one exactly as applied. The accumulator layouts of S and O are the mma.m16n8k16 layouts of
 * attention_prefill.cu's warps stacked four deep, so the masking, softmax and output code is that kernel's with one
 * m-tile. A warpgroup skips the tiles wholly outside its rows' causal or sliding-window span. Grid, row masks and
 * output as attention_prefill.cu's (x = head, y = sequence × query tile, the last tiles first; surplus tiles return
 * at once).
 *
 * tsr_cuda_fa_wgmma takes a batch where the device runs this file's sm_90a code (a probe kernel tells, once), the
 * shared memory fits and TSR_CUDA_FA_WGMMA is not 0; otherwise the caller runs the mma.sync kernel. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

#include <math.h>
#include <stdlib.h>

#define FW_WGS     2 /* warpgroups per block */
#define FW_THREADS (FW_WGS * 128)
#define FW_BQ      (FW_WGS * 64) /* query rows per block */
#define FW_ONES    256 /* bytes of fp16 ones: the B operand whose product with P gives each row's sum */

/* Shared memory: two stages of K and V tiles and each warpgroup's queries, all 1024-byte aligned (+1 KB to align the
 * start), then the ones and two tiles' row slots. */
static size_t fw_smem_bytes(int D, int BKV)
{
    return (size_t)(2 * 2 * BKV + FW_BQ) * D * sizeof(__half) + FW_ONES + 2 * BKV * sizeof(int32_t) + 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* S (64 × BKV positions, fp32) = the warpgroup's queries at q_at · Kᵀ of the tile at k_at. */
template <int D, int BKV> __device__ __forceinline__ void fw_scores(float (&s)[BKV / 2], uint32_t q_at, uint32_t k_at)
{
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const uint64_t da = wg_desc(q_at + (ks >> 2) * (64 * 128) + (ks & 3) * 32, 0);
        const uint64_t db = wg_desc(k_at + (ks >> 2) * (BKV * 128) + (ks & 3) * 32, 0);
        if constexpr (BKV == 64)
            wg_mma_ss64(s, da, db, ks > 0);
        else
            wg_mma_ss128(s, da, db, ks > 0);
    }
}

/* Masks the scores of positions t0 .. t0 + 8 NB - 1 where the tile reaches past the thread's first row or a window
 * is in force, folds them into the rows' running maxima (factor: what the rows' earlier sums and outputs are to be
 * multiplied by) and rounds their probabilities to fp16 A operands; returns whether any of the thread's maxima
 * moved. The 4 lanes of a row group hold a row's scores. */
template <int NB>
__device__ __forceinline__ bool fw_softmax(float (&s)[4 * NB], uint32_t (&pa)[NB][2], float (&m_run)[2],
                                           float (&factor)[2], int t0, const int (&pos)[2], const int (&lo)[2],
                                           const bool (&ok)[2], bool window, int t4)
{
    if (window || !ok[1] || t0 + 8 * NB - 1 > pos[0]) {
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int i = j >> 1, t = t0 + n * 8 + 2 * t4 + (j & 1);
                if (!ok[i] || t > pos[i] || t < lo[i]) s[4 * n + j] = -INFINITY;
            }
    }
    bool moved = false;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NB; n++) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * i], s[4 * n + 2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[i], mx);
        const float m_sub = m_new == -INFINITY ? 0.0f : m_new * FA_LOG2E;
        factor[i] = fa_exp2(m_run[i] * FA_LOG2E - m_sub);
        moved |= factor[i] != 1.0f;
#pragma unroll
        for (int n = 0; n < NB; n++) {
            const float p0 = fa_exp2(fmaf(s[4 * n + 2 * i], FA_LOG2E, -m_sub));
            const float p1 = fa_exp2(fmaf(s[4 * n + 2 * i + 1], FA_LOG2E, -m_sub));
            pa[n][i] = h2_bits(__floats2half2_rn(p0, p1));
        }
        m_run[i] = m_new;
    }
    return moved;
}

/* K/V rows of a tile by slot: srow[r] = the cache slot (page · page_size + offset) of position t0 + r, -1 for r >= n.
 * The copies then need no page-table arithmetic: each of the block's threads copies 16-byte column c8 of every
 * RSTEP-th row, K and V, into the tiles' 128-byte swizzle, zeros for rows past n. */
template <int D, int BKV>
__device__ __forceinline__ void fw_copy(unsigned char *ks, unsigned char *vs, const __half *kh, const __half *vh,
                                        const int32_t *srow, int width)
{
    constexpr int VEC = D / 8, RSTEP = FW_THREADS / VEC;
    const int c8 = (int)(threadIdx.x % VEC) * 8, rt = (int)(threadIdx.x / VEC);
#pragma unroll
    for (int r = rt; r < BKV; r += RSTEP) {
        const int idx = srow[r];
        const size_t off = idx >= 0 ? (size_t)idx * width + c8 : 0;
        const uint32_t at = wg_swz(r, c8 / 8, BKV);
        cp_async16_zfill(ks + at, kh + off, idx >= 0);
        cp_async16_zfill(vs + at, vh + off, idx >= 0);
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

/* The output accumulators and row sums times the rows' factors. */
template <int D> __device__ __forceinline__ void fw_rescale(float (&o)[D / 2], float (&lsum)[4], const float (&f)[2])
{
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        o[4 * n] *= f[0], o[4 * n + 1] *= f[0];
        o[4 * n + 2] *= f[1], o[4 * n + 3] *= f[1];
    }
    lsum[0] *= f[0], lsum[1] *= f[0], lsum[2] *= f[1], lsum[3] *= f[1];
}

/* O += P · V and the row sums += P · 1 over the NB 8-position blocks of P, V the tile at v_at (sixteen positions are
 * 2048 bytes apart). */
template <int D, int BKV, int NB>
__device__ __forceinline__ void fw_pv(float (&o)[D / 2], float (&lsum)[4], const uint32_t (&pa)[NB][2], uint32_t v_at,
                                      uint64_t ones)
{
#pragma unroll
    for (int kk = 0; kk < NB / 2; kk++) {
        const uint32_t pf[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1]};
        const uint64_t dv = wg_desc(v_at + kk * 2048, BKV * 128);
        if constexpr (D == 128)
            wg_mma_rs128(o, pf, dv, 1);
        else
            wg_mma_rs64(o, pf, dv, 1);
        wg_mma_rs8(lsum, pf, ones);
    }
}
#endif

template <int D, int BKV>
__global__ void __launch_bounds__(FW_THREADS, BKV == 64 ? 2 : 1)
    fa_wgmma_kernel(tsr_batch_layout b, tsr_attn_args a, const __half *kc, const __half *vc, int page_size,
                    const float *q, float *out, int q_tiles)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int NS = BKV / 8;
    constexpr uint32_t TILE = BKV * D * sizeof(__half), QT = 64 * D * sizeof(__half);
    extern __shared__ __align__(1024) unsigned char fw_smem[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(fw_smem), pad = (1024 - (raw & 1023)) & 1023;
    unsigned char *smem = fw_smem + pad; /* [stage][K, V][TILE], [warpgroup][QT], ones, srow */
    const uint32_t sbase = raw + pad;

    const int h = blockIdx.x, seq = blockIdx.y / q_tiles, tile = q_tiles - 1 - (int)(blockIdx.y % q_tiles);
    const int r0 = b.seq_row0[seq] + tile * FW_BQ, r_end = b.seq_row0[seq + 1];
    if (r0 >= r_end) return;
    const int n_q = min(FW_BQ, r_end - r0);
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              t4 = lane & 3;
    const int kvh = h / (a.n_heads / a.n_kv_heads), width = a.n_kv_heads * D;
    const int p_first = b.positions[r0], p_last = p_first + n_q - 1;
    const int lo_first = a.window > 0 && p_first - a.window + 1 > 0 ? p_first - a.window + 1 : 0;
    const int32_t *table = b.page_tables + (size_t)seq * b.max_pages;

    const int n_tiles = (p_last - lo_first) / BKV + 1;
    int32_t *srow = (int32_t *)(smem + 4 * TILE + FW_WGS * QT + FW_ONES); /* [2][BKV]: tiles 0, 1, then by parity */
    const __half *kh = kc + (size_t)kvh * D, *vh = vc + (size_t)kvh * D;
    if (threadIdx.x < BKV)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int t = lo_first + j * BKV + (int)threadIdx.x, pg = t / page_size;
            srow[j * BKV + threadIdx.x] = t <= p_last ? table[pg] * page_size + t - pg * page_size : -1;
        }
    __syncthreads();
    fw_copy<D, BKV>(smem, smem + TILE, kh, vh, srow, width);
    /* the block's queries, scaled, as fp16 (zeros past the sequence's rows), and the ones; made visible to the tensor
     * cores by the loop's first proxy fence and barrier */
    for (int i = threadIdx.x; i < FW_BQ * D / 4; i += FW_THREADS) {
        const int row = i / (D / 4), c4 = i % (D / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < n_q) v = *(const float4 *)(q + ((size_t)(r0 + row) * a.n_heads + h) * D + 4 * c4);
        uint2 hv;
        hv.x = h2_bits(__floats2half2_rn(v.x * a.scale, v.y * a.scale));
        hv.y = h2_bits(__floats2half2_rn(v.z * a.scale, v.w * a.scale));
        *(uint2 *)(smem + 4 * TILE + (row >> 6) * QT + wg_swz(row & 63, c4 >> 1, 64) + (c4 & 1) * 8) = hv;
    }
    if (threadIdx.x < FW_ONES / 4) ((uint32_t *)(smem + 4 * TILE + FW_WGS * QT))[threadIdx.x] = 0x3c003c00u;
    const uint64_t ones = wg_desc_plain(sbase + 4 * TILE + FW_WGS * QT, 128, 128);

    /* this thread's rows (g and g + 8 of its warp's 16): position, first visible position, validity */
    int pos[2], lo[2];
    bool ok[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = wg * 64 + warp * 16 + g + 8 * i;
        ok[i] = row < n_q;
        pos[i] = p_first + row;
        lo[i] = a.window > 0 && pos[i] - a.window + 1 > 0 ? pos[i] - a.window + 1 : 0;
    }
    /* the warpgroup's visible span: from its first row's window start to its last row's position */
    const int wg_first = p_first + wg * 64, wg_hi = min(p_last, wg_first + 63);
    const int wg_lo = a.window > 0 && wg_first - a.window + 1 > 0 ? wg_first - a.window + 1 : 0;
    const bool wg_rows = wg * 64 < n_q;
    const uint32_t q_at = sbase + 4 * TILE + wg * QT;

    float o[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
    /* per row: the running maximum, and (lsum, the tensor cores' product of P with ones: every column of a row
     * holds its sum) the running sum of the rounded probabilities */
    float m_run[2] = {-INFINITY, -INFINITY}, lsum[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    for (int it = 0; it < n_tiles; it++) {
        const int kv0 = lo_first + it * BKV;
        const uint32_t k_at = sbase + (it & 1) * 2 * TILE, v_at = k_at + TILE;
        if (it + 1 < n_tiles) {
            unsigned char *nk = smem + ((it + 1) & 1) * 2 * TILE;
            fw_copy<D, BKV>(nk, nk + TILE, kh, vh, srow + ((it + 1) & 1) * BKV, width);
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        wg_fence_smem();
        __syncthreads();
        /* the page-table entry of this thread's row of tile it + 2: read now, its slot stored at the end (the slots of
         * tile it, which the same place held, were read by the copies before this iteration's barrier) */
        int32_t e2 = -1, sl2 = 0;
        if (threadIdx.x < BKV) {
            const int t = kv0 + 2 * BKV + (int)threadIdx.x, pg = t / page_size;
            sl2 = t - pg * page_size;
            if (t <= p_last) e2 = table[pg];
        }

        if (wg_rows && kv0 <= wg_hi && kv0 + BKV - 1 >= wg_lo) {
            float s[BKV / 2];
            uint32_t pa[NS][2];
            float factor[2];
            wg_arrive();
            fw_scores<D, BKV>(s, q_at, k_at);
            wg_commit();
            wg_wait<0>();
            wg_keep(s);
            const bool moved = fw_softmax<NS>(s, pa, m_run, factor, kv0, pos, lo, ok, a.window > 0, t4);
            if (__any_sync(0xffffffffu, moved)) fw_rescale<D>(o, lsum, factor);
            wg_arrive();
            fw_pv<D, BKV, NS>(o, lsum, pa, v_at, ones);
            wg_commit();
            wg_wait<0>();
            wg_keep(o);
            wg_keep(lsum);
        }
        if (threadIdx.x < BKV) srow[(it & 1) * BKV + threadIdx.x] = e2 >= 0 ? e2 * page_size + sl2 : -1;
        __syncthreads(); /* the stage read here is refilled next iteration */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!ok[i]) continue;
        const float l = lsum[2 * i];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float *dst = out + ((size_t)(r0 + wg * 64 + warp * 16 + g + 8 * i) * a.n_heads + h) * D + 2 * t4;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *(float2 *)(dst + n * 8) = make_float2(o[4 * n + 2 * i] * inv, o[4 * n + 2 * i + 1] * inv);
    }
#endif
}

/* 1 where this build holds sm_90a code for the device (the wgmma kernels are empty otherwise). */
__device__ int fw_probe_flag;
__global__ void fw_probe_kernel(void)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    fw_probe_flag = 1;
#else
    fw_probe_flag = 0;
#endif
}

bool tsr_cuda_wgmma_code(void)
{
    static int avail = -1;
    if (avail >= 0) return avail > 0;
    if (!tsr_cuda_sm90()) return (avail = 0) > 0;
    cudaStreamCaptureStatus cap;
    if (cudaStreamIsCapturing(tsr_cuda_stream(), &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone)
        return false; /* settled at the next call outside a capture */
    int flag = 0;
    fw_probe_kernel<<<1, 1, 0, tsr_cuda_stream()>>>();
    if (cudaMemcpyFromSymbolAsync(&flag, fw_probe_flag, sizeof flag, 0, cudaMemcpyDeviceToHost, tsr_cuda_stream()) !=
            cudaSuccess ||
        cudaStreamSynchronize(tsr_cuda_stream()) != cudaSuccess) {
        cudaGetLastError();
        flag = 0;
    }
    avail = flag;
    return avail > 0;
}

/* Whether this kernel runs here: the wgmma code runs (tsr_cuda_wgmma_code) and TSR_CUDA_FA_WGMMA is not 0. */
static bool fw_available(void)
{
    static const bool off = tsr_cuda_env_off("TSR_CUDA_FA_WGMMA");
    return !off && tsr_cuda_wgmma_code();
}

template <int D, int BKV>
static void fw_launch(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                      float *out)
{
    const size_t smem = fw_smem_bytes(D, BKV);
    static bool configured = false;
    if (!configured) {
        tsr_cuda_allow_smem((const void *)fa_wgmma_kernel<D, BKV>, smem, "the wgmma prefill attention");
        configured = true;
    }
    /* the longest sequence has at most n_rows - (n_seqs - 1) rows */
    const int q_tiles = (b->n_rows - b->n_seqs + 1 + FW_BQ - 1) / FW_BQ;
    dim3 grid((unsigned)a->n_heads, (unsigned)(b->n_seqs * q_tiles));
    fa_wgmma_kernel<D, BKV><<<grid, FW_THREADS, smem, tsr_cuda_stream()>>>(
        *b, *a, (const __half *)kv->k[a->layer], (const __half *)kv->v[a->layer], kv->page_size, q, out, q_tiles);
    TSR_CUDA_LAUNCHED();
}

/* K/V tiles of 64 positions, or TSR_CUDA_FW_BKV=128 (measured against each other in NOTES.md); 0 where the shared
 * memory of neither fits. */
static int fw_tile_positions(int D)
{
    static const int optin = tsr_cuda_smem_block();
    static const int want = getenv("TSR_CUDA_FW_BKV") && atoi(getenv("TSR_CUDA_FW_BKV")) == 128 ? 128 : 64;
    if (fw_smem_bytes(D, want) <= (size_t)optin) return want;
    return fw_smem_bytes(D, 64) <= (size_t)optin ? 64 : 0;
}

int tsr_cuda_fa_wgmma(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                      float *out)
{
    if (kv->dtype != TSR_F16 || a->n_heads % a->n_kv_heads) return 0;
    if (a->head_dim != 64 && a->head_dim != 128) return 0;
    if (!fw_available()) return 0;
    const int bkv = fw_tile_positions(a->head_dim);
    if (!bkv) return 0;
    if (a->head_dim == 64)
        bkv == 128 ? fw_launch<64, 128>(b, a, kv, q, out) : fw_launch<64, 64>(b, a, kv, q, out);
    else
        bkv == 128 ? fw_launch<128, 128>(b, a, kv, q, out) : fw_launch<128, 64>(b, a, kv, q, out);
    return 1;
}
