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

/* After a kernel launch (or a cuBLAS call): counts it (tsr_cuda_launches) and checks the launch. */
#define TSR_CUDA_LAUNCHED()                                                                                            \
    do {                                                                                                               \
        tsr_cuda_launches++;                                                                                           \
        TSR_CUDA_CHECK(cudaGetLastError());                                                                            \
    } while (0)

/* Kernels and cuBLAS calls issued so far (tsr_launch and TSR_CUDA_LAUNCHED count them): activations staged ahead
 * for a GEMV are taken only while no launch came after the one that wrote them (stage_ahead.cuh; backend.cu). */
extern unsigned long long tsr_cuda_launches;

#ifdef __cplusplus
extern "C" {
#endif
void tsr_cuda_fatal(const char *file, int line, const char *what);
cudaStream_t tsr_cuda_stream(void);
cublasHandle_t tsr_cuda_blas(void);
/* A scratch buffer of at least `bytes` bytes, reused between calls (grows only on the first large call). */
void *tsr_cuda_scratch(int slot, size_t bytes);
/* The same, or NULL (the slot left empty) where the device has no room for it; never while a graph is recorded. */
void *tsr_cuda_scratch_try(int slot, size_t bytes);
#ifdef __cplusplus
}
#endif

/* Device mirror of a linear layer (tsr_linear.dev). */
struct tsr_linear_dev {
    int kind;               /* TSR_LINEAR_DENSE or TSR_LINEAR_EXL2 */
    int K, N, Npad;         /* N: columns produced; Npad: stored columns (EXL2), a multiple of 32 */
    /* EXL2 and GPTQ: codes in fragment order (exl2_frag.cuh) */
    const uint32_t *fw;     /* packed words */
    const uint2 *units;     /* [n_units]: {first word, group | bits << 24} of each 32-row unit */
    const int32_t *uperm;   /* [32 n_units]: original input row of each unit row, -1 for padding */
    int n_units;            /* Kp = 32 n_units rows in unit order */
    int n_groups;           /* G: the groups of the scale codes (or GPTQ's scales), in unit order (0 where unknown) */
    int uperm_identity;     /* 1: uperm[k] = k for all k < Kp = K (unit order is input order, no padding rows) */
    const int32_t *uinv;    /* [K]: the unit row of each input row, for a matrix whose producer scatters its staged
                             * activations (o, after the attention merge: stage_ahead.cuh); NULL elsewhere */
    const uint32_t *q_scale;/* [G][Npad/8] 4-bit scale codes (EXL2) */
    const float *s_table;   /* [G][16]: EXL2 column scale of each scale code, h((code + 1)^2 · scale_m) (fp16 values
                             * held as fp32, so that a lookup needs no conversion) */
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
