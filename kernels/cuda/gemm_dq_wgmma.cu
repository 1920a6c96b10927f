/* The prefill product of an EXL2 or GPTQ matrix on Hopper's warpgroup tensor cores (wgmma, code for sm_90a), with the
 * weights dequantized in registers: no fp16 copy of the matrix is written to memory and read back, as the cuBLAS path
 * of matmul.cu does (its dequantize pass was ~12 % of an 8B 2048-token prefill; NOTES.md, stop 52).
 *
 * The product is computed transposed, yᵀ = Wᵀ · xpᵀ. The weights are then wgmma's A operand, which may come from
 * registers in the mma.m16n8k16 A layout, and that is the layout exl2_frag.cuh's packing decodes into: a lane's words
 * of one (unit, column block) hold its A fragments for two 16-column tiles (ct) × two 16-row K steps, decoded with
 * the decode GEMV's instructions and multiplied by their column's fp16 scale (the same single rounding as the
 * dequantize pass, so the weights are bit for bit the fp16 ones cuBLAS would read). The activations (xp: the input in
 * the matrix's unit row order, fp16, from matmul.cu's permutation pass) are the B operand, K-major in shared memory.
 *
 * A block takes 256 activation rows (the wgmma's N) and 4 column blocks (128 output columns). Warp w of warpgroup ct
 * owns column block w's tile ct: the four warps of a warpgroup give the 64 A rows of one m64n256k16 wgmma, and each
 * (unit, column block) is decoded half by each warpgroup, so a thread keeps one 64 × 256 accumulator (128 registers)
 * and decodes 8 of the 16 registers of its words per unit. K advances in stages of two units (64 rows); each stage's
 * activation tile (one tensor copy into the 128-byte swizzle, wgmma.cuh), the units' words of the block's column
 * blocks and their group parameters (scale codes, and the EXL2 scale table or GPTQ's scales) arrive by bulk copies
 * counted by the stage's full barrier. Per unit a warpgroup decodes its A fragments into one of two register sets
 * (the other may still be read by the wgmma's in flight), issues two wgmma's and waits until at most that pair is in
 * flight, so each unit's decode overlaps the tensor cores' work on the one before.
 *
 * Variants (TSR_CUDA_DW_*, dw_variant; NOTES.md, stops 54-55): v4, the one TSR_CUDA_DQ_WGMMA=1 runs, has a third
 * warpgroup whose first warp issues every copy as soon as the consumers release a stage on its empty barrier (its
 * registers go to the consumers by setmaxnreg); v3 (TSR_CUDA_DW_PRODUCER=0) has warp 0 issue them after a block
 * barrier per stage (a fifth slower); v6 (TSR_CUDA_DW_MULTICAST=1) runs v4 in clusters of two CTAs over
 * neighbouring column tiles that share each activation tile, each CTA loading half of it into both by a multicast
 * copy (v4 measured waiting on its copies, not on its decode, which costs 7 %; v6 halves the L2 reads and is still
 * 7 % slower than v4); v5 (TSR_CUDA_DW_PRODUCER=2) decodes in warps of their own into an fp16 tile in shared
 * memory (slower). Output: y = product + beta · y, fp32 or fp16, columns past N and rows past M left alone. Off
 * by default (TSR_CUDA_DQ_WGMMA=1 turns it on) until it is measured faster than the dequantize pass and cuBLAS: v4
 * reached 26.9k tokens/s of an 8B 2048-token prefill on the H100 against the cuBLAS path's 35.6k. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/exl2_frag.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/wgmma.cuh"

#include <cuda.h> /* CUtensorMap and its encoder's signature only: the encoder is reached through the runtime */
#include <stdlib.h>
#include <string.h>

#define DW_THREADS   256 /* two warpgroups of consumers */
#define DW_PRODUCER  128 /* v4: a third warpgroup, of which one warp issues the copies (TSR_CUDA_DW_PRODUCER=1); its
                          * registers go to the consumers (setmaxnreg) */
#define DW_ROWS      256 /* activation rows per block: the wgmma's N */
#define DW_CBS       4   /* column blocks of 32 per block, one per warp of a warpgroup */
#define DW_STAGES    4   /* stage buffers (TSR_CUDA_DW_STAGES=5: five); v3's copies run two stages ahead */
#define DW_A_BYTES   (DW_ROWS * 128)          /* a stage's activations: 256 rows × 64 halves */
#define DW_W_UNIT    (32 * 8 * 4)             /* one (unit, column block): up to 8 words per lane */
#define DW_W_BYTES   (DW_CBS * 2 * DW_W_UNIT) /* a stage's words */
#define DW_P_UNIT    320 /* a unit's group parameters: 4 × 16 bytes of codes, then the table (EXL2: 64 bytes) or the
                          * block's 128 GPTQ scales */
