/* Matrix multiplication on the GPU for every linear layer: y[M][N] = x[M][K] · W + bias.
 *
 * EXL2, decode (M <= 8): the CUDA-core GEMV streams the packed weights once. Each thread owns one output column; a
 * block covers 128 columns and a range of 32-row chunks; the chunk's b packed words per column are read
 * coalesced across the warp, unpacked in registers (widths are compile-time per chunk via a switch), scaled by the
 * fp16-rounded group scale, and multiplied with the permuted activations staged in shared memory. Blocks of
 * different chunk ranges write partial sums that a second kernel adds up with the bias (deterministic).
 * EXL2, prefill and batches above 8 rows (TSR_CUDA_DQ_MIN_M, default 9): the activations are first gathered
 * through the permutation into stored row order as fp16; then column slabs of the matrix are dequantized to fp16
 * into one buffer reserved at model preparation (the largest layer matrix) and multiplied by cuBLAS (fp16
 * operands, fp32 accumulation), as ExLlamaV2 does above 50 rows: the extra fp16 write and read cost far less
 * than the tile kernels here lose (kernels/cuda/NOTES.md has the figures). With TSR_CUDA_DQ_MIN_M=0 (or 33),
 * 9 to 32 rows take the tensor-core GEMV of gemv_tc.cu and larger M a WMMA GEMM that dequantizes each 32-row
 * chunk of a 64-column tile into shared memory.
 * GPTQ matrices (4-bit groups with per-column fp16 scales and zero points) run through the same two kernels.
 * Dense weights: a warp-per-column GEMV for M <= 8, cuBLAS (GemmEx, fp32 accumulation) above. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"

#include <cuda_bf16.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

#define GEMV_COLS 128
#define GEMV_CHUNKS 4
#define GEMV_MAX_M 32

/* Scale of (group g, column n), and the amount to add to an offset code (code − 2^(b−1)) to get code − zero:
 * 0 for EXL2; 2^(b−1) − zero for GPTQ. */
__device__ __forceinline__ void group_params(const tsr_linear_dev &L, int g, int bits, int n, float *S, float *zoff)
{
    if (L.gptq) {
        *S = __half2float(L.g_scales[(size_t)g * L.Npad + n]);
        int zero = (int)((L.g_zeros[(size_t)g * (L.Npad / 8) + n / 8] >> (4 * (n % 8))) & 0xfu) + L.zero_add;
        *zoff = (float)((1 << (bits - 1)) - zero);
        return;
    }
    uint32_t code = (L.q_scale[(size_t)g * (L.Npad / 8) + n / 8] >> (4 * (n % 8))) & 0xfu;
    *S = __half2float(__float2half_rn((float)((code + 1) * (code + 1)) * L.scale_m[g]));
    *zoff = 0.0f;
}

/* Codes (offset by −2^(B−1)) of rows 0..31 from a chunk's packed words already in registers. */
template <int B> __device__ __forceinline__ void decode_words(const uint32_t *w, int *codes)
{
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int bit = j * B, t = bit >> 5, sh = bit & 31;
        uint32_t v = w[t] >> sh;
        if (sh + B > 32) v |= w[t + 1] << (32 - sh);
        codes[j] = (int)(v & ((1u << B) - 1u)) - (1 << (B - 1));
    }
}

/* Codes of rows 0..31 of a chunk in column n (rows beyond the chunk decode from zero words). */
template <int B> __device__ __forceinline__ void decode32(const uint32_t *qw, size_t Npad, int qrow, int rows, int n, int *codes)
{
    uint32_t w[B];
    const int n_words = (rows * B + 31) / 32;
#pragma unroll
    for (int t = 0; t < B; t++) w[t] = t < n_words ? qw[(size_t)(qrow + t) * Npad + n] : 0u;
    decode_words<B>(w, codes);
}

