/* Decode attention for fp16 and quantized KV caches: one block per (row, KV head, split of the context), all the
 * query heads that share the KV head together (grouped-query attention), the split's K and V rows copied to shared
 * memory at once.
 *
 * The general kernel of attention.cu walks positions one round of four after another in a warp per (row, head);
 * at batch 1 that costs ~29 µs per layer for a context a few hundred tokens long, all of it latency. Here a block
 * of 256 threads takes up to AD_CHUNK positions per round: their K and V rows (gathered through the page table)
 * arrive by cp.async in one round trip (q is read while they travel) and serve every query head of the group. For
 * groups of up to 8 heads the G × AD_CHUNK scores and P·V are tensor-core tiles (K and V as A operands by ldmatrix,
 * q and the probabilities as fp16 hi + lo B operands, so the products are as exact as in fp32; at batch 32-64 the
 * scalar arithmetic below was the kernel's cost: +8-10 % decode on the 8B shape); larger groups (and
 * TSR_CUDA_ATTN_MMA=0) take dot products read from shared memory (a thread per position and a quarter of the
 * heads) and a thread per output dim pair and group of heads for P·V. Either way a warp per head folds the scores
 * into a running softmax (max and sum in fp32, as the general kernel computes them). A block takes one or more
 * rounds: there are enough splits to give the chip a few blocks per SM, split s taking rounds s, s + splits, ...
 * (so a launch sized for a CUDA graph's longest possible context still spreads a short one over its blocks), and
 * with more than one split the partial (max, sum, unnormalized output) triples go to attention.cu's merge kernel in
 * its format.
 * Launched with programmatic dependent launch: the first round's K and V rows of earlier steps are requested before
 * the wait for the kernels before it (so they travel while the q/k/v reduction and rope_store finish), the rows this
 * step writes and q after it (+1 % at batch 1, +3 % at batch 8 on the 8B shape). A round's page-table entries are
 * read during the round before it (kv_tile_pages), so that its copies start without a table round trip.
 * Quantized caches (Q4/Q6/Q8) fill the same fp16 tiles from their codes: a round's codes and scales arrive by
 * cp.async in a stage behind the tiles (ad_quant_request; earlier steps' rows before the programmatic-launch wait as
 * above, the rows this step staged copied exactly into the tiles), then a warp per row rebuilds the plain fp16
 * vector from the stage (ad_quant_decode, kvq_tile.cuh). The rest of the kernel is the same, so it attends over fp16
 * rows as ExLlamaV2 does, not in the codes' rotated domain as the CPU and attention.cu's exact kernel do (test_cuda
 * measures the difference: ~5e-5 relative). */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/kv_tile.cuh"
#include "kernels/cuda/kvq_tile.cuh"

#include <math.h>
#include <stdlib.h>

#define AD_CHUNK 64       /* positions per round */
#define AD_THREADS 256
#define AD_MAX_G 16       /* query heads per KV head */

/* Shared memory: q of the group (fp32), the round's scores / probabilities, the running max, sum and rescale per
 * head (and a spare, for alignment), and the round's K and V rows (fp16, rows padded by 16 bytes against bank
 * conflicts). */
static size_t ad_smem_bytes(int D, int G)
{
    return (size_t)G * D * 4 + (size_t)G * AD_CHUNK * 4 + (size_t)G * 4 * 4 + 2 * (size_t)AD_CHUNK * (D + 8) * 2;
}

/* Blocks per SM the registers must allow (__launch_bounds__): with 128-dim heads 4 (64 registers; shared memory
 * would allow 5), 3 for the two-tile path of 5-8 heads per KV head, which needs more; with 64-dim heads, whose
 * tiles are half as large, 5 (48 registers, as ptxas chose before stop 40). Measured at stop 40 on the 8B shape,
 * the same kernel at 80, 64 and 48 registers: 3 blocks per SM decoded 8K-32K contexts 3-19 % slower than 4; 5
 * blocks were slower at 512 positions, batch 8 (-7 %), and no faster at 8K-32K. The bound keeps an edit of the
 * kernel from dropping it to fewer blocks unnoticed (a stop-40 build with one more kernel argument took 80). */
