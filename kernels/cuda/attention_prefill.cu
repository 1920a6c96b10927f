/* Prefill attention on tensor cores, for fp16 KV caches: the flash-attention scheme on mma.sync m16n8k16.
 *
 * One block of four warps takes 128 consecutive query rows of one sequence and one head; each warp owns 32 rows as
 * two m-tiles of 16 (FA_MT), as FlashAttention 2 lays out head size 128: every K or V fragment a warp loads from
 * shared memory feeds both m-tiles, so there are two independent accumulator chains per fragment. The block first
 * writes its queries, scaled, as fp16 rows into shared memory, from which each warp reads its A operands by
 * ldmatrix per pair of k-steps; it keeps the 16 × 64 scores of each m-tile for the current K/V tile and the fp32
 * output accumulators in registers. The block walks the rows' visible positions in tiles of 64 (32 where a block
 * may not have the 104 KB of shared memory that takes at head size 128: sm_86, sm_89); each tile's K and V rows are
 * gathered through the page table into shared memory by cp.async, the next tile's copies in flight while
 * the current one is used. Per tile a warp computes S = Q·Kᵀ (K as B operands through ldmatrix), folds S into a
 * per-row online softmax (running max and sum in fp32, exp2 with log2 e folded in), rounds the probabilities P to
 * fp16 (as FlashAttention and ExLlamaV2's flash-attn path do; the row sums add the rounded values, so the weights
 * sum to one exactly as applied), reuses P's accumulator registers directly as the A operands of P·V (V through
 * transposing ldmatrix) and rescales its output accumulators. No score matrix beyond one 16 × 64 tile per m-tile
 * exists, in registers only. Masked: rows past the sequence's end, positions past a row's own (causal) or before
 * its sliding window. Until stop 35 a warp owned 16 rows with its queries in registers (three blocks of 64 rows per
 * SM): the 8B 2048-token prefill's attention took 227 us per layer, now about 162 (NOTES.md, stop 35).
 *
 * Grid: x = head (so the query heads that share a KV head run side by side and read its K/V once from DRAM, then
 * from L2), y = sequence × query tile, the last tiles of a sequence (the most positions) first. The host does not
 * know how rows are spread over sequences, so it launches enough tiles for the longest possible sequence and
 * surplus blocks return at once. Decode-only batches and quantized caches keep the warp-per-row kernel of
 * attention.cu, which dispatches here; where the device runs sm_90a code (H100, H200) tsr_cuda_attention_prefill
 * hands the batch to the wgmma form of this kernel first (attention_prefill_wgmma.cu). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/kv_tile.cuh"

#include <math.h>
#include <stdlib.h>

#define FA_MT    2 /* m-tiles of 16 query rows per warp */
#define FA_WARPS 4
#define FA_BQ    (FA_WARPS * 16 * FA_MT) /* query rows per block */

/* Shared memory of one block for head dimension D and K/V tiles of BKV positions: two stages of K and V tiles, then
 * the block's queries, fp16 rows padded by 16 bytes so that the eight rows an ldmatrix reads fall in different
 * banks. */
static size_t fa_smem_bytes(int D, int BKV)
{
    return (size_t)(2 * 2 * BKV + FA_BQ) * (D + 8) * sizeof(__half);
}

/* Two blocks per SM where shared memory allows: 255 registers (36 bytes spilled at D = 128) and, with tiles of 64
 * positions, 104 KB of shared memory each at D = 128. */
