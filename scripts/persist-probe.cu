/* What a persistent batch-1 decode step could gain on the memory side (kernels/cuda/NOTES.md, "A persistent decode
 * step"): one launch of the blocks that fit on the chip streams the weight bytes of a whole 8B step (32 layers of
 * q/k/v, o, gate/up and down at 4.0 bpw, then the 6-bit head) through per-warp cp.async rings of 2 KB steps, as the
 * one-row GEMV does, with no decoding of the weights. Each op's bytes are cut evenly over every warp of the grid.
 * Modes, at each op boundary:
 *   free   no barrier: the stream alone, the ceiling of any schedule;
 *   drain  the ring drains, a grid barrier, then the next op's first steps are requested (separate launches with
 *          free launch costs and free dependencies);
 *   ahead  the next op's steps are requested before the barrier (the ring never stops), the barrier, then the
 *          op's steps are consumed;
 *   chain  ahead, and after each barrier every block waits a fixed time standing for the dependent small work
 *          between two products (norm, rope, attention, merge, silu: the H100 trace's 3 / 10 / 3 / 2 us before
 *          q/k/v / o / gate-up / down), while its requests stay in flight;
 *   chainL2 chain, and during each wait every warp asks L2 for the rest of its share of the op (bulk prefetch).
 * With --compute, each step also runs ~260 ALU instructions and 16 mma.sync per warp over its slot, about what the
 * one-row GEMV's 4-bit loop issues per step (stop 36's SASS count), so that issue and streaming compete as in the
 * real kernel. Each run reads a fresh 4.2 GB region set, so L2 holds nothing from the previous run.
 *
 * Build and run on the GPU machine:
 *   nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/persist scripts/persist-probe.cu && /tmp/persist [--compute | --trace]
 *   [--idle-fence | --release | --ll]
 * (--trace: where each op's time goes in the ahead and chain modes, per warp, from %globaltimer; the chain's wait
 * also with its threads sleeping between looks at the clock; the barrier without its fence, arrived at by a warp
 * that streams nothing, by an atomic with release semantics, and replaced by an LL exchange of a row (below).
 * --idle-fence, --release, --ll: the table's barriers so. Each block has one warp beside its WARPS streaming ones,
 * which only joins the barriers.)
 * The LL exchange (bar_kind 4) stands for a hand-off that needs no fence at all, NCCL's LL protocol: every block
 * stores its share of a LL_ROW-wide row (a norm's input) as 8-byte (value, op) pairs with plain stores into one of two
 * buffers by the op's parity, then reads the whole row, each pair again until its flag names the op. A block cannot
 * store op k + 1's pairs before it has read all of op k's, so two buffers suffice. */
#include "probe_check.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <string_view>
#include <vector>

#define WARPS      8
#define STEP_BYTES 2048
#define MAX_OPS    (32 * 4 + 1)
#define TRACE_FIELDS 4 /* per op and warp: start, first step landed, (D - 1)-th landed, end */
#define LL_ROW     4096 /* the row an LL exchange hands on (the 8B shape's hidden size) */

enum { MODE_FREE, MODE_DRAIN, MODE_AHEAD, MODE_CHAIN, MODE_CHAIN_L2 };

struct plan {
    int n_ops;
    int bar_kind; /* the grid barrier's arriving thread: 0 thread 0 (a streaming warp's) after a fence, 1 the same
                   * without the fence, 2 a thread of a warp that streams nothing (the block's extra warp) after a
                   * fence, 3 thread 0 by an atomic with release semantics (no separate fence); 4 no barrier but an
                   * LL exchange of a row */
    unsigned long long step0[MAX_OPS + 1]; /* op k's steps are [step0[k], step0[k + 1]) of the whole stream */
    unsigned chain_ns[MAX_OPS];            /* MODE_CHAIN: the wait after op k's barrier */
    int sleep;                             /* the wait in __nanosleep steps instead of a spin */
};

__device__ __forceinline__ void cp16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ unsigned long long gtime()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

/* A grid barrier over a counter that only grows (as mlp_decode.cu's): the n-th arrival waits for the round's last.
 * The arriving thread per kind (plan.bar_kind): does a fence in a warp whose copies are in flight wait for them? */
