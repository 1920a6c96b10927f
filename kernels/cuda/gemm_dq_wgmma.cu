/* The product of many rows by an EXL2 or GPTQ matrix on Hopper's warpgroup tensor cores (wgmma, code for sm_90a), with
 * the weights dequantized in registers: no fp16 copy of the matrix is written to memory and read back, as the cuBLAS
 * path of matmul.cu does (its dequantize pass was ~12 % of an 8B 2048-token prefill; NOTES.md, stop 52).
 *
 * The product is computed transposed, yᵀ = Wᵀ · xpᵀ. The weights are then wgmma's A operand, which may come from
 * registers in the mma.m16n8k16 A layout, and that is the layout exl2_frag.cuh's packing decodes into: a lane's words
 * of one (unit, column block) hold its A fragments for two 16-column tiles (ct) × two 16-row K steps, decoded with
 * the decode GEMV's instructions and multiplied by their column's fp16 scale (the same single rounding as the
 * dequantize pass, so the weights are bit for bit the fp16 ones cuBLAS would read). The activations (xp: the input in
 * the matrix's unit row order, fp16, from matmul.cu's permutation pass) are the B operand, K-major in shared memory.
 *
 * A block takes up to 256 activation rows (the wgmma's N: the least multiple of 32 from 96 that holds M, so that
 * little of the tensor cores' work falls on rows past M; dw_rows) and 4 column blocks (128 output columns). Warp w of
 * warpgroup ct owns column block w's tile ct: the four warps of a warpgroup give the 64 A rows of one m64n256k16
 * wgmma, and each (unit, column block) is decoded half by each warpgroup, so a thread keeps one 64 × 256 accumulator
 * (128 registers) and decodes 8 of the 16 registers of its words per unit. K advances in stages of two units (64
 * rows). Per unit a warpgroup decodes its A fragments into one of two register sets (the other may still be read by
 * the wgmma's in flight), issues two wgmma's and waits until at most that pair is in flight, so each unit's decode
 * overlaps the tensor cores' work on the one before. Where asked (dw_pairs_asked, off by default, not yet measured),
 * a block runs a second pair of consumer warpgroups, taking turns a stage with the first (at most 128 rows) or taking
 * the tile's second half of rows (192 or 256).
 *
 * The copies: a third warpgroup, whose first two warps issue them (its registers go to the consumers by setmaxnreg). A
 * stage's activation tile arrives by one tensor copy into the 128-byte swizzle (wgmma.cuh), DW_AST tiles in flight
 * (DW_AST_FEW at few rows); its words (per unit one piece: the block's four column blocks) by bulk copies, DW_WST
 * stages in flight (a thread's copies complete about one every 0.3 µs up to a few KB, NOTES.md, stops 69 and 71: so
 * the first warp issues the tiles and the second the rest, dw_produce); the groups' parameters (scale codes, and the
 * EXL2 scale tables or GPTQ's scales) 16 groups at a time with the words of the stage where they begin (one copy per
 * unit cost 13 %, stop 56). Each is issued as soon as the consumers release the stage that used its buffer.
 * TSR_CUDA_DW_DIAG times parts of the kernel (dw_diag, wrong results). Output: y = product + beta · y, fp32 or fp16,
 * columns past N and rows past M left alone, the block's sums first laid out in shared memory so that each warp stores
 * whole rows (dw_store_staged: at decode rows the stores straight from the accumulators were most of a small
 * matrix's time).
 *
 * Where the grid leaves SMs idle (few rows: one row tile, and o's or down's 32 column tiles at the 8B shape), each
 * tile's K is split into up to DW_MAX_SPLITS ranges (grid.z, dw_splits): each range writes fp32 partial sums into the
 * dequantize buffer, which this product does not otherwise use, and dw_reduce_kernel adds them in range order (the
 * same sums every run) with beta · y.
 *
 * Both launch under PDL (launch.cuh): a block initializes its barriers, reads its unit records and requests its first
 * stages' weights and group parameters while the kernel before it finishes; only the activation tiles and the
 * stores wait for it (+1-2 % on decode steps of 96-256 rows, NOTES.md, stop 62; TSR_CUDA_DW_PDL=0: plain launches).
 *
 * Taken by row count (dw_max_m): by default from the dequantize path's first rows (65 on an H100/H200: matmul.cu
 * dq_min_m) up to 512, where it beats the dequantize pass and cuBLAS by 16-75 % in decode steps of the 8B shape and
 * prefills a 2048-token prompt in chunks of 512 at 30.0k tokens/s against 24.8k; above that the cuBLAS path stays,
 * which ties with it at 640-1024 rows and prefills 2048 tokens at once at 36.3k tokens/s against its 33.6k (H100,
 * NOTES.md, stops 61 and 66). TSR_CUDA_DQ_WGMMA=1 takes every row count, =0 none. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/exl2_frag.cuh"
#include "kernels/cuda/exl2_pack.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/wgmma.cuh"

#include <cuda.h> /* CUtensorMap and its encoder's signature only: the encoder is reached through the runtime */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define DW_THREADS   256 /* two warpgroups of consumers: one pair (two where asked: dw_pairs_asked) */
#define DW_PRODUCER  128 /* a third warpgroup, of which two warps issue the copies (dw_produce); its registers go
                          * to the consumers (setmaxnreg) */
#define DW_ROWS      256 /* activation rows per block at most: the wgmma's N (fewer where M fits: dw_rows) */
#define DW_CBS       4   /* column blocks of 32 per block, one per warp of a warpgroup */
#define DW_A_BYTES   (DW_ROWS * 128)          /* a stage's activations: 256 rows × 64 halves (a block of fewer
                                               * rows uses the first R × 128 bytes of each stage's buffer) */
#define DW_W_UNIT    (32 * 8 * 4)             /* one (unit, column block): up to 8 words per lane */
#define DW_W_BYTES   (DW_CBS * 2 * DW_W_UNIT) /* a stage's words: per unit, its 4 column blocks as in memory */
#define DW_GB        16  /* groups whose parameters are copied together: the scale codes (GPTQ: zero codes) of the
                          * block's 4 column blocks, 64 bytes a group, by one tensor copy; the EXL2 scale tables, 64
                          * bytes a group, by one bulk copy, or the block's 128 GPTQ scales, 256 bytes a group, by
                          * one tensor copy */
#define DW_P_SLOTS   (2 * DW_GB) /* group g's parameters in slot g % DW_P_SLOTS */
#define DW_MAX_UNITS 1024 /* unit records kept in shared memory (K up to 32768) */

/* Diagnostics (TSR_CUDA_DW_DIAG; wrong results, for timing only): the kernel without its decode (ones for weights);
 * the copies alone (consumers that wait for each stage and release it at once), the activations' copies alone, the
 * words' and parameters' copies alone; the decode and wgmma's alone (the first stages copied, then read again and
 * again), the wgmma's alone (the A registers loaded from the words, undecoded); the full kernel without the
 * parameters' copies, and without the words' and the parameters' copies (stale ones decoded); the full kernel
 * without its stores (the sums left in the accumulators: what the epilogue costs). */
enum dw_diag {
    DG_NONE, DG_NODECODE, DG_COPY, DG_COPY_ACT, DG_COPY_WORDS, DG_MMA, DG_MMA_RAW, DG_NOPARAMS, DG_ACTONLY, DG_NOSTORE
};
#define DG_COPY_ONLY(DG) ((DG) == DG_COPY || (DG) == DG_COPY_ACT || (DG) == DG_COPY_WORDS)
#define DG_RECOPY(DG)    ((DG) == DG_MMA || (DG) == DG_MMA_RAW) /* the first stages read again and again */

