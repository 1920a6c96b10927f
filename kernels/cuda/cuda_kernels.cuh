/* Launchers of the CUDA kernels, one family per .cu file; backend.cu assembles them into the ops table. */
#ifndef TSR_CUDA_KERNELS_CUH
#define TSR_CUDA_KERNELS_CUH

#include "kernels/ops.h"

#include <cuda_fp16.h>

void tsr_cuda_embed(const tsr_dense *table, const int32_t *ids, int n, float *out);
void tsr_cuda_rmsnorm(const float *x, const tsr_dense *w, float eps, int rows, int dim, float *out);
/* x += y, then out = rmsnorm(x) · w (ops.h add_rmsnorm); out may alias y. */
void tsr_cuda_add_rmsnorm(float *x, const float *y, const tsr_dense *w, float eps, int rows, int dim, float *out);
/* x += y (n_parts parts, part p at y + p · part_stride, rows ld apart, plus bias when not NULL), then, with w,
 * out = rmsnorm(x) · w per row; out may alias y. */
void tsr_cuda_add_parts(float *x, const float *parts, int n_parts, size_t part_stride, int ld, const __half *bias,
                        const tsr_dense *w, float eps, int rows, int dim, float *out);
void tsr_cuda_linear(const tsr_linear *L, const float *x, int M, float *y);
/* The decode GEMV (gemv.cu) of n EXL2/GPTQ matrices sharing x and K: y[i] = x · W_i + bias_i, in one launch (plus a
 * reduction or staging launch) per tsr_cuda_gemv_rows() rows. With parts (one matrix, at most that many rows), the
 * K-split partial sums (without the bias) are left to the caller instead: `splits` parts of [M][Npad] floats from
 * `partial`, or splits = 0 when y was written. */
#define TSR_GEMV_MAX_M     32 /* rows of one launch on every GPU (sm_90's bulk kernel: up to 64) */
#define TSR_GEMV_MAX_PARTS 3
struct tsr_linear_dev;
struct tsr_gemv_parts {
    const float *partial;
    int splits, Npad;
};
void tsr_cuda_gemv(const tsr_linear_dev *const *L, int n, const float *x, int M, float *const *y,
                   tsr_gemv_parts *parts = NULL);
/* The activations of n EXL2/GPTQ matrices sharing x (M rows of K), staged once in the GEMV's B-operand order (fp16
 * hi + lo halves when `exact`, else fp16) into scratch slot `slot`: part i's entries start at xs[i] (gemv.cu). */
void tsr_cuda_gemv_prestage(const tsr_linear_dev *const *L, int n, const float *x, int M, bool exact, int slot,
                            const uint2 **xs);
/* Activations staged ahead (stage_ahead.cuh): plans the entries of x (M rows) for the GEMV of the n matrices L (scratch
 * slot 0), false where that GEMV would not take pre-staged entries; after the launch that writes them,
 * tsr_cuda_gemv_stage_done hands them to the next GEMV of the same matrices on x, if no launch comes between. */
struct tsr_stage_ahead;
bool tsr_cuda_gemv_stage_plan(const tsr_linear_dev *const *L, int n, int M, tsr_stage_ahead *S);
void tsr_cuda_gemv_stage_done(const tsr_linear_dev *const *L, int n, const float *x, const tsr_stage_ahead *S);
/* The entries staged ahead for the matrices L on x (M rows; exact: hi + lo halves), for a kernel other than their
 * GEMV that reads the same entries (the fused MLP): true with xs[i] set, if they are still the latest writes. */
bool tsr_cuda_gemv_take_staged(const tsr_linear_dev *const *L, int n, const float *x, int M, bool exact,
                               const uint2 **xs);
/* silu_mul in place on gate (M rows of L's K) that also stages the activations of L's GEMV ahead (elementwise.cu);
 * false, having done nothing, where that GEMV would not take them. */