__device__ __forceinline__ void decode_any(int bits, const uint32_t *qw, size_t Npad, int qrow, int rows, int n, int *codes)
{
    switch (bits) {
    case 2: decode32<2>(qw, Npad, qrow, rows, n, codes); break;
    case 3: decode32<3>(qw, Npad, qrow, rows, n, codes); break;
    case 4: decode32<4>(qw, Npad, qrow, rows, n, codes); break;
    case 5: decode32<5>(qw, Npad, qrow, rows, n, codes); break;
    case 6: decode32<6>(qw, Npad, qrow, rows, n, codes); break;
    default: decode32<8>(qw, Npad, qrow, rows, n, codes); break;
    }
}

/* ---- decode GEMV (M <= 8): warps split K inside a block ----
 * A block of DEC_WARPS warps owns 32·CPL adjacent columns (each lane CPL = 2 or 4 of them, read with one 8- or
 * 16-byte load per packed row, so a warp reads 256 or 512 contiguous bytes per row). Warp w takes chunks c0+w, c0+w+DEC_WARPS, ... of the
 * block's range; each lane gathers one activation of the chunk through the permutation and the warp shares them
 * with shuffles. The warps' sums meet in shared memory; the block writes y (plus bias) directly, or a partial sum
 * when K is split over several blocks to fill the chip. */
#define DEC_WARPS 8

/* CPL (columns per lane) consecutive packed words of one row: one 8- or 16-byte load. */
template <int CPL> __device__ __forceinline__ void load_cols(const uint32_t *p, uint32_t *w)
{
    if (CPL == 4) {
        const uint4 v = __ldg((const uint4 *)p);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else {
        const uint2 v = __ldg((const uint2 *)p);
        w[0] = v.x, w[1] = v.y;
    }
}

template <int B, int MM, int CPL>
__device__ __forceinline__ void dec_chunk(const tsr_linear_dev &L, const tsr_exl2_chunk &ch, int n0, const float *xv,
                                          const float *S, const float *zoff, float (*acc)[CPL])
{
    uint32_t w[B][CPL];
    const int n_words = (ch.rows * B + 31) / 32;
#pragma unroll
    for (int t = 0; t < B; t++) {
        if (t < n_words) {
            load_cols<CPL>(L.q_weight + (size_t)(ch.qrow + t) * L.Npad + n0, w[t]);
        } else {
#pragma unroll
            for (int c = 0; c < CPL; c++) w[t][c] = 0u;
        }
    }
    /* code → float without a conversion instruction: the bits 0x4B000000 | code are the float 2^23 + code, and
     * subtracting 2^23 + 2^(B-1) − zoff leaves the exact signed value, which the fp16-rounded scale multiplies */
    float bias[CPL];
#pragma unroll
    for (int c = 0; c < CPL; c++) bias[c] = 8388608.0f + (float)(1 << (B - 1)) - zoff[c];
#pragma unroll
    for (int j = 0; j < 32; j++) {
        const int bit = j * B, t = bit >> 5, sh = bit & 31;
        float wv[CPL];
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            uint32_t v = w[t][c] >> sh;
            if (sh + B > 32) v |= w[t + 1][c] << (32 - sh);
            wv[c] = (__uint_as_float(0x4B000000u | (v & ((1u << B) - 1u))) - bias[c]) * S[c];
        }
#pragma unroll
        for (int m = 0; m < MM; m++) {
            const float xj = __shfl_sync(0xffffffffu, xv[m], j); /* rows beyond the chunk carry x = 0 */
#pragma unroll
            for (int c = 0; c < CPL; c++) acc[m][c] = fmaf(wv[c], xj, acc[m][c]);
        }
    }
}

/* One matrix of a decode launch: its blocks are col_blocks × splits of the grid, after those of the parts before. */
struct dec_part {
    tsr_linear_dev L;
    float *y, *partial; /* partial: [splits][M][Npad] when K is split over blocks, else NULL */
    int cpb, col_blocks, blocks;
};

