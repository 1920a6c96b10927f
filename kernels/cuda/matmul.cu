/* Matrix multiplication on the GPU for every linear layer: y[M][N] = x[M][K] · W + bias.
 *
 * EXL2 and GPTQ below TSR_CUDA_DQ_MIN_M rows: the decode GEMV of gemv.cu (tsr_cuda_gemv), in chunks of at most 32
 * rows.
 * EXL2 and GPTQ, prefill and batches from TSR_CUDA_DQ_MIN_M rows (default on sm_90, where the bulk GEMV runs 33-64
 * rows as two chunks faster than the dequantize round trip: 65; 33 elsewhere; dq_min_m): the activations are gathered
 * through the permutation as fp16 (for the down projection, silu(gate) · up is formed in the same pass); column slabs
 * of the matrix are dequantized to fp16 into one buffer reserved at model preparation (the largest layer matrix) and
 * multiplied by cuBLAS (fp16 operands, fp32 accumulation), as ExLlamaV2 does above 50 rows; the o and down
 * projections add their product to the residual stream in cuBLAS's epilogue (beta 1). A layer's MLP on this path
 * (tsr_cuda_mlp_half, for ops.h mlp_add_norm) has cuBLAS write gate's and up's products as fp16 into the caller's
 * scratch, so that down's gated conversion reads half the bytes. With TSR_CUDA_DQ_WGMMA=1 on sm_90a the product runs
 * instead in gemm_dq_wgmma.cu, which dequantizes in registers (no slab, no cuBLAS; q, k and v in one launch); off by
 * default until it beats this path (NOTES.md, stop 54). kernels/cuda/NOTES.md has the figures.
 * Dense weights: a warp-per-column GEMV for M <= 8, cuBLAS (GemmEx, fp32 accumulation) above. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/exl2_frag.cuh"
#include "kernels/cuda/launch.cuh"

#include <cuda_bf16.h>
#include <map>
#include <stdlib.h>
#include <string.h>
#include <type_traits>
#include <iterator>
#include <utility>
#include <vector>

/* ---- EXL2 through cuBLAS: dequantize column slabs to fp16, then one dense GEMM per slab ---- */

/* xp[m][k] = h(x[m][uperm[k]]) (GATED: h(silu(x) · up) at the same place, the MLP's gating folded into the down
 * projection's input pass): the activations in unit row order as fp16, 0 on padding rows. Each block keeps the
 * permutation in shared memory as 16-bit indices (loaded once, PERM_SMEM; K < 65535) and takes rows m = blockIdx.x,
 * + gridDim.x ...: a row is read whole (four values at a time where K allows), converted into shared memory, then
 * gathered from there, so that global reads and writes are both contiguous. Until stop 25 each block took one row
 * and read the permutation from global memory with it (4 bytes per value, as much as the row itself): 30 us for
 * 2048 x 4096. x and up are fp32, or fp16 (T = __half: gate's and up's products in tsr_cuda_mlp_half, with their
 * biases bx and bu added here when not NULL). */
__device__ __forceinline__ float silu_times(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

__device__ __forceinline__ float4 pm_load4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float4 pm_load4(const __half *p)
{
    const uint2 r = *(const uint2 *)p;
    const float2 a = __half22float2(bits_h2(r.x)), b = __half22float2(bits_h2(r.y));
    return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float pm_load1(const float *p) { return *p; }
__device__ __forceinline__ float pm_load1(const __half *p) { return __half2float(*p); }
__device__ __forceinline__ float pm_bias(const __half *b, int k) { return b ? __half2float(b[k]) : 0.0f; }
/* silu(x + bx) · (up + bu) for four values at input column k (biases NULL: none) */
__device__ __forceinline__ float4 pm_gate4(float4 v, float4 u, const __half *bx, const __half *bu, int k)
{
    if (bx) v.x += pm_bias(bx, k), v.y += pm_bias(bx, k + 1), v.z += pm_bias(bx, k + 2), v.w += pm_bias(bx, k + 3);
    const float4 ub = bu ? make_float4(pm_bias(bu, k), pm_bias(bu, k + 1), pm_bias(bu, k + 2), pm_bias(bu, k + 3))
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    return make_float4(silu_times(v.x, u.x + ub.x), silu_times(v.y, u.y + ub.y), silu_times(v.z, u.z + ub.z),
                       silu_times(v.w, u.w + ub.w));
}

template <bool GATED, bool PERM_SMEM, typename T>
__global__ void __launch_bounds__(512)
    permute_half_kernel(const T *x, const T *up, const __half *bx, const __half *bu, const int32_t *uperm, int M, int K,
                        int Kp, __half *xp)
{
    extern __shared__ __align__(16) unsigned char pm_smem[];
    __half *row_h = (__half *)pm_smem;
    uint16_t *perm = (uint16_t *)(pm_smem + (((size_t)K * sizeof(__half) + 15) & ~(size_t)15));
    if (PERM_SMEM)
        for (int k = threadIdx.x; k < Kp; k += blockDim.x)
            perm[k] = uperm[k] < 0 ? (uint16_t)0xffffu : (uint16_t)uperm[k];
    constexpr uintptr_t A4 = 4 * sizeof(T) - 1; /* alignment of four values */
    const bool vec = (K & 3) == 0 && ((uintptr_t)x & A4) == 0 && (!GATED || ((uintptr_t)up & A4) == 0);
    for (int m = blockIdx.x; m < M; m += gridDim.x) {
        const T *xm = x + (size_t)m * K, *um = GATED ? up + (size_t)m * K : NULL;
        if (vec) {
            for (int k = 4 * threadIdx.x; k < K; k += 4 * blockDim.x) {
                float4 v = pm_load4(xm + k);
                if (GATED) v = pm_gate4(v, pm_load4(um + k), bx, bu, k);
                *(__half2 *)(row_h + k) = __floats2half2_rn(v.x, v.y);
                *(__half2 *)(row_h + k + 2) = __floats2half2_rn(v.z, v.w);
            }
        } else {
            for (int k = threadIdx.x; k < K; k += blockDim.x)
                row_h[k] = __float2half_rn(GATED ? silu_times(pm_load1(xm + k) + pm_bias(bx, k),
                                                              pm_load1(um + k) + pm_bias(bu, k))
                                                 : pm_load1(xm + k));
        }
        __syncthreads();
        __half2 *out = (__half2 *)(xp + (size_t)m * Kp); /* Kp is a multiple of 32 */
        for (int k = 2 * threadIdx.x; k < Kp; k += 2 * blockDim.x) {
            __half2 h;
            if (PERM_SMEM) {
                const unsigned s0 = perm[k], s1 = perm[k + 1];
                h.x = s0 != 0xffffu ? row_h[s0] : __float2half_rn(0.0f);
                h.y = s1 != 0xffffu ? row_h[s1] : __float2half_rn(0.0f);
            } else {
                const int s0 = uperm[k], s1 = uperm[k + 1];
                h.x = s0 >= 0 ? row_h[s0] : __float2half_rn(0.0f);
                h.y = s1 >= 0 ? row_h[s1] : __float2half_rn(0.0f);
            }
            out[k >> 1] = h;
        }
        __syncthreads();
    }
}

/* xp = h(x) (GATED: h(silu(x + bx) · (up + bu))) for a matrix whose unit order is the input's (uperm the identity, no
 * padding rows: down's input under the MLP fold, backend.cu): a straight conversion of the M · K values, four a
 * thread, without permute_half_kernel's pass through shared memory (x, up four-value aligned, K a multiple of 4). */
template <bool GATED, typename T>
__global__ void __launch_bounds__(256)
    convert_half_kernel(const T *x, const T *up, const __half *bx, const __half *bu, size_t n4, int K, __half *xp)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (size_t)gridDim.x * blockDim.x) {
        const size_t e = 4 * i;
        float4 v = pm_load4(x + e);
        if (GATED) v = pm_gate4(v, pm_load4(up + e), bx, bu, (int)(e % (size_t)K));
        const __half2 lo = __floats2half2_rn(v.x, v.y), hi = __floats2half2_rn(v.z, v.w);
        *(uint2 *)(xp + e) = make_uint2(h2_bits(lo), h2_bits(hi));
    }
}

