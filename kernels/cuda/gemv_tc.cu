/* EXL2/GPTQ decode GEMV on the tensor cores (v9): y[M][N] = x[M][K] · W + bias for M <= 32. matmul.cu uses it
 * for 8 < M <= 32 (TSR_CUDA_GEMV=tc: for every M <= 32); at M <= 8 the CUDA-core kernel is still faster
 * (kernels/cuda/NOTES.md: this kernel is issue/latency bound at ~0.75 TB/s, not memory bound).
 *
 * The weights are streamed once; the tensor cores (mma.sync m16n8k16, fp16 operands, fp32 accumulation) do the
 * multiply-adds, so the CUDA cores only unpack codes. Exactness: A holds the integer codes minus their offset,
 * which fp16 represents exactly; B holds the activations split into two fp16 terms (hi + lo, 22 significant bits),
 * so the products are as accurate as the fp32 GEMV's; the per-(group, column) scale multiplies each group's fp32
 * sum. (Activations must stay inside fp16's range, |x| < 65504, as they do in ExLlamaV2, which runs in fp16.)
 *
 * Layout: a block is four warps, each owning 32 adjacent columns (a lane reads one 16-byte word row of 4 columns),
 * and a range of 32-row chunks (K split over gridDim.y blocks to fill the chip). Within a chunk the four lanes of
 * a quad (q = lane % 4) hold bytes [qB, qB + B) of each column's packed stream, i.e. rows 8q .. 8q + 7, at any
 * width B; the k order inside an mma is a free choice, so rows are assigned to k slots such that every lane
 * converts its own codes (two per register: (code | 0x6400) is the half 1024 + code) and never shuffles. The
 * block stages the activations of its chunks once, through the permutation, in the B-fragment order, in shared
 * memory (only the M real tokens: 128 bytes per chunk and token; every thread stages at most 4 items, so staging
 * costs two round trips). Each thread's words and scale data for the next TG_DEPTH chunks are in flight through
 * cp.async into its own ring of shared-memory slots (no register scoreboard: a register double buffer drained on
 * every chunk, see NOTES.md), loaded with an L2 evict-first policy; the TG_PREFETCH chunks beyond are requested into
 * L2. The first copies start before the kernel waits for its predecessor (PDL). The grid is sized from the
 * kernel's occupancy to run in one wave.
 * K-split partial sums go to a scratch buffer; the last block of each column range adds them in a fixed order
 * (deterministic), adds the bias and writes y, so no second kernel is launched. */
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/launch.cuh"

#include <stdlib.h>
#include <string.h>

#define TG_WARPS 4
#define TG_COLS (TG_WARPS * 32)
#define TG_DEPTH 6        /* chunks in flight per thread (cp.async ring slots) */
#define TG_XS_BYTES 16384 /* staged activations: 128 bytes per (chunk, token) */
#define TG_MAX_STAGE 128  /* chunks per staging pass at most (128 / M) */
#define TG_PREFETCH 16    /* chunks whose weights are requested into L2 ahead of the register loads */

struct tg_words {
    uint4 a, b; /* the lane's first and second packed word (rows qrow + wa, qrow + wb) of its 4 columns */
    uint2 s;    /* EXL2: q_scale word, scale_m bits; GPTQ: the 4 columns' fp16 scales */
    uint32_t z; /* GPTQ: zero-code word */
};

__device__ __forceinline__ uint64_t tg_evict_first(void)
{
    uint64_t pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}

/* Asynchronous copies global → shared (LDGSTS): tracked by cp.async groups, not by register scoreboards, so a
 * deep pipeline of loads stays in flight. A copy with pred false reads nothing and zero-fills. */
__device__ __forceinline__ void tg_cp16(uint32_t dst, const void *src, bool pred, uint64_t pol)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
                 "r"(pred ? 16 : 0), "l"(pol)
                 : "memory");
}

__device__ __forceinline__ void tg_cp8(uint32_t dst, const void *src, bool pred)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(pred ? 8 : 0) : "memory");
}