/* Up to three matrices of one input and unit order (q, k and v) in one launch: part p takes the column tiles from
 * tiles_end[p - 1] to tiles_end[p] of the grid's y. */
struct dw_parts {
    tsr_linear_dev L[TSR_GEMV_MAX_PARTS];
    void *y[TSR_GEMV_MAX_PARTS];
    int tiles_end[TSR_GEMV_MAX_PARTS];
    int n;
    int splits;                       /* K ranges per tile (grid.z); past 1 each writes fp32 partial sums */
    float *part[TSR_GEMV_MAX_PARTS];  /* split z of part p: part[p] + z · M · N, reduced by dw_reduce_kernel */
    CUtensorMap codes[TSR_GEMV_MAX_PARTS];  /* each part's scale codes (GPTQ: zero codes), boxes of DW_GB groups */
    CUtensorMap scales[TSR_GEMV_MAX_PARTS]; /* GPTQ: each part's fp16 scales, boxes of DW_GB groups */
    int pwarps; /* the producer's issuing warps, 1 or 2 (dw_produce; TSR_CUDA_DW_PWARPS) */
};

/* The rings: DW_AST activation tiles in flight and DW_WST stages of words, which run DW_WST - DW_AST stages ahead of
 * the tiles (their small copies take longer to land than a tile; 4 × 8 is the best measured, stop 56, against 5 × 5,
 * 4 × 4, 4 × 10 and 3 × 12). The groups' parameters arrive DW_GB groups at a time with the words of the stage where the
 * first of them starts (groups are numbered in unit order, each a run of units), into two halves of a ring of
 * DW_P_SLOTS slots: a batch overwrites the one two before it, whose last unit lies at least DW_GB units, DW_WST
 * stages, earlier, so its stage has been released. Shared memory, 1024-byte aligned (+1 KB to align the start): the
 * activation tiles, the words' stages, the codes' slots, the tables' or GPTQ scales' slots, the barriers (per tile
 * a full one: its copy landed; per words' stage a full one: its words and parameters landed, and an empty one: the
 * consumers are done with stage s, its tile and its words), then the unit records. Blocks of at most 128 rows keep
 * DW_AST_FEW tiles of 16 KB in flight in the same 128 KB instead (their words then no longer run ahead:
 * dw_launch_variant); the barriers leave room for DW_AST_FEW tiles either way. */
#define DW_AST     4
#define DW_AST_FEW 8
#define DW_WST     8
#define DW_A_RING  (DW_AST * DW_A_BYTES)
#define DW_W_OFF   DW_A_RING
#define DW_P_OFF   (DW_W_OFF + DW_WST * DW_W_BYTES)
#define DW_T_OFF   (DW_P_OFF + DW_P_SLOTS * 64)
#define DW_BAR_OFF (DW_T_OFF + DW_P_SLOTS * 256)
#define DW_REC_OFF (DW_BAR_OFF + 8 * (DW_AST_FEW + 2 * DW_WST))
static_assert(DW_WST >= DW_AST && DW_WST >= DW_AST_FEW, "the words run with or ahead of the tiles");
static_assert(DW_GB / 2 >= DW_WST, "a batch of parameters is refilled only after its last stage's release");
static size_t dw_smem_bytes(int n_units)
{
    return DW_REC_OFF + (size_t)n_units * sizeof(uint2) + 1024;
}

/* y[at] = v + beta · y[at], y fp16 (y_half) or fp32: one output of either epilogue or of the splits' reduction */
__device__ __forceinline__ void dw_put(void *y, size_t at, float v, float beta, int y_half)
{
    if (y_half) {
        __half *yh = (__half *)y;
        if (beta != 0.0f) v = fmaf(beta, __half2float(yh[at]), v);
        yh[at] = __float2half_rn(v);
    } else {
        float *yf = (float *)y;
        yf[at] = beta != 0.0f ? fmaf(beta, yf[at], v) : v;
    }
}

/* y[at..at + 3] = v + beta · y[at..], y fp16 (y_half, 8-byte aligned there) or fp32 (16-byte aligned): four
 * neighbouring outputs at once */