__device__ __forceinline__ void grid_sync(unsigned long long *bar, int kind)
{
    __syncthreads();
    if (threadIdx.x == (kind == 2 ? WARPS * 32 : 0)) {
        if (kind == 0 || kind == 2) __threadfence();
        unsigned long long old;
        if (kind == 3)
            asm volatile("atom.add.release.gpu.u64 %0, [%1], 1;" : "=l"(old) : "l"(bar) : "memory");
        else
            old = atomicAdd(bar, 1ull);
        const unsigned long long n = gridDim.x, target = (old / n + 1) * n;
        unsigned long long now;
        do
            asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(now) : "l"(bar) : "memory");
        while (now < target);
    }
    __syncthreads();
}

/* bar_kind 4: the block's share of op k's row stored as (value, k) pairs, then the whole row read until every pair's
 * flag is k (plain 8-byte stores and loads, no fence); the values' sum goes to *sink so that nothing is left out. */
__device__ __forceinline__ void ll_exchange(unsigned long long *ll, int k, float *sink)
{
    __syncthreads(); /* the block's values are ready (in the real step: its part of the row) */
    unsigned long long *row = ll + (size_t)(k & 1) * LL_ROW;
    const int per = (LL_ROW + (int)gridDim.x - 1) / (int)gridDim.x;
    for (int i = threadIdx.x; i < per; i += blockDim.x) {
        const int at = (int)blockIdx.x * per + i;
        if (at < LL_ROW) {
            const unsigned long long v = ((unsigned long long)(unsigned)k << 32) | (unsigned)at;
            asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(row + at), "l"(v) : "memory");
        }
    }
    float sum = 0.0f;
    for (int i = threadIdx.x; i < LL_ROW; i += blockDim.x) {
        unsigned long long v;
        do
            asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(row + i) : "memory");
        while ((unsigned)(v >> 32) != (unsigned)k);
        sum += (float)(unsigned)v;
    }
    if (sum < 0.0f) *sink = sum; /* never: the values are indices */
    __syncthreads();
}

/* The boundary before op k: the grid barrier, or with bar_kind 4 the LL exchange */
__device__ __forceinline__ void boundary(unsigned long long *bar, unsigned long long *ll, int kind, int k, float *sink)
{
    if (kind == 4)
        ll_exchange(ll, k, sink);
    else
        grid_sync(bar, kind);
}

/* The stand-in for a step's decode: the lane's 64 bytes of the slot through ~260 LOP3/HFMA2 and 16 mma.sync. */
__device__ __forceinline__ void work(const uint32_t *slot, int lane, float (&acc)[4])
{
    const uint4 a = ((const uint4 *)slot)[lane], b = ((const uint4 *)slot)[lane + 32];
    const uint4 c = ((const uint4 *)slot)[lane + 64], d = ((const uint4 *)slot)[lane + 96];
    uint32_t w[16] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
    const __half2 s = __float2half2_rn(0.01f), z = __float2half2_rn(-8.0f);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        uint32_t r[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t f;
            asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(f) : "r"(w[i] >> (4 * k)), "r"(0x000f000fu), "r"(0x64006400u));
            __half2 h = __hfma2(*(__half2 *)&f, s, z);
            r[k] = *(uint32_t *)&h;
        }
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                     : "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]), "r"(r[0]), "r"(r[1]));
    }
}

