/* The decode GEMV of EXL2 and GPTQ matrices (matmul.cu takes it below TSR_CUDA_DQ_MIN_M rows; tsr_cuda_gemv).
 *
 * A tensor-core GEMV over the fragment layout of exl2_frag.cuh. A block of 8 warps covers 128 columns and a range of
 * 32-row units; the block first copies its activations into shared memory, staged once per launch by a small kernel
 * that gathers them through the permutation into the B-operand order of mma.m16n8k16 (up to 8 rows split into fp16
 * hi + lo halves, so the products are exact to ~2^-22 like fp32; above 8 rows fp16, as on the cuBLAS path; with
 * TSR_CUDA_GEMV_PRESTAGE=0 each block gathers its exact rows itself; where the launch before it produced the
 * activations, the residual pass with its norm or silu_mul, that launch wrote the entries already: stage_ahead.cuh),
 * and each warp then streams 64 columns of one quarter of the units: b words per lane per 32 × 32 block, each pair of
 * codes masked in place into an fp16 pattern (one LOP3) and scaled back with the zero point subtracted by one HFMA2
 * (exact), then per 16 × 16 tile one mma per 8-token tile into fp32 accumulators that are scaled once per group (up to
 * 4 rows the hi and lo halves take the 8 B-columns of one mma, 5 to 8 rows two mma's). Warps of a block add up in
 * shared memory; when K is split over blocks to fill the chip, a second kernel adds the blocks' partial sums and the
 * bias (deterministic). Up to three matrices with the same input (q/k/v, gate/up) run as one launch. On sm_90, 3 to 64
 * rows take frag_gemv_bulk_kernel instead (except narrow groups of 9-16 rows, fg_frag_n): the same products from
 * 448- or 512-column blocks whose units arrive by bulk copies (bulk.cuh) issued by one producer warp, with hi + lo
 * halves only up to 4 rows (fg_exact), in 1 to 4 or 8 token tiles of 8; from 9 rows (GPTQ: 33) the group scales
 * are multiplied into the fp16 A operands (fg_fold) rather than into fp32 sums per group, and from 17 rows (GPTQ:
 * 33) each unit's activations travel through the ring beside its weights (ft_xring) instead of being staged for the
 * block's K range. At one row, GPTQ's 4-bit units (EXL2's too with TSR_CUDA_GEMV_IMMA=1) go through integer tensor
 * cores instead of the fp16 decode (gemv_imma.cuh). */
#include "kernels/cuda/bulk.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/exl2_frag.cuh"
#include "kernels/cuda/gemv_imma.cuh"
#include "kernels/cuda/gemv_warp.cuh"
#include "kernels/cuda/launch.cuh"

#include <stdlib.h>

/* ---- decode GEMV over the fragment layout ---- */

#define FG_WARPS 8         /* per block: 2 column groups of 64 × FG_WK slices of the block's units */
#define FG_WK 4
#define FG_COLS 128        /* columns per block */
#define FG_MAX_PARTS TSR_GEMV_MAX_PARTS /* matrices per launch */
#define FG_STAGE_MAX 32768 /* bytes of staged activations per block, M <= 8 (two blocks per SM) */
#define FG_STAGE_WIDE 131072 /* the same for 8 < M <= 32 (one block per SM) */
#define FG_MAX_M      TSR_GEMV_MAX_M /* rows per launch at most: 1, 2 or 4 mma n-tiles of 8 tokens */
/* shared-memory words per warp, after the staged activations: unit records, ring, scale scratch (fg_warp) */
#define FG_WARP_WORDS (FG_RING * FG_STEP_WORDS + 2 * FG_WARP_UNITS + FG_SCALE_WORDS)

/* One matrix of a launch: its blocks are col_blocks × splits of the grid, after those of the parts before. */
struct fg_part {
    tsr_linear_dev L;
    float *y, *partial; /* partial: [splits][M][Npad] when K is split over blocks, else NULL */
    const uint2 *xs;    /* the activations pre-staged by fg_prestage_kernel (B-operand order: hi + lo halves where
                         * fg_exact, else fp16), or NULL: each block gathers its own */
    int ub;             /* units per block */
    int col_blocks, blocks;
};
struct fg_group {
    fg_part p[FG_MAX_PARTS];
    int n;
};

/* The part of a grouped launch that block b belongs to: parts take consecutive stretches of their `blocks` blocks,
 * and b becomes the block's index within its part. */
template <typename Group, typename Index> __device__ __forceinline__ int group_part(const Group &G, Index &b)
{
    int part = 0;
    while (part + 1 < G.n && b >= G.p[part].blocks) b -= G.p[part++].blocks;
    return part;
}

/* One result of a part: column nn of token m, as a K-split partial sum of split `split` when the part has them,
 * else into y with the bias (columns past N are padding and dropped). */
__device__ __forceinline__ void fg_store(const fg_part &P, int split, int M, int m, int nn, float v)
{
    const tsr_linear_dev &L = P.L;
    if (P.partial)
        P.partial[((size_t)split * M + m) * L.Npad + nn] = v;
    else if (nn < L.N)
        P.y[(size_t)m * L.N + nn] = v + (L.bias ? __half2float(L.bias[nn]) : 0.0f);
}

/* Activations of units [u0, u0 + nu) as staged B operands: entry ((unit · 2 + ks) · M + token) · 4 + quad holds
 * the hi halves of rows c, c+1 and c+8, c+9 (c = 2 quad) of the 16-row step, then the lo halves. The block's
 * threads take the (16-row step, quad) pairs of the range in chunks of FG_STAGE_CHUNK each: a chunk's sources
 * (unit rows through the permutation, which does not depend on x) are read first, so the first chunk's can be read
 * before the PDL wait, and then all its x values are requested before any is converted. */
#define FG_STAGE_CHUNK 4
struct fg_src {
    int s[FG_STAGE_CHUNK][4];
};

__device__ __forceinline__ void fg_stage_src(const tsr_linear_dev &L, int u0, int pairs, int chunk, fg_src &S)
{
#pragma unroll
    for (int p = 0; p < FG_STAGE_CHUNK; p++) {
        const int i = (chunk * FG_STAGE_CHUNK + p) * (int)blockDim.x + (int)threadIdx.x;
        const int k = u0 * 32 + (i >> 2) * 16 + 2 * (i & 3);
#pragma unroll
        for (int j = 0; j < 4; j++) S.s[p][j] = i < pairs ? L.uperm[k + (j & 1) + 8 * (j >> 1)] : -1;
    }
}

__device__ __forceinline__ void fg_stage_chunk(const float *x, int K, int M, int pairs, int chunk, const fg_src &S,
                                               uint4 *stage)
{
    for (int tok = 0; tok < M; tok++) {
        float v[FG_STAGE_CHUNK][4];
#pragma unroll
        for (int p = 0; p < FG_STAGE_CHUNK; p++)
#pragma unroll
            for (int j = 0; j < 4; j++) v[p][j] = S.s[p][j] >= 0 ? x[(size_t)tok * K + S.s[p][j]] : 0.0f;
#pragma unroll
        for (int p = 0; p < FG_STAGE_CHUNK; p++) {
            const int i = (chunk * FG_STAGE_CHUNK + p) * (int)blockDim.x + (int)threadIdx.x;
            if (i >= pairs) continue;
            stage[((i >> 2) * M + tok) * 4 + (i & 3)] = fg_hi_lo(v[p]);
        }
    }
}

/* The activations staged once per launch instead of once per block: the entries of fg_stage_chunk for every unit
 * of each part (hi + lo halves where the rows are exact, fg_exact, else hi halves only), which the blocks then copy
 * whole with cp.async. Always for fp16 rows; for exact rows unless TSR_CUDA_GEMV_PRESTAGE=0 (fg_prestage_exact). */
struct fg_pre_part {
    const int32_t *uperm;
    uint2 *xs;
    unsigned entries, blocks;
};
struct fg_pre_group {
    fg_pre_part p[FG_MAX_PARTS];
    int n;
};