__host__ __device__ constexpr int ad_min_blocks(int d, int nt) { return d == 64 ? 5 : nt == 2 ? 3 : 4; }

/* The tensor-core path (NT > 0, groups of up to 8 query heads): scores S^T = K · q^T and the output O^T = V^T · P^T
 * as mma.m16n8k16 tiles, K and V (A operands) straight from the round's tiles by ldmatrix, q and P (B operands) in
 * fp16 hi + lo halves so that the products are exact as in fp32 (as the decode GEMV does with its activations).
 * Column c of B n-tile t holds head ad_head(NT, t, c), its lo halves where ad_lo(NT, t, c): with NT = 1 (G <= 4)
 * columns 0-3 take heads 0-3's hi halves and 4-7 their lo halves, with NT = 2 tile 0 the hi and tile 1 the lo halves
 * of heads 0-7. */
__device__ __forceinline__ int ad_head(int NT, int t, int c) { return NT == 1 ? (c & 3) : c; }
__device__ __forceinline__ bool ad_lo(int NT, int t, int c) { return NT == 1 ? c >= 4 : t == 1; }

/* v's fp16 hi half, or (lo) what remains of v after it, rounded to fp16. */
__device__ __forceinline__ __half ad_part(float v, bool lo)
{
    const __half hi = __float2half_rn(v);
    return lo ? __float2half_rn(v - __half2float(hi)) : hi;
}

/* The B operand pair of a lane for rows r, r + 1 and r + 8, r + 9 of a column whose values are src[row] (stride 1),
 * in the half `lo` (ad_part); zeros for a column past the group (valid false). */
__device__ __forceinline__ void ad_bfrag(const float *src, int r, bool valid, bool lo, uint32_t &b0, uint32_t &b1)
{
    const float v0 = valid ? src[r] : 0.0f, v1 = valid ? src[r + 1] : 0.0f;
    const float v2 = valid ? src[r + 8] : 0.0f, v3 = valid ? src[r + 9] : 0.0f;
    b0 = h2_bits(__halves2half2(ad_part(v0, lo), ad_part(v1, lo)));
    b1 = h2_bits(__halves2half2(ad_part(v2, lo), ad_part(v3, lo)));
}

/* Where a block's rows come from: its sequence's page table, the row layout, its KV head, the first position this
 * step wrote (p0) and the batch row that holds it (row0), for the staged-row rule of quantized caches. */
struct ad_fill_at {
    const int32_t *table;
    int page_size, width, kvh, p0, row0, layer;
};

/* A quantized cache's round as stored, in shared memory behind the tiles: K and V codes (D · bits / 8 bytes a row:
 * sized for the mode, so that a Q4 stage takes half a Q8 one: on cards with 100 KB of shared memory per SM (sm_86,
 * sm_89) two blocks of a Q4 cache with 128-dim heads and up to 4 query heads per KV head fit, as for fp16, where
 * room for 8-bit codes left one), K and V scales (D / 32 a row) and a flag per row whose tile row came from the
 * staging area. Every piece starts on a 16-byte boundary (D is 64 or 128). */
static size_t ad_qstage_bytes(int D, int k_bits, int v_bits)
{
    return (size_t)AD_CHUNK * D * (k_bits + v_bits) / 8 + 2 * (size_t)AD_CHUNK * (D / 16) + AD_CHUNK * 4;
}
struct ad_qstage {
    uint8_t *kc, *vc;
    __half *ks, *vs;
    int *staged;
    int k_row, v_row; /* bytes of a row's K codes, V codes */
};
__device__ __forceinline__ ad_qstage ad_qstage_at(unsigned char *p, int D, int k_bits, int v_bits)
{
    ad_qstage q;
    q.k_row = D * k_bits / 8, q.v_row = D * v_bits / 8;
    q.kc = p, q.vc = p + AD_CHUNK * q.k_row;
    q.ks = (__half *)(q.vc + AD_CHUNK * q.v_row), q.vs = q.ks + AD_CHUNK * (D / 32);
    q.staged = (int *)(q.vs + AD_CHUNK * (D / 32));
    return q;
}

