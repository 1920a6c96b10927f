/* Prefill attention on tensor cores, for fp16 KV caches: the flash-attention scheme on mma.sync m16n8k16.
 *
 * One block of four warps takes 64 consecutive query rows of one sequence and one head; each warp owns 16 rows and
 * keeps everything about them in registers: the scaled queries as fp16 A operands, the 16 × 64 scores of the
 * current K/V tile and the fp32 output accumulators. The block walks the rows' visible positions in tiles of 64;
 * each tile's K and V rows are gathered through the page table into shared memory by cp.async, the next tile's
 * copies in flight while the current one is used. Per tile a warp computes S = Q·Kᵀ (K as B operands through
 * ldmatrix), folds S into a per-row online softmax (running max and sum in fp32, exp2 with log2 e folded in),
 * rounds the probabilities P to fp16 (as FlashAttention and ExLlamaV2's flash-attn path do; the row sums add the
 * rounded values, so the weights sum to one exactly as applied), reuses P's accumulator registers directly as the
 * A operands of P·V (V through transposing ldmatrix) and rescales its output accumulators. No score matrix beyond
 * one 16 × 64 tile per warp exists, in registers only. Masked: rows past the sequence's end, positions past a
 * row's own (causal) or before its sliding window.
 *
 * Grid: x = head (so the query heads that share a KV head run side by side and read its K/V once from DRAM, then
 * from L2), y = sequence × query tile, the last tiles of a sequence (the most positions) first. The host does not
 * know how rows are spread over sequences, so it launches enough tiles for the longest possible sequence and
 * surplus blocks return at once. Decode-only batches and quantized caches keep the warp-per-row kernel of
 * attention.cu, which dispatches here. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/kv_tile.cuh"

#include <math.h>

#define FA_BQ 64    /* query rows per block */
#define FA_BKV 64   /* positions per K/V tile */
#define FA_WARPS 4  /* each warp owns 16 query rows */
#define FA_LOG2E 1.4426950408889634f

/* 2^x by the hardware's approximation alone: exp2f adds a range check and two multiplies per call for results
 * below 2^-126, which the probabilities' rounding to fp16 (and the output's rescale) cannot tell from 0 */
__device__ __forceinline__ float fa_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Shared memory of one block for head dimension D: two stages of K and V tiles, fp16 rows padded by 16 bytes so
 * that the eight rows an ldmatrix reads fall in different banks. */
static size_t fa_smem_bytes(int D) { return (size_t)2 * 2 * FA_BKV * (D + 8) * sizeof(__half); }

/* Three blocks per SM (168 registers, 24 bytes spilled; without the bound ptxas took 172 and two fit): 2048-token
 * prefill +1.3-1.7 % (NOTES.md, stop 25). */