bool tsr_cuda_silu_stage(const tsr_linear_dev *L, float *gate, const float *up, int M);
/* The matrices that read the output of the norm with weights w (q, k, v for an attention norm; gate, up for an MLP
 * norm) into L (up to TSR_GEMV_MAX_PARTS); their count, 0 for a norm nobody registered (backend.cu). */
int tsr_cuda_norm_readers(const tsr_dense *w, const tsr_linear_dev **L);
/* Whether two quantized matrices read their input rows in the same unit order (matmul.cu; compared once per pair,
 * outside graph recording: a pair first seen while recording counts as different). */
bool tsr_cuda_same_unit_order(const tsr_linear_dev *a, const tsr_linear_dev *b);
/* Prefill's hand-off (matmul.cu): where the norm with weights w over M rows of dim has readers on the dequantize
 * path, the fp16 conversion of its output in reader 0's unit order: xp (scratch slot 0, Kp values a row), through
 * uperm (NULL: the identity); false where it has none. After the norm's launch, tsr_cuda_dq_handoff_done hands xp
 * to the next product of those readers on `out`, if no launch comes between. */
bool tsr_cuda_dq_handoff_plan(const tsr_dense *w, int M, int dim, __half **xp, const int32_t **uperm, int *Kp);
void tsr_cuda_dq_handoff_done(const float *out, int M);
/* ops.h mlp_add_norm: the MLP of one decode row as one persistent launch where the shapes allow it (mlp_decode.cu),
 * rows on the dequantize path through tsr_cuda_mlp_half; returns 1 when done, 0 when the caller must run the steps. */
int tsr_cuda_mlp_add_norm(const tsr_linear *gate, const tsr_linear *up, const tsr_linear *down, const float *h, int M,
                          float *x, const tsr_dense *w, float eps, float *out, float *scratch_gate, float *scratch_up);
/* The MLP of rows on the dequantize path with gate's and up's products in fp16 (matmul.cu; TSR_CUDA_MLP_HALF=0 leaves
 * it out): into the caller's scratch_gate and scratch_up, which down's gated conversion then reads at half the bytes
 * of fp32. Returns 0, having done nothing, for rows or matrices it does not take. */
int tsr_cuda_mlp_half(const tsr_linear_dev *G, const tsr_linear_dev *U, const tsr_linear_dev *D, const float *h, int M,
                      float *x, const tsr_dense *w, float eps, float *out, float *scratch_gate, float *scratch_up);
/* Whether the environment variable `name` is set to 0: a switch that is on by default, turned off (backend.cu). */
bool tsr_cuda_env_off(const char *name);
/* Whether `name` is set to a nonzero number: a switch that is off by default, turned on (backend.cu). */
bool tsr_cuda_env_on(const char *name);
/* Attribute attr of the current device, or fallback when it cannot be read (backend.cu). */
int tsr_cuda_device_attr(cudaDeviceAttr attr, int fallback);
/* The shared memory the kernels plan with, per block (opt-in) and per SM: the device's, or less where
 * TSR_CUDA_SMEM_OPTIN caps a block at that many bytes (and an SM at 1 KB more), so that a larger GPU plans as a
 * consumer card does (99 KB on sm_86/sm_89; with a build for sm_80, tests/parallel/gpu-pack.sh TSR_GPUPACK_ARCHS)
 * (backend.cu). */
int tsr_cuda_smem_block(void);
int tsr_cuda_smem_sm(void);
/* The blocks of `threads` threads and `smem` bytes of dynamic shared memory of `kernel` that fit on the device at
 * once, per the occupancy API, and no more than tsr_cuda_smem_sm holds per SM (0 where none fits) (backend.cu). */
int tsr_cuda_resident_blocks(const void *kernel, int threads, size_t smem);
/* Opts `kernel` in to `bytes` of dynamic shared memory per block; a fatal error naming `what` where that is more
 * than tsr_cuda_smem_block (a planning bug: the callers size their needs from it) (backend.cu). */
void tsr_cuda_allow_smem(const void *kernel, size_t bytes, const char *what);
/* Whether the device is sm_90 or newer and this build has sm_90 code for it (else, JIT-compiled from older PTX, it
 * runs the sm_80 paths); false before tsr_cuda_init (backend.cu). */
