/* The MLP of one decode row as one persistent launch (ops.h mlp_add_norm; TSR_CUDA_MLP_FUSE=0 leaves it out).
 *
 * At batch 1 the MLP ran as six launches (the staging of h, the gate/up GEMV, silu_mul, the staging of its result
 * through down's permutation, the down GEMV, the residual pass), and each GEMV's weight stream stopped at its own
 * end: its blocks came in one uneven wave (8B gate/up: 224 blocks of 128 columns for 264 places, so almost a third of
 * the SMs ran half the work), drained, and the next GEMV started its stream only once its predecessor was done
 * (kernels/cuda/NOTES.md, "A persistent decode step"). Here one grid of the blocks that fit on the chip at once runs
 * both products; every warp streams the units of its work through its own cp.async ring with the one-row GEMV's
 * decode (gemv_warp.cuh), the activations of each ring step travelling beside its weights:
 *
 * - phase 1, gate and up: their (column pair of 64, unit) work is one line of units, cut into equal stretches, one
 *   per warp of the grid; a warp sums each column pair its stretch touches into its own slot of partial sums;
 * - a grid barrier (requesting phase 2's first weights before it measured no gain);
 * - the grid stages down's input, a thread per row: silu(gate) · up, summed from the slots in a fixed order
 *   (deterministic), gathered through down's permutation into fp16 hi + lo B operands; a second grid barrier;
 * - phase 2, down: each column pair of 64 split into S slices of K, one per warp, the 8 warps of a block adding
 *   theirs; the sums are the K-split parts the residual pass (tsr_cuda_add_parts, the only launch after this one)
 *   adds to x before the next norm.
 *
 * Measured on the H200 (kernels/cuda/NOTES.md, stop 29): each phase streams at the run loops' rate (2.9-3.0 TB/s at
 * 8B, 3.5-3.6 at 70B), and the barriers and the staging cost 8-18 us per launch, so the launch wins where the phases
 * are long (70B 4.0 bpw: +3 % at batch 1) and loses where they are short (70B 2.5 bpw: -1 %, 8B: -8 %); by default it
 * runs only for the former (MLP_AUTO_BYTES).
 *
 * The grid never exceeds what the occupancy API says is resident at once, so the barriers cannot wait for a block
 * that is not running (dependent launches under PDL start only once every block of this grid has started). The
 * barrier's counter (one per kernel instance, whose grid size it assumes) lives in device memory allocated at the
 * first call; it only grows, so CUDA graph replays reuse it. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/gemv_warp.cuh"
#include "kernels/cuda/launch.cuh"

#include <stdlib.h>

#define MLP_WARPS      8  /* per block: two blocks per SM, as the one-row GEMV */
#define MLP_PAIR_COLS  64 /* columns a warp covers: two column blocks */
#define MLP_X_WORDS    64 /* per ring step: the hi + lo entries of up to two units at one row (2 × 128 bytes) */
#define MLP_MAX_SLICES 64 /* K slices per column pair of down, at most (parts of the residual pass) */
#define MLP_WARP_WORDS (2 * FG_WARP_UNITS + FG_RING * FG_STEP_WORDS + FG_SCALE_WORDS + FG_RING * MLP_X_WORDS)

struct mlp_args {
    tsr_linear_dev gate, up, down;
    const uint2 *xs_gate, *xs_up; /* phase 1's activations: fg_prestage_kernel's hi + lo entries of h */
    uint2 *xs_down;               /* phase 2's: written between the barriers */
    float *part1;                 /* [warps][slots][64]: a warp's sums of each column pair its stretch touches */
    float *part2;                 /* [S / 8 or S][down.Npad]: down's K-split parts (block_parts) */
    unsigned long long *bar;      /* the grid barrier's arrivals (mlp_grid_sync) */
    unsigned T1;                  /* phase 1's units in all: (Pg + Pu) · U1 (warps · T1 < 2^32) */
    int U1, Pg, Pu, slots;        /* units of a gate/up column pair, column pairs of gate and of up, slots per warp */
    int U2, P2, S;                /* down: units, column pairs, K slices per pair */
    int block_parts;              /* S is a multiple of 8: a block's 8 warps (8 slices of one pair) add up their
                                   * sums, so down has S / 8 parts; else S */
    int sparse;                   /* phase 1 has fewer units than warps (some stretches empty) */
    int warps;                    /* of the grid */
    unsigned long long *trace;    /* TSR_CUDA_MLP_TRACE: per block, the global timer at each stage (MLP_STAGES) */
};
#define MLP_STAGES 7 /* start, after the wait, phase 1 done, barrier 1, staged, barrier 2, phase 2 done */