/* The copies of rows r_lo .. r_hi - 1 (below n) of the round at t0 of a quantized cache: codes and scales into the
 * stage, or (check_staged: rows this step may have written) the staged fp16 rows straight into the tiles. Four
 * threads per row, each a quarter of its 16-byte pieces; the caller commits them. */
template <int D>
__device__ __forceinline__ void ad_quant_request(const ad_qstage &st, __half *ks, __half *vs, const kvq_view &c,
                                                 const ad_fill_at &f, int t0, int n, int r_lo, int r_hi,
                                                 bool check_staged)
{
    constexpr int DP = D + 8, PIECES = AD_THREADS / AD_CHUNK;
    const int r = threadIdx.x % AD_CHUNK, piece = threadIdx.x / AD_CHUNK, t = t0 + r;
    if (r < r_lo || r >= r_hi || r >= n) return;
    const int64_t slot = (int64_t)f.table[t / f.page_size] * f.page_size + t % f.page_size;
    const bool staged = check_staged && t >= f.p0 && kvq_staged_row(c, (int64_t)f.row0 + (t - f.p0), f.layer, slot);
    if (piece == 0) st.staged[r] = staged;
    if (staged) {
        const size_t off = ((size_t)f.row0 + (t - f.p0)) * f.width + (size_t)f.kvh * D;
        for (int i = piece; i < D / 8; i += PIECES) {
            cp_async16_zfill(ks + r * DP + 8 * i, c.stage_k + off + 8 * i, true);
            cp_async16_zfill(vs + r * DP + 8 * i, c.stage_v + off + 8 * i, true);
        }
        return;
    }
    const size_t off = (size_t)slot * f.width + (size_t)f.kvh * D;
    for (int i = 16 * piece; i < st.k_row; i += 16 * PIECES)
        cp_async16_zfill(st.kc + r * st.k_row + i, c.kc + off * c.k_bits / 8 + i, true);
    for (int i = 16 * piece; i < st.v_row; i += 16 * PIECES)
        cp_async16_zfill(st.vc + r * st.v_row + i, c.vc + off * c.v_bits / 8 + i, true);
    if (piece == PIECES - 2) cp_async_small<D / 16>(st.ks + r * (D / 32), c.ks + off / 32);
    if (piece == PIECES - 1) cp_async_small<D / 16>(st.vs + r * (D / 32), c.vs + off / 32);
}

/* The round's rows as plain fp16 rows of the tiles, from the stage (kvq_tile.cuh: a warp per row), rows the request
 * copied from the staging area left as they are, rows from n on zeros (their probabilities are 0, and 0 · NaN would
 * not be). */
template <int D, int KB, int VB>
__device__ __forceinline__ void ad_quant_decode_bits(const ad_qstage &st, __half *ks, __half *vs, int n)
{
    constexpr int DP = D + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int r = warp; r < AD_CHUNK; r += AD_THREADS / 32) {
        __half *kd = ks + r * DP, *vd = vs + r * DP;
        if (r >= n) {
            kvq_row_zero<D>(lane, kd);
            kvq_row_zero<D>(lane, vd);
            continue;
        }
        if (st.staged[r]) continue;
        uint32_t kw, vw;
        float ksc, vsc;
        kvq_row_load<D, KB>(st.kc + r * (D * KB / 8), st.ks + r * (D / 32), lane, kw, ksc);
        kvq_row_load<D, VB>(st.vc + r * (D * VB / 8), st.vs + r * (D / 32), lane, vw, vsc);
        kvq_row_decode<D, KB>(kw, ksc, lane, kd);
        kvq_row_decode<D, VB>(vw, vsc, lane, vd);
    }
}

template <int D>
__device__ __forceinline__ void ad_quant_decode(const ad_qstage &st, __half *ks, __half *vs, int n, const kvq_view &c)
{
    kvq_with_bits(c.k_bits, c.v_bits, [&](auto kb, auto vb) {
        ad_quant_decode_bits<D, decltype(kb)::value, decltype(vb)::value>(st, ks, vs, n);
    });
}