__global__ void fg_prestage_kernel(const __grid_constant__ fg_pre_group G, const float *x, int M, int K, int exact)
{
    tsr_pdl_start();
    unsigned b = blockIdx.x;
    const fg_pre_part &P = G.p[group_part(G, b)];
    const unsigned i = b * blockDim.x + threadIdx.x;
    if (i >= P.entries) return;
    const int q = (int)(i & 3), tok = (int)((i >> 2) % M), uk = (int)((i >> 2) / M);
    const int4 src = stage_entry_src(P.uperm, uk * 4 + q);
    const int s[4] = {src.x, src.y, src.z, src.w};
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        v[j] = s[j] >= 0 ? x[(size_t)tok * K + s[j]] : 0.0f;
    stage_entry_store(P.xs, i, exact, v); /* exact: hi + lo halves, as fg_stage_chunk writes them */
}

/* The block's activations for units [u0, u0 + nu) into shared memory, by all its threads: copied from the entries
 * fg_prestage_kernel wrote (nu · 2 · M · 4 of them, 16 bytes each for exact rows, SELF, else 8), or, for exact rows
 * without them (P.xs NULL), gathered here. In two calls: fg_stage_begin reads the first chunk's permutation entries,
 * which do not depend on x, as the block's first loads (so they travel beside its unit records); fg_stage_block
 * waits for the kernel that writes x (PDL) and stages. */
template <bool SELF>
__device__ __forceinline__ void fg_stage_begin(const fg_part &P, int u0, int nu, fg_src &S)
{
    if (SELF && !P.xs) fg_stage_src(P.L, u0, nu * 8, 0, S);
}

template <bool SELF>
__device__ __forceinline__ void fg_stage_block(const fg_part &P, const float *x, int M, int u0, int nu, uint4 *stage,
                                               const fg_src &S0)
{
    if (SELF && !P.xs) {
        const int pairs = nu * 8;
        const int chunks = (pairs + FG_STAGE_CHUNK * (int)blockDim.x - 1) / (FG_STAGE_CHUNK * (int)blockDim.x);
        tsr_pdl_wait();
        fg_stage_chunk(x, P.L.K, M, pairs, 0, S0, stage);
        fg_src S;
        for (int c = 1; c < chunks; c++) {
            fg_stage_src(P.L, u0, pairs, c, S);
            fg_stage_chunk(x, P.L.K, M, pairs, c, S, stage);
        }
    } else {
        tsr_pdl_wait();
        const int per = SELF ? 2 : 1; /* 16-byte pieces per entry: hi + lo, or hi */
        const uint4 *src = (const uint4 *)(P.xs + (size_t)u0 * 2 * M * 4 * per);
        for (int i = threadIdx.x; i < nu * M * 4 * per; i += blockDim.x) cp_async16(stage + i, src + i);
        cp_async_commit();
        cp_async_wait<0>();
    }
}

/* Relative cost of decoding one unit of a width (the run loops' instructions per unit, stop 21). */
__device__ __forceinline__ int fg_unit_cost(int bits)
{
    switch (bits) {
    case 2: return 19;
    case 3: return 26;
    case 4: return 18;
    case 5:
    case 6: return 29;
    default: return 22;
    }
}

/* The units [first, end) of the block's range [u0, u1) that K slice wk of its warps takes. The slices split the
 * range where the units' running cost crosses k / FG_WK of the total, measured at each unit's midpoint (equal
 * counts made the slice with the 3-bit tail of a matrix a quarter slower than the others, and the block waited
 * for it), with at most FG_WARP_UNITS units per slice (u1 - u0 <= FG_WK · FG_WARP_UNITS). Every warp computes all
 * boundaries from the unit records, each lane a stretch of up to 8 units. */
template <bool GPTQ>
__device__ __forceinline__ int2 fg_slice(const uint2 *units, int u0, int u1, int wk, int lane)
{
    static_assert(FG_WK * FG_WARP_UNITS <= 256, "a lane scans at most 8 units");
    const int nu = u1 - u0;
    if constexpr (GPTQ) { /* one width */
        const int per = (nu + FG_WK - 1) / FG_WK;
        return make_int2(u0 + min(nu, wk * per), u0 + min(nu, (wk + 1) * per));
    }
    const int per = (nu + 31) / 32, a = u0 + min(nu, lane * per), b = u0 + min(nu, lane * per + per);
    int c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        c[j] = a + j < b ? fg_unit_cost((int)(units[a + j].y >> 24)) : 0;
        sum += c[j];
    }
    int incl = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    int2 r = make_int2(u0, u1);
    int prev = u0;
#pragma unroll
    for (int k = 1; k < FG_WK; k++) {
        int cnt = 0, run = incl - sum;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            cnt += c[j] && FG_WK * (2 * run + c[j]) < 2 * k * total;
            run += c[j];
        }
        int bk = u0 + (int)__reduce_add_sync(0xffffffffu, (unsigned)cnt);
        bk = max(min(bk, prev + FG_WARP_UNITS), u1 - (FG_WK - k) * FG_WARP_UNITS);
        if (k == wk) r.x = bk;
        if (k == wk + 1) r.y = bk;
        prev = bk;
    }
    return r;
}

/* IMMA (one row only): 4-bit units on integer tensor cores (gemv_imma.cuh), the other widths as below. */
template <bool ONE, bool PK, bool GPTQ, int NT, bool IMMA = false>
__global__ void __launch_bounds__(FG_WARPS * 32, NT == 1 ? 2 : 1)
    frag_gemv_kernel(const __grid_constant__ fg_group G, const float *x, int M, int stage_words)
{
    static_assert(!IMMA || (ONE && PK && NT == 1), "the integer path serves one row");
    extern __shared__ uint4 fg_smem[];
    int b = blockIdx.x;
    const fg_part &P = G.p[group_part(G, b)];
    const tsr_linear_dev &L = P.L;
    const int colb = b % P.col_blocks, split = b / P.col_blocks;
    const int u0 = split * P.ub, u1 = min(L.n_units, u0 + P.ub), nu = u1 - u0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wc = warp & 1, wk = warp >> 1;
    const int ncb = L.Npad / 32;
    const int2 slice = fg_slice<GPTQ>(L.units, u0, u1, wk, lane);
    const int wa = slice.x, n = slice.y - slice.x;
    uint32_t *wsm = (uint32_t *)fg_smem + stage_words + warp * FG_WARP_WORDS;
    fg_warp W;
    W.meta = (const uint2 *)wsm;
    W.ring = wsm + 2 * FG_WARP_UNITS;
    W.scratch = (float *)(W.ring + FG_RING * FG_STEP_WORDS);
    W.bs = fg_bsrc_of<NT, PK>(fg_smem, M, lane);
    W.wa = wa, W.u0 = u0, W.M = M, W.lane = lane, W.cb0 = (colb * 4 + wc * 2), W.ncb = ncb;
    W.src_cb[0] = W.cb0 < ncb ? W.cb0 : 0, W.src_cb[1] = W.cb0 + 1 < ncb ? W.cb0 + 1 : W.src_cb[0];
    W.wcb = min(W.cb0, ncb - 1);
    W.fw = L.fw;
    fg_header_role(L, W);
    fg_src S0;
    fg_stage_begin<NT == 1>(P, u0, nu, S0);
    for (int i = lane; i < n; i += 32) ((uint2 *)wsm)[i] = L.units[wa + i];
    __syncwarp();
    /* the weights are constant: the first run's first steps go out before waiting for the kernel that writes x
     * (programmatic dependent launch) and while the block stages x */
    static_assert(FG_WARP_UNITS <= 64, "fg_run_ends covers 64 units");
    const uint64_t ends = fg_run_ends(W.meta, n, lane);
    const int rb0 = n > 0 ? fg_next_end(ends, 0) : 0;
    const int bits0 = n > 0 ? (GPTQ ? 4 : (int)(W.meta[0].y >> 24)) : 0;
    if (n > 0) fg_prologue_any(bits0, W, wa, wa + rb0);
    const uint32_t int_entries = IMMA ? fi_int_entries<GPTQ>(L, u0, nu) : 0u;
    fg_stage_block<NT == 1>(P, x, M, u0, nu, fg_smem, S0);
    __syncthreads();
    fi_lane K = {};
    if constexpr (IMMA) { /* the 4-bit units' activations to fixed point, in place (the warps' scratch free yet) */
        float *scratch0 = (float *)fg_smem + stage_words + 2 * FG_WARP_UNITS + FG_RING * FG_STEP_WORDS; /* warp 0's */
        const float xscale = fi_stage<GPTQ>(nu, int_entries, fg_smem, scratch0, FG_WARP_WORDS);
        __syncthreads();
        K = fi_lane_of(lane, xscale);
    }

    float acc[NT][4][4], tot[NT][4][4];
    fg_zero<NT>(acc, tot);
    frag_scales sc[2] = {};
    int cur = -1;
    for (int ra = 0; ra < n;) {
        const int bits = (int)(W.meta[ra].y >> 24);
        const int rb = fg_next_end(ends, ra);
        const bool issued = ra == 0;
        if constexpr (IMMA) { /* runs end groups: each run's sums are flushed at its end */
            frag_with_width(GPTQ ? 4 : bits, [&](auto w) {
                constexpr int B = decltype(w)::value;
                if constexpr (B == 4) {
                    fi_run<GPTQ>(L, W, wa + ra, wa + rb, issued, (const uint32_t *)fg_smem, K, tot[0]);
                } else if constexpr (!GPTQ) {
                    int rcur = -1;
                    fg_run<B, false, ONE, PK, NT>(L, W, wa + ra, wa + rb, issued, rcur, sc, acc, tot);
                    if (rcur >= 0) fg_flush<ONE, NT>(acc, tot, sc);
                }
            });
        } else if (GPTQ) {
            fg_run<4, true, ONE, PK, NT>(L, W, wa + ra, wa + rb, issued, cur, sc, acc, tot);
        } else {
            frag_with_width(bits, [&](auto w) {
                constexpr int B = decltype(w)::value;
                fg_run<B, false, ONE, PK, NT>(L, W, wa + ra, wa + rb, issued, cur, sc, acc, tot);
            });
        }
        ra = rb;
    }
    tsr_pdl_trigger(); /* late, unlike the small kernels (launch.cuh) */
    if (cur >= 0) fg_flush<ONE, NT>(acc, tot, sc);
    if (PK) fg_unpack<ONE>(tot[0]);

    /* the FG_WK slices of each column group meet in shared memory (the staging area is free again), as
     * red[slice][token][column of the block]; then the whole block adds them up, one (token, column) per thread
     * and pass, and stores them coalesced (a per-fragment store in every warp was a quarter of the time of the
     * small matrices at one row, mostly instruction-cache misses in its unrolled branches: NOTES.md, stop 20) */
    __syncthreads();
    float *red = (float *)fg_smem;
    fg_totals_to_smem<ONE, NT>(tot, red + wk * M * FG_COLS, FG_COLS, 64 * wc, M, lane);
    __syncthreads();
    const int live_cols = min(FG_COLS, L.Npad - colb * FG_COLS);
    for (int e = threadIdx.x; e < M * FG_COLS; e += FG_WARPS * 32) {
        const int m = e / FG_COLS, c = e % FG_COLS;
        if (c >= live_cols) continue;
        float v = 0.0f;
#pragma unroll
        for (int k = 0; k < FG_WK; k++) v += red[(k * M + m) * FG_COLS + c];
        fg_store(P, split, M, m, colb * FG_COLS + c, v);
    }
}

