/* Prefill attention on tensor cores, for fp16 KV caches: the flash-attention scheme in WMMA fragments.
 *
 * One block of four warps takes 64 consecutive query rows of one sequence and one head. It walks the rows'
 * visible positions in tiles of 64: the tile's K and V rows are gathered through the page table into shared
 * memory as fp16, each warp computes the 16×64 scores of its 16 rows against the tile (fp16 operands, fp32
 * accumulation), folds them into a per-row online softmax (running max and sum, fp32) and adds P·V (P rounded to
 * fp16, as FlashAttention and ExLlamaV2's flash-attn path do) into an fp32 output kept in shared memory. No score
 * matrix beyond one 64×64 tile ever exists. Rows past the sequence's end, positions past a row's own (causal) or
 * before its sliding window are masked.
 *
 * Blocks are laid out as (sequence × query tile, head); the host does not know how rows are spread over
 * sequences, so it launches enough tiles for the longest possible sequence and surplus blocks return at once.
 * Decode-only batches and quantized caches keep the warp-per-row kernel of attention.cu, which dispatches here. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

#include <math.h>
#include <mma.h>

using namespace nvcuda;

#define FA_BQ 64      /* query rows per block */
#define FA_BKV 64     /* positions per K/V tile */
#define FA_WARPS 4    /* each warp owns 16 query rows */
#define FA_SPAD 8     /* padding of the score and P rows (floats / halfs) against bank conflicts */

/* Shared memory of one block for head dimension D: Q, K, V tiles (fp16), scores (fp32), P (fp16), output (fp32). */
static size_t fa_smem_bytes(int D)
{
    return (size_t)3 * FA_BQ * (D + 8) * 2 + (size_t)FA_BQ * (FA_BKV + FA_SPAD) * 4 +
           (size_t)FA_BQ * (FA_BKV + FA_SPAD) * 2 + (size_t)FA_BQ * (D + 4) * 4;
}

