/* The CUDA backend: the tsr_ops table implemented with CUDA kernels and cuBLAS, for one GPU per process.
 *
 * This header is plain C and includes no CUDA header, so the runtime and the launcher can use it; it exists only
 * in builds with a CUDA toolkit (TSR_HAVE_CUDA). tsr_cuda_init() selects the device and creates the stream and
 * cuBLAS handle; the ops table then works like the CPU one: prepare_model uploads every weight once (EXL2 and
 * GPTQ codes rewritten into the tensor-core fragment layout of exl2_frag.cuh by exl2_pack.cu, dense weights in their
 * dtype, small derived tables), alloc hands out device memory, and all kernels run on one stream. Errors from CUDA
 * inside ops are fatal to the process (they mean a bug or a lost device), reported with the file and line;
 * initialization and uploads return a tsr_status. */
#ifndef TSR_OPS_CUDA_H
#define TSR_OPS_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/ops.h"

/* Selects GPU `device` (an index) and prepares the backend; safe to call again with the same device. */
tsr_status tsr_cuda_init(int device);
/* Number of visible CUDA devices (0 when none or no driver). */
int tsr_cuda_device_count(void);
/* The CUDA operation table (tsr_cuda_init must have succeeded). */
const tsr_ops *tsr_ops_cuda(void);
/* Name and memory of the selected device, for reports. */
void tsr_cuda_describe(char *buf, size_t cap);
/* Free and total device memory in bytes. */
void tsr_cuda_memory(size_t *free_bytes, size_t *total_bytes);
/* The shared memory per block that the decode GEMV asks for at M rows (bulk: the sm_90 bulk-copy kernel; gptq: the
 * matrices' format) on a device whose blocks may opt in to smem_block bytes, and in *units_per_block the 32-row units
 * of activations one block can stage (0: the GEMV cannot run there). Needs no device (tests). */
size_t tsr_cuda_gemv_smem(int M, int bulk, int gptq, int smem_block, int *units_per_block);
/* Peak device memory allocated through the backend, in bytes. */
size_t tsr_cuda_peak_allocated(void);
/* Waits for all queued work. */
void tsr_cuda_synchronize(void);
/* Waits for queued work, then destroys every recorded decode graph (they are recorded again when next needed).
 * A communicator whose collectives those graphs captured (NCCL) may be destroyed only after this. */
void tsr_cuda_release_graphs(void);
/* Decode GEMVs so far that took activations staged ahead by the launch before them (a residual pass with a norm, or
 * silu_mul) instead of staging their own (kernels/cuda/stage_ahead.cuh), for tests and diagnostics. */
unsigned long long tsr_cuda_staged_taken(void);
/* Prefill products (the dequantize path) so far that took their input converted by the norm before them instead of
 * converting it themselves (matmul.cu, prefill's hand-off), for tests and diagnostics. */
unsigned long long tsr_cuda_dq_handoffs_taken(void);
/* Pairs of products (k and v) that the dequantize path ran as one batched product so far (matmul.cu), for tests. */
unsigned long long tsr_cuda_dq_pairs_run(void);
/* Whether EXL2 products of M rows go to the wgmma product that dequantizes in registers (gemm_dq_wgmma.cu) on this
 * device rather than the dequantize pass and cuBLAS, for matrices it can take (K up to 32768), for tests. */
int tsr_cuda_dq_wgmma_rows(int M);
/* Measures device-to-device copy bandwidth (bytes read + written per second) over `bytes`-sized buffers. */
double tsr_cuda_copy_bandwidth(size_t bytes);
/* Measures the dense fp16 tensor-core rate as prefill uses it (cuBLAS, fp16 operands and output, fp32 accumulation):
 * FLOP per second of n x n x n products, the best of five; 0 where the device has no room or cuBLAS fails. */
double tsr_cuda_gemm_rate(int n);

#ifdef __cplusplus
}
#endif

#endif