/* Opts kernel f in to at least smem bytes of dynamic shared memory (never less than an earlier call opted it in to:
 * `opted`, the kernel's own, so that a launch planned earlier with more still fits) and returns the blocks of 512
 * threads that fit on the chip at once with smem (at least 1). */
template <typename F> static int permute_blocks(F f, size_t smem, size_t &opted)
{
    if (smem > opted) {
        tsr_cuda_allow_smem((const void *)f, smem, "the activations' permutation");
        opted = smem;
    }
    int per_sm = 0;
    TSR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, 512, smem));
    return per_sm > 0 ? per_sm * tsr_cuda_device_attr(cudaDevAttrMultiProcessorCount, 1) : 1;
}

/* permute_half_kernel over M rows; up non-NULL: the gated input silu(x + bx) · (up + bu). The permutation stays in
 * global memory where it would not fit beside the row (at most 160 KB, and what the device allows: 70B's down
 * projection needs 114 KB, more than the 99 KB of the consumer cards) or K does not fit 16 bits. */
template <typename T>
static void permute_half(const T *x, const T *up, const int32_t *uperm, int M, int K, int Kp, __half *xp,
                         const __half *bx = NULL, const __half *bu = NULL, bool identity = false)
{
    constexpr uintptr_t A4 = 4 * sizeof(T) - 1; /* alignment of four values */
    if (identity && Kp == K && (K & 3) == 0 && ((uintptr_t)x & A4) == 0 && (!up || ((uintptr_t)up & A4) == 0) &&
        !tsr_cuda_env_off("TSR_CUDA_CONVERT")) {
        const size_t n4 = (size_t)M * K / 4;
        static const int blocks = 8 * tsr_cuda_device_attr(cudaDevAttrMultiProcessorCount, 1);
        const int grid = n4 / 256 + 1 < (size_t)blocks ? (int)(n4 / 256 + 1) : blocks;
        if (up)
            convert_half_kernel<true, T><<<grid, 256, 0, tsr_cuda_stream()>>>(x, up, bx, bu, n4, K, xp);
        else
            convert_half_kernel<false, T><<<grid, 256, 0, tsr_cuda_stream()>>>(x, up, bx, bu, n4, K, xp);
        TSR_CUDA_LAUNCHED();
        return;
    }
    const size_t row = ((size_t)K * sizeof(__half) + 15) & ~(size_t)15, with_perm = row + (size_t)Kp * sizeof(uint16_t);
    /* the most a block of the device may opt in to: 99 KB on sm_86/89, 227 KB on sm_90 (48 KB if unknown) */
    static const size_t optin = (size_t)tsr_cuda_smem_block();
    const bool in_smem = K < 0xffff && with_perm <= 160 * 1024 && with_perm <= optin;
    const size_t smem = in_smem ? with_perm : row;
    auto launch = [&](auto kernel) {
        static std::map<size_t, int> fits; /* blocks on the chip per shared-memory size, one table per kernel */
        static size_t opted;               /* the kernel's opt-in so far */
        auto it = fits.find(smem);
        const int chip = it != fits.end() ? it->second : (fits[smem] = permute_blocks(kernel, smem, opted));
        const int grid = M < chip ? M : chip;
        kernel<<<grid, 512, smem, tsr_cuda_stream()>>>(x, up, bx, bu, uperm, M, K, Kp, xp);
        TSR_CUDA_LAUNCHED();
    };
    if (up)
        in_smem ? launch(permute_half_kernel<true, true, T>) : launch(permute_half_kernel<true, false, T>);
    else
        in_smem ? launch(permute_half_kernel<false, true, T>) : launch(permute_half_kernel<false, false, T>);
}

/* dq[k][j] = W[k][32 cb0 + j] in unit row order for the slab's columns; one warp per (unit, column block): the
 * lane's fragment values go through a shared tile so the rows are written whole. */