/* ---- decode GEMV on sm_90: whole units streamed by bulk copies from one producer warp ---- */

/* The same products as frag_gemv_kernel, organized so that the per-unit bookkeeping leaves the consumer warps: a
 * block covers 2 NC column blocks of a range of units; one producer lane streams each unit's column blocks
 * (contiguous in the fragment layout), its group's scale codes and its scale table into a ring slot with three bulk
 * copies, and each of the NC consumer warps decodes its 2 column blocks of every unit from the slot. The warps own
 * distinct columns: no reduction inside the block; K splits over blocks are added as before. The block copies its
 * stretch of the pre-staged activations (hi + lo halves up to 4 rows, fg_exact; fp16 above, HALF in the one-tile
 * instance), or gathers exact rows itself (TSR_CUDA_GEMV_PRESTAGE=0). (A ring that packed units by their own
 * width, 4-bit units taking half the room of 8-bit ones, was measured slower: kernels/cuda/NOTES.md, stop 18.) The
 * slot layout is that of FT_CONSUMERS (the most) consumers. */
#define FT_CONSUMERS 8
#define FT_CB (2 * FT_CONSUMERS) /* column blocks per slot, at most */
#define FT_COLS (32 * FT_CB)
#define FT_RING 4
#define FT_SLOT_WORDS (FT_CB * 32 * 8)        /* one unit of width 8 */
#define FT_HDR_WORDS (4 * FT_CB + 16 * FT_CB) /* scale or zero codes, then EXL2's table (16 fp32) or GPTQ's scales */
#define FT_STEP_WORDS (FT_SLOT_WORDS + FT_HDR_WORDS)
#define FT_MAX_UNITS 256 /* per block (FG_STAGE_MAX / 128 bytes per unit at M = 1) */
#define FT_MIN_UNITS 8   /* split K no further than this many units per block */
#define FT_MAX_M      64  /* rows per launch: up to 8 token tiles (frag_gemv_kernel: FG_MAX_M) */
#define FT_RED_ROWS   32  /* rows of results per pass through the ring at the end */
static_assert(FT_RING * FT_STEP_WORDS >= FT_RED_ROWS * FT_COLS, "the ring holds 32 rows of the block's results");

/* Consumer warps of the NT-tile kernel (NT = 1 to 4, or 8). With 8 (9 warps with the producer) one scheduler holds
 * three, whose registers share its quarter of the register file (16384 / (3 x 32): 168 per thread), and the 4-tile
 * kernel spilled in its run loop; with 7 it takes 203 registers without spills (+2-3 % at 32-64 rows). The 2-tile
 * kernel lost 14 % at 16 rows with 7 (NOTES.md, stop 26): 448-column blocks cut 4096 columns into 9 1/7 blocks;
 * the 3-tile kernel fits 8 (166 registers). (Those counts predate fg_fold, which dropped the per-group sums: the
 * 4-tile kernel now takes 145 registers, the 8-tile one 225 with 7.) */
__host__ __device__ constexpr int ft_consumers(int NT)
{
    return NT >= 4 ? 7 : 8;
}
static_assert(ft_consumers(1) <= FT_CONSUMERS && ft_consumers(2) <= FT_CONSUMERS && ft_consumers(3) <= FT_CONSUMERS &&
                  ft_consumers(4) <= FT_CONSUMERS && ft_consumers(8) <= FT_CONSUMERS,
              "the slot layout holds every instance's column blocks");

/* Shared memory after the staged activations. */
struct ft_shared {
    uint64_t full[FT_RING], empty[FT_RING];
    uint2 meta[FT_MAX_UNITS];
    float scales[FT_CONSUMERS][FG_SCALE_WORDS]; /* fg_exl2_scales' exchange, per consumer warp */
    uint32_t ring[FT_RING][FT_STEP_WORDS];
};
static_assert(sizeof(ft_shared) % 16 == 0, "XR's activation slots follow ft_shared, 16-byte aligned");

/* XR (activations through the ring): after ft_shared, each slot's staged activations of its unit, 2 × M × 4
 * entries of 8 bytes (fp16; fg_prestage_kernel's layout), so that no block stages its whole K range. */
#define FT_X_WORDS (FT_MAX_M * 16)

/* XR: slot s's activation area, after ft_shared. */
__device__ __forceinline__ uint32_t *ft_xslot(ft_shared &F, int s)
{
    return (uint32_t *)(&F + 1) + s * FT_X_WORDS;
}

/* XR: the activations of block unit i (block units start at unit u0 of the part) into slot i % FT_RING's
 * activation area; its full barrier already expects them (ft_issue). */
__device__ __forceinline__ void ft_issue_x(const fg_part &P, ft_shared &F, int u0, int i, int M)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int s = i % FT_RING;
    bulk_copy(ft_xslot(F, s), P.xs + (size_t)(u0 + i) * 2 * M * 4, (unsigned)M * 64u, &F.full[s]);
#endif
}

/* Producer: unit i of the block (record m) into its ring slot, arming the slot's full barrier (XR: also for the
 * unit's activations, which ft_issue_x copies, after the PDL wait for the first slots). */
