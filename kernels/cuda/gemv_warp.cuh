/* The per-warp machinery of the fragment-layout GEMV (gemv.cu's frag_gemv_kernel, and the fused decode MLP of
 * mlp_decode.cu): a warp streams the units of its two column blocks through a ring of cp.async steps in shared
 * memory, decodes each unit's codes into the A operands of mma.m16n8k16 and multiplies them with staged B operands
 * (the activations, in the order fg_hi_lo and the staging kernels write). Everything here is inline device code;
 * the kernels own their shared memory and say where each warp's ring, unit records and scale scratch lie (fg_warp). */
#ifndef TSR_CUDA_GEMV_WARP_CUH
#define TSR_CUDA_GEMV_WARP_CUH

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/exl2_frag.cuh"
#include "kernels/cuda/stage_ahead.cuh"

#include <stdint.h>

#define FG_WARP_UNITS  64 /* unit records per warp, copied to shared memory */
#define FG_SCALE_WORDS 64 /* per warp: the EXL2 column scales of a group change, exchanged by the lanes of a quad */

/* The per-warp ring of weight steps in shared memory (cp.async). A step is NU units of one width (two of at most
 * 4 bits, else one) for the warp's two column blocks, followed by one header entry per unit with its group's
 * scale data. FG_RING - 1 steps are in flight while the warp decodes the oldest. The loop is compiled once per
 * width and runs over a run of equal-width units (the converter orders groups by width, so a warp sees 2-3
 * runs); the ring drains at the end of a run. */
#define FG_RING       4
#define FG_SLOT_WORDS 512 /* 2 units × 2 column blocks × 32 lanes × 4 words, or 1 × 2 × 32 × 8 */
#define FG_HDR_WORDS                                                                                                   \
    40 /* per unit: codes (2 × 4 words), then EXL2's 16-entry scale table (16 fp32 words) or                          \
        * GPTQ's fp16 scales (2 × 16 words) */
#define FG_STEP_WORDS (FG_SLOT_WORDS + 2 * FG_HDR_WORDS)

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* tot += S · acc for the 4 tiles (2 column blocks × 2 column tiles) of a warp and each of its NT token tiles at
 * the end of a group; ONE: only token 0 (C column 0) is live. */
template <bool ONE, int NT>
__device__ __forceinline__ void fg_flush(float (&acc)[NT][4][4], float (&tot)[NT][4][4], const frag_scales (&sc)[2])
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const float s0 = sc[t >> 1].s[2 * (t & 1)], s1 = sc[t >> 1].s[2 * (t & 1) + 1];
            tot[nt][t][0] = fmaf(s0, acc[nt][t][0], tot[nt][t][0]);
            tot[nt][t][2] = fmaf(s1, acc[nt][t][2], tot[nt][t][2]);
            if (!ONE) {
                tot[nt][t][1] = fmaf(s0, acc[nt][t][1], tot[nt][t][1]);
                tot[nt][t][3] = fmaf(s1, acc[nt][t][3], tot[nt][t][3]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[nt][t][i] = 0.0f;
        }
}

/* Both accumulator sets of a warp at zero, before its first unit. */
template <int NT> __device__ __forceinline__ void fg_zero(float (&acc)[NT][4][4], float (&tot)[NT][4][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[nt][t][i] = tot[nt][t][i] = 0.0f;
}

/* With hi and lo in one mma (fg_bop's PK), token n's two sums sit in C columns n and n + 4, two lanes apart: their
 * total goes to the lane of column n (lane % 4 < 2; the other lanes' columns are past the rows). */
template <bool ONE> __device__ __forceinline__ void fg_unpack(float (&tot)[4][4])
{
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (!ONE || !(i & 1)) tot[t][i] += __shfl_xor_sync(0xffffffffu, tot[t][i], 2);
}

/* A warp's totals (its 2 column blocks × 2 column tiles, token tiles T0 .. T0 + TN - 1 of NT) into
 * red[token - 8 T0][column], rows ld floats apart, the warp's first column at col0: lane and fragment index give
 * token 8 nt + 2 (lane % 4) + i % 2 and column 32 (t / 2) + 16 (t % 2) + lane / 4 + 8 (i / 2) of mma.m16n8k16's C
 * layout; tokens past M are skipped (ONE: only token 0's even entries are live). */
template <bool ONE, int NT, int T0 = 0, int TN = NT>
__device__ __forceinline__ void fg_totals_to_smem(const float (&tot)[NT][4][4], float *red, int ld, int col0, int M,
                                                  int lane)
{
    const int g = lane >> 2;
#pragma unroll
    for (int nt = T0; nt < T0 + TN; nt++)
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int m = 8 * nt + 2 * (lane & 3) + (i & 1);
                const int c = col0 + 32 * (t >> 1) + 16 * (t & 1) + g + 8 * (i >> 1);
                if ((!ONE || !(i & 1)) && m < M) red[(m - 8 * T0) * ld + c] = tot[nt][t][i];
            }
}

