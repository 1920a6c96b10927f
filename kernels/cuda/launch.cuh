/* Kernel launches with programmatic dependent launch (PDL, sm_90): a kernel launched through tsr_launch may start
 * while the kernel before it on the stream is still running, and must call tsr_pdl_wait() in every block before it
 * reads anything that kernel wrote (and before it exits, so that its own completion still implies the
 * predecessor's). tsr_pdl_trigger() lets the next kernel start launching early. Both are no-ops where the
 * feature is off (TSR_CUDA_PDL=0, devices before sm_90) or the kernel was launched without the attribute. */
#ifndef TSR_CUDA_LAUNCH_CUH
#define TSR_CUDA_LAUNCH_CUH

#include "kernels/cuda/cuda_common.cuh"

extern "C" int tsr_cuda_pdl(void);

__device__ __forceinline__ void tsr_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void tsr_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
static inline void tsr_launch_smem(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = tsr_cuda_stream();
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = tsr_cuda_pdl() ? 1 : 0;
    TSR_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, ((Params)args)...));
}

template <typename... Params, typename... Args>
static inline void tsr_launch(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args)
{
    tsr_launch_smem(kernel, grid, block, 0, args...);
}

#endif