/* One piece of a warp's work: units [u0, u1) of column pair `pair` of L, its activations from xs, its 64 sums to
 * dst (the first `live` of them exist). */
struct mlp_seg {
    const tsr_linear_dev *L;
    const uint2 *xs;
    float *dst;
    int pair, u0, u1, live;
};

/* Phase 1's stretch of warp w: units [w T1 / warps, (w + 1) T1 / warps) of the line of gate's column pairs, then
 * up's, U1 units each. */
__device__ __forceinline__ unsigned mlp_stretch_start(const mlp_args &A, unsigned w)
{
    return w * A.T1 / (unsigned)A.warps;
}

/* The warp whose stretch holds unit v of the line: the last w with mlp_stretch_start(w) <= v. */
__device__ __forceinline__ int mlp_owner(const mlp_args &A, unsigned v)
{
    return (int)(((v + 1) * (unsigned)A.warps - 1) / A.T1);
}

extern __shared__ uint4 mlp_smem[];

/* Warp v's row of 64 sums for the block's reduction at the end: the start of its ring, free by then. */
__device__ __forceinline__ float *mlp_red_row(int v)
{
    return (float *)mlp_smem + v * MLP_WARP_WORDS + 2 * FG_WARP_UNITS;
}

/* With A.block_parts: the 8 warps of a block hold slices 8 j .. 8 j + 7 of one column pair p (items are pair-major
 * and P2 · S is a multiple of 8); their sums, added in warp order, become part j of down. */
__device__ __forceinline__ void mlp_block_sum(const mlp_args &A)
{
    __syncthreads();
    const int item = blockIdx.x * MLP_WARPS;
    if (item >= A.P2 * A.S || threadIdx.x >= MLP_PAIR_COLS) return;
    const int p = item / A.S, j = (item % A.S) / MLP_WARPS, c = threadIdx.x;
    if (MLP_PAIR_COLS * p + c >= A.down.Npad) return;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < MLP_WARPS; w++)
        v += mlp_red_row(w)[c];
    A.part2[(size_t)j * A.down.Npad + MLP_PAIR_COLS * p + c] = v;
}

/* Segment k of warp w in phase `phase`, false past its work. Phase 1: the k-th column pair its stretch touches
 * (slot k of its partial sums). Phase 2: item w + k · warps of the P2 × S grid of (column pair, K slice). */
__device__ __forceinline__ bool mlp_seg_of(const mlp_args &A, int phase, int w, int k, mlp_seg &s)
{
    if (phase == 0) {
        const unsigned v0 = mlp_stretch_start(A, w), v1 = mlp_stretch_start(A, w + 1), U1 = (unsigned)A.U1;
        const unsigned p = v0 / U1 + (unsigned)k, a = max(v0, p * U1), b = min(v1, (p + 1) * U1);
        if (a >= b) return false;
        const bool is_gate = p < (unsigned)A.Pg;
        s.L = is_gate ? &A.gate : &A.up;
        s.xs = is_gate ? A.xs_gate : A.xs_up;
        s.pair = (int)(is_gate ? p : p - A.Pg);
        s.u0 = (int)(a - p * U1), s.u1 = (int)(b - p * U1);
        s.dst = A.part1 + ((size_t)w * A.slots + k) * MLP_PAIR_COLS;
        s.live = MLP_PAIR_COLS;
        return true;
    }
    const long long item = w + (long long)k * A.warps;
    if (item >= (long long)A.P2 * A.S) return false;
    const int p = (int)(item / A.S), slice = (int)(item % A.S);
    s.L = &A.down;
    s.xs = A.xs_down;
    s.pair = p;
    s.u0 = slice * A.U2 / A.S, s.u1 = (slice + 1) * A.U2 / A.S;
    if (A.block_parts) { /* into the block's reduction rows (mlp_block_sum) */
        s.dst = mlp_red_row(threadIdx.x >> 5);
        s.live = MLP_PAIR_COLS;
    } else {
        s.dst = A.part2 + (size_t)slice * A.down.Npad + MLP_PAIR_COLS * p;
        s.live = min(MLP_PAIR_COLS, A.down.Npad - MLP_PAIR_COLS * p);
    }
    return true;
}