/* Where a lane reads its B operands (fg_bop) in the block's staged activations. */
struct fg_bsrc {
    const uint2 *p; /* one token tile: the lane's entry of 16-row step 0; more: the staged activations */
    int step;       /* one token tile: 8-byte words from one 16-row step's entry to the next */
};

/* With one token tile the lane's entry is fixed up to the 16-row step, so it is computed once per warp; the lanes
 * of B-columns past the rows read the last row's entry instead (their C columns are never stored). */
template <int NT, bool PK, bool HALF = false>
__device__ __forceinline__ fg_bsrc fg_bsrc_of(const void *stage, int M, int lane)
{
    fg_bsrc b;
    b.p = (const uint2 *)stage;
    b.step = 0;
    if (NT == 1 && HALF) { /* pre-staged fp16 entries of 8 bytes (fg_prestage_kernel) */
        b.p += min(lane >> 2, M - 1) * 4 + (lane & 3);
        b.step = M * 4;
    } else if (NT == 1) {
        const int tok = min(PK ? (lane >> 2) & 3 : lane >> 2, M - 1);
        b.p += (tok * 4 + (lane & 3)) * 2 + (PK ? lane >> 4 : 0);
        b.step = M * 8;
    }
    return b;
}

/* Everything a warp's run loop needs besides the accumulators. Each lane copies at most one 16-byte piece of a
 * unit's header: from hsrc + group · hstride to word hdst of the entry (when hon). */
struct fg_warp {
    const uint2 *meta; /* the warp's unit records in shared memory (index: unit - wa) */
    uint32_t *ring;
    float *scratch; /* FG_SCALE_WORDS */
    fg_bsrc bs;     /* the lane's view of the block's staged activations (fg_bsrc_of) */
    const uint32_t *fw;
    uint64_t hsrc;    /* an address (see fg_span) */
    uint32_t hstride; /* bytes per group (group offsets stay far below 4 GiB: groups × Npad × 2 bytes at most) */
    int hdst;
    bool hon;
    int wa, u0, M, lane, cb0, ncb;
    int src_cb[2]; /* the column block whose header each half of the ring copies: cb0 + c, or a live one when
                    * cb0 + c is past the matrix (its results are never written), so the copies need no
                    * predicate */
    int wcb;       /* the first of the two column blocks whose weights the ring copies: cb0, or the last one
                    * when cb0 is past the matrix (the second may be one past: FRAG_PAD_WORDS) */
};

/* A run of equal-width units [ra, ra + n) of a warp as its copies see it. w: the lane's first 16 bytes of column
 * block wcb in a unit of this width that started at word 0 (a unit's record holds its first word); meta: ra's
 * record in the warp's copy. */
struct fg_span {
    uint64_t w; /* an address: pointer arithmetic made ptxas keep a base and a 64-bit index, 3 more per copy */
    const uint2 *meta;
    int n;
};

template <int B> __device__ __forceinline__ fg_span fg_span_of(const fg_warp &W, int ra, int rb)
{
    fg_span R;
    R.meta = W.meta + (ra - W.wa);
    R.n = rb - ra;
    R.w = (uint64_t)(W.fw + W.wcb * 32 * B + W.lane * 4);
    return R;
}