__device__ __forceinline__ void tg_cp4(uint32_t dst, const void *src, bool pred)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(pred ? 4 : 0) : "memory");
}

__device__ __forceinline__ void tg_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N> __device__ __forceinline__ void tg_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

__device__ __forceinline__ void tg_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

__device__ __forceinline__ void tg_mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t tg_hsub2(uint32_t a, uint32_t b)
{
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ uint32_t tg_elem(const uint4 &v, int c)
{
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

/* The lane's 8 codes of one column (rows 8q .. 8q+7), as 4 half2 registers holding (code p − off, code p+4 − off),
 * p = 0..3. wa, wb: the two words holding bytes [qB, qB + B) of the column's chunk stream; sh: that range's bit
 * offset in wa. */
template <int B>
__device__ __forceinline__ void tg_codes(uint32_t wa, uint32_t wb, int sh, uint32_t off, uint32_t (&h)[4])
{
    constexpr uint32_t m = (1u << B) - 1u;
    if (B == 8) {
#pragma unroll
        for (int p = 0; p < 4; p++)
            h[p] = tg_hsub2((__byte_perm(wa, wb, p | ((p + 4) << 8)) & 0x00ff00ffu) | 0x64006400u, off);
        return;
    }
    uint32_t lo, hi;
    if (B == 4) {
        lo = wa;
        hi = wa >> 16;
    } else if (B == 2) {
        lo = wa >> sh;
        hi = lo >> 8;
    } else {
        const uint64_t v = (((uint64_t)wb << 32) | wa) >> sh;
        lo = (uint32_t)v;
        hi = (uint32_t)(v >> (4 * B));
    }
    if (B <= 4) {
        const uint32_t t = B == 4 ? wa : __byte_perm(lo, hi, 0x5410);
#pragma unroll
        for (int p = 0; p < 4; p++) h[p] = tg_hsub2(((t >> (p * B)) & (m | (m << 16))) | 0x64006400u, off);
    } else {
#pragma unroll
        for (int p = 0; p < 4; p++)
            h[p] = tg_hsub2(((lo >> (p * B)) & m) | (((hi >> (p * B)) & m) << 16) | 0x64006400u, off);
    }
}

/* One chunk: decode the lane's 4 columns and run the mma for both column tiles, both k steps, every token tile,
 * with the hi and the lo activation terms. Tile T holds columns 2T (A rows 0-7) and 2T+1 (rows 8-15) of each
 * lane; k step s holds code pairs 2s (a0, a1) and 2s+1 (a2, a3). */
template <int B, int NT>
__device__ __forceinline__ void tg_chunk(const tg_words &w, int q, const uint4 *xs_chunk, int gi, int M,
                                         const uint32_t (&off)[4], float (&cg)[2][NT][4])
{
    const int sh = 8 * ((q * B) & 3);
    uint32_t h[4][4];
#pragma unroll
    for (int c = 0; c < 4; c++) tg_codes<B>(tg_elem(w.a, c), tg_elem(w.b, c), sh, off[c], h[c]);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        /* token nt*8 + gi: its hi and lo fragments, zero past the batch */
        const int m = nt * 8 + gi;
        uint4 xh = make_uint4(0u, 0u, 0u, 0u), xl = xh;
        if (m < M) {
            xh = xs_chunk[(m * 4 + q) * 2];
            xl = xs_chunk[(m * 4 + q) * 2 + 1];
        }
#pragma unroll
        for (int T = 0; T < 2; T++) {
            tg_mma(cg[T][nt], h[2 * T][0], h[2 * T + 1][0], h[2 * T][1], h[2 * T + 1][1], xh.x, xh.y);
            tg_mma(cg[T][nt], h[2 * T][2], h[2 * T + 1][2], h[2 * T][3], h[2 * T + 1][3], xh.z, xh.w);
            tg_mma(cg[T][nt], h[2 * T][0], h[2 * T + 1][0], h[2 * T][1], h[2 * T + 1][1], xl.x, xl.y);
            tg_mma(cg[T][nt], h[2 * T][2], h[2 * T + 1][2], h[2 * T][3], h[2 * T + 1][3], xl.z, xl.w);
        }
    }
}

/* Starts the copies of one chunk's data for this lane into its ring slot: the two packed words of its 4 columns
 * (a: row qrow + wa, b: row qrow + wb when the lane's bytes straddle two words) and the group's scale data
 * (EXL2: q_scale word, scale_m; GPTQ: 4 fp16 scales, zero-code word). */
__device__ __forceinline__ void tg_issue(const tsr_linear_dev &L, const int4 rec, int q, int col4, bool live, uint64_t pol,
                                         uint32_t sa, uint32_t sb, uint32_t ss)
{
    const int bits = rec.w >> 24, g = rec.w & 0xffffff;
    const int nw = (rec.z * bits + 31) >> 5;
    const int wa = (q * bits) >> 2, wb = (q * bits + bits - 1) >> 2;
    const uint32_t *base = L.q_weight + (size_t)rec.x * L.Npad + (live ? col4 : 0);
    tg_cp16(sa, base + (size_t)(wa < nw ? wa : 0) * L.Npad, live && wa < nw, pol);
    tg_cp16(sb, base + (size_t)(wb < nw ? wb : 0) * L.Npad, live && wb != wa && wb < nw, pol);
    const int c = live ? col4 : 0;
    if (L.gptq) {
        tg_cp8(ss, L.g_scales + (size_t)g * L.Npad + c, live);
        tg_cp4(ss + 8, L.g_zeros + (size_t)g * (L.Npad / 8) + c / 8, live);
    } else {
        tg_cp4(ss, L.q_scale + (size_t)g * (L.Npad / 8) + c / 8, live);
        tg_cp4(ss + 4, L.scale_m + g, live);
    }
}

/* Asks L2 for the lines this lane's tg_issue of the chunk will read (the warp's requests coalesce to one line per
 * packed row); no registers are held, so a window of chunks can be in flight ahead of the cp.async ring. */
__device__ __forceinline__ void tg_prefetch(const tsr_linear_dev &L, const int4 rec, int q, int col4, bool live)
{
    const int bits = rec.w >> 24;
    const int nw = (rec.z * bits + 31) >> 5;
    const int wa = (q * bits) >> 2, wb = (q * bits + bits - 1) >> 2;
    if (!live) return;
    const uint32_t *base = L.q_weight + (size_t)rec.x * L.Npad + col4;
    if (wa < nw) tg_prefetch_l2(base + (size_t)wa * L.Npad);
    if (wb != wa && wb < nw) tg_prefetch_l2(base + (size_t)wb * L.Npad);
}

/* Scales and code offsets of the lane's 4 columns for a new group. */
__device__ __forceinline__ void tg_group(const tsr_linear_dev &L, const tg_words &w, int bits, int col4, float (&S)[4],
                                         uint32_t (&off)[4])
{
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int nib = 4 * ((col4 + c) & 7);
        int zero;
        if (L.gptq) {
            const uint32_t hw = c < 2 ? w.s.x : w.s.y;
            S[c] = __half2float(__ushort_as_half((unsigned short)(hw >> (16 * (c & 1)))));
            zero = (int)((w.z >> nib) & 0xfu) + L.zero_add;
        } else {
            const uint32_t code = (w.s.x >> nib) & 0xfu;
            S[c] = __half2float(__float2half_rn((float)((code + 1) * (code + 1)) * __uint_as_float(w.s.y)));
            zero = 1 << (bits - 1);
        }
        off[c] = (0x6400u + (uint32_t)zero) * 0x10001u; /* the half 1024 + zero, twice */
    }
}