template <int D, int BKV>
__global__ void __launch_bounds__(FA_WARPS * 32, 2)
    fa_prefill_kernel(tsr_batch_layout b, tsr_attn_args a, const __half *kc, const __half *vc, int page_size,
                      const float *q, float *out, int q_tiles)
{
    constexpr int DP = D + 8, KS = D / 16, NS = BKV / 8, NO = D / 8, MT = FA_MT, BQ = FA_BQ;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half *tiles = (__half *)fa_smem;     /* [stage][K, V][BKV][DP] */
    __half *qs = tiles + 2 * 2 * BKV * DP; /* [BQ][DP]: scaled queries */

    const int h = blockIdx.x, seq = blockIdx.y / q_tiles, tile = q_tiles - 1 - (int)(blockIdx.y % q_tiles);
    const int r0 = b.seq_row0[seq] + tile * BQ, r_end = b.seq_row0[seq + 1];
    if (r0 >= r_end) return;
    const int n_q = min(BQ, r_end - r0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int kvh = h / (a.n_heads / a.n_kv_heads), width = a.n_kv_heads * D;
    const int p_first = b.positions[r0], p_last = p_first + n_q - 1;
    const int lo_first = a.window > 0 && p_first - a.window + 1 > 0 ? p_first - a.window + 1 : 0;
    const int32_t *table = b.page_tables + (size_t)seq * b.max_pages;

    const int n_tiles = (p_last - lo_first) / BKV + 1;
    kv_tile_gather<D, BKV, FA_WARPS * 32>(tiles, tiles + BKV * DP, kc, vc, table, page_size, width, kvh, lo_first,
                                          p_last + 1 - lo_first);
    /* the block's queries, scaled, as fp16 rows (zeros past the sequence's rows); made visible by the loop's first
     * barrier */
    for (int i = threadIdx.x; i < BQ * D / 4; i += FA_WARPS * 32) {
        const int row = i / (D / 4), c = 4 * (i % (D / 4));
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (row < n_q) v = *(const float4 *)(q + ((size_t)(r0 + row) * a.n_heads + h) * D + c);
        uint2 hv;
        hv.x = h2_bits(__floats2half2_rn(v.x * a.scale, v.y * a.scale));
        hv.y = h2_bits(__floats2half2_rn(v.z * a.scale, v.w * a.scale));
        *(uint2 *)(qs + row * DP + c) = hv;
    }

    /* this lane's rows (g and g + 8 of each m-tile): position, first visible position, validity */
    int pos[MT][2], lo[MT][2];
    bool ok[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int row = (warp * MT + m) * 16 + g + 8 * i;
            ok[m][i] = row < n_q;
            pos[m][i] = p_first + row;
            lo[m][i] = a.window > 0 && pos[m][i] - a.window + 1 > 0 ? pos[m][i] - a.window + 1 : 0;
        }
    /* the warp's visible span: from its first row's window start to its last row's position */
    const int warp_first = p_first + warp * MT * 16, warp_hi = min(p_last, warp_first + MT * 16 - 1);
    const int warp_lo = a.window > 0 && warp_first - a.window + 1 > 0 ? warp_first - a.window + 1 : 0;
    const bool warp_rows = warp * MT * 16 < n_q;
    const __half *qw = qs + (size_t)warp * MT * 16 * DP;

    float o[MT][NO][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int n = 0; n < NO; n++)
            o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
    float m_run[MT][2], l_run[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
        m_run[m][0] = m_run[m][1] = -INFINITY, l_run[m][0] = l_run[m][1] = 0.0f;

    for (int it = 0; it < n_tiles; it++) {
        const int kv0 = lo_first + it * BKV;
        const __half *Ks = tiles + (it & 1) * 2 * BKV * DP, *Vs = Ks + BKV * DP;
        if (it + 1 < n_tiles) {
            __half *nk = tiles + ((it + 1) & 1) * 2 * BKV * DP;
            kv_tile_gather<D, BKV, FA_WARPS * 32>(nk, nk + BKV * DP, kc, vc, table, page_size, width, kvh, kv0 + BKV,
                                                  p_last + 1 - (kv0 + BKV));
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();

        if (warp_rows && kv0 <= warp_hi && kv0 + BKV - 1 >= warp_lo) {
            /* S = Q · Kᵀ: per pair of k-steps the queries' A operands of each m-tile, then per 8-position column
             * tile one ldmatrix of K for the two k-steps of every m-tile */
            float s[MT][NS][4];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int n = 0; n < NS; n++)
                    s[m][n][0] = s[m][n][1] = s[m][n][2] = s[m][n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks += 2) {
                uint32_t qa[MT][2][4];
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int j = 0; j < 2; j++)
                        ldsm_x4(qa[m][j], qw + (m * 16 + (lane & 15)) * DP + (ks + j) * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    uint32_t kb[4];
                    ldsm_x4(kb, Ks + (n * 8 + (lane & 7)) * DP + ks * 16 + (lane >> 3) * 8);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        mma_16816(s[m][n], qa[m][0], kb[0], kb[1]);
                        mma_16816(s[m][n], qa[m][1], kb[2], kb[3]);
                    }
                }
            }

            /* masks, only where the tile reaches past the warp's first row or a window is in force (one branch
             * for both m-tiles: the code from the scores to P·V is then one block the compiler can interleave) */
            const bool full = a.window == 0 && ok[MT - 1][1] && kv0 + BKV - 1 <= warp_first;
            if (!full) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int n = 0; n < NS; n++)
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const int i = j >> 1, t = kv0 + n * 8 + 2 * t4 + (j & 1);
                            if (!ok[m][i] || t > pos[m][i] || t < lo[m][i]) s[m][n][j] = -INFINITY;
                        }
            }
            /* online softmax per row (the 4 lanes of a row group hold its BKV scores), every row of the warp at
             * once; the output's rescale only when some row's maximum moved (past the first tiles it seldom does) */
            uint32_t pa[MT][NS][2];
            float factor[MT][2];
            bool moved = false;
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int n = 0; n < NS; n++)
                        mx = fmaxf(mx, fmaxf(s[m][n][2 * i], s[m][n][2 * i + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m_run[m][i], mx);
                    const float m_sub = m_new == -INFINITY ? 0.0f : m_new * FA_LOG2E;
                    factor[m][i] = fa_exp2(m_run[m][i] * FA_LOG2E - m_sub);
                    moved |= factor[m][i] != 1.0f;
                    float psum = 0.0f;
#pragma unroll
                    for (int n = 0; n < NS; n++) {
                        const float p0 = fa_exp2(fmaf(s[m][n][2 * i], FA_LOG2E, -m_sub));
                        const float p1 = fa_exp2(fmaf(s[m][n][2 * i + 1], FA_LOG2E, -m_sub));
                        const __half2 ph = __floats2half2_rn(p0, p1);
                        pa[m][n][i] = h2_bits(ph);
                        const float2 pf = __half22float2(ph);
                        psum += pf.x + pf.y;
                    }
                    l_run[m][i] = l_run[m][i] * factor[m][i] + psum;
                    m_run[m][i] = m_new;
                }
            if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int n = 0; n < NO; n++) {
                        o[m][n][0] *= factor[m][0], o[m][n][1] *= factor[m][0];
                        o[m][n][2] *= factor[m][1], o[m][n][3] *= factor[m][1];
                    }
            }

            /* O += P · V: per pair of output tiles one transposing ldmatrix of V for every m-tile */