/* Up to DEC_MAX_PARTS matrices sharing one input (q/k/v, gate/up) in one launch. */
#define DEC_MAX_PARTS 3
struct dec_group {
    dec_part p[DEC_MAX_PARTS];
    int n;
};

template <int MM, int CPL>
__global__ void __launch_bounds__(DEC_WARPS * 32) exl2_dec_kernel(const __grid_constant__ dec_group G, const float *x,
                                                                  int M)
{
    int b = blockIdx.x, part = 0;
    while (part + 1 < G.n && b >= G.p[part].blocks) b -= G.p[part++].blocks;
    const tsr_linear_dev &L = G.p[part].L;
    const int cpb = G.p[part].cpb, col_block = b % G.p[part].col_blocks, split = b / G.p[part].col_blocks;
    float *partial = G.p[part].partial, *y = G.p[part].y;
    __shared__ float red[DEC_WARPS][MM][32 * CPL];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_out = col_block * (32 * CPL) + lane * CPL;
    const bool live = n_out < L.Npad;
    /* lanes past the last column decode column 0 (every lane must take part in the shuffles) and write nothing */
    const int n0 = live ? n_out : 0;
    const int c0 = split * cpb, c1 = min(L.n_chunks, c0 + cpb);
    float acc[MM][CPL];
#pragma unroll
    for (int m = 0; m < MM; m++)
#pragma unroll
        for (int c = 0; c < CPL; c++) acc[m][c] = 0.0f;
    int last_group = -1;
    float S[CPL], zoff[CPL];
#pragma unroll
    for (int c = 0; c < CPL; c++) S[c] = zoff[c] = 0.0f;
    for (int ci = c0 + warp; ci < c1; ci += DEC_WARPS) {
        const tsr_exl2_chunk ch = L.chunks[ci];
        const int g = ch.group & 0xffffff, bits = ch.group >> 24;
        float xv[MM];
        const int row = lane < ch.rows ? L.perm[ch.row0 + lane] : 0;
#pragma unroll
        for (int m = 0; m < MM; m++) xv[m] = lane < ch.rows && m < M ? x[(size_t)m * L.K + row] : 0.0f;
        if (g != last_group) {
#pragma unroll
            for (int k = 0; k < CPL; k++) group_params(L, g, bits, n0 + k, &S[k], &zoff[k]);
            last_group = g;
        }
        switch (bits) {
        case 2: dec_chunk<2, MM, CPL>(L, ch, n0, xv, S, zoff, acc); break;
        case 3: dec_chunk<3, MM, CPL>(L, ch, n0, xv, S, zoff, acc); break;
        case 4: dec_chunk<4, MM, CPL>(L, ch, n0, xv, S, zoff, acc); break;
        case 5: dec_chunk<5, MM, CPL>(L, ch, n0, xv, S, zoff, acc); break;
        case 6: dec_chunk<6, MM, CPL>(L, ch, n0, xv, S, zoff, acc); break;
        default: dec_chunk<8, MM, CPL>(L, ch, n0, xv, S, zoff, acc); break;
        }
    }
#pragma unroll
    for (int m = 0; m < MM; m++)
#pragma unroll
        for (int c = 0; c < CPL; c++) red[warp][m][lane * CPL + c] = acc[m][c];
    __syncthreads();
    /* warp w sums rows m = w, w + DEC_WARPS, ... over the warps */
    for (int m = warp; m < MM && m < M; m += DEC_WARPS) {
#pragma unroll
        for (int c = 0; c < CPL; c++) {
            float t = 0.0f;
            for (int k = 0; k < DEC_WARPS; k++) t += red[k][m][lane * CPL + c];
            if (!live) continue;
            if (partial)
                partial[((size_t)split * M + m) * L.Npad + n0 + c] = t;
            else if (n0 + c < L.N)
                y[(size_t)m * L.N + n0 + c] = t + (L.bias ? __half2float(L.bias[n0 + c]) : 0.0f);
        }
    }
}