template <int D, bool COMPUTE>
__global__ void __launch_bounds__(WARPS * 32 + 32, 2) persist_kernel(plan p, int mode, const char *base,
                                                                 unsigned long long *bar, float *out,
                                                                 unsigned long long *trace, unsigned long long *ll)
{
    extern __shared__ uint4 smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp == WARPS) { /* the extra warp streams nothing: it only joins the barriers (arriving for bar_kind 2) */
        for (int k = 1; k < p.n_ops && mode != MODE_FREE; k++) boundary(bar, ll, p.bar_kind, k, out);
        return;
    }
    const unsigned long long W = (unsigned long long)gridDim.x * WARPS, w = blockIdx.x * WARPS + warp;
    char *ring = (char *)smem + warp * D * STEP_BYTES;
    /* the warp's steps of op k: [lo, hi) of the stream (32-bit products: an op has < 2^19 steps, a grid < 2^13
     * warps; a 64-bit division per issued step cost ~0.5 us at an op's start in the first version) */
    auto cut = [&](int k, unsigned v) {
        return p.step0[k] + (unsigned long long)((unsigned)(p.step0[k + 1] - p.step0[k]) * v / (unsigned)W);
    };
    auto lo_of = [&](int k) { return cut(k, (unsigned)w); };
    auto hi_of = [&](int k) { return cut(k, (unsigned)w + 1); };
    float acc[4] = {0, 0, 0, 0};
    unsigned sink = 0;
    /* the warp's own list of steps over all ops is walked by (op, index); `issue` requests the j-th step ahead */
    int iop = 0;
    unsigned long long inext = lo_of(0), ihi = hi_of(0);
    unsigned long long issued = 0, consumed = 0; /* ring slots go by the warp's own count of steps */
    auto issue_one = [&](bool cross) {
        while (iop < p.n_ops && inext >= ihi) {
            if (!cross) return false;
            iop++;
            if (iop < p.n_ops) inext = lo_of(iop), ihi = hi_of(iop);
        }
        if (iop >= p.n_ops) return false;
        char *slot = ring + (issued++ % D) * STEP_BYTES;
        const char *src = base + inext * STEP_BYTES;
#pragma unroll
        for (int i = 0; i < STEP_BYTES / 16 / 32; i++) cp16(slot + (i * 32 + lane) * 16, src + (i * 32 + lane) * 16);
        inext++;
        return true;
    };
    const bool cross = mode != MODE_DRAIN;
    for (int k = 0; k < p.n_ops; k++) {
        if (k > 0 && mode != MODE_FREE) {
            boundary(bar, ll, p.bar_kind, k, out);
            if (mode == MODE_CHAIN_L2 && lane == 0) /* the op's steps past the ring asked of L2 during the wait */
                for (unsigned long long st = lo_of(k) + D; st < hi_of(k); st++)
                    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + st * STEP_BYTES),
                                 "r"(STEP_BYTES)
                                 : "memory");
            if (mode >= MODE_CHAIN && p.chain_ns[k]) { /* --sleep: the threads sleep between their looks */
                const unsigned long long t0 = gtime();
                while (gtime() - t0 < p.chain_ns[k])
                    if (p.sleep) __nanosleep(500);
            }
        }
        if (!cross) { /* the op's prologue */
            iop = k, inext = lo_of(k), ihi = hi_of(k);
            for (int s = 0; s < D - 1; s++) {
                issue_one(false);
                commit();
            }
        } else if (k == 0) {
            for (int s = 0; s < D - 1; s++) {
                issue_one(true);
                commit();
            }
        }
        /* --trace: per warp and op, the global time at the op's start (after its barrier and wait), when its
         * first step and its (D - 1)-th (the last one requested before the start) had landed, and at its end */
        const unsigned long long lo = lo_of(k), hi = hi_of(k);
        unsigned long long *tr = trace ? trace + ((size_t)k * W + w) * TRACE_FIELDS : nullptr;
        if (tr && lane == 0) tr[0] = tr[1] = tr[2] = gtime();
        for (unsigned long long st = lo; st < hi; st++) {
            wait_group<D - 2>();
            __syncwarp();
            if (tr && lane == 0 && (st == lo || st == lo + D - 2)) tr[st == lo ? 1 : 2] = gtime();
            const uint32_t *slot = (const uint32_t *)(ring + (consumed++ % D) * STEP_BYTES);
            if (COMPUTE)
                work(slot, lane, acc);
            else
                sink ^= slot[lane];
            __syncwarp();
            issue_one(cross);
            commit();
        }
        if (!cross) {
            wait_group<0>();
            __syncwarp();
        }
        if (tr && lane == 0) tr[3] = gtime();
    }
    wait_group<0>();
    out[blockIdx.x * WARPS * 32 + threadIdx.x] = acc[0] + acc[1] + acc[2] + acc[3] + (float)(sink & 1);
}