bool tsr_cuda_sm90(void);
/* Whether M rows run the sm_90 bulk-copy GEMV (TSR_CUDA_GEMV_BULK; gemv.cu). */
bool tsr_cuda_gemv_bulk(int M);
/* Whether the decode GEMV's instances for 9-32 rows stage less than 32 KB of activations per block, as where blocks
 * have 99 KB of shared memory (sm_86, sm_89): their K then splits into many pieces (gemv.cu). */
bool tsr_cuda_gemv_narrow_stage(void);
/* Rows one GEMV launch takes: 64 where the bulk kernel runs 33-64 rows, else TSR_GEMV_MAX_M (gemv.cu). */
int tsr_cuda_gemv_rows(void);
/* ops.h linear_add_norm: the decode GEMV's K-split parts are added in the residual pass; on the dequantize path
 * cuBLAS adds the product to x (beta 1) and a norm pass follows. */
void tsr_cuda_linear_add_norm(const tsr_linear *L, const float *a, int M, float *x, const tsr_dense *w, float eps,
                              float *out);
/* ops.h silu_linear_add_norm: on the dequantize path (prefill) the gating is folded into the input's permutation
 * pass; below it silu_mul, then tsr_cuda_linear_add_norm (TSR_CUDA_SILU_FOLD=0 leaves the op out: backend.cu). */
void tsr_cuda_silu_linear_add_norm(const tsr_linear *L, float *gate, const float *up, int M, float *x,
                                   const tsr_dense *w, float eps, float *out);
/* y[i] = x · W_i for n layers sharing x (ops.h linear_many): EXL2 decode GEMVs in one launch, else one by one (the
 * dequantize path permutes x once for consecutive matrices of one unit order). */
void tsr_cuda_linear_many(const tsr_linear *const *L, int n, const float *x, int M, float *const *y);
/* Reserves, at model preparation, the fp16 slab buffer of the dequantize-and-cuBLAS path (matmul.cu); grows
 * only. Out of memory is fatal. */
void tsr_cuda_dq_reserve(size_t bytes);
/* Drops what the dequantize path remembers of a matrix's unit order (matmul.cu), before its uperm is freed. */
void tsr_cuda_forget_unit_order(const int32_t *uperm);
void tsr_cuda_rope(const tsr_batch_layout *b, float *x, int n_heads, int head_dim, int rot_dim);
void tsr_cuda_kv_store(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v);
/* ops.h rope_store: rope of q and k, then k and v into the cache, in one launch */
void tsr_cuda_rope_store(const tsr_batch_layout *b, float *q, int n_heads, float *k, const float *v, tsr_kv_cache *kv,
                         int layer, int rot_dim);
/* kv_store and rope_store for the quantized KV modes (kv_store_quant.cu; tsr_cuda_kv_store and tsr_cuda_rope_store
 * dispatch to them): one launch each */
void tsr_cuda_kv_store_quant(const tsr_batch_layout *b, tsr_kv_cache *kv, int layer, const float *k, const float *v);
void tsr_cuda_rope_store_quant(const tsr_batch_layout *b, float *q, int n_heads, float *k, const float *v,
                               tsr_kv_cache *kv, int layer, int rot_dim);
void tsr_cuda_attention(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                        float *out);
/* The tensor-core prefill attention (attention_prefill.cu) when it applies (fp16 cache, head_dim 64 or 128):
 * returns 1 after launching it, 0 when the caller must use the general kernel. */
int tsr_cuda_attention_prefill(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv,
                               const float *q, float *out);
/* The prefill attention over a quantized cache (attention_kvq.cu): the context of the batch's sequences rebuilt as an
 * fp16 cache in scratch memory, then tsr_cuda_attention_prefill over it (or, for decode rows followed by prompt
 * chunks, the decode kernel for the first and a copy for the second). Returns 0 (nothing launched) where that kernel
 * does not apply, or the copy would not pay for the batch's rows or not fit in device memory. */