template <int MM>
__global__ void __launch_bounds__(GEMV_COLS) exl2_gemv_kernel(tsr_linear_dev L, const float *x, int M, int cpb,
                                                              float *partial)
{
    __shared__ float xs[MM][GEMV_CHUNKS * 32];
    const int n = blockIdx.x * GEMV_COLS + threadIdx.x;
    const int c0 = blockIdx.y * cpb, c1 = min(L.n_chunks, c0 + cpb);
    const int rowbase = L.chunks[c0].row0;
    const int nrows = L.chunks[c1 - 1].row0 + L.chunks[c1 - 1].rows - rowbase;
    for (int i = threadIdx.x; i < MM * nrows; i += GEMV_COLS) {
        const int m = i / nrows, r = i % nrows;
        xs[m][r] = m < M ? x[(size_t)m * L.K + L.perm[rowbase + r]] : 0.0f;
    }
    __syncthreads();
    if (n >= L.Npad) return;
    float acc[MM];
#pragma unroll
    for (int m = 0; m < MM; m++) acc[m] = 0.0f;
    int last_group = -1;
    float S = 0.0f, zoff = 0.0f;
    int codes[32];
    for (int c = c0; c < c1; c++) {
        const tsr_exl2_chunk ch = L.chunks[c];
        const int g = ch.group & 0xffffff, bits = ch.group >> 24;
        if (g != last_group) {
            group_params(L, g, bits, n, &S, &zoff);
            last_group = g;
        }
        decode_any(bits, L.q_weight, L.Npad, ch.qrow, ch.rows, n, codes);
        const int r0 = ch.row0 - rowbase;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            if (j < ch.rows) {
                const float w = ((float)codes[j] + zoff) * S;
#pragma unroll
                for (int m = 0; m < MM; m++) acc[m] += w * xs[m][r0 + j];
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MM; m++)
        if (m < M) partial[((size_t)blockIdx.y * M + m) * L.Npad + n] = acc[m];
}

template <int MM>
static void gemv_launch(const tsr_linear_dev *L, const float *x, int M, int cpb, float *partial, int splits)
{
    dim3 grid(tsr_div_up(L->Npad, GEMV_COLS), splits);
    exl2_gemv_kernel<MM><<<grid, GEMV_COLS, 0, tsr_cuda_stream()>>>(*L, x, M, cpb, partial);
}

/* Sums the K-split partials of each part (those with splits > 1) plus bias into y, all parts in one launch. */
struct red_part {
    const float *partial;
    const __half *bias;
    float *y;
    int splits, N, Npad;
    unsigned blocks;
};
struct red_group {
    red_part p[DEC_MAX_PARTS];
    int n;
};

__global__ void exl2_reduce_group_kernel(const __grid_constant__ red_group G, int M)
{
    unsigned b = blockIdx.x;
    int part = 0;
    while (part + 1 < G.n && b >= G.p[part].blocks) b -= G.p[part++].blocks;
    const red_part &P = G.p[part];
    const size_t i = (size_t)b * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * P.N) return;
    const int m = (int)(i / P.N), n = (int)(i % P.N);
    float s = P.bias ? __half2float(P.bias[n]) : 0.0f;
    for (int k = 0; k < P.splits; k++) s += P.partial[((size_t)k * M + m) * P.Npad + n];
    P.y[i] = s;
}

/* The K-split partials of one matrix plus its bias into y. */
static void reduce_launch(const float *partial, int splits, const tsr_linear_dev *L, int M, float *y)
{
    red_group R = {};
    const unsigned blocks = tsr_div_up((size_t)M * L->N, 256);
    R.p[0] = red_part{partial, L->bias, y, splits, L->N, L->Npad, blocks};
    R.n = 1;
    exl2_reduce_group_kernel<<<blocks, 256, 0, tsr_cuda_stream()>>>(R, M);
    TSR_CUDA_LAUNCHED();
}

/* The decode GEMV of n matrices with the same input in one launch (plus one reduction launch when any of them
 * splits K over blocks). Each part's partial sums take their own stretch of scratch slot 3. */