template <int D>
__global__ void __launch_bounds__(FA_WARPS * 32)
    fa_prefill_kernel(tsr_batch_layout b, tsr_attn_args a, const __half *kc, const __half *vc, int page_size,
                      const float *q, float *out, int q_tiles)
{
    constexpr int DP = D + 8;              /* fp16 row stride of Q/K/V tiles */
    constexpr int SP = FA_BKV + FA_SPAD;   /* row stride of scores and P */
    constexpr int OP = D + 4;              /* fp32 row stride of the output */
    extern __shared__ __align__(32) unsigned char fa_smem[];
    __half *Qs = (__half *)fa_smem;
    __half *Ks = Qs + FA_BQ * DP;
    __half *Vs = Ks + FA_BKV * DP;
    float *S = (float *)(Vs + FA_BKV * DP);
    __half *P = (__half *)(S + FA_BQ * SP);
    float *O = (float *)(P + FA_BQ * SP);

    const int seq = blockIdx.x / q_tiles, tile = blockIdx.x % q_tiles, h = blockIdx.y;
    const int r0 = b.seq_row0[seq] + tile * FA_BQ, r_end = b.seq_row0[seq + 1];
    if (r0 >= r_end) return;
    const int n_q = min(FA_BQ, r_end - r0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int kvh = h / (a.n_heads / a.n_kv_heads), width = a.n_kv_heads * D;
    const int p_first = b.positions[r0], p_last = p_first + n_q - 1;
    const int lo_first = a.window > 0 && p_first - a.window + 1 > 0 ? p_first - a.window + 1 : 0;
    const int32_t *table = b.page_tables + (size_t)seq * b.max_pages;

    /* Q (scaled, fp16) and a zero output */
    for (int i = tid; i < FA_BQ * D; i += FA_WARPS * 32) {
        const int r = i / D, c = i % D;
        const float v = r < n_q ? q[((size_t)(r0 + r) * a.n_heads + h) * D + c] * a.scale : 0.0f;
        Qs[r * DP + c] = __float2half_rn(v);
        O[r * OP + c] = 0.0f;
    }
    /* each lane pair owns one row of the warp's 16: its running max and sum, and half of its columns */
    const int my_row = warp * 16 + (lane >> 1), half_sel = lane & 1;
    const int my_pos = p_first + my_row;
    const int my_lo = a.window > 0 && my_pos - a.window + 1 > 0 ? my_pos - a.window + 1 : 0;
    const bool row_ok = my_row < n_q;
    float m_run = -INFINITY, l_run = 0.0f;

    for (int kv0 = lo_first; kv0 <= p_last; kv0 += FA_BKV) {
        __syncthreads(); /* the previous tile's K/V are no longer read */
        /* gather the tile's K and V rows, 16 bytes per load */
        constexpr int VEC = D / 8;
        for (int i = tid; i < FA_BKV * VEC; i += FA_WARPS * 32) {
            const int r = i / VEC, c8 = (i % VEC) * 8, t = kv0 + r;
            uint4 kw = make_uint4(0, 0, 0, 0), vw = kw;
            if (t <= p_last) {
                const size_t off = ((size_t)table[t / page_size] * page_size + t % page_size) * width + (size_t)kvh * D + c8;
                kw = *(const uint4 *)(kc + off);
                vw = *(const uint4 *)(vc + off);
            }
            *(uint4 *)(Ks + r * DP + c8) = kw;
            *(uint4 *)(Vs + r * DP + c8) = vw;
        }
        __syncthreads();

        /* S = Q · Kᵀ for this warp's 16 rows */
        float *Sw = S + warp * 16 * SP;
#pragma unroll
        for (int n = 0; n < FA_BKV / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int k = 0; k < D / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, Qs + warp * 16 * DP + k * 16, DP);
                wmma::load_matrix_sync(fb, Ks + n * 16 * DP + k * 16, DP);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Sw + n * 16, acc, SP, wmma::mem_row_major);
        }
        __syncwarp();

        /* online softmax of the row's 64 scores (this lane: 32 of them), P in fp16, the output rescaled */
        const float *srow = S + my_row * SP + half_sel * 32;
        float tmax = -INFINITY;
#pragma unroll 8
        for (int j = 0; j < 32; j++) {
            const int t = kv0 + half_sel * 32 + j;
            if (row_ok && t <= my_pos && t >= my_lo) tmax = fmaxf(tmax, srow[j]);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        const float m_new = fmaxf(m_run, tmax);
        const float factor = m_new == -INFINITY ? 1.0f : __expf(m_run - m_new);
        float psum = 0.0f;
        __half *prow = P + my_row * SP + half_sel * 32;
#pragma unroll 8
        for (int j = 0; j < 32; j++) {
            const int t = kv0 + half_sel * 32 + j;
            float p = 0.0f;
            if (row_ok && t <= my_pos && t >= my_lo) p = __expf(srow[j] - m_new);
            const __half ph = __float2half_rn(p);
            prow[j] = ph;
            psum += __half2float(ph);
        }
        psum += __shfl_xor_sync(0xffffffffu, psum, 1);
        l_run = l_run * factor + psum;
        m_run = m_new;
        float *orow = O + my_row * OP + half_sel * (D / 2);
        if (factor != 1.0f)
#pragma unroll 8
            for (int c = 0; c < D / 2; c++) orow[c] *= factor;
        __syncwarp();

        /* O += P · V for this warp's 16 rows */
#pragma unroll
        for (int n = 0; n < D / 16; n++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, O + warp * 16 * OP + n * 16, OP, wmma::mem_row_major);
#pragma unroll
            for (int k = 0; k < FA_BKV / 16; k++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, P + warp * 16 * SP + k * 16, SP);
                wmma::load_matrix_sync(fb, Vs + k * 16 * DP + n * 16, DP);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(O + warp * 16 * OP + n * 16, acc, OP, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (!row_ok) return;
    const float inv = l_run > 0.0f ? 1.0f / l_run : 0.0f;
    float *dst = out + ((size_t)(r0 + my_row) * a.n_heads + h) * D + half_sel * (D / 2);
    const float *orow = O + my_row * OP + half_sel * (D / 2);
    for (int c = 0; c < D / 2; c++) dst[c] = orow[c] * inv;
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
    dim3 grid((unsigned)(b->n_seqs * q_tiles), (unsigned)a->n_heads);
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
