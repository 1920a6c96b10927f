/* How fast the H100's tensor cores run the wgmma product's pattern with nothing else in the loop (stop 65: with no
 * copies, or no decode, gemm_dq_wgmma.cu's gate at 256 rows takes 52 µs for 35.7 at the paper rate). One block per
 * SM, a 256-row activation tile of zeros in shared memory (128-byte swizzle, as the product's), A registers of ones;
 * each "stage" is the product's: two units of two m64n256k16 wgmma's each. Variants:
 *   rs-unit-w1  A from registers, one commit group per unit, wait until one group is left (the product's loop)
 *   rs-unit-w0  the same, waiting for each group to finish
 *   rs-stage-w1 one commit group per stage (four wgmma's)
 *   rs-unit-w2  two register sets more: wait until two groups are left
 *   ss-unit-w1  A from shared memory too (the SS form)
 * each with two warpgroups (as the product) and with one. Prints cycles per wgmma per SM against the 128 of the
 * paper rate (2048 fp16 FMA a cycle an SM).
 * Build: nvcc -std=c++17 -O3 -arch=sm_90a -I. -o /tmp/wgmma-probe scripts/wgmma-probe.cu. Stop 65 on an H100: 128
 * cycles (970 TFLOP/s) in every variant but one warpgroup waiting for each group (82 %); cuBLAS on real data: 751-760
 * TFLOP/s (NOTES.md, stop 65). */
#include "kernels/cuda/wgmma.cuh"

#include <cstdio>
#include <cuda_fp16.h>

#define STAGES 2048

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) /* the wrappers of wgmma.cuh exist in sm_90a's device pass only */
__device__ __forceinline__ void ss256(float (&d)[128], uint64_t a, uint64_t b)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" WG_D128_TEXT
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WG_D128(d)
                 : "l"(a), "l"(b));
}
#endif

template <int V>
__global__ void __launch_bounds__(256, 1) probe(int wgs, float *sink, unsigned long long *cycles)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(smem_raw), pad = (1024 - (raw & 1023)) & 1023;
    unsigned char *smem = smem_raw + pad;
    const uint32_t base = raw + pad; /* B: 32 KB; A for SS: 8 KB per warpgroup after it */
    for (int i = threadIdx.x; i < (32768 + 16384) / 16; i += blockDim.x) ((int4 *)smem)[i] = make_int4(0, 0, 0, 0);
    __syncthreads();
    wg_fence_smem();
    const int wg = threadIdx.x / 128;
    if (wg >= wgs) return;
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.0f;
    uint32_t a[4][2][4];
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int k = 0; k < 2; k++)
#pragma unroll
            for (int r = 0; r < 4; r++) a[s][k][r] = 0x3c003c00u;
    const uint64_t d0 = wg_desc(base, 0), da = wg_desc(base + 32768 + 8192 * wg, 0);
    unsigned long long t0 = clock64();
    for (int st = 0; st < STAGES; st++) {
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const uint64_t d = d0 + (uint64_t)(u * 4);
            if (V == 2 && u == 1) { /* one group per stage: the second unit joins the first's */
                wg_mma_rs256k(acc, a[u][0], d);
                wg_mma_rs256k(acc, a[u][1], d + 2);
                wg_commit();
                wg_wait<1>();
                continue;
            }
            wg_arrive();
            if (V == 4) {
                ss256(acc, da + (uint64_t)(u * 4), d);
                ss256(acc, da + (uint64_t)(u * 4 + 2), d + 2);
            } else {
                const int set = V == 3 ? (2 * (st & 1) + u) : u;
                wg_mma_rs256k(acc, a[set][0], d);
                wg_mma_rs256k(acc, a[set][1], d + 2);
            }
            if (V == 2) continue;
            wg_commit();
            if (V == 1)
                wg_wait<0>();
            else if (V == 3)
                wg_wait<2>();
            else
                wg_wait<1>();
        }
    }
    wg_wait<0>();
    wg_keep(acc);
    unsigned long long t1 = clock64();
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 128; i++) s += acc[i];
    if (s == 12345.0f) sink[0] = s; /* never: keeps the sums alive */
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
#endif
}

template <int V> static void run(const char *name, int wgs, int sms, float *sink, unsigned long long *dcyc)
{
    const int smem = 32768 + 16384 + 1024;
    cudaFuncSetAttribute(probe<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    probe<V><<<sms, 256, smem>>>(wgs, sink, dcyc); /* warm */
    cudaEventRecord(e0);
    probe<V><<<sms, 256, smem>>>(wgs, sink, dcyc);
    cudaEventRecord(e1);
    cudaError_t err = cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    static unsigned long long cyc[1024];
    cudaMemcpy(cyc, dcyc, sizeof(unsigned long long) * sms, cudaMemcpyDeviceToHost);
    unsigned long long mx = 0;
    for (int i = 0; i < sms; i++) mx = cyc[i] > mx ? cyc[i] : mx;
    const double wgmmas = (double)STAGES * 4 * wgs; /* per SM */
    const double tflops = 2.0 * 64 * 256 * 16 * wgmmas * sms / (ms * 1e-3) / 1e12;
    printf("%-12s wgs %d  %7.1f cycles a wgmma (paper 128: %5.1f %%)  %8.3f ms  %6.1f TFLOP/s  %s\n", name, wgs,
           (double)mx / wgmmas, 100.0 * 128.0 * wgmmas / (double)mx, ms, tflops,
           err == cudaSuccess ? "" : cudaGetErrorString(err));
}

int main()
{
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float *sink;
    unsigned long long *dcyc;
    cudaMalloc(&sink, 4), cudaMalloc(&dcyc, 8 * 1024);
    for (int wgs = 2; wgs >= 1; wgs--) {
        run<0>("rs-unit-w1", wgs, sms, sink, dcyc);
        run<1>("rs-unit-w0", wgs, sms, sink, dcyc);
        run<2>("rs-stage-w1", wgs, sms, sink, dcyc);
        run<3>("rs-unit-w2", wgs, sms, sink, dcyc);
        run<4>("ss-unit-w1", wgs, sms, sink, dcyc);
    }
    return 0;
}