/* The header piece lane `lane` copies (see fg_warp and FG_HDR_WORDS). */
__device__ __forceinline__ void fg_header_role(const tsr_linear_dev &L, fg_warp &W)
{
    const int lane = W.lane;
    W.hon = false;
    W.hsrc = 0;
    W.hstride = 0;
    W.hdst = 0;
    if (lane < 2) { /* scale codes (EXL2) or zero codes (GPTQ) of column block cb0 + lane */
        W.hon = true;
        W.hsrc = (uint64_t)((L.gptq ? L.g_zeros : L.q_scale) + 4 * (lane == 0 ? W.src_cb[0] : W.src_cb[1]));
        W.hstride = (uint32_t)(L.Npad / 8) * 4;
        W.hdst = 4 * lane;
    } else if (!L.gptq && lane < 6) { /* the group's 16-entry scale table (fp32), four quarters */
        W.hon = true;
        W.hsrc = (uint64_t)(L.s_table + 4 * (lane - 2));
        W.hstride = 16 * sizeof(float);
        W.hdst = 8 + 4 * (lane - 2);
    } else if (L.gptq && lane >= 8 && lane < 16) { /* 4 × 16 bytes of fp16 scales per column block */
        const int c = (lane - 8) >> 2, q = (lane - 8) & 3;
        W.hon = true;
        W.hsrc = (uint64_t)(L.g_scales + 32 * (c == 0 ? W.src_cb[0] : W.src_cb[1]) + 8 * q);
        W.hstride = (uint32_t)L.Npad * sizeof(__half);
        W.hdst = 8 + 16 * c + 4 * q;
    }
}

/* Copies step `st` of the run R into ring slot `si`: NU units, the last one again where the run ends first (the
 * decode skips it), so that the copies need no branch. The two column blocks of a unit are one contiguous piece. */
template <int B> __device__ __forceinline__ void fg_issue(const fg_warp &W, const fg_span &R, int st, int si)
{
    constexpr int NU = B <= 4 ? 2 : 1, piece = 32 * B /* words per (unit, column block) */;
    uint32_t *slot = W.ring + si * FG_STEP_WORDS;
#pragma unroll
    for (int uu = 0; uu < NU; uu++) {
        const int j = NU == 1 ? st : min(st * NU + uu, R.n - 1);
        const uint2 m = R.meta[j];
        const uint32_t *src = (const uint32_t *)(R.w + (uint64_t)m.x * 4u);
        uint32_t *dst = slot + uu * 2 * piece + W.lane * 4;
#pragma unroll
        for (int k = 0; k < (2 * piece + 127) / 128; k++)
            if (k * 128 + W.lane * 4 < 2 * piece) cp_async16(dst + k * 128, src + k * 128);
        if (W.hon)
            cp_async16(slot + FG_SLOT_WORDS + uu * FG_HDR_WORDS + W.hdst,
                       (const void *)(W.hsrc + (uint64_t)(m.y & 0xffffffu) * W.hstride));
    }
}

/* tab[i] of a table in shared memory, one address instruction (mad) where indexing through the generic pointer
 * took two. */
__device__ __forceinline__ float fg_lds_f32(const float *tab, int i)
{
    float v;
    asm volatile("{\n\t.reg .u32 a;\n\tmad.lo.u32 a, %1, 4, %2;\n\tld.shared.f32 %0, [a];\n\t}\n"
                 : "=f"(v)
                 : "r"(i), "r"((unsigned)__cvta_generic_to_shared(tab)));
    return v;
}

/* The EXL2 column scales of a lane's two column blocks (codes: their 2 × 4 code words; tab: the group's fp32
 * table), decoded once per quad: the four lanes of a quad own the same eight columns, so each looks up two (word
 * q of each block) and the quad swaps them through the warp's scratch (FG_SCALE_WORDS). 14 instructions instead of
 * 34 for eight lookups per lane. */