__device__ __forceinline__ void dw_put4(void *y, size_t at, float4 v, float beta, int y_half)
{
    if (!y_half) {
        float4 *yp = (float4 *)((float *)y + at);
        if (beta != 0.0f) {
            const float4 o = *yp;
            v = make_float4(fmaf(beta, o.x, v.x), fmaf(beta, o.y, v.y), fmaf(beta, o.z, v.z), fmaf(beta, o.w, v.w));
        }
        *yp = v;
    } else {
        uint2 *yp = (uint2 *)((__half *)y + at);
        if (beta != 0.0f) {
            const uint2 o = *yp;
            const float2 a = __half22float2(bits_h2(o.x)), b = __half22float2(bits_h2(o.y));
            v = make_float4(fmaf(beta, a.x, v.x), fmaf(beta, a.y, v.y), fmaf(beta, b.x, v.z), fmaf(beta, b.y, v.w));
        }
        *yp = make_uint2(h2_bits(__floats2half2_rn(v.x, v.y)), h2_bits(__floats2half2_rn(v.z, v.w)));
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The barriers: full ones count the bytes of their copies and the producer's arrival; empty ones the 8 consumer
 * warps' arrivals. */
__device__ __forceinline__ void dw_bar_init(uint32_t bar, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void dw_bar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void dw_bar_expect(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void dw_bar_wait(uint32_t bar, uint32_t parity)
{
    asm volatile("{\n.reg .pred p;\nDW_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra DW_WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* The box at columns c0.., rows c1.. of a 2D tensor map into dst, counted by bar; parts past the tensor arrive as
 * zeros (the activations: 64 halves of K × 256 rows into the 128-byte swizzle; the codes or GPTQ scales: DW_GB
 * groups' rows of the block's columns, unswizzled). */
__device__ __forceinline__ void dw_tma(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
/* bytes (a multiple of 16) from global src to shared dst, counted by bar */
__device__ __forceinline__ void dw_bulk(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* The lane's A fragments of 16-column tile CT of a unit, scaled by its two columns' scales h0, h1 (sc.s[2 CT],
 * sc.s[2 CT + 1] as fp16): a[ks] for 16-row step ks. */
template <int B, bool GPTQ, int CT>
__device__ __forceinline__ void dw_decode(const uint32_t *slot, int lane, const frag_scales &sc, __half2 h0, __half2 h1,
                                          uint32_t (&a)[2][4])
{
    uint32_t w[B];
    frag_words<B, false>(slot, lane, w); /* the words' copy in shared memory */
    frag_a<B, GPTQ, 2 * CT>(w, sc, a[0]);
    frag_a<B, GPTQ, 2 * CT + 1>(w, sc, a[1]);
#pragma unroll
    for (int ks = 0; ks < 2; ks++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[ks][r] = h2_bits(__hmul2(bits_h2(a[ks][r]), (r & 1) ? h1 : h0));
}

/* One m64nRk16 wgmma (R activation rows: the block's tile) on the A registers a and the B tile at descriptor b. */
template <int R> __device__ __forceinline__ void dw_mma(float (&acc)[R / 2], const uint32_t (&a)[4], uint64_t b)
{
    static_assert(R % 32 == 0 && R >= 96 && R <= 256, "tiles of 96-256 rows, in steps of 32");
    if constexpr (R == 96)
        wg_mma_rs96k(acc, a, b);
    else if constexpr (R == 128)
        wg_mma_rs128k(acc, a, b);
    else if constexpr (R == 160)
        wg_mma_rs160k(acc, a, b);
    else if constexpr (R == 192)
        wg_mma_rs192k(acc, a, b);
    else if constexpr (R == 224)
        wg_mma_rs224k(acc, a, b);
    else
        wg_mma_rs256k(acc, a, b);
}

/* Where unit 1 of a stage lies in its words' buffer, in words: after DW_CBS column blocks of the widest units. */
#define DW_UNIT1_AT (DW_CBS * (DW_W_UNIT / 4))

/* The producer warp: stage s's words and with them, where batch >= 0, the parameters of groups DW_GB batch.. (lane 2
 * the codes, lane 3 the tables or GPTQ scales); their barrier's count. The words of the block's column blocks of unit
 * ui (one piece of memory) come by lane ui's bulk copy into the stage's buffer (unit 1 at DW_UNIT1_AT; one tensor copy
 * of both where they share a width was 7-10 % slower, stop 71). Lane 0 arrives on bar expecting their bytes. A
 * thread's copies complete about one every 0.3 µs whatever their size up to a few KB (NOTES.md, stops 69 and 71), so
 * each lane issues one copy a stage at most. */
template <bool GPTQ>
__device__ __forceinline__ void dw_issue_words(const tsr_linear_dev &L, const CUtensorMap *codes,
                                               const CUtensorMap *scales, const uint2 *rec, int s,
                                               int batch, int cb0, uint32_t w_at, uint32_t p_base, uint32_t t_base,
                                               uint32_t bar, int lane)
{
    const int u0 = 2 * s, nu = min(2, L.n_units - u0), cbs = min(DW_CBS, L.Npad / 32 - cb0);
    const int g0 = DW_GB * batch, slot0 = g0 % DW_P_SLOTS;
    uint32_t bytes = 0, dst = 0;
    const void *src = NULL;
    if (lane < nu) {
        const uint2 e = rec[u0 + lane];
        const int bits = (int)(e.y >> 24);
        bytes = 128u * (uint32_t)(bits * cbs);
        src = L.fw + e.x + (size_t)cb0 * 32 * bits;
        dst = w_at + (uint32_t)(lane * 4 * DW_UNIT1_AT);
    } else if (lane == 2 && batch >= 0) {
        bytes = DW_GB * 64;
    } else if (lane == 3 && batch >= 0) {
        bytes = GPTQ ? DW_GB * 256 : 64u * (uint32_t)min(DW_GB, L.n_groups - g0);
        src = L.s_table + (size_t)g0 * 16; /* read for EXL2 only: GPTQ's scales come by a tensor copy below */
        dst = t_base + (uint32_t)slot0 * (GPTQ ? 256 : 64);
    }
    uint32_t total = bytes;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) dw_bar_expect(bar, total);
    __syncwarp();
    if (lane == 2 && bytes)
        dw_tma(p_base + (uint32_t)slot0 * 64, codes, 4 * cb0, g0, bar);
    else if (lane == 3 && bytes && GPTQ)
        dw_tma(dst, scales, 32 * cb0, g0, bar);
    else if (bytes)
        dw_bulk(dst, src, bytes, bar);
}

/* A warp's part of the 64 × 256 accumulator: element 4 j + i is column col + g + 8 (i / 2), row m0 + 8 j + 2 t4 + i % 2
 * (g = lane / 4, t4 = lane % 4); y = it + beta · y, columns past N and rows past M left alone. */
template <int R>
__device__ __forceinline__ void dw_store(const float (&acc)[R / 2], const tsr_linear_dev &L, int M, void *y, float beta,
                                         int y_half, int m0, int col, int lane)
{
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int n = col + g + 8 * (i >> 1);
        if (n >= L.N) continue;
#pragma unroll
        for (int j = 0; j < R / 8; j++) {
            const int m = m0 + 8 * j + 2 * t4 + (i & 1);
            if (m >= M) continue;
            dw_put(y, (size_t)m * L.N + n, acc[4 * j + i], beta, y_half);
        }
    }
}

/* The epilogue: the block's R × 128 sums are laid out row by row in shared memory, in the rings' space (free once
 * every stage has been consumed; DW_EPI_STRIDE floats a row, 4 banks past the one above, so that a warp's 32 sums of
 * rows 2 t4 + i apart fall in 32 banks), then each thread writes 4 neighbouring columns of a row at once: a warp
 * writes 512 bytes of one row, and a thread R / 8 vector stores instead of R / 2 scalar ones of 4 rows each. At 256
 * rows o took 45.8 µs with the direct stores (dw_store, TSR_CUDA_DW_EPI=0) and 27.0 with these, gate 74.1 and 61.2
 * (H100, NOTES.md, stop 64). Every consumer thread calls it (its named barriers count 256); warps past the matrix's
 * columns write nothing.
 * col0: the block's first column. */
#define DW_EPI_STRIDE 132
static_assert((size_t)DW_ROWS * DW_EPI_STRIDE * 4 <= DW_P_OFF, "the staged sums fit the first two rings");
template <int KP> __device__ __forceinline__ void dw_consumers_sync(void)
{
    asm volatile("bar.sync 1, %0;\n" ::"n"(KP * DW_THREADS) : "memory");
}
template <int R, int KP, bool RS, int RA = RS ? R / KP : R>
__device__ __forceinline__ void dw_store_staged(const float (&acc)[RA / 2], bool owns, float *stage,
                                                const tsr_linear_dev &L, int M, void *y, float beta, int y_half,
                                                int m0, int col0, int c_local, int lane, int kp)
{
    const int g = lane >> 2, t4 = lane & 3, tid = (int)threadIdx.x;
    dw_consumers_sync<KP>(); /* the other warpgroups' wgmma's have finished reading the rings */
    /* pairs by rows (RS) lay out their own rows at once; pairs by stages one after the other, pair 0 its sums and
     * pair 1 then adding its own (the same order in every run) */
    constexpr int ROUNDS = RS ? 1 : KP;
#pragma unroll
    for (int k = 0; k < ROUNDS; k++) {
        if (owns && (RS || kp == k)) {
            float *rows = stage + (RS ? kp * RA : 0) * DW_EPI_STRIDE;
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < RA / 8; j++) {
                    float *at = rows + (8 * j + 2 * t4 + (i & 1)) * DW_EPI_STRIDE + c_local + g + 8 * (i >> 1);
                    *at = k ? *at + acc[4 * j + i] : acc[4 * j + i];
                }
        }
        dw_consumers_sync<KP>();
    }
    const int q = tid & 31, n0 = col0 + 4 * q; /* this thread's 4 columns */
    if (n0 >= L.N) return;
    const bool vec = L.N % 4 == 0 && n0 + 4 <= L.N && ((uintptr_t)y & (y_half ? 7 : 15)) == 0;
    for (int r = tid >> 5; r < R; r += KP * DW_THREADS / 32) {
        const int m = m0 + r;
        if (m >= M) continue;
        const float4 v = *(const float4 *)(stage + r * DW_EPI_STRIDE + 4 * q);
        const size_t at = (size_t)m * L.N + n0;
        if (vec) {
            dw_put4(y, at, v, beta, y_half);
        } else {
            const float vs[4] = {v.x, v.y, v.z, v.w};
            for (int c = 0; c < 4 && n0 + c < L.N; c++) dw_put(y, at + c, vs[c], beta, y_half);
        }
    }
}

/* The producer: stage s's activation tile and the words and parameters of stage s + DW_WST - AST, as soon as the
 * consumers have released stage s - AST (whose tile buffer the one and whose words' buffer the other reuses). The
 * words thus run DW_WST - AST stages ahead of the tiles (AST: DW_AST, or DW_AST_FEW at few rows). With pwarps 1 the
 * producer's warp 0 issues them all (lane 0 the tile and unit 0's words); with 2, warp 0 the tiles and warp 1 the
 * words and parameters, as a thread's copies seem to complete one after another (stop 71: decode +10-14 % at 65-512
 * rows). Each warp waits on the empty barriers itself; neither can fall a phase behind, since the consumers need
 * both's copies. (A third warp for unit 1's words, and lanes taking turns a stage, gained nothing more: stop 71.) pw:
 * this warp's index in the producer warpgroup. */
template <bool GPTQ, int DG, int R, int AST>
__device__ __forceinline__ void dw_produce(const tsr_linear_dev &L, const CUtensorMap *map, const CUtensorMap *codes,
                                           const CUtensorMap *scales, const uint2 *rec, int m0, int cb0,
                                           uint32_t a_base, int s0, int n_local, int pwarps, int pw)
{
    constexpr int AHEAD = DW_WST - AST, A_SLOT = DW_A_RING / AST;
    static_assert(R * 128 <= A_SLOT, "a tile fits its slot");
    const int n_copied = DG_RECOPY(DG) ? min(AST, n_local) : n_local;
    const int lane = threadIdx.x & 31;
    const uint32_t bars = a_base + DW_BAR_OFF, full_w = bars + 8 * DW_AST_FEW, empty = full_w + 8 * DW_WST;
    /* batches of group parameters issued so far, counted from the batch of the range's first unit (a range never
     * starts at a stage whose two units lie in two batches: dw_split_start) */
    int batches = n_local > 0 ? (int)(rec[2 * s0].y & 0xffffffu) / DW_GB : 0;
    const bool tiles = pw == 0, issues_words = pwarps == 1 || pw == 1;
    /* the ring's buffers are indexed by t, the stage's place in the block's range; the copies by s0 + t */
    auto words = [&](int t) {
        const int s = s0 + t, last = min(2 * s + 1, L.n_units - 1), grp = (int)(rec[last].y & 0xffffffu);
        int batch = -1; /* the stage's last unit is in group DW_GB · batches or later: that batch comes with it */
        if (grp >= DW_GB * batches) batch = batches++;
        if (DG == DG_COPY_ACT || DG == DG_ACTONLY) {
            if (lane == 0) dw_bar_arrive(full_w + 8 * (t % DW_WST));
            return;
        }
        dw_issue_words<GPTQ>(L, codes, scales, rec, s, DG == DG_NOPARAMS && t > 0 ? -1 : batch, cb0,
                             a_base + DW_W_OFF + (t % DW_WST) * DW_W_BYTES, a_base + DW_P_OFF, a_base + DW_T_OFF,
                             full_w + 8 * (t % DW_WST), lane);
    };
    if (issues_words)
        for (int t = 0; t < min(AHEAD, n_copied); t++) words(t);
    tsr_pdl_wait(); /* the weights are constant; the activations are the kernel before's output */
    for (int t = 0; t < n_copied; t++) {
        if (t >= AST) dw_bar_wait(empty + 8 * ((t - AST) % DW_WST), (uint32_t)((t - AST) / DW_WST) & 1u);
        if (tiles && lane == 0) {
            const uint32_t bar = bars + 8 * (t % AST);
            dw_bar_expect(bar, DG == DG_COPY_WORDS ? 0u : (uint32_t)(R * 128));
            if (DG != DG_COPY_WORDS) dw_tma(a_base + (t % AST) * A_SLOT, map, 64 * (s0 + t), m0, bar);
        }
        if (issues_words && t + AHEAD < n_copied) words(t + AHEAD);
    }
}

/* The block's work for the warps of warpgroup CT (16-column tile CT of each column block) of consumer pair kp of KP:
 * per stage of the pair's (with pairs by stages every KP-th, from kp; by rows, RS, every stage, for rows kp R / KP..
 * of the tile), wait for its tile and words, decode and multiply its two units, and release the pair's stage before
 * (whose wgmma's have finished) to the producer on its empty barrier (two pairs left in flight, with four register
 * sets, measured the same, stop 56); then store the sums, staged through shared memory (dw_store_staged, which adds
 * the pairs' sums by stages) or, with staged 0 and one pair, as they lie (dw_store).
 * DG: a diagnostic (dw_diag) in place of the full work. */
template <bool GPTQ, int CT, int DG, int R, int AST, int KP, bool RS>
__device__ __forceinline__ void dw_run(const tsr_linear_dev &L, int M, void *y, float beta, int y_half, int staged,
                                       unsigned char *smem, uint32_t a_base, const uint2 *rec, int m0,
                                       int cb0, unsigned s0, unsigned n_local, unsigned kp)
{
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, cbl = warp & 3;
    const int cb = cb0 + cbl;
    const unsigned n_units = (unsigned)L.n_units; /* unsigned: cheap % and / */
    const bool owns = cb < L.Npad / 32;
    const uint32_t bars = a_base + DW_BAR_OFF, full_w = bars + 8 * DW_AST_FEW, empty = full_w + 8 * DW_WST;
    const uint32_t *w_ring = (const uint32_t *)(smem + DW_W_OFF);
    const unsigned char *p_ring = smem + DW_P_OFF, *t_ring = smem + DW_T_OFF;
    const uint64_t d0 = wg_desc(a_base, 0); /* the first tile's descriptor; others add their offset / 16 */
    unsigned grp = ~0u;                     /* the group of the unit being decoded */

    constexpr int RA = RS ? R / KP : R, STEP = RS ? 1 : KP; /* the rows a pair multiplies; its stages' stride */
    float acc[RA / 2];
#pragma unroll
    for (int i = 0; i < RA / 2; i++) acc[i] = 0.0f;
    uint32_t ax[2][4], ay[2][4]; /* A fragments of a stage's first and second unit; a warp past the matrix's columns
                                  * multiplies these zeros (its rows of the product are not stored) */
#pragma unroll
    for (int ks = 0; ks < 2; ks++)
#pragma unroll
        for (int r = 0; r < 4; r++) ax[ks][r] = ay[ks][r] = 0u;

    frag_scales sc;  /* the group's parameters, decoded where it starts (fresh) */
    __half2 h0, h1; /* and the scales of the warp's two columns */
    /* unit u (ui of the range's stage s, whose buffers are the ring's s-th): decode into a, then its two wgmma's */
    auto unit = [&](unsigned s, unsigned u, unsigned ui, bool fresh, uint32_t (&a)[2][4]) {
        const uint32_t *slot = w_ring + (s % DW_WST) * 2 * DW_CBS * (DW_W_UNIT / 4) +
                               (ui ? DW_UNIT1_AT : 0);
        if (DG == DG_NODECODE) { /* ones (wrong results) */
#pragma unroll
            for (int ks = 0; ks < 2; ks++)
#pragma unroll
                for (int r = 0; r < 4; r++) a[ks][r] = 0x3c003c00u;
        } else if (owns && DG == DG_MMA_RAW) { /* the words as they lie, behind the switch by width (wrong results) */
            frag_with_width((int)(rec[u].y >> 24), [&](auto wb) {
                constexpr int B = decltype(wb)::value;
#pragma unroll
                for (int ks = 0; ks < 2; ks++)
#pragma unroll
                    for (int r = 0; r < 4; r++) a[ks][r] = slot[cbl * 32 * B + (4 * ks + r) * 32 + lane];
            });
        } else if (owns) {
            if (fresh) {
                const unsigned slot = grp % DW_P_SLOTS;
                frag_scales_decode(*(const uint4 *)(p_ring + 64 * slot + 16 * cbl),
                                   GPTQ ? (const void *)(t_ring + 256 * slot + 64 * cbl) : t_ring + 64 * slot, GPTQ,
                                   L.zero_add, lane >> 2, sc);
                h0 = __float2half2_rn(sc.s[2 * CT]), h1 = __float2half2_rn(sc.s[2 * CT + 1]);
            }
            if (GPTQ) {
                dw_decode<4, true, CT>(slot + cbl * 32 * 4, lane, sc, h0, h1, a);
            } else {
                frag_with_width((int)(rec[u].y >> 24), [&](auto wb) {
                    constexpr int B = decltype(wb)::value;
                    dw_decode<B, false, CT>(slot + cbl * 32 * B, lane, sc, h0, h1, a);
                });
            }
        }
        const uint32_t rows_at = RS ? kp * RA * 128 : 0; /* whole 1024-byte atoms of the swizzle */
        const uint64_t d = (d0 & ~0xffffffffull) |
                           (uint32_t)(d0 + (((s % AST) * (DW_A_RING / AST) + rows_at + ui * 64) >> 4));
        wg_arrive();
        dw_mma<RA>(acc, a[0], d);
        dw_mma<RA>(acc, a[1], d + 2);
        wg_commit();
        wg_wait<1>();
    };

    /* the release of stage s's buffers to the producer: every wgmma that reads them has finished */
    auto release = [&](unsigned s) {
        __syncwarp();
        if (lane == 0) dw_bar_arrive(empty + 8 * (s % DW_WST));
    };
    /* whether unit u starts a group (the records' group of unit u differs from the last one's) */
    auto fresh_group = [&](unsigned u) {
        const unsigned g = rec[u].y & 0xffffffu;
        const bool fresh = g != grp;
        grp = g;
        return fresh;
    };
    for (unsigned s = RS ? 0 : kp; s < n_local; s += STEP) {
        const unsigned u0 = 2 * (s0 + s);
        if (!DG_RECOPY(DG) || s < AST) {
            dw_bar_wait(bars + 8 * (s % AST), (uint32_t)(s / AST) & 1u);
            dw_bar_wait(full_w + 8 * (s % DW_WST), (uint32_t)(s / DW_WST) & 1u);
        }
        if (DG_COPY_ONLY(DG)) {
            release(s);
            continue;
        }
        unit(s, u0, 0, fresh_group(u0), ax);
        if (!DG_RECOPY(DG) && s >= STEP) release(s - STEP); /* the wait left only unit u0's pair in flight */
        if (u0 + 1 < n_units) {
            unit(s, u0 + 1, 1, fresh_group(u0 + 1), ay);
        }
    }
    wg_wait<0>();
    wg_keep(acc);
    /* nostore returns on a condition the compiler cannot decide (M > 0 always holds here), else ptxas drops the decode
     * and the wgmma's whose sums nothing stores (it did so at stop 64: NOTES.md, stop 65) */
    if (DG_COPY_ONLY(DG) || (DG == DG_NOSTORE && M > 0)) return;
    if constexpr (KP > 1) {
        dw_store_staged<R, KP, RS>(acc, owns, (float *)smem, L, M, y, beta, y_half, m0, 32 * cb0, 32 * cbl + 16 * CT,
                                   lane, (int)kp);
    } else {
        if (staged)
            dw_store_staged<R, 1, false>(acc, owns, (float *)smem, L, M, y, beta, y_half, m0, 32 * cb0,
                                         32 * cbl + 16 * CT, lane, 0);
        else if (owns)
            dw_store<R>(acc, L, M, y, beta, y_half, m0, 32 * cb + 16 * CT, lane);
    }
}
#endif

/* The first K stage of split z of `splits` (n_stages at z == splits): an even share, moved one stage on where that
 * stage's two units lie in two batches of group parameters, so that a range's first stage needs one batch only (the
 * producer issues one batch per stage; a batch spans at least 16 units, so the next stage lies in one). */
__device__ __forceinline__ int dw_split_start(const uint2 *rec, int n_units, int n_stages, int splits, int z)
{
    if (z <= 0) return 0;
    if (z >= splits) return n_stages;
    int s = (int)((long long)n_stages * z / splits);
    if (2 * s + 1 < n_units && (rec[2 * s].y & 0xffffffu) / DW_GB != (rec[2 * s + 1].y & 0xffffffu) / DW_GB) s++;
    return s;
}

/* Registers a thread after setmaxnreg, for the producer warpgroup and the consumers: one pair 40 and 232 (the
 * accumulator of 256 rows takes 128); two pairs 32 and 120 (a pair's accumulator at most 128 rows: 64), the 65,536 of
 * an SM either way. */
template <int KP> struct dw_regs {
    static constexpr int producer = KP == 1 ? 40 : 32, consumer = KP == 1 ? 232 : 120;
    static_assert(128 * producer + 2 * 128 * KP * consumer <= 65536, "the SM's registers");
};

template <bool GPTQ, int DG, int R, int AST = DW_AST, int KP = 1, bool RS = false> /* the defaults: nvcc 13's host
                                                                                      * stubs name the kernels
                                                                                      * without them */
__global__ void __launch_bounds__(KP * DW_THREADS + DW_PRODUCER, 1)
    dq_wgmma_kernel(const __grid_constant__ dw_parts P, const __grid_constant__ CUtensorMap xmap, int M, float beta,
                    int y_half, int staged)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char dw_smem[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(dw_smem), pad = (1024 - (raw & 1023)) & 1023;
    unsigned char *smem = dw_smem + pad;
    const uint32_t a_base = raw + pad, bars = a_base + DW_BAR_OFF;
    uint2 *rec = (uint2 *)(smem + DW_REC_OFF);
    const int tile = (int)blockIdx.y, m0 = (int)blockIdx.x * R;
    int p = 0;
    while (p + 1 < P.n && tile >= P.tiles_end[p]) p++;
    const tsr_linear_dev &L = P.L[p];
    const int cb0 = (tile - (p ? P.tiles_end[p - 1] : 0)) * DW_CBS;
    for (int u = threadIdx.x; u < L.n_units; u += blockDim.x) rec[u] = L.units[u];
    /* the block's range of K stages (split blockIdx.z of P.splits), and where its sums go: y itself, or the split's
     * fp32 partial sums (beta applied by the reduction) */
    const int n_stages = (L.n_units + 1) / 2, split = (int)blockIdx.z;
    void *y = P.y[p];
    if (P.splits > 1) {
        y = P.part[p] + (size_t)split * M * L.N;
        beta = 0.0f, y_half = 0;
    }
    if (threadIdx.x == 0) {
        for (int b = 0; b < DW_AST_FEW + DW_WST; b++) dw_bar_init(bars + 8 * b, 1); /* full: the producer's arrival */
        for (int b = 0; b < DW_WST; b++)
            dw_bar_init(bars + 8 * (DW_AST_FEW + DW_WST + b), (RS ? KP : 1) * DW_THREADS / 32); /* empty: each
                                                             * warp's of the pairs that consume the stage */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int s0 = dw_split_start(rec, L.n_units, n_stages, P.splits, split);
    const int n_local = dw_split_start(rec, L.n_units, n_stages, P.splits, split + 1) - s0;
    static_assert(KP == 1 || (KP == 2 && (RS ? R == 192 || R == 256 : R <= 128) && DG == DG_NONE),
                  "two pairs hold at most 128 rows' sums each, and pairs by rows 96 or 128 rows");
    if (threadIdx.x >= KP * DW_THREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(dw_regs<KP>::producer) : "memory");
        const int pw = (int)(threadIdx.x - KP * DW_THREADS) / 32;
        if (pw < P.pwarps)
            dw_produce<GPTQ, DG, R, AST>(L, &xmap, &P.codes[p], &P.scales[p], rec, m0, cb0, a_base, s0,
                                         n_local, P.pwarps, pw);
        else
            tsr_pdl_wait();
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(dw_regs<KP>::consumer) : "memory");
    tsr_pdl_wait(); /* before the stores (the kernel before may still read y) */
    const unsigned wg = threadIdx.x / 128, kp = wg >> 1; /* warpgroup 2 kp + CT */
    if (!(wg & 1))
        dw_run<GPTQ, 0, DG, R, AST, KP, RS>(L, M, y, beta, y_half, staged, smem, a_base, rec, m0, cb0, (unsigned)s0,
                                        (unsigned)n_local, kp);
    else
        dw_run<GPTQ, 1, DG, R, AST, KP, RS>(L, M, y, beta, y_half, staged, smem, a_base, rec, m0, cb0, (unsigned)s0,
                                        (unsigned)n_local, kp);
#endif
}

/* cuTensorMapEncodeTiled, from the driver through the runtime (no link to libcuda); NULL where the driver lacks it. */
typedef CUresult (*dw_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static dw_encode_fn dw_encoder(void)
{
    static dw_encode_fn fn;
    static bool asked;
    if (!asked) {
        asked = true;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (dw_encode_fn)p;
        else
            cudaGetLastError();
    }
    return fn;
}

/* map over `rows` rows of `cols` elements of type t (`pitch` bytes apart) at base, read in boxes of box_cols ×
 * box_rows; what lies past the tensor arrives as zeros. A refusal is a planning bug (the inputs are aligned): fatal,
 * naming what. */
static void dw_map_2d(CUtensorMap *map, CUtensorMapDataType t, const void *base, size_t cols, size_t rows, size_t pitch,
                      unsigned box_cols, unsigned box_rows, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                      const char *what)
{
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)pitch};
    const cuuint32_t box[2] = {box_cols, box_rows}, step[2] = {1, 1};
    if (dw_encoder()(map, t, 2, (void *)base, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, l2,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        tsr_cuda_fatal(__FILE__, __LINE__, what);
}

/* The producer's issuing warps (dw_produce): 2 by default, tiles and words apart; TSR_CUDA_DW_PWARPS=1 one warp
 * issuing every copy. Measured on the H100 (NOTES.md, stop 71), two warps against one: decode +3-6 % at 96-512 rows
 * in one call, +10-14 % at 65-512 in another, a prefill in 512-token chunks +5.5 %. */
static int dw_pwarps(void)
{
    static const bool one = getenv("TSR_CUDA_DW_PWARPS") && atoi(getenv("TSR_CUDA_DW_PWARPS")) == 1;
    return one ? 1 : 2;
}

/* Two pairs of consumer warpgroups instead of one (EXL2), so that twice the warps decode and keep wgmma's in flight
 * (stop 71 left the product at 65-256 rows bound by its consumers, NOTES.md), each pair at 120 registers:
 * - TSR_CUDA_DW_KPAIRS=2, where a block takes at most 128 rows: the pairs take turns a stage, each with its own
 *   accumulator, added in the epilogue;
 * - TSR_CUDA_DW_RPAIRS=2, in blocks of 192 or 256 rows: each pair multiplies every stage's weights by half the rows
 *   (m64n96k16 or m64n128k16), so that each weight is decoded twice, once a pair.
 * Both are off by default: written at stop 72, when no GPU was lent to measure them (scripts/device-kpairs.sh). */
static bool dw_pairs_asked(const char *name)
{
    return getenv(name) && atoi(getenv(name)) == 2;
}

/* The diagnostic asked for by TSR_CUDA_DW_DIAG=nodecode, copy, copyact, copywords, mma, mmaraw, noparams, actonly or
 * nostore (dw_diag; EXL2 only: GPTQ runs the full kernel). */
static dw_diag dw_diag_asked(void)
{
    static const char *const names[] = {"",    "nodecode", "copy",     "copyact", "copywords",
                                        "mma", "mmaraw",   "noparams", "actonly",  "nostore"};
    static dw_diag asked = DG_NONE;
    static bool read;
    if (!read) {
        const char *v = getenv("TSR_CUDA_DW_DIAG");
        for (int i = 1; v && i < (int)(sizeof names / sizeof names[0]); i++)
            if (!strcmp(v, names[i])) asked = (dw_diag)i;
        read = true;
    }
    return asked;
}

/* The rows the kernel takes (the dequantize pass and cuBLAS take the others): TSR_CUDA_DQ_WGMMA=1 every row count,
 * =0 none, else up to TSR_CUDA_DQ_WGMMA_MAX_M rows (default DW_MAX_M). Measured on the H100, 8B at 4.0 bpw against
 * the cuBLAS path (NOTES.md, stop 66): decode at 288 rows 18.3k tok/s against 15.2k, 384 22.5k / 18.2k, 448 24.3k /
 * 17.8k, 512 25.9k / 22.4k, 640 22.0k / 22.8k, 1024 26.6k / 27.1k; a 2048-token prefill in chunks of 512 30.0k /
 * 24.8k, of 1024 31.8k / 32.8k, whole 33.6k / 36.3k. */
#define DW_MAX_M 512
static int dw_max_m(void)
{
    static int v = -2;
    if (v == -2) {
        const char *on = getenv("TSR_CUDA_DQ_WGMMA"), *max = getenv("TSR_CUDA_DQ_WGMMA_MAX_M");
        v = on && *on ? (atoi(on) != 0 ? INT_MAX : 0) : max && *max && atoi(max) >= 0 ? atoi(max) : DW_MAX_M;
    }
    return v;
}

/* Whether the kernel takes some row count here: asked for, sm_90a code running, the tensor-map encoder there and
 * the block's shared memory allowed. */
static bool dw_runs(void)
{
    return dw_max_m() > 0 && tsr_cuda_wgmma_code() && dw_encoder() &&
           dw_smem_bytes(DW_MAX_UNITS) <= (size_t)tsr_cuda_smem_block();
}

static bool dw_possible(const tsr_linear_dev *L)
{
    return L->kind == TSR_LINEAR_EXL2 && L->n_units <= DW_MAX_UNITS && L->n_groups > 0 && dw_runs();
}

bool tsr_cuda_dq_wgmma_takes(const tsr_linear_dev *L, int M)
{
    return M <= dw_max_m() && dw_possible(L);
}

extern "C" int tsr_cuda_dq_wgmma_rows(int M)
{
    return M <= dw_max_m() && dw_runs();
}

bool tsr_cuda_dq_wgmma_takes_all(const tsr_linear_dev *L)
{
    return dw_max_m() == INT_MAX && dw_possible(L);
}

/* Activation rows per block (the wgmma's N): M spread evenly over the fewest row tiles of at most 256 rows, each
 * tile the least multiple of 32 from 96 that holds its share, so that the tensor cores' work and the tiles' copies
 * on rows past M stay small (at 129-192 rows tiles of 192 gave +16-18 % over tiles of 256, NOTES.md, stop 62; at 320
 * rows two tiles of 160 instead of two of 256, stop 66). TSR_CUDA_DW_ROWS=S (64, 128 or 256) takes multiples of S
 * instead (128: stop 61's tiles of 128 or 256; 256: whole tiles of 256 past 256 rows, as before stop 66;
 * comparisons). The diagnostics (EXL2) run in tiles of 96 rows where M <= 96, else of 256. */
static int dw_rows(int M, bool gptq)
{
    static const int asked = getenv("TSR_CUDA_DW_ROWS") ? atoi(getenv("TSR_CUDA_DW_ROWS")) : 0;
    const int step = asked == 64 || asked == 128 || asked == 256 ? asked : 32;
    if (!gptq && dw_diag_asked() != DG_NONE) return M <= 96 ? 96 : 256;
    const int row_tiles = (M + 255) / 256, share = (M + row_tiles - 1) / row_tiles;
    int rows = (share + step - 1) / step * step;
    if (rows < 96) rows = step > 96 ? step : step == 64 ? 128 : 96;
    return rows < 256 ? rows : 256;
}

/* K ranges per tile (grid.z): enough for the grid to fill the chip's SMs once (one block fits an SM), each range of
 * at least DW_MIN_STAGES stages, at most DW_MAX_SPLITS, and their partial sums within the dequantize buffer (or 64
 * MiB where none is reserved); TSR_CUDA_DW_SPLITS=N asks for N (still bounded by the stages). */
#define DW_MIN_STAGES 6
#define DW_MAX_SPLITS 8
static int dw_splits(int tiles, int n_stages, size_t partial_bytes)
{
    static const int sms = tsr_cuda_device_attr(cudaDevAttrMultiProcessorCount, 132);
    static const int asked = getenv("TSR_CUDA_DW_SPLITS") ? atoi(getenv("TSR_CUDA_DW_SPLITS")) : 0;
    int splits = asked > 0 ? asked : tiles < sms ? sms / tiles : 1;
    if (splits > DW_MAX_SPLITS) splits = DW_MAX_SPLITS;
    if (splits > n_stages / DW_MIN_STAGES && asked <= 0) splits = n_stages / DW_MIN_STAGES;
    if (splits > n_stages) splits = n_stages;
    const size_t cap = tsr_cuda_dq_reserved() > ((size_t)64 << 20) ? tsr_cuda_dq_reserved() : (size_t)64 << 20;
    while (splits > 1 && (size_t)splits * partial_bytes > cap) splits--;
    return splits < 1 ? 1 : splits;
}

/* The splits' partial sums of each part added in split order (the same sums whatever the run), then beta · y: y =
 * sum + beta · y, fp32 or fp16. Thread i takes element i of the flattened parts. */
struct dw_reduce_args {
    const float *part[TSR_GEMV_MAX_PARTS];
    void *y[TSR_GEMV_MAX_PARTS];
    size_t end[TSR_GEMV_MAX_PARTS]; /* part p's elements end at end[p] of the flattened index (M · N each) */
    int n, splits;
};

/* Element i of the flattened parts: its part (returned), its index e in that part and the part's element count. */
__device__ __forceinline__ int dw_reduce_part(const dw_reduce_args &a, size_t i, size_t &e, size_t &count)
{
    int p = 0;
    while (p + 1 < a.n && i >= a.end[p]) p++;
    e = i - (p ? a.end[p - 1] : 0), count = a.end[p] - (p ? a.end[p - 1] : 0);
    return p;
}

__global__ void dw_reduce_kernel(const __grid_constant__ dw_reduce_args a, float beta, int y_half)
{
    tsr_pdl_start();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.end[a.n - 1]) return;
    size_t e, count;
    const int p = dw_reduce_part(a, i, e, count);
    float v = 0.0f;
    for (int z = 0; z < a.splits; z++) v += a.part[p][(size_t)z * count + e];
    dw_put(a.y[p], e, v, beta, y_half);
}

/* dw_reduce_kernel four elements a thread (16-byte loads of the partial sums), where each part's M · N is a multiple
 * of 4 (so that no four straddle two parts) and every y is aligned for it: thread i takes elements 4 i.. 4 i + 3. */
__global__ void dw_reduce4_kernel(const __grid_constant__ dw_reduce_args a, float beta, int y_half)
{
    tsr_pdl_start();
    const size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= a.end[a.n - 1]) return;
    size_t e, count;
    const int p = dw_reduce_part(a, i, e, count);
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int z = 0; z < a.splits; z++) {
        const float4 t = *(const float4 *)(a.part[p] + (size_t)z * count + e);
        v.x += t.x, v.y += t.y, v.z += t.z, v.w += t.w;
    }
    dw_put4(a.y[p], e, v, beta, y_half);
}

template <bool GPTQ, int DG = DG_NONE, int R = DW_ROWS, int AST = DW_AST, int KP = 1, bool RS = false>
static void dw_launch(const dw_parts &parts, const CUtensorMap &map, int M, int n_units, float beta, bool y_half)
{
    void (*kernel)(dw_parts, CUtensorMap, int, float, int, int) = dq_wgmma_kernel<GPTQ, DG, R, AST, KP, RS>;
    const unsigned threads = KP * DW_THREADS + DW_PRODUCER;
    /* the epilogue: through shared memory (dw_store_staged), or with TSR_CUDA_DW_EPI=0 the accumulators stored as
     * they lie (dw_store; comparisons) */
    static const int staged = !tsr_cuda_env_off("TSR_CUDA_DW_EPI");
    static bool configured = false;
    if (!configured) {
        tsr_cuda_allow_smem((const void *)kernel, dw_smem_bytes(DW_MAX_UNITS), "the EXL2/GPTQ wgmma product");
        configured = true;
    }
    const dim3 grid((unsigned)tsr_div_up((size_t)M, R), (unsigned)parts.tiles_end[parts.n - 1],
                    (unsigned)parts.splits);
    /* under PDL (TSR_CUDA_DW_PDL=0: plain launches, for comparisons) a block's set-up and first weights' copies run
     * while the kernel before it finishes */
    static const bool pdl = !tsr_cuda_env_off("TSR_CUDA_DW_PDL");
    if (pdl) {
        tsr_launch_smem(kernel, grid, dim3(threads), dw_smem_bytes(n_units), parts, map, M, beta, (int)y_half,
                        staged);
    } else {
        kernel<<<grid, threads, dw_smem_bytes(n_units), tsr_cuda_stream()>>>(parts, map, M, beta, (int)y_half,
                                                                             staged);
        TSR_CUDA_LAUNCHED();
    }
    if (parts.splits == 1) return;
    dw_reduce_args r;
    memset(&r, 0, sizeof r);
    r.n = parts.n, r.splits = parts.splits;
    for (int p = 0; p < parts.n; p++) {
        r.part[p] = parts.part[p], r.y[p] = parts.y[p];
        r.end[p] = (p ? r.end[p - 1] : 0) + (size_t)M * parts.L[p].N;
    }
    /* four elements a thread where the parts allow it (TSR_CUDA_DW_REDUCE4=0: one, for comparisons) */
    static const bool four_asked = !tsr_cuda_env_off("TSR_CUDA_DW_REDUCE4");
    bool four = four_asked;
    for (int p = 0; p < parts.n; p++)
        four = four && ((size_t)M * parts.L[p].N) % 4 == 0 && ((uintptr_t)parts.y[p] & (y_half ? 7 : 15)) == 0 &&
               ((uintptr_t)parts.part[p] & 15) == 0;
    void (*reduce)(dw_reduce_args, float, int) = four ? dw_reduce4_kernel : dw_reduce_kernel;
    const unsigned blocks = (unsigned)tsr_div_up(four ? r.end[parts.n - 1] / 4 : r.end[parts.n - 1], 256);
    if (pdl) {
        tsr_launch(reduce, dim3(blocks), dim3(256), r, beta, (int)y_half);
    } else {
        reduce<<<blocks, 256, 0, tsr_cuda_stream()>>>(r, beta, (int)y_half);
        TSR_CUDA_LAUNCHED();
    }
}

/* The diagnostic asked for (EXL2), in tiles of R rows. */
template <int R>
static void dw_launch_diag(const dw_parts &parts, const CUtensorMap &map, int M, int n_units, float beta, bool y_half)
{
    switch (dw_diag_asked()) {
    case DG_NONE: break;
    case DG_NODECODE: dw_launch<false, DG_NODECODE, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_COPY: dw_launch<false, DG_COPY, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_COPY_ACT: dw_launch<false, DG_COPY_ACT, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_COPY_WORDS: dw_launch<false, DG_COPY_WORDS, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_MMA: dw_launch<false, DG_MMA, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_MMA_RAW: dw_launch<false, DG_MMA_RAW, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_NOPARAMS: dw_launch<false, DG_NOPARAMS, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_ACTONLY: dw_launch<false, DG_ACTONLY, R>(parts, map, M, n_units, beta, y_half); break;
    case DG_NOSTORE: dw_launch<false, DG_NOSTORE, R>(parts, map, M, n_units, beta, y_half); break;
    }
}

/* rows: the block's activation rows (dw_rows); the diagnostics run in tiles of 96 or 256 rows */
template <bool GPTQ>
static void dw_launch_variant(const dw_parts &parts, const CUtensorMap &map, int M, int n_units, float beta,
                              bool y_half, int rows)
{
    if (!GPTQ && dw_diag_asked() != DG_NONE) {
        if (rows == 96)
            dw_launch_diag<96>(parts, map, M, n_units, beta, y_half);
        else
            dw_launch_diag<256>(parts, map, M, n_units, beta, y_half);
        return;
    }
    /* DW_AST_FEW activation tiles in flight where a block takes at most 128 rows: +0.4-1.3 % in decode steps of 65-128
     * rows, o and the head 1-3 % faster, the rest unchanged (H100, NOTES.md, stop 68); TSR_CUDA_DW_AST=4 gives the
     * ring of DW_AST tiles at every row count (comparisons) */
    static const bool few = !(getenv("TSR_CUDA_DW_AST") && atoi(getenv("TSR_CUDA_DW_AST")) == DW_AST);
    /* two pairs of consumer warpgroups where asked (dw_pairs_asked; EXL2 only: GPTQ's instances of pairs by stages
     * have ptxas serialize their wgmma's, C7515) */
    if constexpr (!GPTQ) {
        static const bool kpairs = dw_pairs_asked("TSR_CUDA_DW_KPAIRS"), rpairs = dw_pairs_asked("TSR_CUDA_DW_RPAIRS");
        if (few && kpairs && rows == 96)
            return dw_launch<false, DG_NONE, 96, DW_AST_FEW, 2>(parts, map, M, n_units, beta, y_half);
        if (few && kpairs && rows == 128)
            return dw_launch<false, DG_NONE, 128, DW_AST_FEW, 2>(parts, map, M, n_units, beta, y_half);
        if (rpairs && rows == 192)
            return dw_launch<false, DG_NONE, 192, DW_AST, 2, true>(parts, map, M, n_units, beta, y_half);
        if (rpairs && rows == 256)
            return dw_launch<false, DG_NONE, 256, DW_AST, 2, true>(parts, map, M, n_units, beta, y_half);
    }
    if (few && rows == 96) return dw_launch<GPTQ, DG_NONE, 96, DW_AST_FEW>(parts, map, M, n_units, beta, y_half);
    if (few && rows == 128) return dw_launch<GPTQ, DG_NONE, 128, DW_AST_FEW>(parts, map, M, n_units, beta, y_half);
    switch (rows) {
    case 96: dw_launch<GPTQ, DG_NONE, 96>(parts, map, M, n_units, beta, y_half); return;
    case 128: dw_launch<GPTQ, DG_NONE, 128>(parts, map, M, n_units, beta, y_half); return;
    case 160: dw_launch<GPTQ, DG_NONE, 160>(parts, map, M, n_units, beta, y_half); return;
    case 192: dw_launch<GPTQ, DG_NONE, 192>(parts, map, M, n_units, beta, y_half); return;
    case 224: dw_launch<GPTQ, DG_NONE, 224>(parts, map, M, n_units, beta, y_half); return;
    default: dw_launch<GPTQ>(parts, map, M, n_units, beta, y_half); return;
    }
}

int tsr_cuda_dq_wgmma(const tsr_linear_dev *const *L, int n, const __half *xp, int M, void *const *y, float beta,
                      bool y_half)
{
    if (M <= 0 || n < 1 || n > TSR_GEMV_MAX_PARTS) return 0;
    dw_parts parts;
    memset(&parts, 0, sizeof parts);
    size_t partial_bytes = 0; /* one split's partial sums, every part */
    for (int i = 0; i < n; i++) {
        if (!tsr_cuda_dq_wgmma_takes(L[i], M) || L[i]->n_units != L[0]->n_units || L[i]->gptq != L[0]->gptq)
            return 0;
        parts.L[i] = *L[i];
        parts.y[i] = y[i];
        parts.tiles_end[i] = (i ? parts.tiles_end[i - 1] : 0) + (int)tsr_div_up((size_t)L[i]->Npad / 32, DW_CBS);
        partial_bytes += (size_t)M * L[i]->N * sizeof(float);
    }
    parts.n = n;
    const int rows = dw_rows(M, L[0]->gptq != 0);
    const int tiles = (int)tsr_div_up((size_t)M, rows) * parts.tiles_end[n - 1];
    parts.splits = dw_splits(tiles, (L[0]->n_units + 1) / 2, partial_bytes);
    if (parts.splits > 1) { /* the dequantize buffer (scratch slot 3), which this product does not otherwise use */
        float *ws = (float *)tsr_cuda_scratch(3, (size_t)parts.splits * partial_bytes);
        for (int i = 0; i < n; i++) {
            parts.part[i] = ws;
            ws += (size_t)parts.splits * M * L[i]->N;
        }
    }
    /* xp as M rows of Kp halves, read in boxes of `rows` rows × 64 halves in the 128-byte swizzle */
    const size_t kp = (size_t)32 * L[0]->n_units;
    CUtensorMap map;
    dw_map_2d(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, xp, kp, (size_t)M, 2 * kp, 64, (unsigned)rows,
              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
              "cuTensorMapEncodeTiled refused the activations of the wgmma product");
    /* each part's codes as G rows of Npad / 8 words, and GPTQ's scales as G rows of Npad halves, read DW_GB rows at a
     * time */
    for (int i = 0; i < n; i++) {
        const tsr_linear_dev *l = L[i];
        const char *what = "cuTensorMapEncodeTiled refused the group parameters of the wgmma product";
        dw_map_2d(&parts.codes[i], CU_TENSOR_MAP_DATA_TYPE_UINT32, l->gptq ? l->g_zeros : l->q_scale,
                  (size_t)l->Npad / 8, (size_t)l->n_groups, (size_t)l->Npad / 2, 16, DW_GB, CU_TENSOR_MAP_SWIZZLE_NONE,
                  CU_TENSOR_MAP_L2_PROMOTION_NONE, what);
        if (l->gptq)
            dw_map_2d(&parts.scales[i], CU_TENSOR_MAP_DATA_TYPE_FLOAT16, l->g_scales, (size_t)l->Npad,
                      (size_t)l->n_groups, (size_t)l->Npad * 2, 128, DW_GB, CU_TENSOR_MAP_SWIZZLE_NONE,
                      CU_TENSOR_MAP_L2_PROMOTION_NONE, what);
    }
    parts.pwarps = dw_pwarps();
    if (L[0]->gptq)
        dw_launch_variant<true>(parts, map, M, L[0]->n_units, beta, y_half, rows);
    else
        dw_launch_variant<false>(parts, map, M, L[0]->n_units, beta, y_half, rows);
    return 1;
}