template <int B, bool GPTQ, int F>
__device__ __forceinline__ void frag_dequant_f(const uint32_t (&w)[B], const frag_scales &sc, int lane,
                                               __half (*tile)[34])
{
    const int g = lane >> 2, c = 2 * (lane & 3), ct = F >> 1, ks = F & 1;
    uint32_t a[4];
    frag_a<B, GPTQ, F>(w, sc, a);
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const float2 v = __half22float2(bits_h2(a[r]));
        const int h = r & 1, n = 16 * ct + g + 8 * h, k = 16 * ks + c + 8 * (r >> 1);
        const float s = sc.s[2 * ct + h];
        tile[k][n] = __float2half_rn(v.x * s);
        tile[k + 1][n] = __float2half_rn(v.y * s);
    }
}

template <int B, bool GPTQ>
__device__ __forceinline__ void frag_dequant_tile(const uint32_t *fw, size_t base, const frag_scales &sc, int lane,
                                                  __half (*tile)[34])
{
    uint32_t w[B];
    frag_words<B, true>(fw + base, lane, w);
    frag_dequant_f<B, GPTQ, 0>(w, sc, lane, tile);
    frag_dequant_f<B, GPTQ, 1>(w, sc, lane, tile);
    frag_dequant_f<B, GPTQ, 2>(w, sc, lane, tile);
    frag_dequant_f<B, GPTQ, 3>(w, sc, lane, tile);
}

__device__ __forceinline__ void frag_dequant_block(const tsr_linear_dev &L, int cb0, int wcb, __half *dq)
{
    __shared__ __half tile[4][32][34];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, j = blockIdx.x * 4 + warp, cb = cb0 + j;
    if (j >= wcb || cb >= L.Npad / 32) return;
    const int u = blockIdx.y;
    const uint2 meta = L.units[u];
    const int grp = (int)(meta.y & 0xffffffu), bits = (int)(meta.y >> 24);
    frag_scales sc;
    frag_group_params(L, grp, cb, lane >> 2, &sc);
    const size_t base = meta.x + (size_t)cb * 32 * bits;
    if (L.gptq) {
        frag_dequant_tile<4, true>(L.fw, base, sc, lane, tile[warp]);
    } else {
        frag_with_width(bits, [&](auto w) {
            constexpr int B = decltype(w)::value;
            frag_dequant_tile<B, false>(L.fw, base, sc, lane, tile[warp]);
        });
    }
    __syncwarp();
    const size_t ldw = (size_t)wcb * 32;
#pragma unroll 4
    for (int k = 0; k < 32; k++) dq[((size_t)u * 32 + k) * ldw + (size_t)j * 32 + lane] = tile[warp][k][lane];
}

__global__ void __launch_bounds__(128) frag_dequant_kernel(tsr_linear_dev L, int cb0, int wcb, __half *dq)
{
    frag_dequant_block(L, cb0, wcb, dq);
}

/* Two matrices of one shape and unit order in one launch (blockIdx.z picks the matrix): k and v (exl2_dq_gemm_pair). */
__global__ void __launch_bounds__(128)
    frag_dequant_pair_kernel(tsr_linear_dev A, tsr_linear_dev B, int cb0, int wcb, __half *dqa, __half *dqb)
{
    if (blockIdx.z == 0)
        frag_dequant_block(A, cb0, wcb, dqa);
    else
        frag_dequant_block(B, cb0, wcb, dqb);
}

/* The smallest M that takes this path: TSR_CUDA_DQ_MIN_M (1 to 129) for every matrix when set; else 33 (below it
 * the GEMV; 30 where the GEMV stages little, tsr_cuda_gemv_narrow_stage), 65 where the bulk GEMV (sm_90) runs 64 rows
 * and the wgmma product takes this path's rows (sm_90a, up to 512 by default), and 97 with the bulk GEMV alone, which
 * runs up to 64 rows in one launch streaming the weights once (tsr_cuda_gemv_rows; 65 where it is held to 32 rows,
 * TSR_CUDA_GEMV_BULK). Measured (NOTES.md, stops 19, 23 and 28):
 * 64 rows as two chunks of 32 beat this path already (70B geometry +9 %, 8B +6 %); as one launch of 64, 8B +36 % and
 * 70B +71 % over two chunks; at 80 and 96 rows (a launch of 64 and one of the rest) 8B +25 % / +5 %, 70B +37 % / +26 %
 * over this path; at 128 rows 8B -9 %. */
static int dq_min_m(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TSR_CUDA_DQ_MIN_M");
        v = e ? atoi(e) : 0;
        if (v < 1 || v > 4 * TSR_GEMV_MAX_M + 1) v = 0; /* 0: the default */
    }
    if (v) return v;
    /* where the wgmma product takes 65 rows (sm_90a), from 65: 8B at 96 rows 7.2k tok/s through the GEMV's chunks,
     * at 128 through the product 14.0k; at 64 the one bulk launch won (8.0k against 7.8k; NOTES.md, stop 61). Stop 66:
     * from 53 rows the product took 8B's 56-64 rows 3-5 % faster but 70B's 24 % slower (58.2 against 44.2-45.5 ms a
     * step), so 65 stays */
    if (tsr_cuda_gemv_rows() > TSR_GEMV_MAX_M && tsr_cuda_dq_wgmma_rows(2 * TSR_GEMV_MAX_M + 1))
        return 2 * TSR_GEMV_MAX_M + 1;
    if (tsr_cuda_gemv_rows() > TSR_GEMV_MAX_M) return 3 * TSR_GEMV_MAX_M + 1;
    if (tsr_cuda_gemv_bulk(TSR_GEMV_MAX_M)) return 2 * TSR_GEMV_MAX_M + 1;
    /* blocks of 99 KB (sm_86/sm_89), 8B 4.0 bpw planned as such a card on the H200 (NOTES.md, stop 38): the GEMV's
     * step grows ~0.5 ms per row (12.3-12.5 ms at 24 rows, 13.3 at 26, 16.4 at 32), this path's takes 13.5 ms at
     * 32 rows but 14.3 at 27; 28-31 were not measured */
    return tsr_cuda_gemv_narrow_stage() ? 30 : TSR_GEMV_MAX_M + 1;
}

/* The widest slab in columns (TSR_CUDA_DQ_SLAB_COLS, a multiple of 128; default: as wide as the buffer allows).
 * Tests narrow it to run several slabs on small matrices. */