/* The warp's view of column pair `pair` of L (column blocks 2 pair and 2 pair + 1; the second may be past the
 * matrix, as in frag_gemv_kernel's last column group). */
__device__ __forceinline__ void mlp_warp_setup(const tsr_linear_dev &L, int pair, uint32_t *wsm, int lane, fg_warp &W)
{
    const int ncb = L.Npad / 32;
    W.meta = (const uint2 *)wsm;
    W.ring = wsm + 2 * FG_WARP_UNITS;
    W.scratch = (float *)(W.ring + FG_RING * FG_STEP_WORDS);
    W.bs = fg_bsrc{NULL, 0};
    W.u0 = 0, W.M = 1, W.lane = lane, W.cb0 = 2 * pair, W.ncb = ncb;
    W.src_cb[0] = W.cb0 < ncb ? W.cb0 : 0, W.src_cb[1] = W.cb0 + 1 < ncb ? W.cb0 + 1 : W.src_cb[0];
    W.wcb = min(W.cb0, ncb - 1);
    W.fw = L.fw;
    fg_header_role(L, W);
}

/* The unit records of units [u, u + n) (n <= FG_WARP_UNITS) into the warp's copy. */
__device__ __forceinline__ void mlp_load_meta(const tsr_linear_dev &L, fg_warp &W, int u, int n)
{
    __syncwarp(); /* the previous chunk's records have been read */
    W.wa = u;
    for (int i = W.lane; i < n; i += 32)
        ((uint2 *)W.meta)[i] = L.units[u + i];
    __syncwarp();
}

/* The activations of step st of run R (starting at unit ra) into activation slot si: NU units of 128 bytes, the last
 * unit again where the run ends first (as fg_issue copies its weights). */
template <int B>
__device__ __forceinline__ void mlp_issue_x(const fg_warp &W, const fg_span &R, int ra, int st, int si, const uint2 *xs,
                                            uint32_t *xring)
{
    constexpr int NU = B <= 4 ? 2 : 1;
    if (W.lane < 8 * NU) {
        const int uu = W.lane >> 3, piece = W.lane & 7;
        const int j = NU == 1 ? st : min(st * NU + uu, R.n - 1);
        cp_async16(xring + si * MLP_X_WORDS + uu * 32 + piece * 4, xs + (size_t)(ra + j) * 16 + piece * 2);
    }
}

/* fg_run for one row with the activations in the ring: units [ra, rb) of width B. `issued`: the weights of the
 * first FG_RING - 1 steps are in flight already (fg_prologue before a wait), so only their activations go out. The
 * group change and decode of a unit repeat fg_run's lines: a shared helper changed the one-row GEMV's SASS (register
 * allocation, ~1 % more instructions in some instances), so fg_run stays as measured until that is timed. */
template <int B, bool GPTQ>
__device__ __forceinline__ void mlp_run(const tsr_linear_dev &L, const fg_warp &W, int ra, int rb, bool issued,
                                        const uint2 *xs, uint32_t *xring, int &cur, frag_scales (&sc)[2],
                                        float (&acc)[1][4][4], float (&tot)[1][4][4])
{
    constexpr int NU = B <= 4 ? 2 : 1;
    const int steps = (rb - ra + NU - 1) / NU;
    const fg_span R = fg_span_of<B>(W, ra, rb);
    if (issued) {
#pragma unroll
        for (int s = 0; s < FG_RING - 1; s++)
            if (s < steps) mlp_issue_x<B>(W, R, ra, s, s, xs, xring);
        cp_async_commit();
        cp_async_wait<0>();
        __syncwarp();
    } else {
#pragma unroll
        for (int s = 0; s < FG_RING - 1; s++) {
            if (s < steps) fg_issue<B>(W, R, s, s), mlp_issue_x<B>(W, R, ra, s, s, xs, xring);
            cp_async_commit();
        }
    }
    const fg_bsrc xb0 = fg_bsrc_of<1, true>(xring, 1, W.lane);
    for (int st = 0; st < steps; st++) {
        cp_async_wait<FG_RING - 2>();
        __syncwarp();
        const int next = st + FG_RING - 1;
        if (next < steps)
            fg_issue<B>(W, R, next, next % FG_RING), mlp_issue_x<B>(W, R, ra, next, next % FG_RING, xs, xring);
        cp_async_commit();
        const int si = st % FG_RING;
        const uint32_t *slot = W.ring + si * FG_STEP_WORDS;
        fg_bsrc xb = xb0;
        xb.p += si * (MLP_X_WORDS / 2);
#pragma unroll
        for (int uu = 0; uu < NU; uu++) {
            const int i = ra + st * NU + uu;
            if (i >= rb) break;
            const int grp = (int)(W.meta[i - W.wa].y & 0xffffffu);
            if (grp != cur) {
                if (cur >= 0) fg_flush<true, 1>(acc, tot, sc);
                fg_group_from_hdr<B, GPTQ>(slot + FG_SLOT_WORDS + uu * FG_HDR_WORDS, L.zero_add, W.scratch, W.lane, sc);
                cur = grp;
            }
            fg_unit<B, GPTQ, 1, true>(slot + uu * 2 * 32 * B, xb, uu, 1, W.lane, sc, acc);
        }
    }
    cp_async_wait<0>();
    __syncwarp();
}

