/* Kernel launches with programmatic dependent launch (PDL, sm_90): a kernel launched through tsr_launch may start
 * while the kernel before it on the stream is still running, and must call tsr_pdl_wait() in every block before it
 * reads anything that kernel wrote, before it writes any global memory (an earlier kernel may still read it), and
 * before it exits (so that its own completion still implies the predecessor's, and by induction every earlier
 * kernel's). tsr_pdl_trigger() lets the next kernel start launching. Both are no-ops where the feature is off
 * (TSR_CUDA_PDL=0, devices before sm_90) or the kernel was launched without the attribute.
 *
 * The small kernels trigger first thing (tsr_pdl_start): the next kernel launches once all of their blocks are
 * resident, so a GEMV after them (o after attention and its merge, q/k/v and gate/up after the residual pass, down
 * after silu) has its blocks on the chip and its constant weights in flight while they run; before stop 22 they
 * triggered after their wait, and a GEMV launched only once its predecessor's predecessor had finished (8B, batch
 * 1: +5 % from this alone; batch 8 about -1.5 %, not explained: kernels/cuda/NOTES.md). The GEMVs trigger after
 * their run loops: triggering at their start measured no better. A dependent launches only once its predecessor
 * is wholly resident, so waiting blocks never keep an earlier kernel's blocks off the chip.
 *
 * tsr_launch_cluster launches the same way in thread-block clusters (sm_90). In a trace build (trace.cuh) the wait
 * also notes the kernel's release and every launch here is noted while a graph is recorded. */
#ifndef TSR_CUDA_LAUNCH_CUH
#define TSR_CUDA_LAUNCH_CUH

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/trace.cuh"

extern "C" int tsr_cuda_pdl(void);

__device__ __forceinline__ void tsr_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    tsr_trace_release();
}

__device__ __forceinline__ void tsr_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The first statement of a kernel that reads nothing before its predecessor is done: trigger, then wait. */
__device__ __forceinline__ void tsr_pdl_start(void)
{
    tsr_pdl_trigger();
    tsr_pdl_wait();
}

/* cluster: blocks per cluster along x (grid.x a multiple of it), or 0 for none. */
template <typename... Params, typename... Args>
static inline void tsr_launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, unsigned cluster,
                                      Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = tsr_cuda_stream();
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    if (cluster) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster, attr[n].val.clusterDim.y = 1, attr[n].val.clusterDim.z = 1;
        n++;
    }
    if (tsr_cuda_pdl()) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    TSR_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ((Params)args)...));
    tsr_cuda_launches++;
#if TSR_CUDA_TRACE
    tsr_trace_launch((const void *)kernel, grid);
#endif
}

template <typename... Params, typename... Args>
static inline void tsr_launch_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args... args)
{
    tsr_launch_cluster(kernel, grid, block, smem, 0, args...);
}

template <typename... Params, typename... Args>
static inline void tsr_launch(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args)
{
    tsr_launch_smem(kernel, grid, block, 0, args...);
}

#endif