template <int MM, int CPL>
static void dec_launch(const tsr_linear_dev *const *Ls, int n, const float *x, int M, float *const *ys)
{
    dec_group G = {};
    red_group R = {};
    int splits[DEC_MAX_PARTS];
    size_t scratch = 0, offset[DEC_MAX_PARTS];
    unsigned blocks = 0;
    G.n = n;
    for (int i = 0; i < n; i++) {
        const tsr_linear_dev *L = Ls[i];
        /* split K over blocks only as far as needed to give every SM about two blocks */
        const int col_blocks = (int)tsr_div_up(L->Npad, 32 * CPL);
        int sp = 1;
        while (col_blocks * sp < 264 && L->n_chunks / (sp * 2) >= DEC_WARPS) sp *= 2;
        const int cpb = (L->n_chunks + sp - 1) / sp;
        splits[i] = sp = (L->n_chunks + cpb - 1) / cpb;
        offset[i] = scratch;
        if (sp > 1) scratch += (size_t)sp * M * L->Npad;
        G.p[i] = dec_part{*L, ys[i], NULL, cpb, col_blocks, col_blocks * sp};
        blocks += (unsigned)(col_blocks * sp);
    }
    float *partial = scratch ? (float *)tsr_cuda_scratch(3, scratch * sizeof(float)) : NULL;
    unsigned red_blocks = 0;
    for (int i = 0; i < n; i++) {
        if (splits[i] <= 1) continue;
        G.p[i].partial = partial + offset[i];
        const unsigned rb = tsr_div_up((size_t)M * Ls[i]->N, 256);
        R.p[R.n++] = red_part{G.p[i].partial, Ls[i]->bias, ys[i], splits[i], Ls[i]->N, Ls[i]->Npad, rb};
        red_blocks += rb;
    }
    exl2_dec_kernel<MM, CPL><<<blocks, DEC_WARPS * 32, 0, tsr_cuda_stream()>>>(G, x, M);
    TSR_CUDA_LAUNCHED();
    if (R.n) {
        exl2_reduce_group_kernel<<<red_blocks, 256, 0, tsr_cuda_stream()>>>(R, M);
        TSR_CUDA_LAUNCHED();
    }
}

/* The CUDA-core decode GEMV (M <= 8) for n matrices sharing x, or 0 when it does not apply (the caller then runs
 * the matrices one by one through tsr_cuda_linear). */
static int dec_gemv(const tsr_linear_dev *const *Ls, int n, const float *x, int M, float *const *ys)
{
    for (int i = 0; i < n; i++)
        if (M > 8 || Ls[i]->Npad % 4 || Ls[i]->K != Ls[0]->K) return 0;
    switch (M) {
    /* two columns per lane for one or two rows (fewer registers, more warps per SM), four above */
    case 1: dec_launch<1, 2>(Ls, n, x, M, ys); break;
    case 2: dec_launch<2, 2>(Ls, n, x, M, ys); break;
    case 3:
    case 4: dec_launch<4, 4>(Ls, n, x, M, ys); break;
    default: dec_launch<8, 4>(Ls, n, x, M, ys); break;
    }
    return 1;
}

int tsr_cuda_exl2_tc_gemv(const tsr_linear_dev *L, const float *x, int M, float *y); /* gemv_tc.cu */

/* Which decode GEMV runs for the M that reach it (measured on the H200, kernels/cuda/NOTES.md): the CUDA-core
 * kernel v6 for M <= 8 (faster there: 10.4 vs 11.6 ms per 8B step at batch 1) and the tensor-core kernel
 * (gemv_tc.cu) for 8 < M <= 32, which by default go to the dequantize-and-cuBLAS path instead (dq_path).
 * TSR_CUDA_GEMV=tc runs the tensor-core kernel for every M <= 32 that reaches here, TSR_CUDA_GEMV=v6 the
 * CUDA-core kernels (for comparisons). */