/* The width of the run starting at record i of the warp's copy. */
template <bool GPTQ> __device__ __forceinline__ int mlp_bits(const fg_warp &W, int i)
{
    return GPTQ ? 4 : (int)(W.meta[i].y >> 24);
}

/* The runs of the n units in the warp's copy; `issued`: the first run's first steps are in flight (mlp_preissue). */
template <bool GPTQ>
__device__ __forceinline__ void mlp_chunk(const tsr_linear_dev &L, const fg_warp &W, int n, bool issued,
                                          const uint2 *xs, uint32_t *xring, int &cur, frag_scales (&sc)[2],
                                          float (&acc)[1][4][4], float (&tot)[1][4][4])
{
    const uint64_t ends = fg_run_ends(W.meta, n, W.lane);
    for (int ra = 0; ra < n;) {
        const int rb = fg_next_end(ends, ra);
        if constexpr (GPTQ) {
            mlp_run<4, true>(L, W, W.wa + ra, W.wa + rb, issued && ra == 0, xs, xring, cur, sc, acc, tot);
        } else {
            frag_with_width(mlp_bits<GPTQ>(W, ra), [&](auto wd) {
                constexpr int B = decltype(wd)::value;
                mlp_run<B, false>(L, W, W.wa + ra, W.wa + rb, issued && ra == 0, xs, xring, cur, sc, acc, tot);
            });
        }
        ra = rb;
    }
}

/* The warp set up for segment s and the weights of its first run's first steps in flight: what can go out before
 * the wait for the activations. */
template <bool GPTQ> __device__ __forceinline__ void mlp_preissue(const mlp_seg &s, fg_warp &W, uint32_t *wsm, int lane)
{
    mlp_warp_setup(*s.L, s.pair, wsm, lane, W);
    const int n = min(FG_WARP_UNITS, s.u1 - s.u0);
    if (n <= 0) return;
    mlp_load_meta(*s.L, W, s.u0, n);
    const uint64_t ends = fg_run_ends(W.meta, n, lane);
    fg_prologue_any(mlp_bits<GPTQ>(W, 0), W, W.wa, W.wa + fg_next_end(ends, 0));
}

/* Segment s whole: its units in chunks of at most FG_WARP_UNITS, then its 64 sums (lanes of C column 0 after
 * fg_unpack hold them: column 32 (t / 2) + 16 (t % 2) + lane / 4 + 8 (i / 2)) to s.dst. `pre`: mlp_preissue ran
 * for it. */
