/* A latency probe for the batch-1 decode step's chain of dependent kernels: what one dependency costs on this GPU
 * when nothing else does, measured three ways, so that a layer's fixed cost (stop 42: the attention half of an 8B
 * layer takes ~30 µs for 23 MB of weights, ~7 dependent launches) can be split into the boundaries themselves and
 * the work after them.
 *
 *   chain   N kernels in a row, each waiting for the one before (griddepcontrol.wait under programmatic dependent
 *           launch, or plain stream order), a CUDA graph replayed; each kernel's first block adds one to a counter
 *           the previous kernel wrote, so every boundary carries a real dependency. Grids of 1 to 528 blocks.
 *   barrier one persistent kernel of one or two blocks per SM crossing N grid-wide barriers (a count that only
 *           grows, one atomic per block, polled with ld.acquire), the same dependency between phases.
 *   l2trip  one block doing N dependent L2 round trips (a pointer chase through global memory): the floor of the
 *           "read what the previous phase wrote" step.
 *
 * Build and run on the GPU machine: nvcc -O3 -arch=sm_90 -o /tmp/chain scripts/chain-probe.cu && /tmp/chain */
#include "probe_check.cuh"

#include <cuda_runtime.h>

#include <stdio.h>

#define N_LINKS 224 /* 7 dependent launches per layer × 32 layers */

__global__ void link_kernel(int *counter, int i, int pdl)
{
    if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        const int v = *(volatile int *)(counter + i);
        counter[i + 1] = v + 1;
    }
}

__global__ void barrier_kernel(unsigned *count, int *data, int n)
{
    const unsigned blocks = gridDim.x;
    for (int i = 0; i < n; i++) {
        if (blockIdx.x == 0 && threadIdx.x == 0) data[i + 1] = data[i] + 1; /* phase i's work */
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(count, 1u);
            const unsigned target = blocks * (unsigned)(i + 1);
            unsigned seen;
            do {
                asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(seen) : "l"(count));
            } while (seen < target);
        }
        __syncthreads();
    }
}

__global__ void chase_kernel(const int *next, int n, int *out)
{
    int p = 0;
    for (int i = 0; i < n; i++) p = *(volatile const int *)(next + p);
    *out = p;
}

static float replay_ms(cudaGraphExec_t exec, cudaStream_t s, int reps)
{
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaGraphLaunch(exec, s); /* warm */
    cudaEventRecord(a, s);
    for (int r = 0; r < reps; r++) cudaGraphLaunch(exec, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    return ms / reps;
}

int main(void)
{
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int *counter;
    CHECK(cudaMalloc(&counter, (N_LINKS + 2) * sizeof(int)));
    CHECK(cudaMemset(counter, 0, (N_LINKS + 2) * sizeof(int)));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("chain: %d dependent kernels per graph, us per link\n", N_LINKS);
    printf("%8s %8s %10s %10s\n", "blocks", "threads", "pdl", "plain");
    const int grids[] = {1, sms, 2 * sms, 4 * sms};
    for (int g : grids) {
        float us[2];
        for (int pdl = 1; pdl >= 0; pdl--) {
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            for (int i = 0; i < N_LINKS; i++) {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(g);
                cfg.blockDim = dim3(256);
                cfg.stream = s;
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = attr;
                cfg.numAttrs = pdl;
                CHECK(cudaLaunchKernelEx(&cfg, link_kernel, counter, i, pdl));
            }
            CHECK(cudaStreamEndCapture(s, &graph));
            CHECK(cudaGraphInstantiate(&exec, graph, 0));
            us[pdl] = replay_ms(exec, s, 50) * 1000.0f / N_LINKS;
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
        }
        printf("%8d %8d %10.2f %10.2f\n", g, 256, us[1], us[0]);
    }
    CHECK(cudaGetLastError());

    unsigned *count;
    int *data;
    CHECK(cudaMalloc(&count, sizeof(unsigned)));
    CHECK(cudaMalloc(&data, (N_LINKS + 2) * sizeof(int)));
    printf("barrier: one persistent kernel, %d grid-wide barriers, us per barrier\n", N_LINKS);
    for (int per_sm = 1; per_sm <= 2; per_sm++) {
        CHECK(cudaMemset(count, 0, sizeof(unsigned)));
        CHECK(cudaMemset(data, 0, (N_LINKS + 2) * sizeof(int)));
        barrier_kernel<<<sms * per_sm, 256, 0, s>>>(count, data, N_LINKS); /* warm */
        CHECK(cudaStreamSynchronize(s));
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        const int reps = 20;
        float total = 0.0f;
        for (int r = 0; r < reps; r++) {
            CHECK(cudaMemsetAsync(count, 0, sizeof(unsigned), s));
            cudaEventRecord(a, s);
            barrier_kernel<<<sms * per_sm, 256, 0, s>>>(count, data, N_LINKS);
            cudaEventRecord(b, s);
            CHECK(cudaEventSynchronize(b));
            float ms;
            cudaEventElapsedTime(&ms, a, b);
            total += ms;
        }
        printf("%8d blocks: %.2f us per barrier\n", sms * per_sm, total / reps * 1000.0f / N_LINKS);
    }

    /* a pointer chase over 64 MB (past L2 for the first touch, then from L2) */
    const int n_el = 16 << 20, hops = 4096;
    int *next, *out;
    CHECK(cudaMalloc(&next, n_el * sizeof(int)));
    CHECK(cudaMalloc(&out, sizeof(int)));
    {
        int *h = (int *)malloc(n_el * sizeof(int));
        const int stride = 4099 * 32; /* 512 KB apart, wrapping */
        for (int i = 0; i < n_el; i++) h[i] = (int)(((long)i + stride) % n_el);
        CHECK(cudaMemcpy(next, h, n_el * sizeof(int), cudaMemcpyHostToDevice));
        free(h);
    }
    for (int pass = 0; pass < 2; pass++) {
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        cudaEventRecord(a, s);
        chase_kernel<<<1, 1, 0, s>>>(next, hops, out);
        cudaEventRecord(b, s);
        CHECK(cudaEventSynchronize(b));
        float ms;
        cudaEventElapsedTime(&ms, a, b);
        printf("l2trip %s: %.0f ns per dependent load (%d hops)\n", pass ? "warm (L2)" : "cold (DRAM)",
               ms * 1e6f / hops, hops);
    }
    return 0;
}