__device__ __forceinline__ void fg_exl2_scales(const uint32_t *codes, const float *tab, float *scratch, int lane,
                                               frag_scales (&sc)[2])
{
    const int g = lane >> 2, q = lane & 3;
    const float s0 = fg_lds_f32(tab, (int)((codes[q] >> (4 * g)) & 0xfu));
    const float s1 = fg_lds_f32(tab, (int)((codes[4 + q] >> (4 * g)) & 0xfu));
    __syncwarp(); /* the previous exchange has been read */
    *(float2 *)(scratch + 8 * g + 2 * q) = make_float2(s0, s1);
    __syncwarp();
    const float4 a = *(const float4 *)(scratch + 8 * g), b = *(const float4 *)(scratch + 8 * g + 4);
    sc[0].s[0] = a.x, sc[1].s[0] = a.y, sc[0].s[1] = a.z, sc[1].s[1] = a.w;
    sc[0].s[2] = b.x, sc[1].s[2] = b.y, sc[0].s[3] = b.z, sc[1].s[3] = b.w;
#pragma unroll
    for (int c = 0; c < 2; c++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            sc[c].zc[j][0] = sc[c].zc[j][1] = __float2half2_rn(0.0f);
}

/* Scales and zero points of a group from its header entry (decoded as frag_group_params does). */
template <int B, bool GPTQ>
__device__ __forceinline__ void fg_group_from_hdr(const uint32_t *hdr, int zero_add, float *scratch, int lane,
                                                  frag_scales (&sc)[2])
{
    if constexpr (!GPTQ) {
        fg_exl2_scales(hdr, (const float *)(hdr + 8), scratch, lane, sc);
    } else {
#pragma unroll
        for (int c = 0; c < 2; c++)
            frag_scales_decode(*(const uint4 *)(hdr + 4 * c), hdr + 8 + 16 * c, true, zero_add, lane >> 2, sc[c]);
    }
}

/* FOLD: the A operand of column tile ct times its columns' scales (rows g and g + 8: sc.h[2 ct], sc.h[2 ct + 1]),
 * one HMUL2 per register, rounded once to fp16 as the dequantize path's weights are. */
__device__ __forceinline__ void fg_fold(uint32_t (&a)[4], const frag_scales &sc, int ct)
{
#pragma unroll
    for (int r = 0; r < 4; r++)
        a[r] = h2_bits(__hmul2(bits_h2(a[r]), sc.h[2 * ct + (r & 1)]));
}

/* One 16-row step KS of a unit: the four tiles' A operands (column block c, column tile ct: tile 2 c + ct,
 * fragment 2 ct + KS), then their mma's per token tile, interleaved across tiles so that no two adjacent mma's
 * share an accumulator. bf: the staged B operands of each token tile (hi, hi, lo, lo); with one token tile the lo
 * halves make the products exact (a second mma per tile, unless PK: fg_bop), with more the activations are fp16
 * (as on the cuBLAS path). FOLD: the operands carry the group's scales (fg_fold), so the sums need none. */
template <int B, bool GPTQ, int KS, int NT, bool PK, bool FOLD = false>
__device__ __forceinline__ void fg_ks(const uint32_t (&w)[2][B], const uint4 (&bf)[NT], const frag_scales (&sc)[2],
                                      float (&acc)[NT][4][4])
{
    uint32_t a[4][4];
    frag_a<B, GPTQ, KS>(w[0], sc[0], a[0]);
    frag_a<B, GPTQ, 2 + KS>(w[0], sc[0], a[1]);
    frag_a<B, GPTQ, KS>(w[1], sc[1], a[2]);
    frag_a<B, GPTQ, 2 + KS>(w[1], sc[1], a[3]);
    if constexpr (FOLD) {
        fg_fold(a[0], sc[0], 0);
        fg_fold(a[1], sc[0], 1);
        fg_fold(a[2], sc[1], 0);
        fg_fold(a[3], sc[1], 1);
    }
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int t = 0; t < 4; t++)
            mma_16816(acc[nt][t], a[t], bf[nt].x, bf[nt].y);
    if (NT == 1 && !PK)
#pragma unroll
        for (int t = 0; t < 4; t++)
            mma_16816(acc[0][t], a[t], bf[0].z, bf[0].w);
}