template <int D>
__global__ void __launch_bounds__(FA_WARPS * 32, 3)
    fa_prefill_kernel(tsr_batch_layout b, tsr_attn_args a, const __half *kc, const __half *vc, int page_size,
                      const float *q, float *out, int q_tiles)
{
    constexpr int DP = D + 8;    /* fp16 row stride of the K/V tiles */
    constexpr int KS = D / 16;   /* k-steps of Q·Kᵀ */
    constexpr int NS = FA_BKV / 8; /* 8-position column tiles of S */
    constexpr int NO = D / 8;    /* 8-column tiles of the output */
    extern __shared__ __align__(16) unsigned char fa_smem[];
    __half *tiles = (__half *)fa_smem; /* [stage][K, V][FA_BKV][DP] */

    const int h = blockIdx.x, seq = blockIdx.y / q_tiles, tile = q_tiles - 1 - (int)(blockIdx.y % q_tiles);
    const int r0 = b.seq_row0[seq] + tile * FA_BQ, r_end = b.seq_row0[seq + 1];
    if (r0 >= r_end) return;
    const int n_q = min(FA_BQ, r_end - r0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int kvh = h / (a.n_heads / a.n_kv_heads), width = a.n_kv_heads * D;
    const int p_first = b.positions[r0], p_last = p_first + n_q - 1;
    const int lo_first = a.window > 0 && p_first - a.window + 1 > 0 ? p_first - a.window + 1 : 0;
    const int32_t *table = b.page_tables + (size_t)seq * b.max_pages;

    /* this lane's two rows (g and g + 8 of the warp's 16): position, first visible position, validity */
    int pos[2], lo[2];
    bool ok[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int row = warp * 16 + g + 8 * i;
        ok[i] = row < n_q;
        pos[i] = p_first + row;
        lo[i] = a.window > 0 && pos[i] - a.window + 1 > 0 ? pos[i] - a.window + 1 : 0;
    }
    /* the warp's visible span: from its first row's window start to its last row's position */
    const int warp_first = p_first + warp * 16, warp_hi = min(p_last, warp_first + 15);
    const int warp_lo = a.window > 0 && warp_first - a.window + 1 > 0 ? warp_first - a.window + 1 : 0;
    const bool warp_rows = warp * 16 < n_q;

    /* Q of the warp's rows, scaled, as fp16 A operands of the KS k-steps */
    uint32_t qa[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int i = j & 1, col = ks * 16 + 2 * t4 + 8 * (j >> 1);
            float2 v = make_float2(0.0f, 0.0f);
            if (ok[i]) v = *(const float2 *)(q + ((size_t)(r0 + warp * 16 + g + 8 * i) * a.n_heads + h) * D + col);
            qa[ks][j] = h2_bits(__floats2half2_rn(v.x * a.scale, v.y * a.scale));
        }

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    const int n_tiles = (p_last - lo_first) / FA_BKV + 1;
    kv_tile_gather<D, FA_BKV, FA_WARPS * 32>(tiles, tiles + FA_BKV * DP, kc, vc, table, page_size, width, kvh, lo_first,
                                             p_last + 1 - lo_first);
    for (int it = 0; it < n_tiles; it++) {
        const int kv0 = lo_first + it * FA_BKV;
        const __half *Ks = tiles + (it & 1) * 2 * FA_BKV * DP, *Vs = Ks + FA_BKV * DP;
        if (it + 1 < n_tiles) {
            __half *nk = tiles + ((it + 1) & 1) * 2 * FA_BKV * DP;
            kv_tile_gather<D, FA_BKV, FA_WARPS * 32>(nk, nk + FA_BKV * DP, kc, vc, table, page_size, width, kvh,
                                                     kv0 + FA_BKV, p_last + 1 - (kv0 + FA_BKV));
            asm volatile("cp.async.wait_group 1;\n" ::);
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        __syncthreads();

        /* a warp whose rows see none of this tile skips it (no rows, the causal end, the window's start) */
        if (warp_rows && kv0 <= warp_hi && kv0 + FA_BKV - 1 >= warp_lo) {
            /* S = Q · Kᵀ: per 8-position column tile, one ldmatrix gives the B operands of two k-steps */
            float s[NS][4];
#pragma unroll
            for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks += 2)
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    uint32_t kb[4];
                    ldsm_x4(kb, Ks + (n * 8 + (lane & 7)) * DP + ks * 16 + (lane >> 3) * 8);
                    mma_16816(s[n], qa[ks], kb[0], kb[1]);
                    mma_16816(s[n], qa[ks + 1], kb[2], kb[3]);
                }

            /* masks, only where the tile reaches past the warp's first row or a window is in force */
            const bool full = a.window == 0 && ok[0] && ok[1] && kv0 + FA_BKV - 1 <= warp_first;
            if (!full) {
#pragma unroll
                for (int n = 0; n < NS; n++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        const int i = j >> 1, t = kv0 + n * 8 + 2 * t4 + (j & 1);
                        if (!ok[i] || t > pos[i] || t < lo[i]) s[n][j] = -INFINITY;
                    }
            }

            /* online softmax per row: the 4 lanes of a row group hold its 64 scores */
            uint32_t pa[NS][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < NS; n++) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m_run[i], mx);
                const float m_sub = m_new == -INFINITY ? 0.0f : m_new * FA_LOG2E;
                const float factor = fa_exp2(m_run[i] * FA_LOG2E - m_sub);
                float psum = 0.0f;
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    const float p0 = fa_exp2(fmaf(s[n][2 * i], FA_LOG2E, -m_sub));
                    const float p1 = fa_exp2(fmaf(s[n][2 * i + 1], FA_LOG2E, -m_sub));
                    const __half2 ph = __floats2half2_rn(p0, p1);
                    pa[n][i] = h2_bits(ph);
                    const float2 pf = __half22float2(ph);
                    psum += pf.x + pf.y;
                }
                l_run[i] = l_run[i] * factor + psum;
                m_run[i] = m_new;
                /* past the first tiles a row's maximum seldom moves: the rescale only when some row's did */
                if (__any_sync(0xffffffffu, factor != 1.0f)) {
#pragma unroll
                    for (int n = 0; n < NO; n++) o[n][2 * i] *= factor, o[n][2 * i + 1] *= factor;
                }
            }

            /* O += P · V: P's accumulators are the A operands; per pair of output tiles one transposing ldmatrix */
#pragma unroll
            for (int kk = 0; kk < FA_BKV / 16; kk++) {
                const uint32_t pf[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1]};
#pragma unroll
                for (int n = 0; n < NO; n += 2) {
                    uint32_t vb[4];
                    ldsm_x4_t(vb, Vs + (kk * 16 + (lane & 15)) * DP + (n + (lane >> 4)) * 8);
                    mma_16816(o[n], pf, vb[0], vb[1]);
                    mma_16816(o[n + 1], pf, vb[2], vb[3]);
                }
            }
        }
        __syncthreads(); /* the stage read here is refilled next iteration */
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        float l = l_run[i];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (!ok[i]) continue;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float *dst = out + ((size_t)(r0 + warp * 16 + g + 8 * i) * a.n_heads + h) * D + 2 * t4;
#pragma unroll
        for (int n = 0; n < NO; n++) *(float2 *)(dst + n * 8) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
}

template <int D>
static void fa_launch(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q, float *out)
{
    const size_t smem = fa_smem_bytes(D);
    static bool configured = false;
    if (!configured) {
        TSR_CUDA_CHECK(cudaFuncSetAttribute(fa_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        configured = true;
    }
    /* the longest sequence has at most n_rows - (n_seqs - 1) rows */
    const int q_tiles = (b->n_rows - b->n_seqs + 1 + FA_BQ - 1) / FA_BQ;
    dim3 grid((unsigned)a->n_heads, (unsigned)(b->n_seqs * q_tiles));
    fa_prefill_kernel<D><<<grid, FA_WARPS * 32, smem, tsr_cuda_stream()>>>(
        *b, *a, (const __half *)kv->k[a->layer], (const __half *)kv->v[a->layer], kv->page_size, q, out, q_tiles);
    TSR_CUDA_LAUNCHED();
}
int tsr_cuda_attention_prefill(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                               float *out)
{
    if (kv->dtype != TSR_F16 || a->n_heads % a->n_kv_heads) return 0;
    switch (a->head_dim) {
    case 64: fa_launch<64>(b, a, kv, q, out); return 1;
    case 128: fa_launch<128>(b, a, kv, q, out); return 1;
    default: return 0;
    }
}
