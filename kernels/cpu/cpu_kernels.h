/* The CPU kernels, one file per family; ops_cpu.c assembles them into the tsr_ops table. Internal to kernels/cpu. */
#ifndef TSR_CPU_KERNELS_H
#define TSR_CPU_KERNELS_H

#include "kernels/ops.h"

void tsr_cpu_linear(const tsr_linear *L, const float *x, int M, float *y);
void tsr_cpu_linear_exl2(const tsr_qmatrix *q, int N, const float *x, int M, float *y);
void tsr_cpu_linear_dense(const tsr_dense *w, const tsr_dense *bias, const float *x, int M, float *y);
void tsr_cpu_attention(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                       float *out);
void tsr_cpu_kv_store(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v);
void tsr_cpu_embed(const tsr_dense *table, const int32_t *ids, int n, float *out);
void tsr_cpu_rmsnorm(const float *x, const tsr_dense *w, float eps, int rows, int dim, float *out);
void tsr_cpu_rope(const tsr_batch_layout *b, float *x, int n_heads, int head_dim, int rot_dim);
void tsr_cpu_gather_rows(const float *x, const int32_t *index, int n, int dim, float *out);
void tsr_cpu_silu_mul(const float *gate, const float *up, size_t n, float *out);
void tsr_cpu_add(float *x, const float *y, size_t n);
void tsr_cpu_argmax_rows(const float *x, int rows, int n, int32_t *ids, float *vals);
/* ops.h top_rows, the reference for the GPU kernels' tests; not in the CPU table, whose rows are host memory
 * already (the step copies nothing to avoid). */
void tsr_cpu_top_rows(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals,
                      float *z);

#endif
