/* GPTQ quantized linear layers (4-bit) on the CPU path.
 *
 * A GPTQ checkpoint (AutoGPTQ / GPTQModel layout, EXL2.md §8) stores, per linear layer `P`, `P.qweight` (I32
 * [K/8, N]: original row k of column n in bits 4(k%8)..+3 of word [k/8][n]), `P.qzeros` (I32 [G, N/8]: the zero
 * code of (group g, column n) in nibble n%8 of word [g][n/8]), `P.scales` (F16, or F32 rounded to F16, [G, N]),
 * optionally `P.g_idx` (I32 [K], the group of each original row) and `P.bias` (F16 [N]). A weight is
 * W[k][n] = (q(k,n) − zero(g,n)) · scales[g][n] with g the group of row k; v1 checkpoints ("gptq", the common
 * format) store zero − 1, so zero = code + 1, and "gptq_v2" stores the exact zero. The group of row k is g_idx[k]
 * when g_idx is present and not all zeros, else k / group_size (group_size from the quantization config, else, as
 * ExLlamaV2 derives it, the smallest power of two with group_size · G ≥ K).
 *
 * tsr_gptq_load() binds such a layer to a tsr_qmatrix in GPTQ mode (exl2.h), so that the one CPU kernel
 * (kernels/cpu/matmul_exl2.c) and tsr_qmatrix_dequant_ref / _bytes / _bpw serve both formats. A qweight column
 * already is a 4-bit EXL2-style bit stream, so for sequential groups the packed data is borrowed from the mapping
 * untouched; with act-order (rows of one group scattered over K) the rows are stably sorted by group, `perm`
 * records the order (stored row i = original row perm[i]; the kernel gathers the activation through it, like
 * EXL2's q_perm) and the 4-bit codes are re-packed in that order into an owned buffer (K·N/2 bytes), each group
 * starting on a fresh word. That is the only copy: no dequantized matrix is ever materialized.
 *
 * Ownership: the qmatrix borrows qweight (when not re-packed), qzeros, scales and bias from the tensor set, which
 * must outlive it; it owns perm, the group table and the re-packed weights, released by tsr_qmatrix_free().
 *
 * Errors: TSR_ERR_UNSUPPORTED for bits other than 4 (from the config, or evident from qweight's shape);
 * TSR_ERR_MISSING when a required tensor is absent (qweight, qzeros, scales; bias when has_bias);
 * TSR_ERR_FORMAT, naming the file and tensor, for a wrong dtype or shape, K or N not a multiple of 8, a group
 * count that does not match K and the group size, a g_idx entry outside [0, G) or a group holding more rows than
 * the group size; TSR_ERR_NOMEM. On failure *out is left empty (nothing to free). */
#ifndef TSR_GPTQ_H
#define TSR_GPTQ_H

#include "runtime/config.h"
#include "runtime/exl2.h"
#include "runtime/safetensors.h"
#include "runtime/status.h"

/* Loads the GPTQ linear layer `key` (`key.qweight` ...) with K inputs and N outputs. qc: the model's quantization
 * settings (bits, group_size, checkpoint_format); NULL or a non-GPTQ method means 4-bit v1 with the group size
 * derived from the tensors. A bias is applied when `key.bias` exists; has_bias makes it required. */
tsr_status tsr_gptq_load(const tsr_st_set *set, const char *key, int K, int N, int has_bias,
                         const tsr_quant_config *qc, tsr_qmatrix *out);

#endif