template <int NT>
__global__ void __launch_bounds__(TG_WARPS * 32) tg_kernel(tsr_linear_dev L, const float *x, int M, int cpb, int xch, int pf,
                                                         float *partial, unsigned *counters, float *y)
{
    /* dynamic shared memory: staged activations, chunk records, then the ring of TG_DEPTH slots per thread
     * (a words, b words, scale data: three uint4 arrays [TG_DEPTH][128]) */
    extern __shared__ uint4 tg_smem[];
    uint4 *xs = tg_smem;
    int4 *recs = (int4 *)(tg_smem + TG_XS_BYTES / 16);
    uint4 *ring = tg_smem + TG_XS_BYTES / 16 + TG_MAX_STAGE;
    __shared__ int s_last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, q = lane & 3, gi = lane >> 2;
    const int col4 = blockIdx.x * TG_COLS + warp * 32 + gi * 4;
    const bool live = col4 < L.Npad;
    const int c_begin = blockIdx.y * cpb, c_end = min(L.n_chunks, c_begin + cpb);
    const uint64_t pol = tg_evict_first();
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    /* slot d of this thread: a at ring[(3d + 0) * 128 + tid], b at (3d + 1), scale data at (3d + 2) */
    auto slot_addr = [&](int d, int part) { return ring_s + (uint32_t)(((3 * d + part) * TG_WARPS * 32 + tid) * 16); };

    float tot[2][NT][4], cg[2][NT][4];
#pragma unroll
    for (int T = 0; T < 2; T++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) tot[T][nt][e] = cg[T][nt][e] = 0.0f;
    float S[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    uint32_t off[4] = {0u, 0u, 0u, 0u};
    int cur_g = -1;

    auto fold = [&]() {
#pragma unroll
        for (int T = 0; T < 2; T++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    tot[T][nt][e] = fmaf(S[2 * T + (e >> 1)], cg[T][nt][e], tot[T][nt][e]);
                    cg[T][nt][e] = 0.0f;
                }
    };

    bool waited = false;
    for (int s0 = c_begin; s0 < c_end; s0 += xch) {
        const int n = min(xch, c_end - s0);
        if (s0 != c_begin) __syncthreads(); /* the previous pass is done with recs and xs */
        for (int i = tid; i < n; i += blockDim.x) recs[i] = __ldg((const int4 *)L.chunks + s0 + i);
        __syncthreads();

        /* the weights do not depend on earlier kernels: start the ring and the L2 window before waiting for
         * them; the activations do */
#pragma unroll
        for (int d = 0; d < TG_DEPTH; d++) {
            if (d < n) tg_issue(L, recs[d], q, col4, live, pol, slot_addr(d, 0), slot_addr(d, 1), slot_addr(d, 2));
            tg_commit();
        }
        if (pf)
            for (int j = TG_DEPTH; j < min(n, TG_DEPTH + TG_PREFETCH); j++) tg_prefetch(L, recs[j], q, col4, live);
        if (!waited) {
            tsr_pdl_wait();
            tsr_pdl_trigger();
            waited = true;
        }
        /* stage the activations: item (chunk j, token m, quad iq) holds rows 8iq..8iq+7 of token m as hi and lo
         * fp16 fragments (row i at half 2(i%4) + i/4, the k-slot order of tg_chunk). A stage has at most 128/M
         * chunks, so a thread has at most 4 items, all loaded at once (two round trips: perm, then x). */
        {
            const int items = n * 4 * M;
            float v[4][8];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int it = tid + u * TG_WARPS * 32;
                int prow[8];
#pragma unroll
                for (int i = 0; i < 8; i++) prow[i] = -1;
                const float *xm = x;
                if (it < items) {
                    const int jj = it / (4 * M), m = (it >> 2) % M, iq = it & 3;
                    const int4 rc = recs[jj];
                    xm = x + (size_t)m * L.K;
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        if (8 * iq + i < rc.z) prow[i] = __ldg(L.perm + rc.y + 8 * iq + i);
                }
#pragma unroll
                for (int i = 0; i < 8; i++) v[u][i] = prow[i] >= 0 ? __ldg(xm + prow[i]) : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int it = tid + u * TG_WARPS * 32;
                if (it >= items) break;
                uint32_t hw[4] = {0u, 0u, 0u, 0u}, lw[4] = {0u, 0u, 0u, 0u};
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    const __half hv = __float2half_rn(v[u][i]);
                    const __half lv = __float2half_rn(v[u][i] - __half2float(hv));
                    const int hpos = 2 * (i & 3) + (i >> 2);
                    hw[hpos >> 1] |= (uint32_t)__half_as_ushort(hv) << (16 * (hpos & 1));
                    lw[hpos >> 1] |= (uint32_t)__half_as_ushort(lv) << (16 * (hpos & 1));
                }
                xs[2 * it] = make_uint4(hw[0], hw[1], hw[2], hw[3]);
                xs[2 * it + 1] = make_uint4(lw[0], lw[1], lw[2], lw[3]);
            }
        }
        __syncthreads();

        for (int j = 0; j < n; j++) {
            const int d = j % TG_DEPTH;
            tg_wait<TG_DEPTH - 1>(); /* chunk j's copies have landed (own slot: no barrier needed) */
            tg_words w;
            w.a = ring[(3 * d + 0) * TG_WARPS * 32 + tid];
            w.b = ring[(3 * d + 1) * TG_WARPS * 32 + tid];
            const uint4 sc = ring[(3 * d + 2) * TG_WARPS * 32 + tid];
            w.s = make_uint2(sc.x, sc.y);
            w.z = sc.z;
            const int grp = recs[j].w, g = grp & 0xffffff, bits = grp >> 24;
            if (g != cur_g) {
                if (cur_g >= 0) fold();
                tg_group(L, w, bits, col4, S, off);
                cur_g = g;
            }
            const uint4 *xc = xs + (size_t)j * M * 8;
            switch (bits) {
            case 2: tg_chunk<2, NT>(w, q, xc, gi, M, off, cg); break;
            case 3: tg_chunk<3, NT>(w, q, xc, gi, M, off, cg); break;
            case 4: tg_chunk<4, NT>(w, q, xc, gi, M, off, cg); break;
            case 5: tg_chunk<5, NT>(w, q, xc, gi, M, off, cg); break;
            case 6: tg_chunk<6, NT>(w, q, xc, gi, M, off, cg); break;
            default: tg_chunk<8, NT>(w, q, xc, gi, M, off, cg); break;
            }
            /* refill this slot (its contents are in registers and consumed above) and move the L2 window */
            if (j + TG_DEPTH < n)
                tg_issue(L, recs[j + TG_DEPTH], q, col4, live, pol, slot_addr(d, 0), slot_addr(d, 1), slot_addr(d, 2));
            tg_commit();
            if (pf && j + TG_DEPTH + TG_PREFETCH < n) tg_prefetch(L, recs[j + TG_DEPTH + TG_PREFETCH], q, col4, live);
        }
        tg_wait<0>();
    }
    if (!waited) { /* an empty range (cannot happen with the launcher's split) still orders after its predecessor */
        tsr_pdl_wait();
        tsr_pdl_trigger();
    }
    if (cur_g >= 0) fold();

    /* lane: columns col4 .. col4+3, tokens nt*8 + 2q and +1; column c is tile c/2, row half c%2 (c0/c2) */
    if (!partial) {
        if (live) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    const int m = nt * 8 + 2 * q + t;
                    if (m >= M) continue;
                    const float v[4] = {tot[0][nt][t], tot[0][nt][2 + t], tot[1][nt][t], tot[1][nt][2 + t]};
#pragma unroll
                    for (int c = 0; c < 4; c++)
                        if (col4 + c < L.N)
                            y[(size_t)m * L.N + col4 + c] = v[c] + (L.bias ? __half2float(L.bias[col4 + c]) : 0.0f);
                }
        }
        return;
    }
    if (live) {
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int t = 0; t < 2; t++) {
                const int m = nt * 8 + 2 * q + t;
                if (m >= M) continue;
                *(float4 *)(partial + ((size_t)blockIdx.y * M + m) * L.Npad + col4) =
                    make_float4(tot[0][nt][t], tot[0][nt][2 + t], tot[1][nt][t], tot[1][nt][2 + t]);
            }
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(&counters[blockIdx.x], 1u) == gridDim.y - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    for (int i = tid; i < M * TG_COLS; i += blockDim.x) {
        const int m = i / TG_COLS, c = blockIdx.x * TG_COLS + i % TG_COLS;
        if (c >= L.N) continue;
        float s = 0.0f;
        for (int k = 0; k < (int)gridDim.y; k++) s += __ldcg(partial + ((size_t)k * M + m) * L.Npad + c);
        y[(size_t)m * L.N + c] = s + (L.bias ? __half2float(L.bias[c]) : 0.0f);
    }
    if (tid == 0) counters[blockIdx.x] = 0u;
}