static size_t dq_slab_cols(void)
{
    static long v = -1;
    if (v < 0) {
        const char *e = getenv("TSR_CUDA_DQ_SLAB_COLS");
        v = e ? atol(e) : 0;
        v = v > 0 ? (v + 127) / 128 * 128 : 0;
    }
    return (size_t)v;
}

static size_t g_dq_bytes; /* the slab buffer, sized at model preparation: scratch slot 3, which the GEMVs also use for
                           * their partial sums (each op uses it only while it runs, on the one stream) */

size_t tsr_cuda_dq_reserved(void)
{
    return g_dq_bytes;
}

void tsr_cuda_dq_reserve(size_t bytes)
{
    if (bytes <= g_dq_bytes) return;
    tsr_cuda_scratch(3, bytes);
    g_dq_bytes = bytes;
}

/* Whether M rows of L go through the dequantize-and-cuBLAS path rather than the GEMV. */
static int dq_path(int M) { return M >= dq_min_m(); }

/* TSR_CUDA_DQ_TIMES=1 (diagnosis): device time of the dequantize path's three parts per matrix shape, from events
 * with a synchronization after each call (so it also removes any overlap), printed at exit. A synchronization cannot
 * be recorded into a CUDA graph, so the setting also turns graph replay off (backend.cu graphs_enabled). */
static int dq_times_on(void)
{
    static int v = -1;
    if (v < 0) v = tsr_cuda_env_on("TSR_CUDA_DQ_TIMES");
    return v;
}

bool tsr_cuda_dq_times(void) { return dq_times_on() != 0; }
struct dq_time {
    double ms[3], min[3]; /* summed and least per part (a shape's first call loads cuBLAS's kernel lazily) */
    long n;
};
static std::map<std::pair<int, std::pair<int, int>>, dq_time> g_dq_times;
static cudaEvent_t g_dq_ev[4];
static void dq_times_report(void)
{
    for (auto &e : g_dq_times)
        fprintf(
            stderr,
            "dq path M %d, %dx%d: %ld calls, permute %.1f us, dequantize %.1f us, gemm %.1f us per call (least %.1f, "
            "%.1f, %.1f)\n",
            e.first.first, e.first.second.first, e.first.second.second, e.second.n, 1e3 * e.second.ms[0] / e.second.n,
            1e3 * e.second.ms[1] / e.second.n, 1e3 * e.second.ms[2] / e.second.n, 1e3 * e.second.min[0],
            1e3 * e.second.min[1], 1e3 * e.second.min[2]);
}
static void dq_mark(int i)
{
    if (!dq_times_on()) return;
    if (!g_dq_ev[0]) {
        for (int k = 0; k < 4; k++) TSR_CUDA_CHECK(cudaEventCreate(&g_dq_ev[k]));
        atexit(dq_times_report);
    }
    TSR_CUDA_CHECK(cudaEventRecord(g_dq_ev[i], tsr_cuda_stream()));
}
static void dq_account(int M, int K, int N)
{
    if (!dq_times_on()) return;
    TSR_CUDA_CHECK(cudaEventSynchronize(g_dq_ev[3]));
    dq_time &t = g_dq_times[std::make_pair(M, std::make_pair(K, N))];
    for (int k = 0; k < 3; k++) {
        float ms = 0;
        TSR_CUDA_CHECK(cudaEventElapsedTime(&ms, g_dq_ev[k], g_dq_ev[k + 1]));
        t.ms[k] += ms;
        t.min[k] = t.n == 0 || ms < t.min[k] ? ms : t.min[k];
    }
    t.n++;
}

/* Columns per slab where `parts` matrices of Kp unit rows share the buffer side by side: a multiple of 128 (or the
 * matrix's Npad when narrower), at most TSR_CUDA_DQ_SLAB_COLS. */
static size_t dq_slab_width(int Kp, int Npad, int parts)
{
    size_t slab = g_dq_bytes / ((size_t)parts * Kp * sizeof(__half));
    slab -= slab % 128;
    if (dq_slab_cols() && slab > dq_slab_cols()) slab = dq_slab_cols();
    if (slab > (size_t)Npad) slab = Npad;
    if (slab < 32) tsr_cuda_fatal(__FILE__, __LINE__, "dequantize buffer not reserved for this matrix");
    return slab;
}

/* y = xp · W (beta 1: y += xp · W, the residual add in cuBLAS's epilogue) through cuBLAS, xp being the activations
 * in unit row order (fp16, Kp = 32 units rows); y fp32, or fp16 (ytype CUDA_R_16F, beta 0). */
static void exl2_dq_gemm(const tsr_linear_dev *L, const __half *xp, int M, void *y, float beta,
                         cudaDataType_t ytype = CUDA_R_32F)
{
    dq_mark(2); /* recorded again after the dequantize pass where that runs */
    if (tsr_cuda_dq_wgmma(&L, 1, xp, M, &y, beta, ytype == CUDA_R_16F)) return; /* sm_90a: no dequantize pass */
    const size_t ysize = ytype == CUDA_R_16F ? sizeof(__half) : sizeof(float);
    const float alpha = 1.0f;
    const int Kp = 32 * L->n_units;
    const size_t slab = dq_slab_width(Kp, L->Npad, 1);
    __half *dq = (__half *)tsr_cuda_scratch(3, g_dq_bytes);
    for (int n0 = 0; n0 < L->N; n0 += (int)slab) {
        const int w = (int)slab, cols = L->N - n0 < w ? L->N - n0 : w;
        dim3 grid(tsr_div_up(w / 32, 4), L->n_units);
        frag_dequant_kernel<<<grid, 128, 0, tsr_cuda_stream()>>>(*L, n0 / 32, w / 32, dq);
        TSR_CUDA_LAUNCHED();
        if (n0 == 0) dq_mark(2);
        cublasStatus_t st = cublasGemmEx(tsr_cuda_blas(), CUBLAS_OP_N, CUBLAS_OP_N, cols, M, Kp, &alpha, dq, CUDA_R_16F,
                                         w, xp, CUDA_R_16F, Kp, &beta, (char *)y + (size_t)n0 * ysize, ytype, L->N,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) tsr_cuda_fatal(__FILE__, __LINE__, "cublasGemmEx failed");
        tsr_cuda_launches++;
    }
}