template <int D, int NT, bool Q>
__global__ void __launch_bounds__(AD_THREADS, ad_min_blocks(D, NT))
    attn_decode_kernel(tsr_batch_layout b, tsr_attn_args a, const __half *kc, const __half *vc, int page_size,
                       const float *q, float *out, float2 *part_ml, float *part_acc, int n_splits, kvq_view c)
{
    constexpr int DP = D + 8, VEC = D / 8;
    constexpr int HG = AD_THREADS / (D / 2);             /* head groups of the P·V threads */
    constexpr int NH = (AD_MAX_G + HG - 1) / HG;          /* heads per P·V thread at most */
    constexpr int SG = AD_THREADS / AD_CHUNK;             /* head groups of the score threads */
    constexpr int NS = (AD_MAX_G + SG - 1) / SG;           /* heads per score thread at most */
    const int split = blockIdx.x, kvh = blockIdx.y, row = blockIdx.z;
    const int G = a.n_heads / a.n_kv_heads, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    extern __shared__ __align__(16) unsigned char ad_smem[];
    float *qs = (float *)ad_smem;           /* [G][D] */
    float *ps = qs + G * D;                 /* [G][AD_CHUNK] */
    float *m_run = ps + G * AD_CHUNK;       /* [G] */
    float *l_run = m_run + G;               /* [G] */
    float *factor = l_run + G;              /* [G] rescale of the output in this round */
    __half *ks = (__half *)(factor + 2 * G); /* [AD_CHUNK][DP], 16-byte aligned (a spare [G] before it) */
    __half *vs = ks + AD_CHUNK * DP;

    /* Before the wait, only what the step's first kernel already found in place: the batch layout (copied before
     * it) and the K/V rows of earlier steps, that is positions before p0, the first of this sequence's rows in the
     * step (a sequence's rows come in position order); rows from p0 on are this step's (rope_store). */
    tsr_pdl_trigger();
    const int p = b.positions[row];
    const int lo = a.window > 0 && p - a.window + 1 > 0 ? p - a.window + 1 : 0;
    const size_t item0 = (size_t)row * a.n_heads + (size_t)kvh * G; /* the group's first (row, head) */
    if (lo + split * AD_CHUNK >
        p) { /* an empty split (contexts shorter than the launch was sized for): a neutral partial */
        tsr_pdl_wait();
        if (tid < G) part_ml[(item0 + tid) * n_splits + split] = make_float2(-INFINITY, 0.0f);
        return;
    }
    const int seq = b.row_seq[row], p0 = b.positions[b.seq_row0[seq]];
    const int32_t *table = b.page_tables + (size_t)seq * b.max_pages;
    const int width = a.n_kv_heads * D;
    const int first = lo + split * AD_CHUNK, n_first = min(AD_CHUNK, p + 1 - first), stride = n_splits * AD_CHUNK;
    const int earlier = max(0, min(n_first, p0 - first)); /* rows of the first round written by earlier steps */
    /* the page-table entries of the thread's rows in the round to copy next (the page tables are in place before
     * the wait too): each round reads the next round's while its own rows travel and its scores are computed */
    int32_t pages[kv_tile_share<D, AD_CHUNK, AD_THREADS>::NP];
    const ad_fill_at fa = {table, page_size, width, kvh, p0, b.seq_row0[seq], a.layer};
    const ad_qstage qst = ad_qstage_at((unsigned char *)(vs + AD_CHUNK * DP), D, c.k_bits, c.v_bits);
    if constexpr (Q) {
        ad_quant_request<D>(qst, ks, vs, c, fa, first, n_first, 0, earlier, false);
        asm volatile("cp.async.commit_group;\n" ::);
        tsr_pdl_wait();
        ad_quant_request<D>(qst, ks, vs, c, fa, first, n_first, earlier, AD_CHUNK, true);
        asm volatile("cp.async.commit_group;\n" ::);
    } else {
        kv_tile_pages<D, AD_CHUNK, AD_THREADS>(table, page_size, first, n_first, pages);
        kv_tile_copy<D, AD_CHUNK, AD_THREADS>(ks, vs, kc, vc, pages, page_size, width, kvh, first, n_first, 0, earlier);
        tsr_pdl_wait();
        kv_tile_copy<D, AD_CHUNK, AD_THREADS>(ks, vs, kc, vc, pages, page_size, width, kvh, first, n_first, earlier,
                                              AD_CHUNK);
    }

    const int d2 = tid % (D / 2), hg = tid / (D / 2); /* P·V: output dims 2 d2, 2 d2 + 1 of heads hg + HG j */
    float2 o[NH];
#pragma unroll
    for (int j = 0; j < NH; j++) o[j] = make_float2(0.0f, 0.0f);
    /* tensor-core path: q's B operands per 16-dim step (warps 0-3, the scores), the output accumulators of warp w's
     * 16 dims (warps below D / 16) */
    constexpr int NQ = NT > 0 ? NT : 1;
    uint32_t qfrag[D / 16][NQ][2];
    float oc[NQ][4];
#pragma unroll
    for (int t = 0; t < NQ; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) oc[t][i] = 0.0f;
    const int g = lane >> 2, qd = lane & 3;

    for (int t0 = first; t0 <= p; t0 += stride) {
        const int n = min(AD_CHUNK, p + 1 - t0);
        if constexpr (Q) {
            if (t0 != first) {
                ad_quant_request<D>(qst, ks, vs, c, fa, t0, n, 0, AD_CHUNK, true);
                asm volatile("cp.async.commit_group;\n" ::);
            }
        } else {
            if (t0 != first) kv_tile_copy<D, AD_CHUNK, AD_THREADS>(ks, vs, kc, vc, pages, page_size, width, kvh, t0, n);
            if (t0 + stride <= p)
                kv_tile_pages<D, AD_CHUNK, AD_THREADS>(table, page_size, t0 + stride,
                                                       min(AD_CHUNK, p + 1 - t0 - stride), pages);
        }
        if (t0 == first) { /* the first round (its rows requested above): q while they are on their way */
            for (int i = tid; i < G * D; i += AD_THREADS) qs[i] = q[item0 * D + i] * a.scale;
            if (tid < G) m_run[tid] = -INFINITY, l_run[tid] = 0.0f;
        }
        asm volatile("cp.async.wait_group 0;\n" ::);
        __syncthreads();
        if constexpr (Q) { /* the stage's codes into the tiles */
            ad_quant_decode<D>(qst, ks, vs, n, c);
            __syncthreads();
        }

        if constexpr (NT > 0) {
            if (t0 == first && warp < AD_CHUNK / 16) /* q's B operands, once */
#pragma unroll
                for (int kstep = 0; kstep < D / 16; kstep++)
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const int h = ad_head(NT, t, g);
                        ad_bfrag(qs + h * D, 16 * kstep + 2 * qd, h < G, ad_lo(NT, t, g), qfrag[kstep][t][0],
                                 qfrag[kstep][t][1]);
                    }
            /* scores of positions 16 w .. 16 w + 15 (warps 0-3): S^T = K · q^T */
            if (warp < AD_CHUNK / 16) {
                float sc[NT][4];
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int i = 0; i < 4; i++) sc[t][i] = 0.0f;
#pragma unroll
                for (int kstep = 0; kstep < D / 16; kstep++) {
                    uint32_t ka[4];
                    ldsm_x4(ka, ks + (warp * 16 + (lane & 15)) * DP + kstep * 16 + (lane >> 4) * 8);
#pragma unroll
                    for (int t = 0; t < NT; t++) mma_16816(sc[t], ka, qfrag[kstep][t][0], qfrag[kstep][t][1]);
                }
                /* hi + lo: lane qd's columns 2 qd, 2 qd + 1 are heads 2 qd, 2 qd + 1 (NT = 1: the lo columns sit
                 * two lanes up) */
                float s4[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    s4[i] = NT == 1 ? sc[0][i] + __shfl_xor_sync(0xffffffffu, sc[0][i], 2) : sc[0][i] + sc[NT - 1][i];
                }
                if (NT == 2 || qd < 2)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int h = 2 * qd + (i & 1), pp = warp * 16 + g + 8 * (i >> 1);
                        if (h < G) ps[h * AD_CHUNK + pp] = pp < n ? s4[i] : -INFINITY;
                    }
            }
        } else { /* scores: position pp against heads h0, h0 + SG, ... */
            const int pp = tid % AD_CHUNK, h0 = tid / AD_CHUNK;
            float s[NS];
#pragma unroll
            for (int j = 0; j < NS; j++) s[j] = 0.0f;
#pragma unroll 4
            for (int c = 0; c < VEC; c++) {
                const uint4 kw = *(const uint4 *)(ks + pp * DP + c * 8);
                const float2 k0 = __half22float2(*(const __half2 *)&kw.x), k1 = __half22float2(*(const __half2 *)&kw.y);
                const float2 k2 = __half22float2(*(const __half2 *)&kw.z), k3 = __half22float2(*(const __half2 *)&kw.w);
#pragma unroll
                for (int j = 0; j < NS; j++) {
                    const int h = h0 + SG * j;
                    if (h >= G) break;
                    const float4 qa = *(const float4 *)(qs + h * D + c * 8),
                                 qb = *(const float4 *)(qs + h * D + c * 8 + 4);
                    s[j] += qa.x * k0.x + qa.y * k0.y + qa.z * k1.x + qa.w * k1.y + qb.x * k2.x + qb.y * k2.y +
                            qb.z * k3.x + qb.w * k3.y;
                }
            }
#pragma unroll
            for (int j = 0; j < NS; j++) {
                const int h = h0 + SG * j;
                if (h < G) ps[h * AD_CHUNK + pp] = pp < n ? s[j] : -INFINITY;
            }
        }
        __syncthreads();

        /* the running softmax: a warp per head, two positions per lane */
        for (int h = warp; h < G; h += AD_THREADS / 32) {
            float v0 = ps[h * AD_CHUNK + lane], v1 = ps[h * AD_CHUNK + lane + 32];
            float mx = fmaxf(v0, v1);
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m_run[h], mx); /* finite: the round has at least one position */
            v0 = __expf(v0 - m_new), v1 = __expf(v1 - m_new);
            float sum = v0 + v1;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            ps[h * AD_CHUNK + lane] = v0, ps[h * AD_CHUNK + lane + 32] = v1;
            __syncwarp();
            if (lane == 0) {
                const float r = __expf(m_run[h] - m_new); /* 0 in the first round (m_run = -inf) */
                l_run[h] = l_run[h] * r + sum;
                m_run[h] = m_new;
                factor[h] = r;
            }
        }
        __syncthreads();

        if constexpr (NT > 0) {
            /* O^T = O^T · factor + V^T · P^T for dims 16 w .. 16 w + 15 (warps below D / 16) */
            if (warp < D / 16) {
#pragma unroll
                for (int t = 0; t < NT; t++)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const int h = ad_head(NT, t, 2 * qd + (i & 1));
                        if (h < G) oc[t][i] *= factor[h];
                    }
#pragma unroll
                for (int kk = 0; kk < AD_CHUNK / 16; kk++) {
                    if (kk * 16 >= n) break; /* probabilities 0 past the round's positions */
                    uint32_t va[4];
                    ldsm_x4_t(va, vs + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * DP + warp * 16 +
                                      ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        const int h = ad_head(NT, t, g);
                        uint32_t b0, b1;
                        ad_bfrag(ps + h * AD_CHUNK, kk * 16 + 2 * qd, h < G, ad_lo(NT, t, g), b0, b1);
                        mma_16816(oc[t], va, b0, b1);
                    }
                }
            }
        } else { /* O = O · factor + P · V */
#pragma unroll
            for (int j = 0; j < NH; j++) {
                const int h = hg + HG * j;
                if (h < G) o[j].x *= factor[h], o[j].y *= factor[h];
            }
            for (int t = 0; t < n; t++) {
                const float2 v = __half22float2(*(const __half2 *)(vs + t * DP + 2 * d2));
#pragma unroll
                for (int j = 0; j < NH; j++) {
                    const int h = hg + HG * j;
                    if (h >= G) break;
                    const float w = ps[h * AD_CHUNK + t];
                    o[j].x = fmaf(w, v.x, o[j].x), o[j].y = fmaf(w, v.y, o[j].y);
                }
            }
        }
        __syncthreads(); /* the round's rows and probabilities are reused by the next round */
    }

    if constexpr (NT > 0) {
        if (warp >= D / 16) return;
        /* hi + lo as for the scores: lane qd's columns are heads 2 qd, 2 qd + 1, at dims g and g + 8 */
        float o4[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            o4[i] = NT == 1 ? oc[0][i] + __shfl_xor_sync(0xffffffffu, oc[0][i], 2) : oc[0][i] + oc[NT - 1][i];
        if (NT == 1 && qd >= 2) return;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = 2 * qd + (i & 1), dim = warp * 16 + g + 8 * (i >> 1);
            if (h >= G) continue;
            const size_t item = item0 + h;
            if (n_splits == 1) {
                const float inv = l_run[h] > 0.0f ? 1.0f / l_run[h] : 0.0f;
                out[item * D + dim] = o4[i] * inv;
            } else {
                part_acc[(item * n_splits + split) * D + dim] = o4[i];
                if (warp == 0 && g == 0 && i < 2) part_ml[item * n_splits + split] = make_float2(m_run[h], l_run[h]);
            }
        }
    } else {
#pragma unroll
        for (int j = 0; j < NH; j++) {
            const int h = hg + HG * j;
            if (h >= G) break;
            const size_t item = item0 + h;
            if (n_splits == 1) {
                const float inv = l_run[h] > 0.0f ? 1.0f / l_run[h] : 0.0f;
                *(float2 *)(out + item * D + 2 * d2) = make_float2(o[j].x * inv, o[j].y * inv);
            } else {
                *(float2 *)(part_acc + (item * n_splits + split) * D + 2 * d2) = o[j];
                if (d2 == 0) part_ml[item * n_splits + split] = make_float2(m_run[h], l_run[h]);
            }
        }
    }
}