/* The staged B operands of 16-row step uk for each token tile (see fg_stage_chunk for the entries). PK (one tile,
 * at most 4 rows): B-column n < 4 takes token n's hi halves and column n + 4 its lo halves, so that one mma gives
 * both products (C columns n and n + 4, two lanes apart, are added at the end: fg_unpack); otherwise column n of
 * tile nt is token 8 nt + n, and one tile's hi and lo halves take two mma's. */
template <int NT, bool PK>
__device__ __forceinline__ void fg_bop(const fg_bsrc &bs, int uk, int M, int lane, uint4 (&bf)[NT])
{
    if constexpr (PK) {
        const uint2 v = bs.p[uk * bs.step];
        bf[0] = make_uint4(v.x, v.y, 0, 0);
    } else if constexpr (NT == 1) {
        bf[0] = *(const uint4 *)(bs.p + uk * bs.step);
    } else {
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int tok = (lane >> 2) + 8 * nt, e = (uk * M + tok) * 4 + (lane & 3);
            const uint2 v = tok < M ? bs.p[e] : make_uint2(0, 0);
            bf[nt] = make_uint4(v.x, v.y, 0, 0);
        }
    }
}

/* Decodes one unit of width B from its slot: the lane's words, then per 16-row step the staged B operands and
 * fg_ks (the four tiles' A operands and their mma's). */
template <int B, bool GPTQ, int NT, bool PK, bool FOLD = false>
__device__ __forceinline__ void fg_unit(const uint32_t *words, const fg_bsrc &bs, int ul, int M, int lane,
                                        const frag_scales (&sc)[2], float (&acc)[NT][4][4])
{
    constexpr int na = frag_na(B), nb = frag_nb(B);
    uint32_t w[2][B];
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const uint32_t *p = words + c * 32 * B;
        if constexpr (na == 4) {
            const uint4 v = *(const uint4 *)(p + lane * 4);
            w[c][0] = v.x, w[c][1] = v.y, w[c][2] = v.z, w[c][3] = v.w;
        } else {
            const uint2 v = *(const uint2 *)(p + lane * 2);
            w[c][0] = v.x, w[c][1] = v.y;
        }
        if constexpr (nb == 4) {
            const uint4 v = *(const uint4 *)(p + 32 * na + lane * 4);
            w[c][4] = v.x, w[c][5] = v.y, w[c][6] = v.z, w[c][7] = v.w;
        } else if constexpr (nb == 2) {
            const uint2 v = *(const uint2 *)(p + 32 * na + lane * 2);
            w[c][na] = v.x, w[c][na + 1] = v.y;
        } else if constexpr (nb == 1) {
            w[c][na] = p[32 * na + lane];
        }
    }
    uint4 bf[NT];
    fg_bop<NT, PK>(bs, ul * 2, M, lane, bf);
    fg_ks<B, GPTQ, 0, NT, PK, FOLD>(w, bf, sc, acc);
    fg_bop<NT, PK>(bs, ul * 2 + 1, M, lane, bf);
    fg_ks<B, GPTQ, 1, NT, PK, FOLD>(w, bf, sc, acc);
}

/* The first FG_RING - 1 steps of the run [ra, rb) of width B, into slots 0, 1, ... (see fg_run). */
template <int B> __device__ __forceinline__ void fg_prologue(const fg_warp &W, int ra, int rb)
{
    constexpr int NU = B <= 4 ? 2 : 1;
    const int steps = (rb - ra + NU - 1) / NU;
    const fg_span R = fg_span_of<B>(W, ra, rb);
#pragma unroll
    for (int s = 0; s < FG_RING - 1; s++) {
        if (s < steps) fg_issue<B>(W, R, s, s);
        cp_async_commit();
    }
}