template <bool GPTQ, bool XR>
__device__ __forceinline__ void ft_issue(const tsr_linear_dev &L, ft_shared &F, int i, int cbf, int live, int M)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint2 m = F.meta[i];
    const int bits = GPTQ ? 4 : (int)(m.y >> 24), grp = (int)(m.y & 0xffffffu), s = i % FT_RING;
    uint32_t *slot = F.ring[s];
    const unsigned wbytes = (unsigned)live * 128u * (unsigned)bits, cbytes = (unsigned)live * 16u;
    const unsigned tbytes = GPTQ ? (unsigned)live * 64u : 64u;
    mbar_expect_tx(&F.full[s], wbytes + cbytes + tbytes + (XR ? (unsigned)M * 64u : 0u));
    bulk_copy(slot, L.fw + m.x + (size_t)cbf * 32 * bits, wbytes, &F.full[s]);
    const uint32_t *codes = (GPTQ ? L.g_zeros : L.q_scale) + (size_t)grp * (L.Npad / 8) + 4 * cbf;
    bulk_copy(slot + FT_SLOT_WORDS, codes, cbytes, &F.full[s]);
    const void *tab = GPTQ ? (const void *)(L.g_scales + (size_t)grp * L.Npad + 32 * cbf)
                           : (const void *)(L.s_table + (size_t)grp * 16);
    bulk_copy(slot + FT_SLOT_WORDS + 4 * FT_CB, tab, tbytes, &F.full[s]);
#endif
}