#define DW_MAX_UNITS 1024 /* unit records kept in shared memory (K up to 32768) */
#define DW5_STAGES   3
#define DW5_AW_BYTES (128 * 128) /* a stage's decoded weights: 128 rows × 64 halves */
#define DW5_THREADS  384         /* consumers (warpgroups 0-1), decoders (warps 8-10), the producer (warp 11) */
#define DW5_DECODERS 3

/* Up to three matrices of one input and unit order (q, k and v) in one launch: part p takes the column tiles from
 * tiles_end[p - 1] to tiles_end[p] of the grid's y. */
struct dw_parts {
    tsr_linear_dev L[TSR_GEMV_MAX_PARTS];
    void *y[TSR_GEMV_MAX_PARTS];
    int tiles_end[TSR_GEMV_MAX_PARTS];
    int n;
};

/* Shared memory: per stage the activation tile (1024-byte aligned, +1 KB to align the start), words, parameters and
 * two barriers (full: the copies landed; empty: the consumers are done with it), then the unit records. */
#define DW_STAGE_BYTES (DW_A_BYTES + DW_W_BYTES + 2 * DW_P_UNIT)
static size_t dw_smem_bytes(int n_units, int stages)
{
    return (size_t)stages * (DW_STAGE_BYTES + 16) + (size_t)n_units * sizeof(uint2) + 1024;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The stage barriers, which count the bytes of the stage's copies. */
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
/* Columns c0.. (K) and rows c1.. (M) of the activations, a 64 × 256 box, into the 128-byte swizzle at dst; rows
 * past M and columns past Kp arrive as zeros. */
__device__ __forceinline__ void dw_tma(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
/* The same box, half of it (128 rows from c1) written at dst in both CTAs of a cluster of two and counted by the
 * barrier at bar's offset in each (v6). */
__device__ __forceinline__ void dw_tma_pair(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "h"((unsigned short)3)
                 : "memory");
}
/* An arrival on the barrier at bar's offset in the other CTA of the cluster of two. */
__device__ __forceinline__ void dw_bar_arrive_peer(uint32_t bar)
{
    uint32_t rank, far;
    asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    asm("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(far) : "r"(bar), "r"(rank ^ 1u));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(far) : "memory");
}
/* Every thread of both CTAs of the cluster. */
__device__ __forceinline__ void dw_cluster_sync(void)
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
/* bytes (a multiple of 16) from global src to shared dst, counted by bar */
__device__ __forceinline__ void dw_bulk(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

/* The lane's A fragments of 16-column tile CT of a unit, scaled: a[ks] for 16-row step ks. */
template <int B, bool GPTQ, int CT>
__device__ __forceinline__ void dw_decode(const uint32_t *slot, int lane, const frag_scales &sc, uint32_t (&a)[2][4])
{
    uint32_t w[B];
    frag_words<B, false>(slot, lane, w); /* the words' copy in shared memory */
    frag_a<B, GPTQ, 2 * CT>(w, sc, a[0]);
    frag_a<B, GPTQ, 2 * CT + 1>(w, sc, a[1]);
    const __half2 h0 = __float2half2_rn(sc.s[2 * CT]), h1 = __float2half2_rn(sc.s[2 * CT + 1]);
#pragma unroll
    for (int ks = 0; ks < 2; ks++)
#pragma unroll
        for (int r = 0; r < 4; r++) a[ks][r] = h2_bits(__hmul2(bits_h2(a[ks][r]), (r & 1) ? h1 : h0));
}

/* Warp 0 (after the block barrier that frees the buffer): stage s's copies, one per lane, and its barrier's count.
 * Lane 0 the activation tile; lanes 1-8 the words of (unit ui = k & 1, column block k >> 1), k = lane - 1; lanes 9-10
 * the units' scale codes, 11-12 their tables (GPTQ: scales). */
template <bool GPTQ, int ST, bool MC = false>
__device__ __forceinline__ void dw_issue(const tsr_linear_dev &L, const CUtensorMap *map, const uint2 *rec, int s,
                                         int n_stages, int m0, int cb0, uint32_t a_base, uint32_t w_base,
                                         uint32_t p_base, uint32_t bars, int lane)
{
    if (s >= n_stages) return;
    const int buf = s % ST, u0 = 2 * s, nu = min(2, L.n_units - u0), ncb = L.Npad / 32;
    const int cbs = min(DW_CBS, ncb - cb0); /* v6: 0 or less in a cluster's padding CTA */
    const uint32_t bar = bars + 8 * buf;
    uint32_t bytes = 0, dst = 0;
    const void *src = NULL;
    if (lane == 0) {
        bytes = DW_A_BYTES;
    } else if (lane <= 8) {
        const int k = lane - 1, ui = k & 1, cbl = k >> 1;
        if (ui < nu && cbl < cbs) {
            const uint2 e = rec[u0 + ui];
            const int bits = (int)(e.y >> 24);
            bytes = 128u * (uint32_t)bits;
            src = L.fw + e.x + (size_t)(cb0 + cbl) * 32 * bits;
            dst = w_base + (uint32_t)(((buf * DW_CBS + cbl) * 2 + ui) * DW_W_UNIT);
        }
    } else if (lane <= 12) {
        const int ui = (lane - 9) & 1;
        if (ui < nu && cbs > 0) {
            const size_t grp = rec[u0 + ui].y & 0xffffffu;
            const uint32_t at = p_base + (uint32_t)((buf * 2 + ui) * DW_P_UNIT);
            if (lane <= 10) {
                bytes = 16u * (uint32_t)cbs;
                src = (GPTQ ? L.g_zeros : L.q_scale) + grp * (L.Npad / 8) + 4 * cb0;
                dst = at;
            } else {
                bytes = GPTQ ? 64u * (uint32_t)cbs : 64u;
                src = GPTQ ? (const void *)(L.g_scales + grp * L.Npad + 32 * cb0) : (const void *)(L.s_table + grp * 16);
                dst = at + 64;
            }
        }
    }
    uint32_t total = bytes;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) dw_bar_expect(bar, total);
    __syncwarp();
    if (lane == 0 && MC) {
        uint32_t rank;
        asm("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
        dw_tma_pair(a_base + buf * DW_A_BYTES + rank * (DW_A_BYTES / 2), map, 64 * s, m0 + (int)rank * (DW_ROWS / 2),
                    bar);
    } else if (lane == 0) {
        dw_tma(a_base + buf * DW_A_BYTES, map, 64 * s, m0, bar);
    } else if (bytes)
        dw_bulk(dst, src, bytes, bar);
}

/* A warp's part of the 64 × 256 accumulator: element 4 j + i is column col + g + 8 (i / 2), row m0 + 8 j + 2 t4 + i % 2
 * (g = lane / 4, t4 = lane % 4); y = it + beta · y, columns past N and rows past M left alone. */
__device__ __forceinline__ void dw_store(const float (&acc)[128], const tsr_linear_dev &L, int M, void *y, float beta,
                                         int y_half, int m0, int col, int lane)
{
    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int n = col + g + 8 * (i >> 1);
        if (n >= L.N) continue;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            const int m = m0 + 8 * j + 2 * t4 + (i & 1);
            if (m >= M) continue;
            const size_t at = (size_t)m * L.N + n;
            float v = acc[4 * j + i];
            if (y_half) {
                __half *yh = (__half *)y;
                if (beta != 0.0f) v = fmaf(beta, __half2float(yh[at]), v);
                yh[at] = __float2half_rn(v);
            } else {
                float *yf = (float *)y;
                yf[at] = beta != 0.0f ? fmaf(beta, yf[at], v) : v;
            }
        }
    }
}

/* v4's producer warp: each stage's copies as soon as the consumers have released its buffer (the empty barrier of
 * stage s - ST completed), up to ST stages ahead of them. */
template <bool GPTQ, int ST, bool MC>
__device__ __forceinline__ void dw_produce(const tsr_linear_dev &L, const CUtensorMap *map, const uint2 *rec, int m0,
                                           int cb0, uint32_t a_base)
{
    const int n_stages = (L.n_units + 1) / 2, lane = threadIdx.x & 31;
    const uint32_t w_base = a_base + ST * DW_A_BYTES, p_base = w_base + ST * DW_W_BYTES;
    const uint32_t bars = p_base + ST * 2 * DW_P_UNIT, empty = bars + 8 * ST;
    for (int s = 0; s < n_stages; s++) {
        if (s >= ST) dw_bar_wait(empty + 8 * (s % ST), (uint32_t)(s / ST - 1) & 1u);
        dw_issue<GPTQ, ST, MC>(L, map, rec, s, n_stages, m0, cb0, a_base, w_base, p_base, bars, lane);
    }
}

/* The block's work for the warps of warpgroup CT (16-column tile CT of each column block). PROD: a producer warp
 * issues the copies and each warp releases a stage on its empty barrier (v4); else warp 0 issues them after a block
 * barrier per stage (v3). */
template <bool GPTQ, int CT, int ST, bool PROD, bool DEC, int W, bool MC>
__device__ __forceinline__ void dw_run(const tsr_linear_dev &L, const CUtensorMap *map, int M, void *y, float beta,
                                       int y_half, unsigned char *smem, uint32_t a_base, const uint2 *rec, int cb0)
{
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, cbl = warp & 3;
    const int m0 = blockIdx.x * DW_ROWS, cb = cb0 + cbl;
    const int n_units = L.n_units, n_stages = (n_units + 1) / 2;
    const bool owns = cb < L.Npad / 32;
    const uint32_t w_base = a_base + ST * DW_A_BYTES, p_base = w_base + ST * DW_W_BYTES;
    const uint32_t bars = p_base + ST * 2 * DW_P_UNIT;
    const uint32_t *w_ring = (const uint32_t *)(smem + ST * DW_A_BYTES);
    const unsigned char *p_ring = smem + ST * (DW_A_BYTES + DW_W_BYTES);

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
    /* A fragments of a stage's first and second unit; with W = 2, odd stages use the second pair */
    uint32_t ax[2][4], ay[2][4], bx[2][4], by[2][4];

    /* unit u (ui of the stage in buffer buf): decode into a, then its two wgmma's */
    auto unit = [&](int buf, int u, int ui, uint32_t (&a)[2][4]) {
        if (!DEC) { /* the diagnostic without decode: ones (wrong results) */
#pragma unroll
            for (int ks = 0; ks < 2; ks++)
#pragma unroll
                for (int r = 0; r < 4; r++) a[ks][r] = 0x3c003c00u;
        } else if (owns) {
            const unsigned char *pp = p_ring + (buf * 2 + ui) * DW_P_UNIT;
            frag_scales sc;
            frag_scales_decode(*(const uint4 *)(pp + 16 * cbl), GPTQ ? (const void *)(pp + 64 + 64 * cbl) : pp + 64,
                               GPTQ, L.zero_add, lane >> 2, sc);
            const uint32_t *slot = w_ring + ((buf * DW_CBS + cbl) * 2 + ui) * (DW_W_UNIT / 4);
            if (GPTQ) {
                dw_decode<4, true, CT>(slot, lane, sc, a);
            } else {
                frag_with_width((int)(rec[u].y >> 24), [&](auto wb) {
                    constexpr int B = decltype(wb)::value;
                    dw_decode<B, false, CT>(slot, lane, sc, a);
                });
            }
        } else {
#pragma unroll
            for (int ks = 0; ks < 2; ks++)
#pragma unroll
                for (int r = 0; r < 4; r++) a[ks][r] = 0u;
        }
        const uint32_t at = a_base + buf * DW_A_BYTES + ui * 64;
        wg_arrive();
        wg_mma_rs256k(acc, a[0], wg_desc(at, 0));
        wg_mma_rs256k(acc, a[1], wg_desc(at + 32, 0));
        wg_commit();
        wg_wait<W>();
    };

    if (!PROD && warp == 0)
        for (int s = 0; s < ST - 2; s++)
            dw_issue<GPTQ, ST>(L, map, rec, s, n_stages, m0, cb0, a_base, w_base, p_base, bars, lane);
    /* the release of stage s's buffer to the producer: every wgmma that reads it has finished */
    auto release = [&](int s) {
        __syncwarp();
        if (lane == 0) dw_bar_arrive(bars + 8 * (ST + s % ST));
        if (MC && lane == 0) dw_bar_arrive_peer(bars + 8 * (ST + s % ST)); /* the peer's copies write here too */
    };
    auto stage = [&](int s, uint32_t (&x)[2][4], uint32_t (&y)[2][4]) {
        if (!PROD) {
            /* every wgmma of stage s - 1's first unit and before has finished: stage s - 2's buffer is free */
            __syncthreads();
            if (warp == 0)
                dw_issue<GPTQ, ST>(L, map, rec, s + ST - 2, n_stages, m0, cb0, a_base, w_base, p_base, bars, lane);
        }
        const int buf = s % ST, u0 = 2 * s;
        dw_bar_wait(bars + 8 * buf, (uint32_t)(s / ST) & 1u);
        unit(buf, u0, 0, x);
        if (PROD && W == 1 && s > 0) release(s - 1); /* the wait left only unit u0's pair in flight */
        if (u0 + 1 < n_units) {
            unit(buf, u0 + 1, 1, y);
            if (PROD && W == 2 && s > 0) release(s - 1); /* the wait left only this stage's pairs in flight */
        }
    };
    for (int s = 0; s < n_stages; s += 2) {
        stage(s, ax, ay);
        if (s + 1 < n_stages) {
            if (W == 1)
                stage(s + 1, ax, ay);
            else
                stage(s + 1, bx, by);
        }
    }
    wg_wait<0>();
    wg_keep(acc);
    if (!owns) return;

    dw_store(acc, L, M, y, beta, y_half, m0, 32 * cb + 16 * CT, lane);
}

/* v5 (TSR_CUDA_DW_PRODUCER=2): the weights decoded by three warps of their own into an fp16 tile in shared memory,
 * and both operands of the consumers' wgmma's read from shared memory. A stage holds, besides v4's buffers, the A
 * tile of its 64 K rows × 128 columns (K-major, 128-byte swizzle: A row 32 cbl + 16 ct + r is column 32 (cb0 + cbl)
 * + 16 ct + r). Barriers per stage: full (the copies), decoded (the 3 decoder warps), empty (8 consumer + 3 decoder
 * warps). (A fourth decoder warp and the producer in a warpgroup of their own would cap the consumers at 128
 * registers, too few for the accumulator.) */

/* Four 8 × 8 fp16 matrices from the mma A-fragment registers r[0..3] of a 16 × 16 tile at A rows r0.., K halves
 * k0.. of a 128-byte-swizzled K-major tile at `tile` (lane l gives row l % 8 of matrix l / 8). */
__device__ __forceinline__ void dw_stmatrix(uint32_t tile, int r0, int k0, int lane, const uint32_t (&r)[4])
{
    const int i = lane >> 3, row = r0 + (lane & 7) + 8 * (i & 1), chunk = (k0 >> 3) + (i >> 1);
    const uint32_t at = tile + (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "r"(r[0]), "r"(r[1]),
                 "r"(r[2]), "r"(r[3])
                 : "memory");
}

/* Decoder warp d: pieces d, d + 3, ... of the 8 (unit ui = piece % 2, column block cb0 + piece / 2) of each stage,
 * into the stage's A tile. */
template <bool GPTQ>
__device__ __forceinline__ void dw5_decode(const tsr_linear_dev &L, const unsigned char *smem, uint32_t a_base,
                                           const uint2 *rec, int cb0, int d, int lane)
{
    constexpr int ST = DW5_STAGES;
    const int n_units = L.n_units, n_stages = (n_units + 1) / 2, cbs = min(DW_CBS, L.Npad / 32 - cb0);
    const uint32_t aw_base = a_base + ST * DW_A_BYTES, w_off = ST * (DW_A_BYTES + DW5_AW_BYTES);
    const uint32_t bars = a_base + w_off + ST * (DW_W_BYTES + 2 * DW_P_UNIT);
    const uint32_t *w_ring = (const uint32_t *)(smem + w_off);
    const unsigned char *p_ring = smem + w_off + ST * DW_W_BYTES;
    for (int s = 0; s < n_stages; s++) {
        const int buf = s % ST, u0 = 2 * s;
        dw_bar_wait(bars + 8 * buf, (uint32_t)(s / ST) & 1u);
        for (int piece = d; piece < 2 * DW_CBS; piece += DW5_DECODERS) {
            const int ui = piece & 1, cbl = piece >> 1;
            if (u0 + ui >= n_units || cbl >= cbs) continue;
            const unsigned char *pp = p_ring + (buf * 2 + ui) * DW_P_UNIT;
            frag_scales sc;
            frag_scales_decode(*(const uint4 *)(pp + 16 * cbl), GPTQ ? (const void *)(pp + 64 + 64 * cbl) : pp + 64,
                               GPTQ, L.zero_add, lane >> 2, sc);
            const uint32_t *slot = w_ring + ((buf * DW_CBS + cbl) * 2 + ui) * (DW_W_UNIT / 4);
            const uint32_t tile = aw_base + buf * DW5_AW_BYTES;
            auto put = [&](auto wb) {
                constexpr int B = decltype(wb)::value;
                uint32_t a[2][4];
                dw_decode<B, GPTQ, 0>(slot, lane, sc, a);
                dw_stmatrix(tile, 32 * cbl, 32 * ui, lane, a[0]);
                dw_stmatrix(tile, 32 * cbl, 32 * ui + 16, lane, a[1]);
                dw_decode<B, GPTQ, 1>(slot, lane, sc, a);
                dw_stmatrix(tile, 32 * cbl + 16, 32 * ui, lane, a[0]);
                dw_stmatrix(tile, 32 * cbl + 16, 32 * ui + 16, lane, a[1]);
            };
            if (GPTQ)
                put(std::integral_constant<int, 4>{});
            else
                frag_with_width((int)(rec[u0 + ui].y >> 24), put);
        }
        wg_fence_smem(); /* the tile's generic-proxy writes, visible to the wgmma's reads */
        __syncwarp();
        if (lane == 0) {
            dw_bar_arrive(bars + 8 * (ST + buf));     /* decoded */
            dw_bar_arrive(bars + 8 * (2 * ST + buf)); /* empty: the words and parameters are read */
        }
    }
}

/* Consumer warpgroup wg: A rows 64 wg.. (column blocks cb0 + 2 wg, + 1) × the block's 256 activation rows. */
__device__ __forceinline__ void dw5_consume(const tsr_linear_dev &L, int M, void *y, float beta, int y_half,
                                            uint32_t a_base, int cb0, int wg)
{
    constexpr int ST = DW5_STAGES;
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, m0 = blockIdx.x * DW_ROWS;
    const int n_units = L.n_units, n_stages = (n_units + 1) / 2;
    const uint32_t aw_base = a_base + ST * DW_A_BYTES;
    const uint32_t bars = a_base + ST * (DW_A_BYTES + DW5_AW_BYTES + DW_W_BYTES + 2 * DW_P_UNIT);
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
    for (int s = 0; s < n_stages; s++) {
        const int buf = s % ST, ks = 2 * min(2, n_units - 2 * s);
        dw_bar_wait(bars + 8 * (ST + buf), (uint32_t)(s / ST) & 1u);
        const uint32_t at = a_base + buf * DW_A_BYTES, aw = aw_base + buf * DW5_AW_BYTES + wg * 64 * 128;
        wg_arrive();
        wg_mma_ss256k(acc, wg_desc(aw, 0), wg_desc(at, 0));
        wg_mma_ss256k(acc, wg_desc(aw + 32, 0), wg_desc(at + 32, 0));
        if (ks == 4) {
            wg_mma_ss256k(acc, wg_desc(aw + 64, 0), wg_desc(at + 64, 0));
            wg_mma_ss256k(acc, wg_desc(aw + 96, 0), wg_desc(at + 96, 0));
        }
        wg_commit();
        wg_wait<1>();
        if (s > 0) { /* only stage s's wgmma's are in flight: stage s - 1 is read */
            __syncwarp();
            if (lane == 0) dw_bar_arrive(bars + 8 * (2 * ST + (s - 1) % ST));
        }
    }
    wg_wait<0>();
    wg_keep(acc);
    const int cb = cb0 + 2 * wg + (warp >> 1);
    if (cb < L.Npad / 32) dw_store(acc, L, M, y, beta, y_half, m0, 32 * cb + 16 * (warp & 1), lane);
}
#endif

template <bool GPTQ, int ST, bool PROD, bool DEC, int W, bool MC>
__global__ void __launch_bounds__(DW_THREADS + (PROD ? DW_PRODUCER : 0), 1)
    dq_wgmma_kernel(const __grid_constant__ dw_parts P, const __grid_constant__ CUtensorMap xmap, int M, float beta,
                    int y_half)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char dw_smem[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(dw_smem), pad = (1024 - (raw & 1023)) & 1023;
    unsigned char *smem = dw_smem + pad; /* [stage][A], [stage][column block][unit][words], [stage][unit][P],
                                          * barriers, records */
    const uint32_t a_base = raw + pad, bars = a_base + ST * DW_STAGE_BYTES;
    uint2 *rec = (uint2 *)(smem + ST * (DW_STAGE_BYTES + 16));
    int p = 0;
    while (p + 1 < P.n && (int)blockIdx.y >= P.tiles_end[p]) p++;
    const tsr_linear_dev &L = P.L[p];
    const int cb0 = ((int)blockIdx.y - (p ? P.tiles_end[p - 1] : 0)) * DW_CBS;
    for (int u = threadIdx.x; u < L.n_units; u += blockDim.x) rec[u] = L.units[u];
    if (threadIdx.x == 0) {
        for (int b = 0; b < ST; b++) {
            dw_bar_init(bars + 8 * b, 1);                       /* full: warp 0's or the producer's arrival */
            dw_bar_init(bars + 8 * (ST + b), (MC ? 2 : 1) * DW_THREADS / 32); /* empty: each consumer warp's */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    if (MC)
        dw_cluster_sync(); /* the peer's barriers are ready before its copies or arrivals reach them */
    else
        __syncthreads();
    if (PROD && threadIdx.x >= DW_THREADS) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x < DW_THREADS + 32)
            dw_produce<GPTQ, ST, MC>(L, &xmap, rec, (int)blockIdx.x * DW_ROWS, cb0, a_base);
        if (MC) dw_cluster_sync(); /* no CTA leaves while the other may still arrive on its barriers */
        return;
    }
    if (PROD) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    if (threadIdx.x < 128)
        dw_run<GPTQ, 0, ST, PROD, DEC, W, MC>(L, &xmap, M, P.y[p], beta, y_half, smem, a_base, rec, cb0);
    else
        dw_run<GPTQ, 1, ST, PROD, DEC, W, MC>(L, &xmap, M, P.y[p], beta, y_half, smem, a_base, rec, cb0);
    if (MC) dw_cluster_sync();
#endif
}

/* v5's kernel: shared memory [stage][activations], [stage][A tile], [stage][column block][unit][words],
 * [stage][unit][P], barriers (full, decoded, empty), records. */
static size_t dw5_smem_bytes(int n_units)
{
    return (size_t)DW5_STAGES * (DW_A_BYTES + DW5_AW_BYTES + DW_W_BYTES + 2 * DW_P_UNIT + 24) +
           (size_t)n_units * sizeof(uint2) + 1024;
}

template <bool GPTQ>
__global__ void __launch_bounds__(DW5_THREADS, 1)
    dq_wgmma5_kernel(const __grid_constant__ dw_parts P, const __grid_constant__ CUtensorMap xmap, int M, float beta,
                     int y_half)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int ST = DW5_STAGES;
    extern __shared__ __align__(1024) unsigned char dw_smem[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(dw_smem), pad = (1024 - (raw & 1023)) & 1023;
    unsigned char *smem = dw_smem + pad;
    const uint32_t a_base = raw + pad, stage_bytes = DW_A_BYTES + DW5_AW_BYTES + DW_W_BYTES + 2 * DW_P_UNIT;
    const uint32_t bars = a_base + ST * stage_bytes;
    uint2 *rec = (uint2 *)(smem + ST * (stage_bytes + 24));
    int p = 0;
    while (p + 1 < P.n && (int)blockIdx.y >= P.tiles_end[p]) p++;
    const tsr_linear_dev &L = P.L[p];
    const int cb0 = ((int)blockIdx.y - (p ? P.tiles_end[p - 1] : 0)) * DW_CBS, warp = threadIdx.x >> 5;
    for (int u = threadIdx.x; u < L.n_units; u += blockDim.x) rec[u] = L.units[u];
    if (threadIdx.x == 0) {
        for (int b = 0; b < ST; b++) {
            dw_bar_init(bars + 8 * b, 1);                 /* full: the producer's arrival and the copies' bytes */
            dw_bar_init(bars + 8 * (ST + b), DW5_DECODERS);         /* decoded: the decoder warps */
            dw_bar_init(bars + 8 * (2 * ST + b), 8 + DW5_DECODERS); /* empty: the consumer and decoder warps */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (warp == 8 + DW5_DECODERS) { /* the producer: stage s once its buffer's stage s - ST is released */
        const int n_stages = (L.n_units + 1) / 2, lane = threadIdx.x & 31;
        const uint32_t w_base = a_base + ST * (DW_A_BYTES + DW5_AW_BYTES), p_base = w_base + ST * DW_W_BYTES;
        for (int s = 0; s < n_stages; s++) {
            if (s >= ST) dw_bar_wait(bars + 8 * (2 * ST + s % ST), (uint32_t)(s / ST - 1) & 1u);
            dw_issue<GPTQ, ST>(L, &xmap, rec, s, n_stages, (int)blockIdx.x * DW_ROWS, cb0, a_base, w_base, p_base, bars,
                               lane);
        }
    } else if (warp >= 8) {
        dw5_decode<GPTQ>(L, smem, a_base, rec, cb0, warp - 8, threadIdx.x & 31);
    } else {
        dw5_consume(L, M, P.y[p], beta, y_half, a_base, cb0, warp >> 2);
    }
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

/* The kernel's variant, from the environment: TSR_CUDA_DW_PRODUCER (0: v3, 1: v4, a producer warp; 2: v5,
 * a decoding warpgroup), TSR_CUDA_DW_STAGES
 * (4 or 5, v4 only), TSR_CUDA_DW_DEPTH (v4: 1 or 2 pairs of wgmma's left in flight after each) and
 * TSR_CUDA_DW_NODECODE=1 (a diagnostic with wrong results: the weights' decode left out). */
static int dw_env(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
}
enum dw_kind { DW_V3, DW_V4, DW_V4_STAGES5, DW_V4_NODECODE, DW_V4_DEPTH2, DW_V4_STAGES5_DEPTH2, DW_V5, DW_V6 };
static dw_kind dw_variant(void)
{
    const bool five = dw_env("TSR_CUDA_DW_STAGES", DW_STAGES) == 5, deep = dw_env("TSR_CUDA_DW_DEPTH", 1) == 2;
    static const dw_kind v = dw_env("TSR_CUDA_DW_PRODUCER", 1) == 2 ? DW_V5
                             : !dw_env("TSR_CUDA_DW_PRODUCER", 1) ? DW_V3
                             : dw_env("TSR_CUDA_DW_NODECODE", 0)  ? DW_V4_NODECODE
                             : dw_env("TSR_CUDA_DW_MULTICAST", 0) ? DW_V6
                             : deep                               ? (five ? DW_V4_STAGES5_DEPTH2 : DW_V4_DEPTH2)
                                                                  : (five ? DW_V4_STAGES5 : DW_V4);
    return v;
}

/* Whether the kernel runs where it can: TSR_CUDA_DQ_WGMMA=1 or 0, else DW_DEFAULT (the dequantize pass and cuBLAS
 * where it does not). */
#define DW_DEFAULT 0
static bool dw_enabled(void)
{
    static const bool on = getenv("TSR_CUDA_DQ_WGMMA") ? atoi(getenv("TSR_CUDA_DQ_WGMMA")) != 0 : DW_DEFAULT;
    const dw_kind v = dw_variant();
    const size_t most = v == DW_V5 ? dw5_smem_bytes(DW_MAX_UNITS)
                                   : dw_smem_bytes(DW_MAX_UNITS, v == DW_V4_STAGES5 || v == DW_V4_STAGES5_DEPTH2 ? 5 : 4);
    return on && tsr_cuda_wgmma_code() && dw_encoder() && most <= (size_t)tsr_cuda_smem_block();
}

bool tsr_cuda_dq_wgmma_takes(const tsr_linear_dev *L)
{
    return L->kind == TSR_LINEAR_EXL2 && L->n_units <= DW_MAX_UNITS && dw_enabled();
}

template <bool GPTQ, int ST, bool PROD, bool DEC, int W = 1, bool MC = false>
static void dw_launch(const dw_parts &parts, const CUtensorMap &map, int M, int n_units, float beta, bool y_half)
{
    void (*kernel)(dw_parts, CUtensorMap, int, float, int) = dq_wgmma_kernel<GPTQ, ST, PROD, DEC, W, MC>;
    static bool configured = false;
    if (!configured) {
        tsr_cuda_allow_smem((const void *)kernel, dw_smem_bytes(DW_MAX_UNITS, ST), "the EXL2/GPTQ wgmma product");
        configured = true;
    }
    const unsigned tiles = (unsigned)parts.tiles_end[parts.n - 1];
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)tsr_div_up((size_t)M, DW_ROWS), MC ? (tiles + 1) & ~1u : tiles);
    cfg.blockDim = dim3(DW_THREADS + (PROD ? DW_PRODUCER : 0));
    cfg.dynamicSmemBytes = dw_smem_bytes(n_units, ST);
    cfg.stream = tsr_cuda_stream();
    cudaLaunchAttribute pair; /* v6: neighbouring column tiles share their activation tiles */
    pair.id = cudaLaunchAttributeClusterDimension;
    pair.val.clusterDim.x = 1, pair.val.clusterDim.y = 2, pair.val.clusterDim.z = 1;
    cfg.attrs = &pair;
    cfg.numAttrs = MC ? 1 : 0;
    TSR_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, parts, map, M, beta, (int)y_half));
    TSR_CUDA_LAUNCHED();
}

