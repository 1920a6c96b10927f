/* Tensor-parallel shards: cutting a loaded model part down to one member's slice of every matrix.
 *
 * Member r of a group of n holds KV heads [r·nkv/n, (r+1)·nkv/n) with their query heads, MLP features [r·I/n,
 * (r+1)·I/n) and a 32-aligned range of the vocabulary. With more members than KV heads (n a multiple of nkv), member r
 * holds KV head r / (n/nkv), replicated on the n/nkv members that share it, and query heads [r·nh/n, (r+1)·nh/n) of
 * that head's group: k_proj and v_proj columns are then copied rather than split. q, k, v, gate, up and the head are
 * cut along their output columns; o_proj and down_proj along their input rows, so that each member's product is a
 * partial sum of the full one and one all-reduce after each restores it (the forward pass does that, forward.h).
 *
 * EXL2 (and GPTQ-mode) matrices are cut without dequantizing. Columns: q_weight columns, the 4-bit scale codes (or
 * GPTQ zero codes and scales) and the bias are gathered, the group table and permutation kept. Rows: the act-order
 * permutation scatters a member's input features over every group, so each group's kept rows are re-packed, in
 * stored order, into a new bit stream of the same width that starts on a word boundary; the group keeps its scale
 * row and multiplier, and the permutation is renumbered into the slice. Every weight value is therefore exactly the
 * one of the whole matrix. Re-packed groups may end inside a 32-bit word (the loader demands whole words of files,
 * the kernels read ceil(rows·bits/32) words per chunk and need no more); groups left empty are dropped. Dense
 * matrices: output slices are views into the mapped file, input slices are copies.
 *
 * Shapes that cannot be split evenly (KV heads that neither divide nor replicate evenly, MLP features not divisible by
 * n) fail with TSR_ERR_UNSUPPORTED and a message naming the dimension. All buffers belong to the model
 * (tsr_model_own). */
#ifndef TSR_PARALLEL_SHARD_H
#define TSR_PARALLEL_SHARD_H

#include "runtime/model.h"

typedef struct tsr_shard_range {
    int kv0, kv1; /* KV heads */
    int h0, h1;   /* query heads */
    int i0, i1;   /* MLP features */
    int v0, v1;   /* vocabulary columns of the head */
} tsr_shard_range;

/* Checks that cfg splits `size` ways; TSR_ERR_UNSUPPORTED with the reason otherwise. KV heads either split evenly
 * (size divides n_kv_heads) or, with more members than KV heads, replicate evenly: size a multiple of n_kv_heads
 * that divides n_heads, each KV head then held by size / n_kv_heads consecutive members that split its query heads. */
tsr_status tsr_shard_check(const tsr_model_config *cfg, int size);

/* KV heads each member holds (1 when they are replicated); tsr_shard_check must have passed. */
int tsr_shard_kv_heads(const tsr_model_config *cfg, int size);

/* Member rank's ranges (tsr_shard_check must have passed). */
void tsr_shard_range_of(const tsr_model_config *cfg, int rank, int size, tsr_shard_range *r);

/* Cuts every matrix m holds down to member rank's slice and sets m->part.tp_rank/tp_size and m->local. The model
 * must be whole in the tensor sense (tp_size 1); size 1 changes nothing. On failure the model may be half cut and
 * must be freed. */
tsr_status tsr_shard_model(tsr_model *m, int rank, int size);

/* Slicing primitives (used by tsr_shard_model, exposed for tests). dst receives a new linear layer computing
 * src's outputs [n0, n1) (columns) or src's product restricted to inputs [k0, k1) (rows; its bias only when
 * keep_bias). src is left untouched; buffers go to m. */
tsr_status tsr_slice_linear_cols(tsr_model *m, const tsr_linear *src, int n0, int n1, tsr_linear *dst);
tsr_status tsr_slice_linear_rows(tsr_model *m, const tsr_linear *src, int k0, int k1, int keep_bias, tsr_linear *dst);

#endif