/* fg_prologue for a run of runtime width `bits`. */
__device__ __forceinline__ void fg_prologue_any(int bits, const fg_warp &W, int ra, int rb)
{
    frag_with_width(bits, [&](auto w) {
        constexpr int B = decltype(w)::value;
        fg_prologue<B>(W, ra, rb);
    });
}

/* The end of a run in the warp's unit records: rb advanced past the units as wide as unit ref, up to n. */
__device__ __forceinline__ int fg_run_end(const uint2 *meta, int rb, int n, int ref)
{
    while (rb < n && (int)(meta[rb].y >> 24) == (int)(meta[ref].y >> 24))
        rb++;
    return rb;
}

/* The runs of a warp's n <= 64 unit records at once: bit i set where unit i is the last of its width (a scan per
 * run was a chain of dependent shared loads, 3.5 % of a gate/up launch's samples). The run from ra ends before
 * ra + __ffsll(ends >> ra). */
__device__ __forceinline__ uint64_t fg_run_ends(const uint2 *meta, int n, int lane)
{
    uint64_t ends = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int i = lane + 32 * h;
        const bool end = i < n && (i + 1 == n || (meta[i].y >> 24) != (meta[i + 1].y >> 24));
        ends |= (uint64_t)__ballot_sync(0xffffffffu, end) << (32 * h);
    }
    return ends;
}
__device__ __forceinline__ int fg_next_end(uint64_t ends, int ra)
{
    return ra + __ffsll((long long)(ends >> ra));
}

/* The ring walk of a run of width-B units [ra, rb): FG_RING - 1 steps in flight, the ring starting at slot 0 and
 * draining at the end (a warp sees 2-3 runs); `issued`: the prologue is already in flight. For each unit i of
 * the run, in order, unit(slot, uu, i): slot is the step's ring slot and uu the unit's place in it. */
template <int B, class U>
__device__ __forceinline__ void fg_walk(const fg_warp &W, int ra, int rb, bool issued, U &&unit)
{
    constexpr int NU = B <= 4 ? 2 : 1;
    const int steps = (rb - ra + NU - 1) / NU;
    if (!issued) fg_prologue<B>(W, ra, rb);
    const fg_span R = fg_span_of<B>(W, ra, rb);
    for (int st = 0; st < steps; st++) {
        cp_async_wait<FG_RING - 2>();
        __syncwarp();
        if (st + FG_RING - 1 < steps) fg_issue<B>(W, R, st + FG_RING - 1, (st + FG_RING - 1) % FG_RING);
        cp_async_commit();
        const uint32_t *slot = W.ring + (st % FG_RING) * FG_STEP_WORDS;
#pragma unroll
        for (int uu = 0; uu < NU; uu++) {
            const int i = ra + st * NU + uu;
            if (i >= rb) break;
            unit(slot, uu, i);
        }
    }
    cp_async_wait<0>();
    __syncwarp();
}

/* The warp's units [ra, rb) (all of width B) through the ring (fg_walk), each group's sums flushed into tot as the
 * next group starts; cur: the group whose scales sc holds (-1: none yet). */
template <int B, bool GPTQ, bool ONE, bool PK, int NT>
__device__ __forceinline__ void fg_run(const tsr_linear_dev &L, const fg_warp &W, int ra, int rb, bool issued, int &cur,
                                       frag_scales (&sc)[2], float (&acc)[NT][4][4], float (&tot)[NT][4][4])
{
    fg_walk<B>(W, ra, rb, issued, [&](const uint32_t *slot, int uu, int i) {
        const int grp = (int)(W.meta[i - W.wa].y & 0xffffffu);
        if (grp != cur) {
            if (cur >= 0) fg_flush<ONE, NT>(acc, tot, sc);
            fg_group_from_hdr<B, GPTQ>(slot + FG_SLOT_WORDS + uu * FG_HDR_WORDS, L.zero_add, W.scratch, W.lane, sc);
            cur = grp;
        }
        fg_unit<B, GPTQ, NT, PK>(slot + uu * 2 * 32 * B, W.bs, i - W.u0, W.M, W.lane, sc, acc);
    });
}

#endif
