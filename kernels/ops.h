/* The operation table: every computation of the forward pass, behind one struct of function pointers.
 *
 * runtime/forward.c calls only this table, so the forward pass is written once for every backend. The CPU table
 * (kernels/cpu/) is the reference: plain C, threaded, fp32 accumulation; the CUDA table (kernels/cuda/) is the
 * fast path. Activations are fp32 row-major [rows][features] buffers in the backend's memory (alloc/release);
 * weights are the views of runtime/weights.h, which a backend may mirror into its own memory in prepare_model
 * (handles in tsr_dense.dev / tsr_linear.dev); the KV cache is runtime/kv_cache.h with storage from alloc.
 * Ops do not allocate and cannot fail on valid arguments (the forward validates a batch before it calls them). */
#ifndef TSR_OPS_H
#define TSR_OPS_H

#include "runtime/kv_cache.h"
#include "runtime/status.h"
#include "runtime/weights.h"

#include <stddef.h>
#include <stdint.h>

struct tsr_model;

/* Where each row of a batch belongs, in backend memory. Rows of one sequence are consecutive, at consecutive
 * positions; when a call runs, every position up to a row's own is already in the KV cache. */
typedef struct tsr_batch_layout {
    int n_seqs, n_rows, max_pages;
    int max_position;           /* largest position of any row (host value, for launch sizing) */
    const int32_t *row_seq;     /* [n_rows] sequence of each row */
    const int32_t *positions;   /* [n_rows] position of each row */
    const int32_t *seq_row0;    /* [n_seqs + 1] first row of each sequence; seq_row0[n_seqs] = n_rows */
    const int32_t *page_tables; /* [n_seqs][max_pages] */
    const float *inv_freq;      /* [n_seqs][rot_dim / 2] RoPE frequencies (per sequence: dynamic NTK) */
    const float *attn_factor;   /* [n_seqs] multiplies cos and sin (YaRN) */
    double attended;            /* Σ over rows of position + 1: the positions all rows attend to together (host
                                   value, for choosing kernels; 0 where not known) */
    const int32_t *host_seq_row0;  /* host mirrors of seq_row0 and positions, for choosing kernels (NULL where not */
    const int32_t *host_positions; /* known); valid for the call */
} tsr_batch_layout;

typedef struct tsr_attn_args {
    int n_heads, n_kv_heads, head_dim;
    float scale;   /* usually 1/sqrt(head_dim) */
    int window;    /* sliding window in tokens, 0 = full causal */
    int layer;
    /* The matrix that reads `out` next (the attention output projection), or NULL. A backend may prepare that
     * product's input while it writes out (CUDA: the merge stages o's decode GEMV activations, stage_ahead.cuh). */
    const tsr_linear *reader;
} tsr_attn_args;