/* The blocks of `kern` with `smem` bytes of shared memory each that fit on the chip at once (at least 1): the
 * grid's size, so that every split starts in the first wave. (A fixed 512 blocks until stop 40 left 16 of the
 * H200's 528 places empty, and 64 splits at batch 1 put an extra round on split 0 for every context just past a
 * multiple of 4096 positions, where 66 splits have room for it.) A device planned as a smaller one
 * (TSR_CUDA_SMEM_OPTIN) counts the blocks its shared memory would hold. Asked once per kernel and size. */
static int ad_resident_blocks(const void *kern, size_t smem)
{
    static const void *last_kern = NULL;
    static size_t last_smem = 0;
    static int last = 0;
    if (kern != last_kern || smem != last_smem) {
        last = tsr_cuda_resident_blocks(kern, AD_THREADS, smem);
        if (last < 1) last = 1;
        last_kern = kern, last_smem = smem;
    }
    return last;
}

/* The layer's quantized storage as the kernel reads it (zeros for an fp16 cache). */
static kvq_view ad_view(const tsr_kv_cache *kv, int layer)
{
    kvq_view c = {};
    if (!tsr_kv_is_quant(kv->dtype)) return c;
    c.kc = (const uint8_t *)kv->k[layer], c.vc = (const uint8_t *)kv->v[layer];
    c.ks = (const __half *)kv->k_scale[layer], c.vs = (const __half *)kv->v_scale[layer];
    c.stage_k = (const __half *)kv->stage_k, c.stage_v = (const __half *)kv->stage_v;
    c.stage_key = kv->stage_key, c.stage_rows = kv->stage_rows;
    c.k_bits = kv->k_bits, c.v_bits = kv->v_bits;
    return c;
}