template <bool GPTQ>
__device__ __forceinline__ void mlp_do_seg(const mlp_seg &s, fg_warp &W, uint32_t *wsm, uint32_t *xring, int lane,
                                           bool pre)
{
    if (!pre) mlp_warp_setup(*s.L, s.pair, wsm, lane, W);
    float acc[1][4][4], tot[1][4][4];
    fg_zero<1>(acc, tot);
    frag_scales sc[2] = {};
    int cur = -1;
    for (int c0 = s.u0; c0 < s.u1; c0 += FG_WARP_UNITS) {
        const int n = min(FG_WARP_UNITS, s.u1 - c0);
        const bool issued = pre && c0 == s.u0;
        if (!issued) mlp_load_meta(*s.L, W, c0, n);
        mlp_chunk<GPTQ>(*s.L, W, n, issued, s.xs, xring, cur, sc, acc, tot);
    }
    if (cur >= 0) fg_flush<true, 1>(acc, tot, sc);
    fg_unpack<true>(tot[0]);
    if ((lane & 3) == 0) {
        const int g = lane >> 2;
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int i = 0; i < 4; i += 2) {
                const int c = 32 * (t >> 1) + 16 * (t & 1) + g + 8 * (i >> 1);
                if (c < s.live) s.dst[c] = tot[0][t][i];
            }
    }
}

/* Every block of the grid at this point before any goes on; the writes before it are visible to all after it. The
 * counter only grows (64 bits: no wrap in any run): a block arriving as the n-th of its barrier waits until the
 * count reaches the next multiple of the grid, so the last arrival's one atomic releases everyone (a reset and a
 * generation word took three serial round trips: 2.6 us per barrier on the H200). */
__device__ __forceinline__ void mlp_grid_sync(unsigned long long *bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned long long n = gridDim.x, target = (atomicAdd(bar, 1ull) / n + 1) * n;
        unsigned long long now;
        asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(now) : "l"(bar) : "memory");
        while (now < target) {
            __nanosleep(20);
            asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(now) : "l"(bar) : "memory");
        }
        __threadfence();
    }
    __syncthreads();
}

/* Where column c of phase 1's column pair p (gate's pairs, then up's) has its sums: in the slots of the warps whose
 * stretches touch the pair, in warp order. The first of them, wa, may have started in an earlier pair (its slot: p
 * minus its first pair); every later one up to wb starts inside p (slot 0), unless its stretch is empty (only where
 * phase 1 has fewer units than the grid has warps, A.sparse). */
struct mlp_src {
    const float *first; /* wa's sum */
    int w1, wb;         /* the warps after wa: w1 = wa + 1 .. wb */
};

__device__ __forceinline__ mlp_src mlp_src_of(const mlp_args &A, int p, int c)
{
    const unsigned va = (unsigned)p * (unsigned)A.U1;
    const int wa = mlp_owner(A, va);
    const int slot = p - (int)(mlp_stretch_start(A, (unsigned)wa) / (unsigned)A.U1);
    return mlp_src{A.part1 + ((size_t)wa * A.slots + slot) * MLP_PAIR_COLS + c, wa + 1,
                   mlp_owner(A, va + (unsigned)A.U1 - 1)};
}

/* The sum, added in warp order. The loads of up to MLP_SUM_AT_ONCE warps go out before any is added (a plain loop
 * waited for each load before issuing the next: 5 us of staging at 8B). */
#define MLP_SUM_AT_ONCE 8
__device__ __forceinline__ float mlp_src_sum(const mlp_args &A, const mlp_src &r, int c)
{
    float s = __ldcg(r.first);
    for (int w0 = r.w1; w0 <= r.wb; w0 += MLP_SUM_AT_ONCE) {
        float t[MLP_SUM_AT_ONCE];
#pragma unroll
        for (int i = 0; i < MLP_SUM_AT_ONCE; i++) {
            const int w = w0 + i;
            const bool live =
                w <= r.wb && (!A.sparse || mlp_stretch_start(A, (unsigned)w) < mlp_stretch_start(A, (unsigned)w + 1));
            t[i] = live ? __ldcg(A.part1 + (size_t)w * A.slots * MLP_PAIR_COLS + c) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < MLP_SUM_AT_ONCE; i++)
            s += t[i];
    }
    return s;
}

/* One stored row k of down's input as a thread stages it: the intermediate column src it names through down's
 * permutation (-1 for padding, or past the rows), and where gate's and up's sums of that column lie. Everything
 * here depends only on the permutation and the grid, so a thread prepares its first row before the barrier. */
struct mlp_row {
    int k, src;
    mlp_src g, u;
};

__device__ __forceinline__ mlp_row mlp_row_of(const mlp_args &A, int k)
{
    mlp_row r;
    r.k = k;
    r.src = k < A.U2 * 32 ? A.down.uperm[k] : -1;
    if (r.src >= 0) {
        const int p = r.src / MLP_PAIR_COLS, c = r.src % MLP_PAIR_COLS;
        r.g = mlp_src_of(A, p, c);
        r.u = mlp_src_of(A, A.Pg + p, c);
    }
    return r;
}