/* FOLD: a group's scales as fp16 pairs for fg_fold, from the fp32 ones just decoded. */
__device__ __forceinline__ void fg_fold_scales(frag_scales (&sc)[2])
{
#pragma unroll
    for (int c = 0; c < 2; c++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            sc[c].h[j] = __float2half2_rn(sc[c].s[j]);
}

/* The end of the bulk kernel for token tiles T0 .. T0 + FT_RED_ROWS / 8 - 1 (at most NT) of a consumer warp: its
 * totals into red (in the ring, FT_COLS floats per row; the warp's own 64 columns), then coalesced stores. */
template <bool ONE, int NT, int T0>
__device__ __forceinline__ void ft_store_rows(const fg_part &P, const float (&tot)[NT][4][4], float *red, int split,
                                              int M, int warp, int lane, int cbf, int live)
{
    constexpr int TN = NT - T0 < FT_RED_ROWS / 8 ? NT - T0 : FT_RED_ROWS / 8;
    fg_totals_to_smem<ONE, NT, T0, TN>(tot, red, FT_COLS, 64 * warp, M, lane);
    __syncwarp();
    const int live_cols = 32 * live, m0 = 8 * T0, rows = min(M - m0, 8 * TN);
    for (int e = lane; e < rows * 64; e += 32) {
        const int m = e >> 6, c = 64 * warp + (e & 63);
        if (c >= live_cols) continue;
        fg_store(P, split, M, m0 + m, 32 * cbf + c, red[m * FT_COLS + c]);
    }
    __syncwarp();
}

/* Consumer warp w: units [ra, rb) of the block, all of width B, from their slots; a warp whose column blocks are
 * both past the matrix (`idle`) only takes part in the ring's barriers. FOLD: the scales go into the A operands
 * (fg_fold), so a new group only decodes them; else the group's sums are scaled into tot (fg_flush). */
template <int B, bool GPTQ, bool ONE, bool PK, int NT, bool FOLD, bool XR>
__device__ __forceinline__ void ft_run(const tsr_linear_dev &L, ft_shared &F, const fg_bsrc &bs, int ra, int rb, int w,
                                       bool idle, int lane, int M, int &cur, frag_scales (&sc)[2],
                                       float (&acc)[NT][4][4], float (&tot)[NT][4][4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int g = lane >> 2;
    for (int i = ra; i < rb; i++) {
        const int s = i % FT_RING;
        mbar_wait(&F.full[s], (unsigned)(i / FT_RING) & 1u);
        if (!idle) {
            const uint32_t *slot = F.ring[s];
            const int grp = (int)(F.meta[i].y & 0xffffffu);
            if (grp != cur) {
                if (!FOLD && cur >= 0) fg_flush<ONE, NT>(acc, tot, sc);
                const uint32_t *hdr = slot + FT_SLOT_WORDS;
                if (GPTQ) {
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        frag_scales_decode(*(const uint4 *)(hdr + 4 * (2 * w + c)),
                                           (const __half *)(hdr + 4 * FT_CB) + 32 * (2 * w + c), true, L.zero_add,
                                           g, sc[c]);
                } else {
                    fg_exl2_scales(hdr + 8 * w, (const float *)(hdr + 4 * FT_CB), F.scales[w], lane, sc);
                }
                if (FOLD) fg_fold_scales(sc);
                cur = grp;
            }
            if (XR) { /* the unit's activations sit in its slot's activation area */
                fg_bsrc xb = bs;
                xb.p = (const uint2 *)ft_xslot(F, s);
                fg_unit<B, GPTQ, NT, PK, FOLD>(slot + 2 * w * 32 * B, xb, 0, M, lane, sc, acc);
            } else {
                fg_unit<B, GPTQ, NT, PK, FOLD>(slot + 2 * w * 32 * B, bs, i, M, lane, sc, acc);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&F.empty[s]);
    }
#endif
}

template <bool ONE, bool PK, bool GPTQ, int NT, bool HALF = false, bool FOLD = false, bool XR = false>
__global__ void __launch_bounds__((ft_consumers(NT) + 1) * 32, NT == 1 ? 2 : 1)
    frag_gemv_bulk_kernel(const __grid_constant__ fg_group G, const float *x, int M, int stage_words)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ uint4 fg_smem[];
    int b = blockIdx.x;
    const fg_part &P = G.p[group_part(G, b)];
    const tsr_linear_dev &L = P.L;
    const int colb = b % P.col_blocks, split = b / P.col_blocks;
    const int u0 = split * P.ub, nu = min(L.n_units, u0 + P.ub) - u0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int NC = ft_consumers(NT);
    const int ncb = L.Npad / 32, cbf = colb * 2 * NC, live = min(2 * NC, ncb - cbf);
    ft_shared &F = *(ft_shared *)((uint32_t *)fg_smem + stage_words);
    if (threadIdx.x == 0) {
        for (int s = 0; s < FT_RING; s++)
            mbar_init(&F.full[s], 1), mbar_init(&F.empty[s], NC);
        mbar_init_fence();
    }
    fg_src S0;
    fg_stage_begin<NT == 1 && !HALF>(P, u0, nu, S0);
    for (int i = threadIdx.x; i < nu; i += blockDim.x) F.meta[i] = L.units[u0 + i];
    __syncthreads();
    /* the weights are constant: the ring fills before waiting for the kernel that writes x (PDL) and while the
     * block stages x */
    const bool producer = warp == NC && lane == 0;
    if (producer)
        for (int i = 0; i < min(nu, FT_RING); i++)
            ft_issue<GPTQ, XR>(L, F, i, cbf, live, M);
    if (XR) { /* no staging: the activations follow the weights through the ring once the kernel writing them is done */
        tsr_pdl_wait();
        if (producer)
            for (int i = 0; i < min(nu, FT_RING); i++)
                ft_issue_x(P, F, u0, i, M);
    } else {
        fg_stage_block<NT == 1 && !HALF>(P, x, M, u0, nu, fg_smem, S0);
        __syncthreads();
    }
    if (warp == NC) {
        if (producer)
            for (int i = FT_RING; i < nu; i++) {
                mbar_wait(&F.empty[i % FT_RING], (unsigned)(i / FT_RING - 1) & 1u);
                ft_issue<GPTQ, XR>(L, F, i, cbf, live, M);
                if (XR) ft_issue_x(P, F, u0, i, M);
            }
        tsr_pdl_trigger();
        return;
    }

    float acc[NT][4][4], tot[NT][4][4];
    fg_zero<NT>(acc, tot);
    frag_scales sc[2] = {};
    int cur = -1;
    const bool idle = 2 * warp >= live;
    const fg_bsrc bs = fg_bsrc_of<NT, PK, HALF>(fg_smem, M, lane);
    /* HALF's fp16 entries are read and multiplied as PK's packed ones: one 8-byte entry per step, one mma per tile */
    for (int ra = 0; ra < nu;) {
        const int rb = fg_run_end(F.meta, ra + 1, nu, ra);
        if (GPTQ) {
            ft_run<4, true, ONE, PK || HALF, NT, FOLD, XR>(L, F, bs, ra, rb, warp, idle, lane, M, cur, sc, acc, tot);
        } else {
            frag_with_width((int)(F.meta[ra].y >> 24), [&](auto wd) {
                constexpr int B = decltype(wd)::value;
                ft_run<B, false, ONE, PK || HALF, NT, FOLD, XR>(L, F, bs, ra, rb, warp, idle, lane, M, cur, sc, acc,
                                                                tot);
            });
        }
        ra = rb;
    }
    tsr_pdl_trigger(); /* late, unlike the small kernels (launch.cuh) */
    if (!FOLD && cur >= 0) fg_flush<ONE, NT>(acc, tot, sc);
    if (PK) fg_unpack<ONE>(tot[0]);
    /* each warp's columns go through the ring (free once every consumer is past its last unit) as red[token][column
     * of the block], FT_RED_ROWS rows at a time, and the warp stores them coalesced (as frag_gemv_kernel's end) */
    asm volatile("bar.sync 1, %0;\n" ::"n"(NC * 32) : "memory");
    float *red = (float *)F.ring;
    const float(&res)[NT][4][4] = FOLD ? acc : tot;
    ft_store_rows<ONE, NT, 0>(P, res, red, split, M, warp, lane, cbf, live);
    if constexpr (NT * 8 > FT_RED_ROWS)
        ft_store_rows<ONE, NT, FT_RED_ROWS / 8>(P, res, red, split, M, warp, lane, cbf, live);
#endif
}

/* Whether up to 4 rows put the hi and lo halves into one mma (fg_bop's PK): TSR_CUDA_GEMV_PACK, default 1 (0: two
 * mma's, as for 5 to 8 rows; kept to measure the difference). */
static bool fg_pack(void)
{
    static const bool on = !tsr_cuda_env_off("TSR_CUDA_GEMV_PACK");
    return on;
}

/* Whether M rows stage their activations as fp16 hi + lo halves (products exact to ~2^-22, as in fp32): in
 * frag_gemv_kernel up to 8 rows, in the bulk kernel (bulk) up to TSR_CUDA_GEMV_EXACT rows (default 4, where hi and
 * lo share one mma; 4 to 8). Above, the activations are fp16, staged once per launch (fg_prestage_kernel), as on
 * the cuBLAS path: at 5-8 rows one mma per tile instead of two and no gather of x through the permutation in every
 * block, +10-14 % decode at batch 6-8 on the 8B shape (NOTES.md, stop 26). */
static bool fg_exact(int M, bool bulk)
{
    static int most = -1;
    if (most < 0) {
        const char *e = getenv("TSR_CUDA_GEMV_EXACT");
        most = e ? atoi(e) : 4;
    }
    return M <= 8 && (!bulk || M <= max(most, 4));
}

/* Whether one row takes its 4-bit units on integer tensor cores (gemv_imma.cuh): TSR_CUDA_GEMV_IMMA=1 for both
 * formats, 0 for neither, by default GPTQ's only. 8B GPTQ 4-bit at batch 1: +5-6 % with groups of 128 rows, +6 %
 * with groups of 32. 8B EXL2 4.0 bpw: 5-6 % slower, whether its 4-bit groups are 32-64 rows (the converter's mix)
 * or all 128 (NOTES.md, stops 37-38). */
static bool fg_imma(bool gptq)
{
    static int on = -2;
    if (on == -2) {
        const char *e = getenv("TSR_CUDA_GEMV_IMMA");
        on = e ? atoi(e) != 0 : -1;
    }
    return on < 0 ? gptq : on != 0;
}

/* Whether launches whose rows are exact (fg_exact) stage them once per launch too (hi + lo halves, by
 * fg_prestage_kernel), each block then copying its stretch, rather than gathering x through the permutation in every
 * block: TSR_CUDA_GEMV_PRESTAGE, default 1 (0: the gather in every block). 70B 4.0 bpw batch 1 57.4 -> 63.1 tok/s,
 * batch 4 192 -> 215; 8B batch 4 +3 %, batches 1-2 unchanged (a rule that pre-staged only where a block's gather
 * took more than one round per thread got 70B most of it and missed 8B's; NOTES.md, stop 26). */
static bool fg_prestage_exact(void)
{
    static const bool on = !tsr_cuda_env_off("TSR_CUDA_GEMV_PRESTAGE");
    return on;
}

/* Token tiles of 8 rows in the bulk kernel for M rows (1, 2, 3, 4 or 8; frag_gemv_kernel has no 3-tile instance
 * and takes 17-24 rows with 4, fg_kernel, and at most FG_MAX_M rows), and its columns per block. */
static int fg_tiles(int M)
{
    return M <= 8 ? 1 : M <= 16 ? 2 : M <= 24 ? 3 : M <= 32 ? 4 : 8;
}
static int ft_cols(int M)
{
    return 64 * ft_consumers(fg_tiles(M));
}
static int ft_threads(int M)
{
    return (ft_consumers(fg_tiles(M)) + 1) * 32; /* the consumers and the producer warp */
}

/* Whether M rows in the bulk kernel take their activations through the ring with the weights (XR) instead of
 * staging the block's whole K range first: from TSR_CUDA_GEMV_XRING_MIN rows (at least 9: exact rows stage 16-byte
 * entries; default 17 for EXL2, 33 for GPTQ); TSR_CUDA_GEMV_XRING=0 never. Staged, 64 rows fit 32 units per block in
 * 128 KB, so K was split into 4 to 8 pieces and the partial sums grew to half the weight bytes (70B gate/up),
 * written and read again; through the ring K is split only to fill the chip: at 64 rows 8B 4.0 bpw +16 %, 70B
 * +48 %; at 24-32 rows 70B +10-12 %, 8B +0.5 %; but at 9-16 rows 15-28 % slower, and GPTQ 8B at 32 rows 19 % slower
 * (neither explained yet; NOTES.md, stop 28). */
static bool ft_xring(int M, bool gptq)
{
    static int least = -1;
    if (least < 0) {
        const char *e = getenv("TSR_CUDA_GEMV_XRING_MIN");
        least = tsr_cuda_env_off("TSR_CUDA_GEMV_XRING") ? FT_MAX_M + 1 : e && atoi(e) >= 9 ? atoi(e) : 0;
    }
    return M >= (least ? least : gptq ? FG_MAX_M + 1 : 17);
}

/* The bulk kernel for M rows (from 3 by default: one and two rows stay on frag_gemv_kernel, tsr_cuda_gemv_bulk): hi
 * and lo in one mma up to 4 rows, or 1 to 4 token tiles of 8, or 8 tiles for 33-64 rows. The 3-tile instance took
 * 8B 4.0 bpw decode at 17-24 rows 9-10 % higher than 17-24 rows in the 4-tile one (NOTES.md, stop 27). The 8-tile
 * kernel folds the group scales into its A operands (fg_fold): its 128 accumulators leave no room for a second set
 * of per-group sums. So do EXL2's 2- to 4-tile kernels (fp16 activations, as on the dequantize path): 3-6 % faster
 * at 24-32 rows than per-group sums, neutral at 16; GPTQ's groups of 128 rows change four times less often than the
 * converter's EXL2 groups, and folding lost 8 % there at 32 rows (NOTES.md, stop 28). */
template <bool GPTQ> static void (*ft_kernel(int M))(const fg_group, const float *, int, int)
{
    if (M <= 4 && fg_pack()) return frag_gemv_bulk_kernel<false, true, GPTQ, 1>;
    if (M <= 8) return fg_exact(M, true) ? frag_gemv_bulk_kernel<false, false, GPTQ, 1>
                                         : frag_gemv_bulk_kernel<false, false, GPTQ, 1, true>;
    constexpr bool F = !GPTQ;
    const bool xr = ft_xring(M, GPTQ);
    if (M <= 16)
        return xr ? frag_gemv_bulk_kernel<false, false, GPTQ, 2, false, F, true>
                  : frag_gemv_bulk_kernel<false, false, GPTQ, 2, false, F>;
    if (M <= 24)
        return xr ? frag_gemv_bulk_kernel<false, false, GPTQ, 3, false, F, true>
                  : frag_gemv_bulk_kernel<false, false, GPTQ, 3, false, F>;
    if (M <= 32)
        return xr ? frag_gemv_bulk_kernel<false, false, GPTQ, 4, false, F, true>
                  : frag_gemv_bulk_kernel<false, false, GPTQ, 4, false, F>;
    return xr ? frag_gemv_bulk_kernel<false, false, GPTQ, 8, false, true, true>
              : frag_gemv_bulk_kernel<false, false, GPTQ, 8, false, true>;
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
    red_part p[FG_MAX_PARTS];
    int n;
};

__global__ void exl2_reduce_group_kernel(const __grid_constant__ red_group G, int M)
{
    tsr_pdl_start();
    unsigned b = blockIdx.x;
    const red_part &P = G.p[group_part(G, b)];
    const size_t i = (size_t)b * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * P.N) return;
    const int m = (int)(i / P.N), n = (int)(i % P.N);
    float s = P.bias ? __half2float(P.bias[n]) : 0.0f;
    for (int k = 0; k < P.splits; k++) s += P.partial[((size_t)k * M + m) * P.Npad + n];
    P.y[i] = s;
}

/* Shared memory of frag_gemv_kernel's warps (rings, unit records, scale scratch), beside the staged activations. */
static int fg_warps_bytes(void)
{
    return FG_WARPS * FG_WARP_WORDS * 4;
}

/* Bytes of staged activations per block: FG_STAGE_MAX up to 8 rows, FG_STAGE_WIDE above, or what the device's
 * shared memory per block leaves beside the warps' (frag_gemv_kernel) or the ring's (bulk) share: on sm_86/sm_89
 * (99 KB) the one-row kernel stages 19 KB, so its blocks take fewer units and K splits into more pieces. */
static int fg_stage_room(int M, bool bulk, int smem_block)
{
    const int room = smem_block - (bulk ? (int)sizeof(ft_shared) : fg_warps_bytes());
    return max(0, min(M <= 8 ? FG_STAGE_MAX : FG_STAGE_WIDE, room));
}
static int fg_stage_max(int M, bool bulk)
{
    return fg_stage_room(M, bulk, tsr_cuda_smem_block());
}

/* frag_gemv_kernel's blocks per SM for M rows: two up to 8 rows where the SM's shared memory holds two (H100,
 * H200), else one (A100, sm_86/sm_89: the launch bounds' second block would not fit). */
static int fg_blocks_per_sm(int M)
{
    const int block = fg_stage_max(M, false) + fg_warps_bytes() + 1024; /* 1 KB per block kept by the system */
    return M <= 8 && 2 * block <= tsr_cuda_smem_sm() ? 2 : 1;
}

/* Whether the one-row kernel's wide instances (9-32 rows) stage less than FG_STAGE_MAX (cuda_kernels.cuh). */
bool tsr_cuda_gemv_narrow_stage(void)
{
    return fg_stage_max(FG_MAX_M, false) < FG_STAGE_MAX;
}

/* Bytes per unit and token of the staged activations: hi + lo halves where fg_exact, else hi halves. */
static int fg_unit_bytes(int M, bool bulk) { return (fg_exact(M, bulk) ? 128 : 64) * M; }

/* The units of activations one block of M rows stages, at most (bulk: frag_gemv_bulk_kernel), on a device whose
 * blocks may have smem_block bytes: the plans' limit (fg_plan, ft_plan). */
static int fg_units_max(int M, bool bulk, bool gptq, int smem_block)
{
    const int stage = fg_stage_room(M, bulk, smem_block);
    if (bulk) return ft_xring(M, gptq) ? FT_MAX_UNITS : min(stage / fg_unit_bytes(M, true), FT_MAX_UNITS);
    return min(stage / fg_unit_bytes(M, false), FG_WARP_UNITS * FG_WK);
}

/* The shared memory a kernel of M rows opts in to there, for its largest stage: the bulk kernel's ring state and
 * (XR) activation slots, or frag_gemv_kernel's warps and, at least, the final reduction's room. */
static size_t fg_optin_bytes(int M, bool bulk, bool gptq, int smem_block)
{
    const size_t stage = (size_t)fg_stage_room(M, bulk, smem_block);
    if (bulk) {
        const bool xr = ft_xring(M, gptq);
        return (xr ? 0 : stage) + sizeof(ft_shared) + (xr ? (size_t)FT_RING * FT_X_WORDS * 4 : 0);
    }
    const size_t red_bytes = (size_t)FG_WK * M * FG_COLS * sizeof(float);
    return stage + fg_warps_bytes() > red_bytes ? stage + fg_warps_bytes() : red_bytes;
}

/* What a launch of M rows asks of such a device (ops_cuda.h; tests): the same two helpers the launches use. */
extern "C" size_t tsr_cuda_gemv_smem(int M, int bulk, int gptq, int smem_block, int *units_per_block)
{
    *units_per_block = fg_units_max(M, bulk != 0, gptq != 0, smem_block);
    return fg_optin_bytes(M, bulk != 0, gptq != 0, smem_block);
}

/* Whether gemv_plan balances launches of several waves (below): TSR_CUDA_GEMV_BALANCE, default 1. */
static bool fg_balance(void)
{
    static const bool on = !tsr_cuda_env_off("TSR_CUDA_GEMV_BALANCE");
    return on;
}

/* Units per block for one GEMV launch whose matrices (same K: n_units units each) have col_blocks column blocks in
 * all: K is split into as many pieces as keep the blocks within `target` (the blocks that fit on the chip at once:
 * o and down at 256 blocks ran 7 % faster than at 128, q/k/v at 240 about 1 % faster than at 192; NOTES.md, stop
 * 21), at most sp_max pieces and at most ub_max units per block. Every matrix of a group gets the same units per
 * block, so that no block has more work than the rest (q with twice k's units per block was the critical path of
 * the q/k/v launch); a matrix's splits are then its units over that. Where the blocks exceed the target even with
 * the fewest pieces the unit limit allows (70B's gate/up at one row: 448 column blocks for 264 places; 70B's down
 * at 8 rows: 28 pieces of 16 column blocks), they come in waves, and the SMs that run one block more than the others
 * set the time: K is then split into the pieces that minimize the busiest SM's work, its blocks times their units
 * plus GEMV_BLOCK_UNITS for a block's fixed costs (staging x, the partial sums, the start and end of the ring).
 * 70B 4.0 bpw batch 1: gate/up in two pieces, +10 %. TSR_CUDA_GEMV_BALANCE=0 keeps the fewest pieces. Within one
 * wave the model fails: balancing 8B's gate/up (224 column blocks for 132 SMs) into 4 pieces lost 12 % (NOTES.md,
 * stop 22). */
#define GEMV_BLOCK_UNITS 8 /* fits stop 22's measurement: 70B gate/up in 2 pieces 10 % faster than in one */
static int gemv_plan(int col_blocks, int n_units, int sp_max, int ub_max, int target, int sms)
{
    sp_max = max(1, sp_max);
    const int sp_min = min(sp_max, (n_units + ub_max - 1) / ub_max);
    int sp = max(sp_min, min(target / col_blocks, sp_max));
    if (fg_balance() && col_blocks * sp_min > target) {
        long best = -1;
        for (int s = sp_min; s <= min(sp_max, sp_min + 8); s++) {
            const long busiest = (long)((col_blocks * s + sms - 1) / sms) * ((n_units + s - 1) / s + GEMV_BLOCK_UNITS);
            if (best < 0 || busiest < best) best = busiest, sp = s;
        }
    }
    return min((n_units + sp - 1) / sp, ub_max);
}

/* frag_gemv_kernel's plan (gemv_plan): at least two units per warp, the staged activations within the stage limit. */
static int fg_plan(int col_blocks, int n_units, int M, int target, int sms)
{
    const int ub_max = fg_units_max(M, false, false, tsr_cuda_smem_block());
    if (ub_max < 1) tsr_cuda_fatal(__FILE__, __LINE__, "the device's shared memory cannot hold the decode GEMV");
    return gemv_plan(col_blocks, n_units, n_units / (2 * FG_WK), ub_max, target, sms);
}

/* The GEMV's block budget: TSR_CUDA_GEMV_BLOCKS, else the number of SMs. frag_gemv_kernel takes up to twice that
 * at up to 8 rows (two of its blocks fit on an SM), the bulk kernel its own share (ft_plan). */
static int fg_target(void)
{
    static int t = -1;
    if (t < 0) {
        const char *e = getenv("TSR_CUDA_GEMV_BLOCKS");
        t = e && atoi(e) > 0 ? atoi(e) : tsr_cuda_device_attr(cudaDevAttrMultiProcessorCount, 132);
    }
    return t;
}

/* frag_gemv_bulk_kernel's plan (gemv_plan): at least FT_MIN_UNITS units per block. The caller asks for two blocks
 * per SM up to 8 rows (both fit beside each other) and one above, where the 2- and 4-tile kernels' registers allow
 * only one (two per SM there measured 5-9 % slower at 16-48 rows: NOTES.md, stop 18). Until stop 23 each matrix
 * had its own share of the target, so q's blocks (8 column blocks of 512 at 8B, 16 at 70B) took 1.5-6 times the
 * units of k's and v's and set the launch's time. */
static int ft_plan(int col_blocks, int n_units, int M, bool gptq, int target, int sms)
{
    const int ub_max = fg_units_max(M, true, gptq, tsr_cuda_smem_block());
    if (ub_max < 1) tsr_cuda_fatal(__FILE__, __LINE__, "the device's shared memory cannot hold the bulk GEMV");
    return gemv_plan(col_blocks, n_units, n_units / FT_MIN_UNITS, ub_max, target, sms);
}

/* Whether M rows take frag_gemv_bulk_kernel: with sm_90 code (tsr_cuda_sm90), from TSR_CUDA_GEMV_BULK_MIN
 * (default 3, at least 2) up to TSR_CUDA_GEMV_BULK rows (default and most FT_MAX_M; 0 keeps frag_gemv_kernel for
 * all). One and two rows stay with frag_gemv_kernel: 2-4 % faster at one row when the bulk kernel came (NOTES.md,
 * stop 18), 7-9 % at two rows since the one-row kernel's later gains; from 3 rows the bulk kernel is as fast or
 * faster (stop 27). */
bool tsr_cuda_gemv_bulk(int M)
{
    static int most = -1, least = 3;
    if (most < 0) {
        const char *e = getenv("TSR_CUDA_GEMV_BULK");
        most = !tsr_cuda_sm90() ? 0 : e ? min(atoi(e), FT_MAX_M) : FT_MAX_M;
        if (most < 0) most = 0;
        const char *l = getenv("TSR_CUDA_GEMV_BULK_MIN");
        if (l && atoi(l) >= 2) least = atoi(l);
    }
    return M >= least && M <= most;
}

/* At 9-16 rows, groups of at most TSR_CUDA_GEMV_FRAG_N columns in all (default 4096; 0: none) take
 * frag_gemv_kernel instead of the 2-tile bulk kernel: o and down at 8B, whose 4096 columns the bulk kernel cuts into 8
 * column blocks of 512, so that K is split into many pieces and the partial sums are megabytes per call, where
 * frag_gemv_kernel's 128-column blocks split K four ways inside the block. 8B 4.0 bpw: +3-4 % at 12 and 16 rows;
 * from 17 rows neutral to -1 %, and at 70B (8192 columns, TSR_CUDA_GEMV_FRAG_N=8192) -3 to -4 % (NOTES.md, stop
 * 27). */
static int fg_frag_n(void)
{
    static int n = -1;
    if (n < 0) {
        const char *e = getenv("TSR_CUDA_GEMV_FRAG_N");
        n = e ? max(0, atoi(e)) : 4096;
    }
    return n;
}

/* Lets kernel use up to `bytes` of dynamic shared memory, once per kernel: the table has room for every GEMV
 * instance of this file (36: 14 of frag_gemv_kernel, 22 of the bulk kernel), and were it ever full, the attribute
 * would be set on every call rather than skipped. */
#define FG_KERNELS 40
typedef void (*fg_kernel_t)(const fg_group, const float *, int, int);
static void fg_allow_smem(fg_kernel_t kern, size_t bytes)
{
    static fg_kernel_t allowed[FG_KERNELS];
    int i = 0;
    while (i < FG_KERNELS && allowed[i] && allowed[i] != kern) i++;
    if (i < FG_KERNELS && allowed[i] == kern) return;
    tsr_cuda_allow_smem((const void *)kern, bytes, "the decode GEMV");
    if (i < FG_KERNELS) allowed[i] = kern;
}

/* The kernel for M rows: token 0 only, hi and lo in one mma up to 4 rows, or 1, 2 or 4 token tiles of 8
 * (TSR_CUDA_GEMV_PACK=0: two mma's per tile, hi and lo, up to 8 rows). */
template <bool GPTQ> static void (*fg_kernel(int M))(const fg_group, const float *, int, int)
{
    if (M == 1 && fg_pack() && fg_imma(GPTQ)) return frag_gemv_kernel<true, true, GPTQ, 1, true>;
    if (M == 1) return fg_pack() ? frag_gemv_kernel<true, true, GPTQ, 1> : frag_gemv_kernel<true, false, GPTQ, 1>;
    if (M <= 4 && fg_pack()) return frag_gemv_kernel<false, true, GPTQ, 1>;
    if (M <= 8) return frag_gemv_kernel<false, false, GPTQ, 1>;
    if (M <= 16) return frag_gemv_kernel<false, false, GPTQ, 2>;
    return frag_gemv_kernel<false, false, GPTQ, 4>;
}

/* frag_gemv_kernel's launch for the planned group G: shared memory for the staged activations, then per warp its
 * unit records and its ring (the final reduction reuses the start). */
static void fg_launch_warps(const fg_group &G, bool gptq, const float *x, int M, unsigned blocks, int stage_words)
{
    size_t smem = (size_t)stage_words * 4 + fg_warps_bytes();
    const size_t red_bytes = (size_t)FG_WK * M * FG_COLS * sizeof(float);
    if (smem < red_bytes) smem = red_bytes;
    fg_kernel_t kern = gptq ? fg_kernel<true>(M) : fg_kernel<false>(M);
    fg_allow_smem(kern, fg_optin_bytes(M, false, gptq, tsr_cuda_smem_block()));
    tsr_launch_smem(kern, dim3(blocks), dim3(FG_WARPS * 32), smem, G, x, M, stage_words);
}

/* Rows per launch (cuda_kernels.cuh): FT_MAX_M where the bulk kernel takes 33 to 64 rows. */
int tsr_cuda_gemv_rows(void)
{
    return tsr_cuda_gemv_bulk(FG_MAX_M + 1) && tsr_cuda_gemv_bulk(FT_MAX_M) ? FT_MAX_M : FG_MAX_M;
}

/* ---- activations staged ahead (stage_ahead.cuh) ---- */

/* The entries the last staging producer wrote, for the GEMV of L on x (x NULL: none). */
struct staged_ahead {
    const float *x;
    int M, n;
    bool exact;
    const tsr_linear_dev *L[FG_MAX_PARTS];
    const uint2 *xs[FG_MAX_PARTS];
    const void *slot;          /* scratch slot 0 when they were planned */
    unsigned long long launch; /* tsr_cuda_launches right after the launch that wrote them */
};
static staged_ahead g_ahead;
static unsigned long long g_ahead_taken;

extern "C" unsigned long long tsr_cuda_staged_taken(void)
{
    return g_ahead_taken;
}

bool tsr_cuda_gemv_stage_plan(const tsr_linear_dev *const *Ls, int n, int M, tsr_stage_ahead *S)
{
    static const bool on = !tsr_cuda_env_off("TSR_CUDA_STAGE_AHEAD");
    if (!on || n < 1 || n > FG_MAX_PARTS || M < 1 || M > 8) return false;
    for (int i = 0; i < n; i++)
        if (Ls[i]->kind != TSR_LINEAR_EXL2 || Ls[i]->K != Ls[0]->K || Ls[i]->gptq != Ls[0]->gptq ||
            Ls[i]->n_units != Ls[0]->n_units)
            return false;
    const bool exact = fg_exact(M, tsr_cuda_gemv_bulk(M)); /* as tsr_cuda_gemv decides it up to 8 rows */
    if (exact && !fg_prestage_exact()) return false;
    *S = tsr_stage_ahead{};
    int first[TSR_STAGE_MAX_ORDERS];
    for (int i = 0; i < n; i++) {
        int o = 0;
        while (o < S->n && !tsr_cuda_same_unit_order(Ls[first[o]], Ls[i]))
            o++;
        if (o == S->n) first[S->n++] = i;
        S->part_order[i] = o;
    }
    const size_t words = (size_t)Ls[0]->n_units * 8 * M * (exact ? 2 : 1); /* of one order */
    uint2 *xs = (uint2 *)tsr_cuda_scratch(0, S->n * words * sizeof(uint2));
    for (int o = 0; o < S->n; o++) {
        S->uperm[o] = Ls[first[o]]->uperm;
        S->xs[o] = xs + o * words;
    }
    S->n_units = Ls[0]->n_units;
    S->M = M;
    S->exact = exact;
    return true;
}

void tsr_cuda_gemv_stage_done(const tsr_linear_dev *const *Ls, int n, const float *x, const tsr_stage_ahead *S)
{
    g_ahead.x = x;
    g_ahead.M = S->M;
    g_ahead.n = n;
    g_ahead.exact = S->exact != 0;
    for (int i = 0; i < n; i++) {
        g_ahead.L[i] = Ls[i];
        g_ahead.xs[i] = S->xs[S->part_order[i]];
    }
    g_ahead.slot = tsr_cuda_scratch(0, 0);
    g_ahead.launch = tsr_cuda_launches;
}

/* The entries staged ahead for these matrices, if they are still the latest writes (no launch since); either way
 * the record is used up. The GEMV takes them, and the fused MLP (cuda_kernels.cuh). */
bool tsr_cuda_gemv_take_staged(const tsr_linear_dev *const *Ls, int n, const float *x, int M, bool exact,
                               const uint2 **xs)
{
    const staged_ahead a = g_ahead;
    g_ahead.x = NULL;
    if (!a.x || a.x != x || a.launch != tsr_cuda_launches || a.M != M || a.n != n || a.exact != exact ||
        a.slot != tsr_cuda_scratch(0, 0))
        return false;
    for (int i = 0; i < n; i++)
        if (a.L[i] != Ls[i]) return false;
    for (int i = 0; i < n; i++)
        xs[i] = a.xs[i];
    g_ahead_taken++;
    return true;
}

/* The activations of n matrices sharing x (cuda_kernels.cuh): fg_prestage_kernel's entries of every part in scratch
 * slot `slot`, part i's from xs[i]. */
void tsr_cuda_gemv_prestage(const tsr_linear_dev *const *Ls, int n, const float *x, int M, bool exact, int slot,
                            const uint2 **xs_out)
{
    fg_pre_group S = {};
    size_t xs_entries = 0;
    for (int i = 0; i < n; i++)
        xs_entries += (size_t)Ls[i]->n_units * 2 * M * 4;
    const int per = exact ? 2 : 1; /* 8-byte words per entry: hi + lo halves, or hi */
    uint2 *xs = (uint2 *)tsr_cuda_scratch(slot, xs_entries * per * sizeof(uint2));
    unsigned pre_blocks = 0;
    S.n = n;
    for (int i = 0; i < n; i++) {
        const unsigned entries = (unsigned)Ls[i]->n_units * 2 * M * 4;
        S.p[i] = fg_pre_part{Ls[i]->uperm, xs, entries, tsr_div_up(entries, 256)};
        xs_out[i] = xs;
        xs += (size_t)entries * per;
        pre_blocks += S.p[i].blocks;
    }
    tsr_launch(fg_prestage_kernel, dim3(pre_blocks), dim3(256), S, x, M, Ls[0]->K, (int)exact);
}

/* The decode GEMV of n matrices with the same input and K (cuda_kernels.cuh): per tsr_cuda_gemv_rows() rows one
 * launch (plus one reduction launch when any of them splits K over blocks, unless `parts` takes them over, and for
 * M > 8 one staging launch before it). Each part's partial sums take their own stretch of scratch slot 3, its
 * pre-staged activations their own stretch of slot 0. */
void tsr_cuda_gemv(const tsr_linear_dev *const *Ls, int n, const float *x, int M, float *const *ys,
                   tsr_gemv_parts *parts)
{
    const int most = tsr_cuda_gemv_rows();
    if (M > most) { /* chunks of `most` rows (below TSR_CUDA_DQ_MIN_M); linear_add_norm cuts its own */
        if (parts) tsr_cuda_fatal(__FILE__, __LINE__, "GEMV partial sums asked for more rows than one launch takes");
        for (int r0 = 0; r0 < M; r0 += most) {
            float *yc[FG_MAX_PARTS];
            for (int i = 0; i < n; i++) yc[i] = ys[i] + (size_t)r0 * Ls[i]->N;
            tsr_cuda_gemv(Ls, n, x + (size_t)r0 * Ls[0]->K, min(most, M - r0), yc, NULL);
        }
        return;
    }
    fg_group G = {};
    red_group R = {};
    int splits[FG_MAX_PARTS];
    size_t scratch = 0, offset[FG_MAX_PARTS];
    unsigned blocks = 0;
    int all_cols = 0;
    for (int i = 0; i < n; i++) all_cols += Ls[i]->Npad;
    const bool bulk = tsr_cuda_gemv_bulk(M) && !(M > 8 && M <= 16 && all_cols <= fg_frag_n());
    const int cols = bulk ? ft_cols(M) : FG_COLS;
    int all_col_blocks = 0; /* the plan is the group's */
    for (int i = 0; i < n; i++) all_col_blocks += (int)tsr_div_up(Ls[i]->Npad, cols);
    const int target = (M <= 8 ? (bulk ? 2 : fg_blocks_per_sm(M)) : 1) * fg_target();
    const int ub = bulk ? ft_plan(all_col_blocks, Ls[0]->n_units, M, Ls[0]->gptq != 0, target, fg_target())
                        : fg_plan(all_col_blocks, Ls[0]->n_units, M, target, fg_target());
    G.n = n;
    for (int i = 0; i < n; i++) {
        const tsr_linear_dev *L = Ls[i];
        const int col_blocks = (int)tsr_div_up(L->Npad, cols);
        const int sp = (L->n_units + ub - 1) / ub;
        splits[i] = sp;
        offset[i] = scratch;
        if (sp > 1) scratch += (size_t)sp * M * L->Npad;
        G.p[i] = fg_part{*L, ys[i], NULL, NULL, ub, col_blocks, col_blocks * sp};
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
    const bool exact = fg_exact(M, bulk);
    if (!exact || fg_prestage_exact()) { /* every part's activations staged once, in B-operand order */
        const uint2 *xs[FG_MAX_PARTS];
        if (!tsr_cuda_gemv_take_staged(Ls, n, x, M, exact, xs)) tsr_cuda_gemv_prestage(Ls, n, x, M, exact, 0, xs);
        for (int i = 0; i < n; i++)
            G.p[i].xs = xs[i];
    }
    const bool xr = bulk && ft_xring(M, Ls[0]->gptq != 0);
    const int stage_words = xr ? 0 : ub * fg_unit_bytes(M, bulk) / 4;
    if (bulk) { /* shared memory: the staged activations (XR: none), the ring's barriers, the unit records, the ring
                 * (XR: then the activation slots) */
        const size_t xr_bytes = xr ? (size_t)FT_RING * FT_X_WORDS * 4 : 0;
        const size_t smem = (size_t)stage_words * 4 + sizeof(ft_shared) + xr_bytes;
        fg_kernel_t kern = Ls[0]->gptq ? ft_kernel<true>(M) : ft_kernel<false>(M);
        fg_allow_smem(kern, fg_optin_bytes(M, true, Ls[0]->gptq != 0, tsr_cuda_smem_block()));
        tsr_launch_smem(kern, dim3(blocks), dim3(ft_threads(M)), smem, G, x, M, stage_words);
    } else {
        fg_launch_warps(G, Ls[0]->gptq != 0, x, M, blocks, stage_words);
    }
    if (parts) {
        *parts = tsr_gemv_parts{G.p[0].partial, G.p[0].partial ? splits[0] : 0, Ls[0]->Npad};
        return;
    }
    if (R.n) tsr_launch(exl2_reduce_group_kernel, dim3(red_blocks), dim3(256), R, M);
}