int tsr_cuda_attention_prefill_kvq(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv,
                                   const float *q, float *out);
/* Its wgmma form (attention_prefill_wgmma.cu), which tsr_cuda_attention_prefill tries first: returns 1 after
 * launching it, 0 where the build has no sm_90a code for the device, the shared memory does not fit or
 * TSR_CUDA_FA_WGMMA=0. */
int tsr_cuda_fa_wgmma(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv, const float *q,
                      float *out);
/* Whether the device is sm_90 or newer and runs this build's sm_90a code, which the wgmma kernels need (asked once,
 * by a probe launch outside stream capture; false while capturing until then) (attention_prefill_wgmma.cu). */
bool tsr_cuda_wgmma_code(void);
/* The many-row products of n (1 to TSR_GEMV_MAX_PARTS) EXL2/GPTQ matrices of one input and unit row order, with their
 * weights dequantized in registers, in one launch (gemm_dq_wgmma.cu): y[i] (M rows of L[i]'s N, fp32 or with y_half
 * fp16) = xp · W_i + beta · y[i], xp being the input in the matrices' unit row order as fp16 (M rows of 32 n_units).
 * Returns 1 after launching it; 0, having done nothing, where the device has no wgmma code, a matrix does not fit the
 * kernel's shared memory, the matrices differ in unit count or kind, or M is past the rows it takes
 * (tsr_cuda_dq_wgmma_takes; the caller then dequantizes for cuBLAS). */
int tsr_cuda_dq_wgmma(const tsr_linear_dev *const *L, int n, const __half *xp, int M, void *const *y, float beta,
                      bool y_half);
/* Whether tsr_cuda_dq_wgmma takes L's products of M rows: TSR_CUDA_DQ_WGMMA=1 every M, =0 none, else M up to
 * TSR_CUDA_DQ_WGMMA_MAX_M (gemm_dq_wgmma.cu's default). */
bool tsr_cuda_dq_wgmma_takes(const tsr_linear_dev *L, int M);
/* Whether it takes L's products of every row count (then L needs no dequantize buffer). */
bool tsr_cuda_dq_wgmma_takes_all(const tsr_linear_dev *L);
/* The dequantize buffer's bytes reserved at model preparation (scratch slot 3; matmul.cu). */
size_t tsr_cuda_dq_reserved(void);
/* Whether TSR_CUDA_DQ_TIMES asks for the dequantize path's per-part times (matmul.cu; then no graph is recorded). */
bool tsr_cuda_dq_times(void);
/* Decode attention over an fp16 or quantized cache with head_dim 64 or 128 and at most 16 query heads per KV head
 * (attention_decode.cu; quantized rows rebuilt as fp16 in its tiles, kvq_tile.cuh): returns 1 after launching it,
 * 0 when the caller must use the general kernel. */
int tsr_cuda_attention_decode(const tsr_batch_layout *b, const tsr_attn_args *a, const tsr_kv_cache *kv,
                              const float *q, float *out);
/* out[item][d] from n_splits partial (max, sum) pairs and unnormalized outputs per item (items = rows × a's heads;
 * attention.cu); also stages the activations of a->reader's decode GEMV where that GEMV would take them. */
void tsr_cuda_attn_merge(size_t items, int d, int n_splits, const float2 *part_ml, const float *part_acc, float *out,
                         const tsr_attn_args *a, int rows);
void tsr_cuda_silu_mul(const float *gate, const float *up, size_t n, float *out);
void tsr_cuda_add(float *x, const float *y, size_t n);
void tsr_cuda_gather_rows(const float *x, const int32_t *index, int n, int dim, float *out);
/* ops.h argmax_rows (argmax.cu) */
void tsr_cuda_argmax_rows(const float *x, int rows, int n, int32_t *ids, float *vals);
/* ops.h top_rows (top.cu) */
void tsr_cuda_top_rows(const float *x, int rows, int n, int k, const float *inv_temp, int32_t *ids, float *vals,
                       float *z);

#endif