/* The row's gated value, silu(gate) · up as silu_mul_kernel computes it (0 for padding), into its staged entry:
 * stored row k of down's one exact row, as the attention merge scatters its values (stage_ahead_scatter). */
__device__ __forceinline__ void mlp_row_stage(const mlp_args &A, const mlp_row &r)
{
    if (r.k >= A.U2 * 32) return;
    float v = 0.0f;
    if (r.src >= 0) {
        const int c = r.src % MLP_PAIR_COLS;
        float g = mlp_src_sum(A, r.g, c), u = mlp_src_sum(A, r.u, c);
        if (A.gate.bias) g += __half2float(A.gate.bias[r.src]);
        if (A.up.bias) u += __half2float(A.up.bias[r.src]);
        v = g / (1.0f + expf(-g)) * u;
    }
    tsr_stage_ahead S = {};
    S.xs[0] = A.xs_down;
    S.M = 1;
    S.exact = 1;
    stage_ahead_scatter(S, r.k, 0, v);
}

/* TSR_CUDA_MLP_TRACE: the global timer (ns) at stage `stage` of this block. */
__device__ __forceinline__ void mlp_mark(const mlp_args &A, int stage)
{
    if (!A.trace || threadIdx.x != 0) return;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    A.trace[blockIdx.x * MLP_STAGES + stage] = t;
}

template <bool GPTQ>
__global__ void __launch_bounds__(MLP_WARPS * 32, 2) mlp_decode_kernel(const __grid_constant__ mlp_args A)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, w = blockIdx.x * MLP_WARPS + warp;
    uint32_t *wsm = (uint32_t *)mlp_smem + warp * MLP_WARP_WORDS;
    uint32_t *xring = wsm + 2 * FG_WARP_UNITS + FG_RING * FG_STEP_WORDS + FG_SCALE_WORDS;
    fg_warp W;
    mlp_seg s;
    /* the weights are constant: phase 1's first steps go out before the wait for the kernel that staged h */
    mlp_mark(A, 0);
    bool have = mlp_seg_of(A, 0, w, 0, s);
    if (have) mlp_preissue<GPTQ>(s, W, wsm, lane);
    tsr_pdl_wait();
    mlp_mark(A, 1);
    for (int phase = 0;; phase++) {
        for (int k = 0; have; have = mlp_seg_of(A, phase, w, ++k, s))
            mlp_do_seg<GPTQ>(s, W, wsm, xring, lane, k == 0 && phase == 0);
        if (phase == 1) {
            if (A.block_parts) mlp_block_sum(A);
            break;
        }
        have = mlp_seg_of(A, 1, w, 0, s);
        /* down's input, one stored row per thread: the first row's sources before the barrier */
        const int stride = gridDim.x * blockDim.x;
        mlp_row row = mlp_row_of(A, blockIdx.x * blockDim.x + threadIdx.x);
        if (A.trace) __syncthreads(), mlp_mark(A, 2);
        mlp_grid_sync(A.bar);
        mlp_mark(A, 3);
        mlp_row_stage(A, row);
        for (int k = row.k + stride; k < A.U2 * 32; k += stride)
            mlp_row_stage(A, mlp_row_of(A, k));
        if (A.trace) __syncthreads(), mlp_mark(A, 4);
        mlp_grid_sync(A.bar);
        mlp_mark(A, 5);
    }
    tsr_pdl_trigger();
    if (A.trace) __syncthreads(), mlp_mark(A, 6);
}

/* TSR_CUDA_MLP_FUSE=1: the fused MLP wherever the shapes allow it; unset: only where gate and up give every warp at
 * least MLP_AUTO_BYTES of weights, so that the fixed costs of the launch (two grid barriers, 1-2 us each, and the
 * staging of down's input, up to 5 us) are small beside its products. On the H200 at batch 1 (2112 warps): 70B 4.0
 * bpw (111 KB per warp) decodes 3 % faster fused, 70B 2.5 bpw (70 KB) 1 % slower, 8B 4.0 bpw (28 KB) 8 % slower
 * (kernels/cuda/NOTES.md, stop 29). =0: never (backend.cu leaves the op out). */