template <int D, int NT, bool Q>
static int ad_launch(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                     float *out)
{
    void (*kern)(tsr_batch_layout, tsr_attn_args, const __half *, const __half *, int, const float *, float *, float2 *,
                 float *, int, kvq_view) = attn_decode_kernel<D, NT, Q>;
    const int G = a->n_heads / a->n_kv_heads;
    const size_t qstage = Q ? ad_qstage_bytes(D, kv->k_bits, kv->v_bits) : 0, smem = ad_smem_bytes(D, G) + qstage;
    static bool configured = false;
    if (!configured) { /* room for the largest group and stage (Q8) */
        tsr_cuda_allow_smem((const void *)kern, ad_smem_bytes(D, AD_MAX_G) + (Q ? ad_qstage_bytes(D, 8, 8) : 0),
                            "the decode attention");
        configured = true;
    }
    /* as many splits as there are blocks that fit on the chip at once, at most one per round of the longest visible
     * span (in a CUDA graph, the longest possible); split s takes rounds s, s + n_splits, ... of its row, so the work
     * spreads over the splits whatever the actual context length */
    int span = b->max_position + 1;
    if (a->window > 0 && a->window < span) span = a->window;
    const int rounds = (span + AD_CHUNK - 1) / AD_CHUNK;
    int n_splits = ad_resident_blocks((const void *)kern, smem) / (b->n_rows * a->n_kv_heads);
    if (n_splits > rounds) n_splits = rounds;
    static const char *cap_env = getenv("TSR_CUDA_ATTN_SPLITS");
    static const int cap = cap_env ? atoi(cap_env) : 0;
    if (cap > 0 && n_splits > cap) n_splits = cap; /* tests: many rounds per split (test_cuda_splits3) */
    if (n_splits < 1) n_splits = 1;
    const size_t items = (size_t)b->n_rows * a->n_heads;
    float2 *ml = NULL;
    float *pacc = NULL;
    if (n_splits > 1) {
        ml = (float2 *)tsr_cuda_scratch(1, items * n_splits * sizeof(float2));
        pacc = (float *)tsr_cuda_scratch(2, items * n_splits * D * sizeof(float));
    }
    tsr_launch_smem(kern, dim3((unsigned)n_splits, (unsigned)a->n_kv_heads, (unsigned)b->n_rows), dim3(AD_THREADS),
                    smem, *b, *a, Q ? (const __half *)NULL : (const __half *)kv->k[a->layer],
                    Q ? (const __half *)NULL : (const __half *)kv->v[a->layer], kv->page_size, q, out, ml, pacc,
                    n_splits, ad_view(kv, a->layer));
    if (n_splits > 1) tsr_cuda_attn_merge(items, D, n_splits, ml, pacc, out, a, b->n_rows);
    return 1;
}