static int gemv_mode(void)
{
    static int mode = -1; /* 0 auto, 1 tc, 2 v6 */
    if (mode < 0) {
        const char *v = getenv("TSR_CUDA_GEMV");
        mode = v && !strcmp(v, "tc") ? 1 : v && !strcmp(v, "v6") ? 2 : 0;
    }
    return mode;
}

static void exl2_gemv(const tsr_linear_dev *L, const float *x, int M, float *y)
{
    const int mode = gemv_mode();
    if ((mode == 1 || (mode == 0 && M > 8)) && tsr_cuda_exl2_tc_gemv(L, x, M, y)) {
        TSR_CUDA_LAUNCHED();
        return;
    }
    if (dec_gemv(&L, 1, x, M, &y)) return;
    /* chunks per block: as many as fit (GEMV_CHUNKS) while the grid still gives every SM a few blocks */
    const int vec4 = 0;
    const long col_blocks = (L->Npad + GEMV_COLS * (vec4 ? 4 : 1) - 1) / (GEMV_COLS * (vec4 ? 4 : 1));
    int cpb = GEMV_CHUNKS;
    while (cpb > 1 && col_blocks * ((L->n_chunks + cpb - 1) / cpb) < 528) cpb /= 2;
    const int splits = (L->n_chunks + cpb - 1) / cpb;
    float *partial = (float *)tsr_cuda_scratch(3, (size_t)splits * M * L->Npad * sizeof(float));
    if (M <= 8) {
        gemv_launch<8>(L, x, M, cpb, partial, splits);
    } else if (M <= 16) {
        gemv_launch<16>(L, x, M, cpb, partial, splits);
    } else {
        gemv_launch<32>(L, x, M, cpb, partial, splits);
    }
    TSR_CUDA_LAUNCHED();
    reduce_launch(partial, splits, L, M, y);
}

/* ---- EXL2 tensor-core GEMM ---- */

#define BM 64
#define BN 64
#define BK 32

using namespace nvcuda;

/* xp[m][i] = h(x[m][perm[i]]): the activations in stored row order, as fp16, so GEMM tiles load contiguously. */
__global__ void permute_half_kernel(const float *x, const int32_t *perm, int M, int K, __half *xp)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * K) return;
    size_t m = i / K;
    xp[i] = __float2half_rn(x[m * K + perm[i % K]]);
}

__global__ void __launch_bounds__(128) exl2_gemm_kernel(tsr_linear_dev L, const __half *xp, int M, float *y)
{
    __shared__ __align__(32) __half As[BM][BK + 16];
    __shared__ __align__(32) __half Bs[BK][BN + 16];
    __shared__ __align__(32) float Cs[BM][BN + 8];
    const int tid = threadIdx.x, warp = tid >> 5;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);

    const int bcol = tid & (BN - 1), bhalf = tid >> 6; /* B tile: column, and which 16 rows */
    const int n = n0 + bcol;
    int last_group = -1;
    float S = 0.0f, zoff = 0.0f;
    int codes[32];
    for (int c = 0; c < L.n_chunks; c++) {
        const tsr_exl2_chunk ch = L.chunks[c];
        /* A: activations gathered through the permutation, as fp16 */
        for (int i = tid; i < BM * BK; i += 128) {
            const int m = i / BK, j = i % BK;
            As[m][j] = m0 + m < M && j < ch.rows ? xp[(size_t)(m0 + m) * L.K + ch.row0 + j] : __float2half_rn(0.0f);
        }
        /* B: the chunk's weights for this tile's columns, dequantized to fp16 */
        const int g = ch.group & 0xffffff, bits = ch.group >> 24;
        if (n < L.Npad) {
            if (g != last_group) {
                group_params(L, g, bits, n, &S, &zoff);
                last_group = g;
            }
            decode_any(bits, L.q_weight, L.Npad, ch.qrow, ch.rows, n, codes);
        }
#pragma unroll
        for (int j = 0; j < 32; j++)
            if ((j >> 4) == bhalf) Bs[j][bcol] = __float2half_rn(n < L.Npad && j < ch.rows ? ((float)codes[j] + zoff) * S : 0.0f);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b[2];
#pragma unroll
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(a[i], &As[wm + 16 * i][kk], BK + 16);
#pragma unroll
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(b[j], &Bs[kk][wn + 16 * j], BN + 16);
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&Cs[wm + 16 * i][wn + 16 * j], acc[i][j], BN + 8, wmma::mem_row_major);
    __syncthreads();
    for (int i = tid; i < BM * BN; i += 128) {
        const int m = i / BN, nn = i % BN;
        if (m0 + m < M && n0 + nn < L.N)
            y[(size_t)(m0 + m) * L.N + n0 + nn] = Cs[m][nn] + (L.bias ? __half2float(L.bias[n0 + nn]) : 0.0f);
    }
}