template <bool GPTQ>
static void dw5_launch(const dw_parts &parts, const CUtensorMap &map, int M, int n_units, float beta, bool y_half)
{
    static bool configured = false;
    if (!configured) {
        tsr_cuda_allow_smem((const void *)dq_wgmma5_kernel<GPTQ>, dw5_smem_bytes(DW_MAX_UNITS),
                            "the EXL2/GPTQ wgmma product");
        configured = true;
    }
    const dim3 grid(tsr_div_up((size_t)M, DW_ROWS), (unsigned)parts.tiles_end[parts.n - 1]);
    dq_wgmma5_kernel<GPTQ>
        <<<grid, DW5_THREADS, dw5_smem_bytes(n_units), tsr_cuda_stream()>>>(parts, map, M, beta, y_half);
    TSR_CUDA_LAUNCHED();
}

template <bool GPTQ>
static void dw_launch_variant(const dw_parts &parts, const CUtensorMap &map, int M, int n_units, float beta,
                              bool y_half)
{
    switch (dw_variant()) {
    case DW_V3: dw_launch<GPTQ, 4, false, true>(parts, map, M, n_units, beta, y_half); break;
    case DW_V4: dw_launch<GPTQ, 4, true, true>(parts, map, M, n_units, beta, y_half); break;
    case DW_V4_STAGES5: dw_launch<GPTQ, 5, true, true>(parts, map, M, n_units, beta, y_half); break;
    case DW_V4_NODECODE: dw_launch<GPTQ, 4, true, false>(parts, map, M, n_units, beta, y_half); break;
    case DW_V4_DEPTH2: dw_launch<GPTQ, 4, true, true, 2>(parts, map, M, n_units, beta, y_half); break;
    case DW_V4_STAGES5_DEPTH2: dw_launch<GPTQ, 5, true, true, 2>(parts, map, M, n_units, beta, y_half); break;
    case DW_V5: dw5_launch<GPTQ>(parts, map, M, n_units, beta, y_half); break;
    case DW_V6: dw_launch<GPTQ, 4, true, true, 1, true>(parts, map, M, n_units, beta, y_half); break;
    }
}