/* Two matrices of one shape and one unit order on the same input (k and v): both dequantized into the buffer's two
 * halves by one launch, then one strided batched GEMM (the input shared: stride 0), so that two products of few
 * columns (4096 x 1024 at the 8B shape: 27 us each at 2048 rows on the H100, a third of the tensor cores' rate) fill
 * the chip together. ya and yb are fp32 outputs that do not overlap; beta 0. Only where both matrices fit the buffer
 * whole (dq_pair_fits); TSR_CUDA_DQ_SLAB_COLS still narrows the slabs (tests). */
static bool dq_pair_fits(const tsr_linear_dev *A, const tsr_linear_dev *B, int M)
{
    static const bool enabled = !tsr_cuda_env_off("TSR_CUDA_DQ_PAIR"); /* 0: one product each (comparisons) */
    return enabled && A->kind == TSR_LINEAR_EXL2 && B->kind == TSR_LINEAR_EXL2 && A->K == B->K && A->N == B->N &&
           A->Npad == B->Npad && A->n_units == B->n_units && !tsr_cuda_dq_wgmma_takes(A, M) &&
           !tsr_cuda_dq_wgmma_takes(B, M) && (size_t)2 * 32 * A->n_units * A->Npad * sizeof(__half) <= g_dq_bytes;
}

static unsigned long long g_dq_pairs_run;

extern "C" unsigned long long tsr_cuda_dq_pairs_run(void)
{
    return g_dq_pairs_run;
}

static void exl2_dq_gemm_pair(const tsr_linear_dev *A, const tsr_linear_dev *B, const __half *xp, int M, float *ya,
                              float *yb)
{
    g_dq_pairs_run++;
    if (yb < ya) { /* the batch's output stride must be positive: the lower output first */
        std::swap(A, B);
        std::swap(ya, yb);
    }
    const float alpha = 1.0f, beta = 0.0f;
    const int Kp = 32 * A->n_units;
    const size_t slab = dq_slab_width(Kp, A->Npad, 2);
    __half *dqa = (__half *)tsr_cuda_scratch(3, g_dq_bytes), *dqb = dqa + slab * Kp;
    for (int n0 = 0; n0 < A->N; n0 += (int)slab) {
        const int w = (int)slab, cols = A->N - n0 < w ? A->N - n0 : w;
        dim3 grid(tsr_div_up(w / 32, 4), A->n_units, 2);
        frag_dequant_pair_kernel<<<grid, 128, 0, tsr_cuda_stream()>>>(*A, *B, n0 / 32, w / 32, dqa, dqb);
        TSR_CUDA_LAUNCHED();
        if (n0 == 0) dq_mark(2);
        cublasStatus_t st = cublasGemmStridedBatchedEx(
            tsr_cuda_blas(), CUBLAS_OP_N, CUBLAS_OP_N, cols, M, Kp, &alpha, dqa, CUDA_R_16F, w, (long long)slab * Kp,
            xp, CUDA_R_16F, Kp, 0, &beta, ya + n0, CUDA_R_32F, A->N, (long long)(yb - ya), 2, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) tsr_cuda_fatal(__FILE__, __LINE__, "cublasGemmStridedBatchedEx failed");
        tsr_cuda_launches++;
    }
}

/* ---- dense ---- */

__device__ __forceinline__ float dense_elem(const void *p, int dtype, size_t i)
{
    switch (dtype) {
    case TSR_F16: return __half2float(((const __half *)p)[i]);
    case TSR_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

template <int M>
__global__ void dense_gemv_kernel(const void *w, int dtype, const void *bias, int bias_dtype, const float *x, int K,
                                  int N, float *y)
{
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;
    float acc[M];
#pragma unroll
    for (int m = 0; m < M; m++) acc[m] = 0.0f;
    for (int k = lane; k < K; k += 32) {
        const float wv = dense_elem(w, dtype, (size_t)n * K + k);
#pragma unroll
        for (int m = 0; m < M; m++) acc[m] += wv * x[(size_t)m * K + k];
    }
#pragma unroll
    for (int m = 0; m < M; m++) {
        float v = acc[m];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) y[(size_t)m * N + n] = v + (bias ? dense_elem(bias, bias_dtype, n) : 0.0f);
    }
}

template <int M> static void dense_gemv_launch(const tsr_linear_dev *L, const float *x, float *y)
{
    dense_gemv_kernel<M><<<tsr_div_up(L->N, 8), 256, 0, tsr_cuda_stream()>>>(L->w, L->dtype, L->dense_bias,
                                                                              L->bias_dtype, x, L->K, L->N, y);
}

__global__ void to_half_kernel(const float *x, size_t n, __half *out)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

__global__ void to_bf16_kernel(const float *x, size_t n, __nv_bfloat16 *out)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void add_bias_kernel(float *y, int M, int N, const void *bias, int dtype)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (size_t)M * N) y[i] += dense_elem(bias, dtype, i % N);
}

static void dense_gemm(const tsr_linear_dev *L, const float *x, int M, float *y)
{
    const float alpha = 1.0f, beta = 0.0f;
    size_t n = (size_t)M * L->K;
    const void *xin = x;
    cudaDataType_t t = CUDA_R_32F;
    if (L->dtype == TSR_F16) {
        __half *h = (__half *)tsr_cuda_scratch(0, n * sizeof(__half));
        to_half_kernel<<<tsr_div_up(n, 256), 256, 0, tsr_cuda_stream()>>>(x, n, h);
        xin = h;
        t = CUDA_R_16F;
    } else if (L->dtype == TSR_BF16) {
        __nv_bfloat16 *h = (__nv_bfloat16 *)tsr_cuda_scratch(0, n * sizeof(__nv_bfloat16));
        to_bf16_kernel<<<tsr_div_up(n, 256), 256, 0, tsr_cuda_stream()>>>(x, n, h);
        xin = h;
        t = CUDA_R_16BF;
    }
    TSR_CUDA_LAUNCHED();
    cublasStatus_t st = cublasGemmEx(tsr_cuda_blas(), CUBLAS_OP_T, CUBLAS_OP_N, L->N, M, L->K, &alpha, L->w, t, L->K,
                                     xin, t, L->K, &beta, y, CUDA_R_32F, L->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) tsr_cuda_fatal(__FILE__, __LINE__, "cublasGemmEx failed");
    tsr_cuda_launches++;
    if (L->dense_bias) {
        add_bias_kernel<<<tsr_div_up((size_t)M * L->N, 256), 256, 0, tsr_cuda_stream()>>>(y, M, L->N, L->dense_bias,
                                                                                          L->bias_dtype);
        TSR_CUDA_LAUNCHED();
    }
}