/* ---- EXL2 through cuBLAS: dequantize column slabs to fp16, then one dense GEMM per slab ---- */

/* dq[r][j] = W[r][n0 + j] for the slab's w columns, rows in stored order (the same fp16 values the tile GEMM
 * builds in shared memory); one thread per (column, 32-row chunk). */
__global__ void exl2_dequant_kernel(tsr_linear_dev L, int n0, int w, __half *dq)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x, n = n0 + j;
    if (j >= w || n >= L.Npad) return;
    const tsr_exl2_chunk ch = L.chunks[blockIdx.y];
    const int g = ch.group & 0xffffff, bits = ch.group >> 24;
    float S, zoff;
    int codes[32];
    group_params(L, g, bits, n, &S, &zoff);
    decode_any(bits, L.q_weight, L.Npad, ch.qrow, ch.rows, n, codes);
#pragma unroll
    for (int r = 0; r < 32; r++)
        if (r < ch.rows) dq[(size_t)(ch.row0 + r) * w + j] = __float2half_rn(((float)codes[r] + zoff) * S);
}

/* The smallest M that takes this path (TSR_CUDA_DQ_MIN_M; 0 turns it off), read once. */
static int dq_min_m(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("TSR_CUDA_DQ_MIN_M");
        v = e ? atoi(e) : 9;
        if (v < 0) v = 0;
    }
    return v;
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

void tsr_cuda_dq_reserve(size_t bytes)
{
    if (dq_min_m() == 0 || bytes <= g_dq_bytes) return;
    tsr_cuda_scratch(3, bytes);
    g_dq_bytes = bytes;
}

/* Whether M rows of L go through the dequantize-and-cuBLAS path: M large enough and a buffer that holds at least
 * a 128-column slab of L. */
static int dq_path(const tsr_linear_dev *L, int M)
{
    return dq_min_m() && M >= dq_min_m() && g_dq_bytes >= (size_t)L->K * 128 * sizeof(__half);
}