typedef struct tsr_ops {
    const char *name;

    /* ---- memory ---- */
    void *(*alloc)(size_t bytes); /* zero-filled backend memory, NULL on failure */
    void (*release)(void *p);
    void (*to_device)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    /* Runs fn(ctx), which only issues ops (no host synchronization, no allocation). With key != 0 a backend may
     * record the work the first times it sees the key and replay the recording afterwards (CUDA graphs): every
     * call with the same key must then issue the same ops with the same arguments. CPU: calls fn. */
    void (*run_cached)(uint64_t key, void (*fn)(void *ctx), void *ctx);
    /* Free backend memory in bytes, for sizing the KV pool (0 when the backend cannot tell: the CPU). */
    size_t (*memory_free)(void);
    /* Mirrors the model's weights into backend memory (CPU: nothing to do). */
    tsr_status (*prepare_model)(struct tsr_model *m);
    void (*release_model)(struct tsr_model *m);

    /* ---- compute ---- */
    /* out[i][:] = table[ids[i]][:] (table: dense [vocab][dim]) */
    void (*embed)(const tsr_dense *table, const int32_t *ids, int n, float *out);
    /* out[r] = x[r] / rms(x[r]) * w, per row; x and out may alias */
    void (*rmsnorm)(const float *x, const tsr_dense *w, float eps, int rows, int dim, float *out);
    /* y[M][L->N] = x[M][L->K] · W + bias */
    void (*linear)(const tsr_linear *L, const float *x, int M, float *y);
    /* Rotates the first rot_dim dims of each head (half-split pairs (i, i + rot_dim/2)) of x[rows][n_heads][head_dim]
     * at each row's position with its sequence's frequencies. */
    void (*rope)(const tsr_batch_layout *b, float *x, int n_heads, int head_dim, int rot_dim);
    /* Stores every row's k and v ([rows][n_kv_heads][head_dim]) into the cache at the row's position. */
    void (*kv_store)(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v);
    /* out[row][n_heads][head_dim] = causal softmax(q·kᵀ·scale)·v over the row's cached positions (GQA). */
    void (*attention)(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                      float *out);
    /* out = silu(gate) * up, elementwise over n */
    void (*silu_mul)(const float *gate, const float *up, size_t n, float *out);
    /* x += y over n */
    void (*add)(float *x, const float *y, size_t n);
    /* out[i] = rows[index[i]] for n rows of dim floats (gathering the rows whose logits are wanted) */
    void (*gather_rows)(const float *x, const int32_t *index, int n, int dim, float *out);
    /* Optional (NULL: callers run linear once per layer): y[i][M][L[i]->N] = x · W_i for n <= 3 layers that share
     * their input x and K (q/k/v, gate/up), which a backend may run as one launch. */
    void (*linear_many)(const tsr_linear *const *L, int n, const float *x, int M, float *const *y);
    /* Optional (NULL: callers run add, then rmsnorm): x += y, then out[r] = x[r] / rms(x[r]) * w per row, as one
     * pass over the residual stream (the add before each RMSNorm). out may alias y. */
    void (*add_rmsnorm)(float *x, const float *y, const tsr_dense *w, float eps, int rows, int dim, float *out);
    /* Optional (NULL: callers run linear, then add_rmsnorm, or add when w is NULL): x[M][L->N] += a · W, then, with w,
     * out = rmsnorm(x) · w per row; out also serves as the backend's scratch for the product (without w its contents
     * are undefined afterwards) and must not alias x or a. Lets a backend that splits the product over K add the
     * parts inside the residual pass instead of in a pass of their own. */
    void (*linear_add_norm)(const tsr_linear *L, const float *a, int M, float *x, const tsr_dense *w, float eps,
                            float *out);
    /* Optional (NULL: callers run rope on q, rope on k, then kv_store): rope of q ([rows][n_heads][head_dim]) and
     * of k ([rows][kv->n_kv_heads][head_dim]) in place, then k and v stored into the cache at each row's position,
     * as one pass (the three launches of a decode step's attention input become one). */
    void (*rope_store)(const tsr_batch_layout *b, float *q, int n_heads, float *k, const float *v, tsr_kv_cache *kv,
                       int layer, int rot_dim);
    /* Optional (NULL: callers copy the rows out and pick on the host): for each row of x[rows][n], ids[r] = the
     * first index of its largest value, NaN entries skipped (0 when the row is all NaN), and vals[r] = that value
     * (NaN then); ids and vals are backend memory. The greedy choice without the logits leaving the device. */
    void (*argmax_rows)(const float *x, int rows, int n, int32_t *ids, float *vals);
    /* Optional (NULL: callers copy the rows out and sample on the host): for each row r of x[rows][n], its k best
     * entries (k <= TSR_TOP_MAX) in decreasing order of value, NaN skipped, -0 below +0, the lower index first on
     * ties: ids[r * k + j] and vals[r * k + j] (id -1 and value NaN past the row's count of non-NaN entries); and
     * z[r] = the sum over its non-NaN entries of exp((x - m) * inv_temp[r]), m its largest (z[r] = 0 when m is not
     * finite or the row is all NaN). ids, vals, z and inv_temp are backend memory. What a sampled decode step reads
     * back instead of the row: enough to draw from top-k, and from top-p or plain temperature when the candidates
     * hold the mass the draw needs (runtime/sampler.h, tsr_sample_top). */
    void (*top_rows)(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals,
                     float *z);
    /* Optional (NULL: callers run silu_mul into gate, then linear_add_norm or its fallbacks): x[M][L->N] +=
     * (silu(gate) ⊙ up) · W, gate and up being [M][L->K], then, with w, out = rmsnorm(x) · w per row; gate is
     * scratch afterwards and out as in linear_add_norm. With x NULL, out = (silu(gate) ⊙ up) · W alone (w
     * ignored): a tensor shard's product, summed over the group before its add. Lets a backend fold the MLP's
     * gating into the pass that prepares the down projection's input (on the GPU, prefill's fp16 conversion and
     * permutation). */
    void (*silu_linear_add_norm)(const tsr_linear *L, float *gate, const float *up, int M, float *x, const tsr_dense *w,
                                 float eps, float *out);
    /* Optional (NULL, or returning 0 for shapes it does not take: callers run linear_many on gate and up, then
     * silu_linear_add_norm): the whole MLP of a layer, x[M][down->N] += (silu(h · Wgate) ⊙ (h · Wup)) · Wdown, then,
     * with w, out = rmsnorm(x) · w per row; out may alias h (read before out is written), never x. Returns 1 when
     * done. scratch_gate and scratch_up are the caller's [M][gate->N] buffers for the two products, which the op
     * may use as scratch in any format (their contents are undefined afterwards). Lets a backend run the three
     * products without a pause in their weight streams (the GPU's one-row persistent launch) or keep the MLP's
     * intermediates in its own format (the GPU's prefill: gate and up in fp16). */
    int (*mlp_add_norm)(const tsr_linear *gate, const tsr_linear *up, const tsr_linear *down, const float *h, int M,
                        float *x, const tsr_dense *w, float eps, float *out, float *scratch_gate, float *scratch_up);

    /* ---- reports ---- */
    /* Optional (NULL: not counted, the CPU): the most backend memory allocated at once so far, in bytes. */
    size_t (*memory_peak)(void);
} tsr_ops;

#define TSR_TOP_MAX 64 /* candidates per row top_rows returns at most */

/* The CPU reference backend (without top_rows: its rows are host memory already; the environment variable
 * TSR_CPU_TOP=1 adds its reference top_rows, for tests of the candidates path on CPU workers). */
const tsr_ops *tsr_ops_cpu(void);

#endif
