/* Upload of quantized matrices in the fragment layout (exl2_pack.cu; the layout is described in exl2_frag.cuh). */
#ifndef TSR_CUDA_EXL2_PACK_CUH
#define TSR_CUDA_EXL2_PACK_CUH

#include "kernels/cuda/cuda_common.cuh"

extern "C" {
#include "runtime/exl2.h"
}

/* Fills d->fw, d->units, d->uperm and d->n_units from q (EXL2 or GPTQ), allocating with dev_alloc (the backend's
 * accounted allocator; the caller frees fw, units and uperm). cols (host, q->N entries, or NULL for the
 * file's order): device column j holds file column cols[j]. rows_in_order: the input arrives in stored-row order, so
 * uperm names stored rows instead of q->perm's original ones. A temporary buffer of q's packed size is held while
 * the repacking kernel runs. Returns TSR_ERR_NOMEM when device memory runs out; the device work is synchronized
 * before returning. */
tsr_status tsr_cuda_exl2_pack(const tsr_qmatrix *q, const int32_t *cols, int rows_in_order, tsr_linear_dev *d,
                              void *(*dev_alloc)(size_t));

#endif