template <int D, bool COMPUTE>
static int run(const plan &p, int mode, char *buf, size_t region, int regions, unsigned long long *bar,
               unsigned long long *ll, float *out, int sms, float *us, unsigned long long *trace = nullptr)
{
    const int smem = WARPS * D * STEP_BYTES;
    CHECK(cudaFuncSetAttribute(persist_kernel<D, COMPUTE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persist_kernel<D, COMPUTE>, WARPS * 32 + 32, smem));
    const int blocks = sms * std::min(per_sm, 2);
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> t;
    for (int r = 0; r < 7; r++) {
        CHECK(cudaMemset(bar, 0, sizeof *bar)); /* the barrier assumes a count that is a multiple of the grid */
        CHECK(cudaMemset(ll, 0, 2 * LL_ROW * sizeof *ll)); /* flags 0: no op's */
        CHECK(cudaEventRecord(a));
        persist_kernel<D, COMPUTE><<<blocks, WARPS * 32 + 32, smem>>>(p, mode, buf + (r % regions) * region, bar, out,
                                                                          trace, ll);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms * 1000.0f);
    }
    std::sort(t.begin(), t.end());
    *us = t[t.size() / 2];
    return 0;
}

int main(int argc, char **argv)
{
    bool compute_only = false, trace_asked = false, idle_fence = false, release = false, ll_asked = false;
    for (int i = 1; i < argc; i++) {
        const std::string_view a = argv[i];
        compute_only |= a == "--compute", trace_asked |= a == "--trace", idle_fence |= a == "--idle-fence";
        release |= a == "--release", ll_asked |= a == "--ll";
    }
    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    /* the 8B step at 4.0 bpw: q/k/v 4096 x 6144, o 4096 x 4096, gate/up 4096 x 28672, down 14336 x 4096; head 6 bpw */
    plan p = {};
    const double op_bytes[4] = {4096.0 * 6144 / 2, 4096.0 * 4096 / 2, 4096.0 * 28672 / 2, 14336.0 * 4096 / 2};
    const unsigned chain[4] = {3000, 10000, 3000, 2000};
    unsigned long long s = 0;
    for (int l = 0; l < 32; l++)
        for (int k = 0; k < 4; k++) {
            p.step0[p.n_ops] = s, p.chain_ns[p.n_ops] = chain[k];
            s += (unsigned long long)(op_bytes[k] / STEP_BYTES);
            p.n_ops++;
        }
    p.step0[p.n_ops] = s, p.chain_ns[p.n_ops] = 0;
    s += (unsigned long long)(128256.0 * 4096 * 6 / 8 / STEP_BYTES);
    p.n_ops++;
    p.step0[p.n_ops] = s;
    const size_t region = s * STEP_BYTES;
    const int regions = 3;
    char *buf;
    unsigned long long *bar, *ll;
    float *out;
    CHECK(cudaMalloc(&buf, region * regions));
    CHECK(cudaMemset(buf, 1, region * regions));
    CHECK(cudaMalloc(&bar, sizeof *bar));
    CHECK(cudaMemset(bar, 0, sizeof *bar));
    CHECK(cudaMalloc(&ll, 2 * LL_ROW * sizeof *ll));
    CHECK(cudaMalloc(&out, (size_t)sms * 2 * WARPS * 32 * sizeof(float)));
    /* the copy rate, read + write counted, as tessera bench measures it */
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int r = 0; r < 5; r++) {
        CHECK(cudaEventRecord(a));
        CHECK(cudaMemcpyAsync(buf + region, buf, (size_t)1 << 30, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        best = std::min(best, ms);
    }
    const double copy = 2.0 * (1 << 30) / (best * 1e-3) / 1e12;
    printf("copy %.3f TB/s; step bytes %.3f GB; %d SMs\n", copy, region / 1e9, sms);
    if (trace_asked) { /* where the time of an op goes, ring 4, no compute */
        const size_t W = (size_t)sms * 2 * WARPS, n = (size_t)p.n_ops * W * TRACE_FIELDS;
        unsigned long long *trace;
        CHECK(cudaMalloc(&trace, n * sizeof *trace));
        std::vector<unsigned long long> h(n);
        const char *ops[4] = {"q/k/v", "o", "gate/up", "down"};
        printf("per op, mean over layers 1-31 (us): gap from the previous op's last warp to this op's first start; per "
               "warp (mean) its first step landed, its 3rd (the last requested before the op; 0 for a warp with fewer) "
               "landed, the op done; "
               "the op's span from its first start to its last end\n");
        /* (mode, sleeping wait, barrier kind): stop 60's four, then the barrier without its fence and with its fence
         * in a warp that streams nothing (stop 62's question: does the fence wait for the warp's copies?) */
        const int modes[10] = {MODE_AHEAD, MODE_CHAIN, MODE_CHAIN, MODE_CHAIN_L2, MODE_AHEAD,
                               MODE_AHEAD, MODE_CHAIN, MODE_AHEAD,    MODE_AHEAD,    MODE_CHAIN};
        const int sleeps[10] = {0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, kinds[10] = {0, 0, 0, 0, 1, 2, 2, 3, 4, 4};
        const char *names[10] = {"ahead",           "chain", "chain, sleeping", "chainL2", "ahead, no fence",
                                 "ahead, fence by an idle warp", "chain, fence by an idle warp",
                                 "ahead, a releasing atomic", "ahead, an LL exchange", "chain, an LL exchange"};
        for (int v = 0; v < 10; v++) {
            float us = 0;
            p.sleep = sleeps[v], p.bar_kind = kinds[v];
            if (run<4, false>(p, modes[v], buf, region, regions, bar, ll, out, sms, &us, trace)) return 1;
            CHECK(cudaMemcpy(h.data(), trace, n * sizeof *trace, cudaMemcpyDeviceToHost));
            printf("%s, ring 4, %.1f us a step\n", names[v], us);
            for (int t = 0; t < 4; t++) {
                double gap = 0, first = 0, third = 0, done = 0, span = 0;
                const int layers = 31;
                for (int l = 1; l <= layers; l++) {
                    const int k = 4 * l + t;
                    unsigned long long prev_end = 0, s_min = ~0ull, e_max = 0;
                    double f = 0, r = 0, d = 0;
                    for (size_t w = 0; w < W; w++) {
                        const unsigned long long *e = &h[((size_t)k * W + w) * TRACE_FIELDS];
                        const unsigned long long *q = &h[((size_t)(k - 1) * W + w) * TRACE_FIELDS];
                        prev_end = std::max(prev_end, q[3]);
                        s_min = std::min(s_min, e[0]), e_max = std::max(e_max, e[3]);
                        f += (double)(e[1] - e[0]), r += (double)(e[2] - e[0]), d += (double)(e[3] - e[0]);
                    }
                    gap += (double)s_min - (double)prev_end, span += (double)(e_max - s_min);
                    first += f / W, third += r / W, done += d / W;
                }
                printf("  %-8s gap %6.2f  first %6.2f  3rd %6.2f  done %6.2f  span %6.2f\n", ops[t],
                       gap / layers / 1e3, first / layers / 1e3, third / layers / 1e3, done / layers / 1e3,
                       span / layers / 1e3);
            }
        }
        p.sleep = 0, p.bar_kind = 0;
        return 0;
    }
    printf("%-6s %-7s %4s %10s %8s %8s %10s\n", "mode", "compute", "ring", "us/step", "TB/s", "% copy", "us/layer");
    const char *names[] = {"free", "drain", "ahead", "chain", "chainL2"};
    p.bar_kind = idle_fence ? 2 : release ? 3 : ll_asked ? 4 : 0;
    printf("op boundaries: %s\n", idle_fence ? "grid barriers arrived at by a warp that streams nothing, after a fence"
                                   : release  ? "grid barriers arrived at by thread 0, by a releasing atomic"
                                   : ll_asked ? "an LL exchange of a row, no barrier"
                                              : "grid barriers arrived at by thread 0, after a fence");
    for (int c = compute_only ? 1 : 0; c < 2; c++)
        for (int mode = 0; mode < 5; mode++)
            for (int d : {4, 6}) {
                float us = 0;
                int rc = c ? (d == 4 ? run<4, true>(p, mode, buf, region, regions, bar, ll, out, sms, &us)
                                     : run<6, true>(p, mode, buf, region, regions, bar, ll, out, sms, &us))
                           : (d == 4 ? run<4, false>(p, mode, buf, region, regions, bar, ll, out, sms, &us)
                                     : run<6, false>(p, mode, buf, region, regions, bar, ll, out, sms, &us));
                if (rc) return rc;
                const double tbs = region / (us * 1e-6) / 1e12;
                printf("%-6s %-7s %4d %10.1f %8.3f %7.1f%% %10.2f\n", names[mode], c ? "yes" : "no", d, us, tbs,
                       100.0 * tbs / copy, us / 32.0);
            }
    CHECK(cudaGetLastError());
    return 0;
}
