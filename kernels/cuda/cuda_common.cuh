/* Shared definitions of the CUDA backend: error checks, the stream, the device mirror of a linear layer. */
#ifndef TSR_CUDA_COMMON_CUH
#define TSR_CUDA_COMMON_CUH

#include "kernels/cuda/ops_cuda.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define TSR_CUDA_CHECK(call)                                                                                           \
    do {                                                                                                               \
        cudaError_t tsr_e_ = (call);                                                                                   \
        if (tsr_e_ != cudaSuccess) tsr_cuda_fatal(__FILE__, __LINE__, cudaGetErrorString(tsr_e_));                     \
    } while (0)

#define TSR_CUDA_LAUNCHED() TSR_CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
extern "C" {
#endif
void tsr_cuda_fatal(const char *file, int line, const char *what);
cudaStream_t tsr_cuda_stream(void);
cublasHandle_t tsr_cuda_blas(void);
/* A scratch buffer of at least `bytes` bytes, reused between calls (grows only on the first large call). */
void *tsr_cuda_scratch(int slot, size_t bytes);
#ifdef __cplusplus
}
#endif

/* One 32-row (or shorter) slice of an EXL2 matrix in stored order: everything a kernel needs to decode it. */
struct tsr_exl2_chunk {
    int qrow;   /* first packed row of q_weight */
    int row0;   /* first stored row (index into perm) */
    int rows;   /* rows in the chunk, <= 32 */
    int group;  /* group index (scale row) | bits << 24 */
};

/* Device mirror of a linear layer (tsr_linear.dev). */
struct tsr_linear_dev {
    int kind;               /* TSR_LINEAR_DENSE or TSR_LINEAR_EXL2 */
    int K, N, Npad;         /* N: columns produced; Npad: stored columns (EXL2) */
    /* EXL2 */
    const uint32_t *q_weight;
    const uint32_t *q_scale;
    const float *scale_m;   /* [G] */
    const int32_t *perm;    /* [K] */
    const tsr_exl2_chunk *chunks;
    int n_chunks;
    const __half *bias;     /* [Npad] or NULL */
    /* GPTQ mode: per-(group, column) fp16 scales and 4-bit zero codes replace EXL2's scale codes and offset */
    int gptq;
    const __half *g_scales; /* [G][Npad] */
    const uint32_t *g_zeros;/* [G][Npad/8] */
    int zero_add;
    /* dense */
    const void *w;          /* [N][K] in dtype */
    int dtype;
    const void *dense_bias; /* [N] in bias_dtype or NULL */
    int bias_dtype;
};

static inline unsigned tsr_div_up(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

#endif