int tsr_cuda_attention_decode(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                              float *out)
{
    const int quant = tsr_kv_is_quant(kv->dtype);
    if ((kv->dtype != TSR_F16 && !quant) || a->n_heads % a->n_kv_heads || a->n_heads / a->n_kv_heads > AD_MAX_G)
        return 0;
    /* tensor cores for groups of up to 8 query heads (TSR_CUDA_ATTN_MMA=0: the scalar path for all, which quantized
     * caches leave to attention.cu's kernel) */
    static const bool mma = !tsr_cuda_env_off("TSR_CUDA_ATTN_MMA");
    const int G = a->n_heads / a->n_kv_heads, nt = !mma ? 0 : G <= 4 ? 1 : G <= 8 ? 2 : 0;
    if (quant && nt == 0) return 0;
    switch (a->head_dim * 8 + nt * 2 + quant) {
    case 64 * 8 + 0: return ad_launch<64, 0, false>(b, a, kv, q, out);
    case 64 * 8 + 2: return ad_launch<64, 1, false>(b, a, kv, q, out);
    case 64 * 8 + 3: return ad_launch<64, 1, true>(b, a, kv, q, out);
    case 64 * 8 + 4: return ad_launch<64, 2, false>(b, a, kv, q, out);
    case 64 * 8 + 5: return ad_launch<64, 2, true>(b, a, kv, q, out);
    case 128 * 8 + 0: return ad_launch<128, 0, false>(b, a, kv, q, out);
    case 128 * 8 + 2: return ad_launch<128, 1, false>(b, a, kv, q, out);
    case 128 * 8 + 3: return ad_launch<128, 1, true>(b, a, kv, q, out);
    case 128 * 8 + 4: return ad_launch<128, 2, false>(b, a, kv, q, out);
    case 128 * 8 + 5: return ad_launch<128, 2, true>(b, a, kv, q, out);
    default: return 0;
    }
}