/* y = xp · W through cuBLAS, xp being the activations already in stored row order (fp16). */
static void exl2_dq_gemm(const tsr_linear_dev *L, const __half *xp, int M, float *y)
{
    const float alpha = 1.0f, beta = 0.0f;
    size_t slab = g_dq_bytes / ((size_t)L->K * sizeof(__half));
    slab -= slab % 128;
    if (dq_slab_cols() && slab > dq_slab_cols()) slab = dq_slab_cols();
    if (slab > (size_t)L->Npad) slab = L->Npad;
    __half *dq = (__half *)tsr_cuda_scratch(3, g_dq_bytes);
    for (int n0 = 0; n0 < L->N; n0 += (int)slab) {
        const int w = (int)slab, cols = L->N - n0 < w ? L->N - n0 : w;
        dim3 grid(tsr_div_up(w, 128), L->n_chunks);
        exl2_dequant_kernel<<<grid, 128, 0, tsr_cuda_stream()>>>(*L, n0, w, dq);
        TSR_CUDA_LAUNCHED();
        cublasStatus_t st = cublasGemmEx(tsr_cuda_blas(), CUBLAS_OP_N, CUBLAS_OP_N, cols, M, L->K, &alpha, dq, CUDA_R_16F,
                                         w, xp, CUDA_R_16F, L->K, &beta, y + n0, CUDA_R_32F, L->N, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
        if (st != CUBLAS_STATUS_SUCCESS) tsr_cuda_fatal(__FILE__, __LINE__, "cublasGemmEx failed");
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
__global__ void dense_gemv_kernel(const void *w, int dtype, const void *bias, int bias_dtype, const float *x, int K, int N,
                                  float *y)
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
    cublasStatus_t st = cublasGemmEx(tsr_cuda_blas(), CUBLAS_OP_T, CUBLAS_OP_N, L->N, M, L->K, &alpha, L->w, t, L->K, xin,
                                     t, L->K, &beta, y, CUDA_R_32F, L->N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) tsr_cuda_fatal(__FILE__, __LINE__, "cublasGemmEx failed");
    if (L->dense_bias) {
        add_bias_kernel<<<tsr_div_up((size_t)M * L->N, 256), 256, 0, tsr_cuda_stream()>>>(y, M, L->N, L->dense_bias,
                                                                                          L->bias_dtype);
        TSR_CUDA_LAUNCHED();
    }
}

void tsr_cuda_linear(const tsr_linear *Lh, const float *x, int M, float *y)
{
    const tsr_linear_dev *L = (const tsr_linear_dev *)Lh->dev;
    if (M <= 0) return;
    if (!L) tsr_cuda_fatal(__FILE__, __LINE__, "linear layer used before prepare_model");
    if (L->kind == TSR_LINEAR_EXL2) {
        const int dq = dq_path(L, M);
        if (M <= GEMV_MAX_M && !dq) {
            exl2_gemv(L, x, M, y);
        } else {
            __half *xp = (__half *)tsr_cuda_scratch(0, (size_t)M * L->K * sizeof(__half));
            permute_half_kernel<<<tsr_div_up((size_t)M * L->K, 256), 256, 0, tsr_cuda_stream()>>>(x, L->perm, M, L->K, xp);
            TSR_CUDA_LAUNCHED();
            if (dq) {
                exl2_dq_gemm(L, xp, M, y);
                if (L->bias) {
                    add_bias_kernel<<<tsr_div_up((size_t)M * L->N, 256), 256, 0, tsr_cuda_stream()>>>(y, M, L->N, L->bias,
                                                                                                      TSR_F16);
                    TSR_CUDA_LAUNCHED();
                }
            } else {
                dim3 grid(tsr_div_up(L->N, BN), tsr_div_up(M, BM));
                exl2_gemm_kernel<<<grid, 128, 0, tsr_cuda_stream()>>>(*L, xp, M, y);
                TSR_CUDA_LAUNCHED();
            }
        }
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

void tsr_cuda_linear_many(const tsr_linear *const *Lh, int n, const float *x, int M, float *const *y)
{
    static int enabled = -1; /* TSR_CUDA_GROUP=0 runs the matrices one by one (for comparisons) */
    if (enabled < 0) enabled = !getenv("TSR_CUDA_GROUP") || atoi(getenv("TSR_CUDA_GROUP")) != 0;
    const tsr_linear_dev *L[DEC_MAX_PARTS];
    int grouped = enabled && n >= 1 && n <= DEC_MAX_PARTS && M <= 8 && gemv_mode() != 1;
    for (int i = 0; grouped && i < n; i++) {
        L[i] = (const tsr_linear_dev *)Lh[i]->dev;
        grouped = L[i] && L[i]->kind == TSR_LINEAR_EXL2 && !dq_path(L[i], M);
    }
    if (grouped && dec_gemv(L, n, x, M, y)) return;
    for (int i = 0; i < n; i++) tsr_cuda_linear(Lh[i], x, M, y[i]);
}