/* ---- prefill's hand-off: a norm writes its readers' input as fp16 in their unit order ----
 * On this path every q/k/v and gate/up product first converted the norm's fp32 output into fp16 through the matrix's
 * permutation (permute_half: 20-24 us a layer at 2048 rows of 4096 on the H100, a read of the 32 MB row block that
 * the norm had just written). Where a norm has registered readers (backend.cu tsr_cuda_norm_readers) that take this
 * path at its row count, the norm (elementwise.cu tsr_cuda_rmsnorm) writes that conversion itself into scratch slot
 * 0, in reader 0's unit order, beside its fp32 output; a product of a matrix in that order on that output takes it
 * instead of converting, if no launch came between (the count after the norm's launch). TSR_CUDA_DQ_HANDOFF=0 turns
 * it off (comparisons). */
struct dq_handoff {
    const float *src;             /* the norm's output */
    const tsr_linear_dev *L;      /* the reader whose unit order xp holds */
    int M;
    unsigned long long launch;    /* tsr_cuda_launches right after the norm's launch */
};
static dq_handoff g_handoff;
static unsigned long long g_handoff_taken;

extern "C" unsigned long long tsr_cuda_dq_handoffs_taken(void)
{
    return g_handoff_taken;
}

bool tsr_cuda_dq_handoff_plan(const tsr_dense *w, int M, int dim, __half **xp, const int32_t **uperm, int *Kp)
{
    static const bool enabled = !tsr_cuda_env_off("TSR_CUDA_DQ_HANDOFF");
    const tsr_linear_dev *R[TSR_GEMV_MAX_PARTS];
    if (!enabled || M <= 0 || !dq_path(M) || tsr_cuda_norm_readers(w, R) < 1) return false;
    const tsr_linear_dev *L = R[0];
    if (L->kind != TSR_LINEAR_EXL2 || L->K != dim) return false;
    *Kp = 32 * L->n_units;
    *uperm = L->uperm_identity && *Kp == dim ? NULL : L->uperm;
    *xp = (__half *)tsr_cuda_scratch(0, (size_t)M * *Kp * sizeof(__half));
    g_handoff = dq_handoff{NULL, L, M, 0}; /* the slot is about to be overwritten: nothing to take until done */
    return true;
}

void tsr_cuda_dq_handoff_done(const float *out, int M)
{
    g_handoff.src = out;
    g_handoff.M = M;
    g_handoff.launch = tsr_cuda_launches;
}

/* Whether scratch slot 0 holds x (M rows) converted for L by the norm that wrote x, with no launch since. */
static bool dq_handoff_take(const tsr_linear_dev *L, const void *x, int M)
{
    const dq_handoff &h = g_handoff;
    if (!h.src || h.src != x || h.M != M || h.launch != tsr_cuda_launches) return false;
    if (h.L != L && !tsr_cuda_same_unit_order(h.L, L)) return false;
    g_handoff_taken++;
    return true;
}

/* A product's input on the dequantize path (x, or with up the gated silu(x + bx) · (up + bu); fp32 or fp16) in L's
 * unit row order as fp16 in scratch slot 0, converted here unless permute = 0 (the slot holds it already: the matrix
 * before it in a group had the same permutation) or the norm that wrote x handed it over; timed as the permute part
 * under TSR_CUDA_DQ_TIMES. */
template <typename T>
static __half *dq_input(const tsr_linear_dev *L, const T *x, const T *up, const __half *bx, const __half *bu, int M,
                        int permute)
{
    const int Kp = 32 * L->n_units;
    __half *xp = (__half *)tsr_cuda_scratch(0, (size_t)M * Kp * sizeof(__half));
    dq_mark(0);
    if (permute && !up && dq_handoff_take(L, x, M)) permute = 0;
    if (permute) permute_half(x, up, L->uperm, M, L->K, Kp, xp, bx, bu, L->uperm_identity != 0);
    dq_mark(1);
    return xp;
}

/* The dequantize path's product of one EXL2/GPTQ matrix: its input (dq_input), then y = xp · W (beta 1: y +=) in
 * ytype, each call timed under TSR_CUDA_DQ_TIMES. No bias. */
template <typename T>
static void dq_product(const tsr_linear_dev *L, const T *x, const T *up, const __half *bx, const __half *bu, int M,
                       void *y, int permute, float beta, cudaDataType_t ytype)
{
    __half *xp = dq_input(L, x, up, bx, bu, M, permute);
    exl2_dq_gemm(L, xp, M, y, beta, ytype);
    dq_mark(3);
    dq_account(M, L->K, L->N);
}

/* dq_product for a pair that exl2_dq_gemm_pair takes (fp32 outputs, beta 0, no bias); timed as one product of both
 * matrices' columns under TSR_CUDA_DQ_TIMES. */
static void dq_pair_product(const tsr_linear_dev *A, const tsr_linear_dev *B, const float *x, int M, float *ya,
                            float *yb, int permute)
{
    __half *xp = dq_input(A, x, (const float *)NULL, (const __half *)NULL, (const __half *)NULL, M, permute);
    exl2_dq_gemm_pair(A, B, xp, M, ya, yb);
    dq_mark(3);
    dq_account(M, A->K, A->N + B->N);
}

/* y[M][N] += L's fp16 bias, where it has one. */
static void dq_add_bias(const tsr_linear_dev *L, float *y, int M)
{
    if (!L->bias) return;
    add_bias_kernel<<<tsr_div_up((size_t)M * L->N, 256), 256, 0, tsr_cuda_stream()>>>(y, M, L->N, L->bias, TSR_F16);
    TSR_CUDA_LAUNCHED();
}