#define MLP_AUTO_BYTES (96 * 1024)
static bool mlp_fuse_always(void)
{
    static int always = -1;
    if (always < 0) {
        const char *e = getenv("TSR_CUDA_MLP_FUSE");
        always = e && atoi(e) == 1;
    }
    return always;
}

/* The barrier counters of the two kernel instances (EXL2, GPTQ), zeroed once (outside graph recording: a recording
 * that needs them first declines). */
static unsigned long long *mlp_barrier(bool gptq)
{
    static unsigned long long *bar;
    if (bar) return bar + gptq;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    TSR_CUDA_CHECK(cudaStreamIsCapturing(tsr_cuda_stream(), &cap));
    if (cap != cudaStreamCaptureStatusNone) return NULL;
    TSR_CUDA_CHECK(cudaMalloc(&bar, 2 * sizeof *bar));
    TSR_CUDA_CHECK(cudaMemset(bar, 0, 2 * sizeof *bar));
    TSR_CUDA_CHECK(cudaDeviceSynchronize());
    return bar + gptq;
}

/* TSR_CUDA_MLP_TRACE=1: each block's stage times of the latest launch, printed at exit as each stage's earliest,
 * mean and latest time after the earliest start (microseconds). */
static unsigned long long *g_trace;
static int g_trace_blocks;
static void mlp_trace_report(void)
{
    if (!g_trace || cudaDeviceSynchronize() != cudaSuccess) return;
    const size_t n = (size_t)g_trace_blocks * MLP_STAGES;
    unsigned long long *h = (unsigned long long *)malloc(n * sizeof *h);
    if (!h || cudaMemcpy(h, g_trace, n * sizeof *h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(h);
        return;
    }
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < g_trace_blocks; b++)
        t0 = h[(size_t)b * MLP_STAGES] < t0 ? h[(size_t)b * MLP_STAGES] : t0;
    static const char *names[MLP_STAGES] = {"start",  "waited",    "phase 1", "barrier 1",
                                            "staged", "barrier 2", "phase 2"};
    fprintf(stderr, "fused MLP, latest launch, %d blocks (us after the first start: earliest / mean / latest)\n",
            g_trace_blocks);
    for (int st = 0; st < MLP_STAGES; st++) {
        double lo = 1e30, hi = 0, sum = 0;
        for (int b = 0; b < g_trace_blocks; b++) {
            const double t = (double)(h[(size_t)b * MLP_STAGES + st] - t0) * 1e-3;
            lo = t < lo ? t : lo, hi = t > hi ? t : hi, sum += t;
        }
        fprintf(stderr, "  %-10s %8.2f %8.2f %8.2f\n", names[st], lo, sum / g_trace_blocks, hi);
    }
    free(h);
}

/* Blocks of the grid: all that are resident at once (TSR_CUDA_MLP_BLOCKS caps it, for tests of small grids), or 0
 * when none fits (tsr_cuda_smem_block) or the device predates sm_80 (cp.async). Asked once per kernel instance: the
 * device is fixed. */
static int mlp_blocks(void (*kern)(const mlp_args), size_t smem)
{
    if (tsr_cuda_device_attr(cudaDevAttrComputeCapabilityMajor, 0) < 8 || smem > (size_t)tsr_cuda_smem_block())
        return 0;
    tsr_cuda_allow_smem((const void *)kern, smem, "the fused decode MLP");
    int blocks = tsr_cuda_resident_blocks((const void *)kern, MLP_WARPS * 32, smem);
    const char *e = getenv("TSR_CUDA_MLP_BLOCKS");
    if (e && atoi(e) > 0 && atoi(e) < blocks) blocks = atoi(e);
    return blocks;
}