int tsr_cuda_dq_wgmma(const tsr_linear_dev *const *L, int n, const __half *xp, int M, void *const *y, float beta,
                      bool y_half)
{
    if (M <= 0 || n < 1 || n > TSR_GEMV_MAX_PARTS) return 0;
    dw_parts parts;
    memset(&parts, 0, sizeof parts);
    for (int i = 0; i < n; i++) {
        if (!tsr_cuda_dq_wgmma_takes(L[i]) || L[i]->n_units != L[0]->n_units || L[i]->gptq != L[0]->gptq) return 0;
        parts.L[i] = *L[i];
        parts.y[i] = y[i];
        parts.tiles_end[i] = (i ? parts.tiles_end[i - 1] : 0) + (int)tsr_div_up((size_t)L[i]->Npad / 32, DW_CBS);
    }
    parts.n = n;
    /* xp as a 2D tensor of M rows of Kp halves, read in boxes of 256 rows × 64 halves in the 128-byte swizzle */
    const cuuint64_t dims[2] = {(cuuint64_t)32 * L[0]->n_units, (cuuint64_t)M};
    const cuuint64_t strides[1] = {(cuuint64_t)64 * L[0]->n_units};
    const cuuint32_t box[2] = {64, dw_variant() == DW_V6 ? DW_ROWS / 2u : DW_ROWS}, step[2] = {1, 1};
    CUtensorMap map;
    if (dw_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)xp, dims, strides, box, step,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) /* a planning bug: the inputs are aligned */
        tsr_cuda_fatal(__FILE__, __LINE__, "cuTensorMapEncodeTiled refused the activations of the wgmma product");
    if (L[0]->gptq)
        dw_launch_variant<true>(parts, map, M, L[0]->n_units, beta, y_half);
    else
        dw_launch_variant<false>(parts, map, M, L[0]->n_units, beta, y_half);
    return 1;
}