static int tg_sm_count(void)
{
    static int n = 0;
    if (!n) {
        int dev = 0;
        TSR_CUDA_CHECK(cudaGetDevice(&dev));
        TSR_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    }
    return n;
}

#define TG_SMEM (TG_XS_BYTES + TG_MAX_STAGE * 16 + 3 * TG_DEPTH * TG_WARPS * 32 * 16)

template <int NT> static void tg_launch(const tsr_linear_dev *L, const float *x, int M, float *y)
{
    static int slots = 0, pf = 1; /* blocks resident on the whole chip; L2 prefetch window on */
    if (!slots) {
        TSR_CUDA_CHECK(cudaFuncSetAttribute(tg_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, TG_SMEM));
        int per_sm = 0;
        TSR_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tg_kernel<NT>, TG_WARPS * 32, TG_SMEM));
        /* TSR_TG_WAVES=n: size the grid for n waves instead of one; TSR_TG_PREFETCH=0: no L2 window (tuning) */
        const char *w = getenv("TSR_TG_WAVES"), *p = getenv("TSR_TG_PREFETCH");
        slots = max(1, per_sm) * tg_sm_count() * (w && atoi(w) > 0 ? atoi(w) : 1);
        pf = !(p && !strcmp(p, "0"));
    }
    const int col_blocks = (int)tsr_div_up(L->Npad, TG_COLS);
    /* split K so that the grid fills the resident slots once (one wave), keeping at least 4 chunks per block and
     * at most 128 partial sums per column (their traffic stays a fraction of the weights') */
    int splits = max(1, slots / col_blocks);
    splits = min(splits, max(1, L->n_chunks / 4));
    splits = min(splits, max(1, 128 / M));
    splits = min(splits, 64);
    const int cpb = (L->n_chunks + splits - 1) / splits;
    splits = (L->n_chunks + cpb - 1) / cpb;
    const int xch = TG_MAX_STAGE / M; /* = TG_XS_BYTES / (128 * M): the staged activations fill 16 KB at most */
    float *partial = NULL;
    unsigned *counters = NULL;
    if (splits > 1) {
        partial = (float *)tsr_cuda_scratch(3, (size_t)splits * M * L->Npad * sizeof(float));
        counters = (unsigned *)tsr_cuda_scratch(4, (size_t)col_blocks * sizeof(unsigned));
    }
    tsr_launch_smem(tg_kernel<NT>, dim3(col_blocks, splits), dim3(TG_WARPS * 32), (size_t)TG_SMEM, *L, x, M, cpb, xch, pf,
                    partial, counters, y);
}

/* Runs the tensor-core GEMV when it applies (EXL2 or GPTQ, M <= 32, stored columns a multiple of 8); returns 0
 * otherwise, and the caller takes another path. */
int tsr_cuda_exl2_tc_gemv(const tsr_linear_dev *L, const float *x, int M, float *y)
{
    if (M < 1 || M > 32 || L->Npad % 8 != 0 || L->n_chunks < 1) return 0;
    if (M <= 8)
        tg_launch<1>(L, x, M, y);
    else if (M <= 16)
        tg_launch<2>(L, x, M, y);
    else
        tg_launch<4>(L, x, M, y);
    return 1;
}