/* The dequantize path of one EXL2/GPTQ matrix, on x or (up non-NULL) on silu(x) · up, into y (beta 0) or added to
 * it (beta 1), bias included; permute as dq_product's. */
static void exl2_dq_linear(const tsr_linear_dev *L, const float *x, const float *up, int M, float *y, int permute,
                           float beta = 0.0f)
{
    dq_product(L, x, up, (const __half *)NULL, (const __half *)NULL, M, y, permute, beta, CUDA_R_32F);
    dq_add_bias(L, y, M);
}

/* Whether two matrices put their input rows in the same unit order (q, k and v, or gate and up, usually do: one
 * input, one act-order permutation, and often one layout of bit widths). Compared once per pair, outside graph
 * recording (a pair first seen while recording counts as different); a released matrix's pairs are forgotten
 * (tsr_cuda_forget_unit_order), as its address may come back with other contents. */
static std::map<std::pair<const int32_t *, const int32_t *>, bool> g_unit_orders;

void tsr_cuda_forget_unit_order(const int32_t *uperm)
{
    for (auto it = g_unit_orders.begin(); it != g_unit_orders.end();)
        it = it->first.first == uperm || it->first.second == uperm ? g_unit_orders.erase(it) : std::next(it);
}

bool tsr_cuda_same_unit_order(const tsr_linear_dev *a, const tsr_linear_dev *b)
{
    if (a->uperm == b->uperm) return true;
    if (a->K != b->K || a->n_units != b->n_units) return false;
    auto &known = g_unit_orders;
    const auto key = std::make_pair(a->uperm, b->uperm);
    auto it = known.find(key);
    if (it != known.end()) return it->second;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    TSR_CUDA_CHECK(cudaStreamIsCapturing(tsr_cuda_stream(), &cap));
    if (cap != cudaStreamCaptureStatusNone) return false;
    const size_t n = (size_t)32 * a->n_units;
    std::vector<int32_t> ha(n), hb(n);
    TSR_CUDA_CHECK(cudaMemcpy(ha.data(), a->uperm, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    TSR_CUDA_CHECK(cudaMemcpy(hb.data(), b->uperm, n * sizeof(int32_t), cudaMemcpyDeviceToHost));
    const bool same = ha == hb;
    known[key] = same;
    return same;
}

void tsr_cuda_linear(const tsr_linear *Lh, const float *x, int M, float *y)
{
    const tsr_linear_dev *L = (const tsr_linear_dev *)Lh->dev;
    if (M <= 0) return;
    if (!L) tsr_cuda_fatal(__FILE__, __LINE__, "linear layer used before prepare_model");
    if (L->kind == TSR_LINEAR_EXL2) {
        if (!dq_path(M)) {
            tsr_cuda_gemv(&L, 1, x, M, &y);
            return;
        }
        exl2_dq_linear(L, x, NULL, M, y, 1);
        return;
    }
    if (M <= 8) {
        switch (M) {
        case 1: dense_gemv_launch<1>(L, x, y); break;
        case 2: dense_gemv_launch<2>(L, x, y); break;
        case 3: dense_gemv_launch<3>(L, x, y); break;
        case 4: dense_gemv_launch<4>(L, x, y); break;
        case 5: dense_gemv_launch<5>(L, x, y); break;
        case 6: dense_gemv_launch<6>(L, x, y); break;
        case 7: dense_gemv_launch<7>(L, x, y); break;
        default: dense_gemv_launch<8>(L, x, y); break;
        }
        TSR_CUDA_LAUNCHED();
        return;
    }
    dense_gemm(L, x, M, y);
}

void tsr_cuda_linear_add_norm(const tsr_linear *Lh, const float *a, int M, float *x, const tsr_dense *w, float eps,
                              float *out)
{
    const tsr_linear_dev *L = (const tsr_linear_dev *)Lh->dev;
    if (M <= 0) return;
    if (!L) tsr_cuda_fatal(__FILE__, __LINE__, "linear layer used before prepare_model");
    const int rows = tsr_cuda_gemv_rows();
    if (L->kind == TSR_LINEAR_EXL2 && !dq_path(M) && M > rows) { /* the GEMV's row chunks, one by one */
        for (int r0 = 0; r0 < M; r0 += rows)
            tsr_cuda_linear_add_norm(Lh, a + (size_t)r0 * L->K, min(rows, M - r0), x + (size_t)r0 * L->N, w, eps,
                                     out + (size_t)r0 * L->N);
        return;
    }
    if (L->kind == TSR_LINEAR_EXL2 && dq_path(M)) { /* x += a · W in the GEMM, then the norm alone */
        exl2_dq_linear(L, a, NULL, M, x, 1, 1.0f);
        if (w) tsr_cuda_rmsnorm(x, w, eps, M, L->N, out);
        return;
    }
    if (L->kind == TSR_LINEAR_EXL2) {
        tsr_gemv_parts parts;
        tsr_cuda_gemv(&L, 1, a, M, &out, &parts);
        if (parts.splits > 0) {
            tsr_cuda_add_parts(x, parts.partial, parts.splits, (size_t)M * parts.Npad, parts.Npad, L->bias, w, eps, M,
                               L->N, out);
            return;
        }
    } else {
        tsr_cuda_linear(Lh, a, M, out);
    }
    tsr_cuda_add_parts(x, out, 1, 0, L->N, NULL, w, eps, M, L->N, out);
}

void tsr_cuda_silu_linear_add_norm(const tsr_linear *Lh, float *gate, const float *up, int M, float *x,
                                   const tsr_dense *w, float eps, float *out)
{
    const tsr_linear_dev *L = (const tsr_linear_dev *)Lh->dev;
    if (M <= 0) return;
    if (!L) tsr_cuda_fatal(__FILE__, __LINE__, "linear layer used before prepare_model");
    if (L->kind == TSR_LINEAR_EXL2 && dq_path(M)) {
        exl2_dq_linear(L, gate, up, M, x ? x : out, 1, x ? 1.0f : 0.0f);
        if (x && w) tsr_cuda_rmsnorm(x, w, eps, M, L->N, out);
        return;
    }
    if (!tsr_cuda_silu_stage(L, gate, up, M)) tsr_cuda_silu_mul(gate, up, (size_t)M * L->K, gate);
    if (x)
        tsr_cuda_linear_add_norm(Lh, gate, M, x, w, eps, out);
    else
        tsr_cuda_linear(Lh, gate, M, out);
}

/* linear_many's matrices as one launch of the wgmma product (gemm_dq_wgmma.cu), where all are quantized, share the
 * first's unit order and the kernel takes them: the input permuted once, then their biases, timed as one product
 * under TSR_CUDA_DQ_TIMES; false, having written no output, otherwise. */
static bool dq_group_wgmma(const tsr_linear *const *Lh, int n, const float *x, int M, float *const *y)
{
    const tsr_linear_dev *L[TSR_GEMV_MAX_PARTS];
    for (int i = 0; i < n; i++) {
        L[i] = (const tsr_linear_dev *)Lh[i]->dev;
        if (!L[i] || L[i]->kind != TSR_LINEAR_EXL2 || !tsr_cuda_dq_wgmma_takes(L[i], M)) return false;
        if (i && !tsr_cuda_same_unit_order(L[0], L[i])) return false;
    }
    __half *xp = dq_input(L[0], x, (const float *)NULL, (const __half *)NULL, (const __half *)NULL, M, 1);
    void *yv[TSR_GEMV_MAX_PARTS];
    int columns = 0;
    for (int i = 0; i < n; i++) yv[i] = y[i], columns += L[i]->N;
    dq_mark(2);
    if (!tsr_cuda_dq_wgmma(L, n, xp, M, yv, 0.0f, false)) return false; /* the permutation is then repeated: harmless */
    dq_mark(3);
    dq_account(M, L[0]->K, columns); /* timed as one product of all the parts' columns (q/k/v: K x 6144 at 8B) */
    for (int i = 0; i < n; i++) dq_add_bias(L[i], y[i], M);
    return true;
}

void tsr_cuda_linear_many(const tsr_linear *const *Lh, int n, const float *x, int M, float *const *y)
{
    static const bool enabled = !tsr_cuda_env_off("TSR_CUDA_GROUP"); /* 0: the matrices one by one (comparisons) */
    const tsr_linear_dev *L[TSR_GEMV_MAX_PARTS];
    int grouped = enabled && n >= 1 && n <= TSR_GEMV_MAX_PARTS;
    for (int i = 0; grouped && i < n; i++) {
        L[i] = (const tsr_linear_dev *)Lh[i]->dev;
        grouped = L[i] && L[i]->kind == TSR_LINEAR_EXL2 && L[i]->K == L[0]->K && L[i]->gptq == L[0]->gptq;
    }
    grouped = grouped && !dq_path(M);
    if (grouped) {
        tsr_cuda_gemv(L, n, x, M, y);
        return;
    }
    /* the dequantize path: on sm_90a matrices of one unit order (q, k and v) in one launch of the wgmma product */
    if (enabled && n > 1 && n <= TSR_GEMV_MAX_PARTS && M > 0 && dq_path(M) && dq_group_wgmma(Lh, n, x, M, y)) return;
    /* else the input permuted once for consecutive matrices of one unit order */
    const tsr_linear_dev *prev = NULL;
    for (int i = 0; i < n; i++) {
        const tsr_linear_dev *d = (const tsr_linear_dev *)Lh[i]->dev;
        const tsr_linear_dev *e = i + 1 < n ? (const tsr_linear_dev *)Lh[i + 1]->dev : NULL;
        if (M > 0 && d && d->kind == TSR_LINEAR_EXL2 && dq_path(M)) {
            const int permute = !prev || !tsr_cuda_same_unit_order(prev, d);
            if (enabled && e && y[i] != y[i + 1] && dq_pair_fits(d, e, M) && tsr_cuda_same_unit_order(d, e)) {
                dq_pair_product(d, e, x, M, y[i], y[i + 1], permute); /* k and v */
                dq_add_bias(d, y[i], M);
                dq_add_bias(e, y[i + 1], M);
                prev = e;
                i++;
                continue;
            }
            exl2_dq_linear(d, x, NULL, M, y[i], permute);
            prev = d;
        } else {
            tsr_cuda_linear(Lh[i], x, M, y[i]);
            prev = NULL;
        }
    }
}

int tsr_cuda_mlp_half(const tsr_linear_dev *G, const tsr_linear_dev *U, const tsr_linear_dev *D, const float *h, int M,
                      float *x, const tsr_dense *w, float eps, float *out, float *scratch_gate, float *scratch_up)
{
    /* off for comparisons, and where the gating is asked to run as a launch of its own (TSR_CUDA_SILU_FOLD=0) */
    static const bool enabled = !tsr_cuda_env_off("TSR_CUDA_MLP_HALF") && !tsr_cuda_env_off("TSR_CUDA_SILU_FOLD");
    if (!enabled || M <= 0 || !dq_path(M) || !scratch_gate || !scratch_up) return 0;
    if (G->K != U->K || G->N != U->N || D->K != G->N) return 0;
    /* gate's and up's products in fp16, each [M][N] in the first half of its fp32 buffer */
    __half *g16 = (__half *)scratch_gate, *u16 = (__half *)scratch_up;
    const __half *none = NULL;
    dq_product(G, h, (const float *)NULL, none, none, M, g16, 1, 0.0f, CUDA_R_16F);
    dq_product(U, h, (const float *)NULL, none, none, M, u16, !tsr_cuda_same_unit_order(G, U), 0.0f, CUDA_R_16F);
    /* x += (silu(gate + its bias) · (up + its bias)) · Wdown, down's input formed in fp16 through its permutation */
    dq_product(D, (const __half *)g16, (const __half *)u16, G->bias, U->bias, M, x, 1, 1.0f, CUDA_R_32F);
    dq_add_bias(D, x, M);
    if (w) tsr_cuda_rmsnorm(x, w, eps, M, D->N, out);
    return 1;
}
