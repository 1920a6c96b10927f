/* The operation table: every computation of the forward pass, behind one struct of function pointers.
 *
 * runtime/forward.c calls only this table, so the forward pass is written once for every backend. The CPU table
 * (kernels/cpu/) is the reference: plain C, threaded, fp32 accumulation. Activations are fp32 row-major
 * [tokens][features] buffers in the backend's memory; weights are the views of runtime/weights.h; the KV cache
 * is runtime/kv_cache.h. No op allocates. Ops cannot fail on valid arguments (the forward validates shapes
 * before it calls them), so they return nothing. */
#ifndef TSR_OPS_H
#define TSR_OPS_H

#include "runtime/kv_cache.h"
#include "runtime/weights.h"

#include <stddef.h>
#include <stdint.h>

/* One sequence's slice of an attention call: its rows in q/out are [row0, row0 + n_tokens), at positions
 * pos0 .. pos0 + n_tokens - 1; every position up to pos0 + n_tokens - 1 is already in the KV cache. */
typedef struct tsr_attn_seq {
    int row0, n_tokens, pos0;
    const int32_t *page_table;
} tsr_attn_seq;

typedef struct tsr_attn_args {
    int n_seqs;
    const tsr_attn_seq *seqs;
    int n_heads, n_kv_heads, head_dim;
    float scale;   /* usually 1/sqrt(head_dim) */
    int window;    /* sliding window in tokens, 0 = full causal */
    int layer;
} tsr_attn_args;

typedef struct tsr_ops {
    const char *name;

    /* out[i][:] = table[ids[i]][:] (table: dense [vocab][dim]) */
    void (*embed)(const tsr_dense *table, const int32_t *ids, int n, float *out);
    /* out[r] = x[r] / rms(x[r]) * w, per row; x and out may alias */
    void (*rmsnorm)(const float *x, const tsr_dense *w, float eps, int rows, int dim, float *out);
    /* y[M][L->N] = x[M][L->K] · W + bias */
    void (*linear)(const tsr_linear *L, const float *x, int M, float *y);
    /* Rotates the first rot_dim dims of each head (half-split pairs (i, i + rot_dim/2)) of x[n][n_heads][head_dim]
     * at positions pos[i], with angles pos·inv_freq, cos/sin multiplied by attn_factor. */
    void (*rope)(float *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos, const float *inv_freq,
                 float attn_factor);
    /* Stores k and v ([n][n_kv_heads][head_dim]) as fp16 at positions pos0.. of a sequence, for one layer. */
    void (*kv_store)(tsr_kv_cache *kv, int layer, const int32_t *page_table, int pos0, int n, const float *k,
                     const float *v);
    /* out[row][n_heads][head_dim] = causal softmax(q·kᵀ·scale)·v over the cached positions (GQA). */
    void (*attention)(const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q, float *out);
    /* out = silu(gate) * up, elementwise over n */
    void (*silu_mul)(const float *gate, const float *up, size_t n, float *out);
    /* x += y over n */
    void (*add)(float *x, const float *y, size_t n);
} tsr_ops;

/* The CPU reference backend. */
const tsr_ops *tsr_ops_cpu(void);

#endif