#pragma unroll
            for (int kk = 0; kk < BKV / 16; kk++) {
#pragma unroll
                for (int n = 0; n < NO; n += 2) {
                    uint32_t vb[4];
                    ldsm_x4_t(vb, Vs + (kk * 16 + (lane & 15)) * DP + (n + (lane >> 4)) * 8);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        const uint32_t pf[4] = {pa[m][2 * kk][0], pa[m][2 * kk][1], pa[m][2 * kk + 1][0],
                                                pa[m][2 * kk + 1][1]};
                        mma_16816(o[m][n], pf, vb[0], vb[1]);
                        mma_16816(o[m][n + 1], pf, vb[2], vb[3]);
                    }
                }
            }
        }
        __syncthreads(); /* the stage read here is refilled next iteration */
    }

#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float l = l_run[m][i];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            if (!ok[m][i]) continue;
            const float inv = l > 0.0f ? 1.0f / l : 0.0f;
            float *dst = out + ((size_t)(r0 + (warp * MT + m) * 16 + g + 8 * i) * a.n_heads + h) * D + 2 * t4;
#pragma unroll
            for (int n = 0; n < NO; n++)
                *(float2 *)(dst + n * 8) = make_float2(o[m][n][2 * i] * inv, o[m][n][2 * i + 1] * inv);
        }
}

template <int D, int BKV>
static void fa_launch(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                      float *out)
{
    const size_t smem = fa_smem_bytes(D, BKV);
    static bool configured = false;
    if (!configured) {
        tsr_cuda_allow_smem((const void *)fa_prefill_kernel<D, BKV>, smem, "the prefill attention");
        configured = true;
    }
    /* the longest sequence has at most n_rows - (n_seqs - 1) rows */
    const int q_tiles = (b->n_rows - b->n_seqs + 1 + FA_BQ - 1) / FA_BQ;
    dim3 grid((unsigned)a->n_heads, (unsigned)(b->n_seqs * q_tiles));
    fa_prefill_kernel<D, BKV><<<grid, FA_WARPS * 32, smem, tsr_cuda_stream()>>>(
        *b, *a, (const __half *)kv->k[a->layer], (const __half *)kv->v[a->layer], kv->page_size, q, out, q_tiles);
    TSR_CUDA_LAUNCHED();
}
/* K/V tiles of 64 positions where a block may have the shared memory for them, else 32 (sm_86 and sm_89 allow 99 KB
 * per block: at D = 128 the 64-position tiles need 104 KB), 0 where not even those fit (the caller then leaves the
 * batch to attention.cu's general kernel); TSR_CUDA_FA_BKV=32 asks for 32 everywhere (tests). */
static int fa_tile_positions(int D)
{
    static const int optin = tsr_cuda_smem_block();
    static const bool forced = getenv("TSR_CUDA_FA_BKV") && atoi(getenv("TSR_CUDA_FA_BKV")) == 32;
    if (!forced && fa_smem_bytes(D, 64) <= (size_t)optin) return 64;
    return fa_smem_bytes(D, 32) <= (size_t)optin ? 32 : 0;
}

int tsr_cuda_attention_prefill(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv,
                               const float *q, float *out)
{
    if (kv->dtype != TSR_F16 || a->n_heads % a->n_kv_heads) return 0;
    if (a->head_dim != 64 && a->head_dim != 128) return 0;
    if (tsr_cuda_fa_wgmma(b, a, kv, q, out)) return 1;
    const int bkv = fa_tile_positions(a->head_dim);
    if (!bkv) return 0;
    if (a->head_dim == 64)
        bkv == 64 ? fa_launch<64, 64>(b, a, kv, q, out) : fa_launch<64, 32>(b, a, kv, q, out);
    else
        bkv == 64 ? fa_launch<128, 64>(b, a, kv, q, out) : fa_launch<128, 32>(b, a, kv, q, out);
    return 1;
}
