/* Weight views used by the forward pass: dense matrices and linear layers (dense or EXL2).
 *
 * Dense data is borrowed from the mmap'd safetensors files (F16, BF16 or F32), never copied. A tsr_linear
 * computes y[m][n] = sum_k x[m][k] * W[k][n] + bias[n] for n < N; dense weights are stored as HF stores them,
 * [N][K] (one row per output), EXL2 weights as packed [Q][Npadded] column streams (exl2.h). */
#ifndef TSR_WEIGHTS_H
#define TSR_WEIGHTS_H

#include "runtime/dtype.h"
#include "runtime/exl2.h"

typedef struct tsr_dense {
    tsr_dtype dtype; /* TSR_F16, TSR_BF16 or TSR_F32 */
    int rows, cols;
    const void *data; /* row-major [rows][cols], borrowed */
    const void *dev;  /* the backend's copy (NULL on the CPU backend) */
} tsr_dense;

typedef enum tsr_linear_kind { TSR_LINEAR_DENSE, TSR_LINEAR_EXL2 } tsr_linear_kind;

typedef struct tsr_linear {
    tsr_linear_kind kind;
    int K;                 /* input features */
    int N;                 /* output features produced (the padded EXL2 columns beyond N are never computed) */
    tsr_dense w;           /* dense: [N][K] */
    tsr_dense bias;        /* dense bias [1][N] (data NULL when none); EXL2 biases live in q.bias */
    tsr_qmatrix q;         /* EXL2 */
    void *dev;             /* the backend's mirror of this layer (NULL on the CPU backend) */
} tsr_linear;

/* Element i of a dense F16/BF16/F32 array as float. */
static inline float tsr_dense_get(tsr_dtype dtype, const void *data, size_t i);

#include "runtime/half.h"

static inline float tsr_dense_get(tsr_dtype dtype, const void *data, size_t i)
{
    switch (dtype) {
    case TSR_F16: return tsr_half_to_float(((const uint16_t *)data)[i]);
    case TSR_BF16: return tsr_bf16_to_float(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
    }
}

#endif