int tsr_cuda_mlp_add_norm(const tsr_linear *gate, const tsr_linear *up, const tsr_linear *down, const float *h, int M,
                          float *x, const tsr_dense *w, float eps, float *out, float *scratch_gate, float *scratch_up)
{
    const tsr_linear_dev *G = (const tsr_linear_dev *)gate->dev, *U = (const tsr_linear_dev *)up->dev,
                         *D = (const tsr_linear_dev *)down->dev;
    if (!x || !G || !U || !D || G->kind != TSR_LINEAR_EXL2 || U->kind != TSR_LINEAR_EXL2 ||
        D->kind != TSR_LINEAR_EXL2)
        return 0;
    if (M != 1) return tsr_cuda_mlp_half(G, U, D, h, M, x, w, eps, out, scratch_gate, scratch_up);
    if (G->gptq != U->gptq || G->gptq != D->gptq || G->K != U->K || G->N != U->N || D->K != G->N) return 0;
    if (G->n_units != U->n_units) return 0;
    const bool gptq = G->gptq != 0;
    void (*kern)(const mlp_args) = gptq ? mlp_decode_kernel<true> : mlp_decode_kernel<false>;
    const size_t smem = (size_t)MLP_WARPS * MLP_WARP_WORDS * 4;
    static int grid[2] = {-1, -1};
    if (grid[gptq] < 0) grid[gptq] = mlp_blocks(kern, smem);
    const int blocks = grid[gptq];
    unsigned long long *bar = blocks > 0 ? mlp_barrier(gptq) : NULL;
    if (!bar) return 0;

    mlp_args A = {};
    A.gate = *G, A.up = *U, A.down = *D;
    A.warps = blocks * MLP_WARPS;
    A.U1 = G->n_units;
    A.Pg = (int)tsr_div_up(G->Npad, MLP_PAIR_COLS), A.Pu = (int)tsr_div_up(U->Npad, MLP_PAIR_COLS);
    const unsigned long long T1 = (unsigned long long)(A.Pg + A.Pu) * (unsigned long long)A.U1;
    if (T1 * (unsigned long long)(A.warps + 1) >= (1ull << 32)) return 0; /* the stretches' 32-bit arithmetic */
    A.T1 = (unsigned)T1;
    const long long stretch = ((long long)A.T1 + A.warps - 1) / A.warps;
    const double phase1_bytes = 4.0 * ((double)gate->q.Q * gate->q.N + (double)up->q.Q * up->q.N);
    if (!mlp_fuse_always() && phase1_bytes < (double)MLP_AUTO_BYTES * A.warps) return 0;
    A.slots = 1 + (int)((stretch - 1 + A.U1 - 1) / A.U1); /* column pairs a stretch can touch */
    A.U2 = D->n_units;
    A.P2 = (int)tsr_div_up(D->Npad, MLP_PAIR_COLS);
    A.S = max(1, min(A.warps / A.P2, min(A.U2, MLP_MAX_SLICES)));
    A.block_parts = A.S >= MLP_WARPS;
    if (A.block_parts) A.S -= A.S % MLP_WARPS;
    A.sparse = A.T1 < (unsigned)A.warps;
    const int parts = A.block_parts ? A.S / MLP_WARPS : A.S;
    A.bar = bar;
    static int trace = -1;
    if (trace < 0) {
        const char *e = getenv("TSR_CUDA_MLP_TRACE");
        trace = e && atoi(e) > 0;
        if (trace) {
            TSR_CUDA_CHECK(cudaMalloc(&g_trace, (size_t)blocks * MLP_STAGES * sizeof *g_trace));
            g_trace_blocks = blocks;
            atexit(mlp_trace_report);
        }
    }
    A.trace = trace && blocks <= g_trace_blocks ? g_trace : NULL;

    const tsr_linear_dev *gu[2] = {G, U};
    const uint2 *xs[2];
    if (!tsr_cuda_gemv_take_staged(gu, 2, h, 1, true, xs)) /* the residual pass before it staged them, or here */
        tsr_cuda_gemv_prestage(gu, 2, h, 1, true, 0, xs);
    A.xs_gate = xs[0], A.xs_up = xs[1];
    A.xs_down = (uint2 *)tsr_cuda_scratch(5, (size_t)A.U2 * 16 * sizeof(uint2));
    A.part1 = (float *)tsr_cuda_scratch(6, (size_t)A.warps * A.slots * MLP_PAIR_COLS * sizeof(float));
    A.part2 = (float *)tsr_cuda_scratch(3, (size_t)parts * D->Npad * sizeof(float));
    tsr_launch_smem(kern, dim3(blocks), dim3(MLP_WARPS * 32), smem, A);
    TSR_CUDA_LAUNCHED();
    tsr_cuda_add_parts(x, A.part2, parts, (size_t)D->Npad, D->Npad, D->bias, w, eps, 1, D->N, out);
    return 1;
}
