/* A memory-side probe for the one-row decode GEMV (kernels/cuda/gemv.cu's frag_gemv_kernel): the same grid, warps,
 * per-warp cp.async ring and copy sizes, with no decoding, so that its time is what the weight stream alone costs
 * for a matrix of a given shape. It answers whether a launch's time at batch 1 is set by the memory side (the
 * access pattern, the bytes in flight, the ramp of a short launch) or by the warps' instructions.
 *
 * A matrix of U units (32 rows) × NCB column blocks of UB bytes each (512 at 4 bits) is read by NCB/4 × SPLIT
 * blocks of 8 warps; warp w of a block takes column blocks 4 colb + 2 (w & 1) and + 1, and a quarter (w >> 1) of
 * the block's K split. Layouts: 0 unit-major (tessera's: unit, then column block), 1 pair-major (a warp's stretch
 * contiguous), 2 banded (16 column blocks per band, units inside a band). Each launch reads a different region of a
 * 2 GiB buffer so that L2 (50 MB on the H200) holds nothing of it.
 *
 * Build and run on the GPU machine: nvcc -O3 -arch=sm_90 -o /tmp/probe scripts/stream-probe.cu && /tmp/probe */
#include "probe_check.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <vector>

__device__ __forceinline__ void cp16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

struct shape {
    int ncb, U, split, ub, layout;
};

__device__ __forceinline__ size_t offset_of(const shape &s, int u, int cb)
{
    if (s.layout == 0) return ((size_t)u * s.ncb + cb) * s.ub;
    if (s.layout == 1) return (((size_t)(cb >> 1) * s.U + u) * 2 + (cb & 1)) * s.ub;
    return ((((size_t)(cb >> 4) * s.U + u) << 4) + (cb & 15)) * s.ub;
}

/* one step = 2 units of the warp's column-block pair: 2 · 2 · UB bytes, UB / 16 copies of 16 bytes per piece */
template <int D>
__global__ void __launch_bounds__(256, 2) probe_kernel(shape s, const char *base, unsigned *out)
{
    extern __shared__ uint4 smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nb = s.ncb / 4, colb = blockIdx.x % nb, sp = blockIdx.x / nb;
    const int cb = colb * 4 + (warp & 1) * 2, wk = warp >> 1;
    const int per_split = s.U / s.split, u0 = sp * per_split + wk * (per_split / 4), n = per_split / 4;
    const int steps = n / 2, step_bytes = 4 * s.ub, per_lane = step_bytes / 16 / 32;
    char *ring = (char *)smem + warp * D * step_bytes;
    auto issue = [&](int st) {
        char *slot = ring + (st % D) * step_bytes;
        for (int i = 0; i < per_lane; i++) {
            const int e = i * 32 + lane, piece = e / (s.ub / 16), within = e % (s.ub / 16);
            const int u = u0 + 2 * st + (piece >> 1), c = cb + (piece & 1);
            cp16(slot + e * 16, base + offset_of(s, u, c) + within * 16);
        }
        commit();
    };
    for (int st = 0; st < D - 1 && st < steps; st++) issue(st);
    unsigned acc = 0;
    for (int st = 0; st < steps; st++) {
        wait_group<D - 2>();
        __syncwarp();
        acc ^= ((const unsigned *)(ring + (st % D) * step_bytes))[lane];
        __syncwarp();
        if (st + D - 1 < steps) issue(st + D - 1);
        else commit();
    }
    out[blockIdx.x * 8 + warp] = acc;
}

template <int D> static float run(const shape &s, char *buf, size_t buf_bytes, unsigned *out, int reps, bool serial)
{
    const size_t bytes = (size_t)s.U * s.ncb * s.ub, regions = buf_bytes / bytes;
    const int blocks = s.ncb / 4 * s.split, smem = 8 * D * 4 * s.ub;
    cudaFuncSetAttribute(probe_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    std::vector<float> t;
    for (int r = 0; r < (serial ? reps : 1); r++) {
        cudaEventRecord(a);
        for (int i = 0; i < (serial ? 1 : reps); i++) {
            const int k = serial ? r : i;
            probe_kernel<D><<<blocks, 256, smem>>>(s, buf + (k % regions) * bytes, out);
        }
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        t.push_back(ms * 1000.0f / (serial ? 1 : reps));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main()
{
    const size_t buf_bytes = (size_t)2 << 30;
    char *buf;
    unsigned *out;
    CHECK(cudaMalloc(&buf, buf_bytes));
    CHECK(cudaMalloc(&out, 1 << 20));
    CHECK(cudaMemset(buf, 1, buf_bytes));
    struct {
        const char *name;
        int ncb, U, split;
    } mats[] = {{"gate+up 8B (28672 x 4096)", 896, 128, 1},
                {"down 8B (4096 x 14336)", 128, 448, 8},
                {"q 8B (4096 x 4096)", 128, 128, 8},
                {"gate+up 70B (57344 x 8192)", 1792, 256, 1}};
    float (*const runs[])(const shape &, char *, size_t, unsigned *, int, bool) = {run<4>, run<6>, run<8>};
    const int rings[] = {4, 6, 8}; /* ring slots: one fewer steps in flight */
    printf("%-28s %-7s %4s %10s %10s %10s %10s\n", "matrix", "layout", "ring", "alone us", "TB/s", "b2b us", "TB/s");
    for (auto &m : mats)
        for (int layout = 0; layout < 3; layout++)
            for (int d = 0; d < 3; d++) {
                const shape s = {m.ncb, m.U, m.split, 512, layout};
                const double mb = (double)s.U * s.ncb * s.ub;
                const float alone = runs[d](s, buf, buf_bytes, out, 21, true);
                const float b2b = runs[d](s, buf, buf_bytes, out, 200, false);
                const int ring = rings[d];
                printf("%-28s %-7s %4d %10.2f %10.2f %10.2f %10.2f\n", m.name,
                       layout == 0 ? "unit" : layout == 1 ? "pair" : "band16", ring, alone, mb / alone / 1e6, b2b,
                       mb / b2b / 1e6);
            }
    CHECK(cudaGetLastError());
    return 0;
}
