/* Paged KV cache storage: a pool of fixed-size pages holding keys (after RoPE) and values.
 *
 * Storage modes (tsr_kv_cache.dtype): TSR_F16 (default), TSR_F32 (exact comparisons against FP32 references), and
 * ExLlamaV2's quantized modes TSR_KV_Q4 (4-bit K and V), TSR_KV_Q6 (8-bit K, 4-bit V) and TSR_KV_Q8 (8-bit K and
 * V), EXL2.md §11.3: each head vector of a token is rounded to fp16, rotated by 32-point Walsh-Hadamard transforms
 * (per 64-element chunk, even and odd elements separately), cut into 32-element groups with one fp16 scale each
 * (amax/8 or amax/128) and stored as codes (two 4-bit codes per byte, low nibble first, or one byte). The quantized
 * modes need head_dim % 64 == 0 and quantize per (token, head): writing a token never touches another's codes.
 *
 * Like ExLlamaV2, a quantized cache lets the rows of a forward call attend to their own chunk exactly: kv_store
 * also keeps the fp16 K/V of the rows it just wrote in a staging area (the first TSR_KV_STAGE_ROWS rows of the
 * call), keyed by (layer, token slot), and attention reads a position from there when the staged row for it (same
 * batch row, same layer, same slot) is present, from the codes otherwise. A staged row is by construction the
 * exact value whose quantization sits in that slot (any later store replaces the whole staging area), so the rule is
 * safe whatever the caller does between the two ops; it matters only for attention right after its kv_store.
 *
 * Page p of layer l holds `page_size` token slots, each [n_kv_heads][head_dim] elements for K and the same for V:
 * k[l] is laid out [n_pages][page_size][n_kv_heads][head_dim] elements of dtype (quantized: the same order, codes of
 * head_dim·bits/8 bytes per head, and k_scale[l] [n_pages][page_size][n_kv_heads][head_dim/32] fp16). A sequence
 * addresses its tokens through a page table: token position t lives in page table[t / page_size], slot
 * t % page_size. Pages are handed out by tsr_kv_alloc_page() from a free list (the scheduler's prefix-sharing
 * allocator builds on this later). The storage is allocated by the backend (host memory for the CPU backend,
 * device memory for CUDA); the page bookkeeping stays on the host. */
#ifndef TSR_KV_CACHE_H
#define TSR_KV_CACHE_H

#include "runtime/dtype.h"
#include "runtime/status.h"

#include <stddef.h>
#include <stdint.h>

typedef struct tsr_kv_cache {
    int n_layers, n_kv_heads, head_dim;
    int page_size;           /* tokens per page */
    int n_pages;
    tsr_dtype dtype;         /* TSR_F16, TSR_F32, TSR_KV_Q4, TSR_KV_Q6 or TSR_KV_Q8 */
    int k_bits, v_bits;      /* quantized modes: bits per K / V code (4 or 8); 0 otherwise */
    void **k, **v; /* [n_layers] → [n_pages][page_size][n_kv_heads][head_dim] elements of dtype (or codes) */
    uint16_t **k_scale, **v_scale; /* quantized: [n_layers] → [n_pages][page_size][n_kv_heads][head_dim/32] fp16 */
    /* quantized: the last kv_store call's rows, fp16 [stage_rows][n_kv_heads][head_dim] (backend memory) */
    uint16_t *stage_k, *stage_v;
    int64_t *stage_key;      /* [stage_rows + 1]: tsr_kv_stage_key() of each staged row; [stage_rows]: rows staged */
    int stage_rows;
    long expand_positions;   /* quantized: positions a backend may rebuild as fp16 at once for attention, the room
                                the pool's sizing left for it (tsr_kv_expand_positions; 0: TSR_KV_EXPAND_ROWS per
                                row of the call). Set by the engine after tsr_kv_init. */
    int32_t *free_list;      /* stack of free page numbers */
    const struct tsr_ops *ops; /* allocator of k and v */
    int n_free;
} tsr_kv_cache;

/* Elements per scale group, and the rotation chunk, of the quantized modes. */
#define TSR_KV_QGROUP 32
#define TSR_KV_QCHUNK 64

/* Rows of one kv_store call a quantized cache stages for exact attention (see above). */
#define TSR_KV_STAGE_ROWS 2048

/* Key of a staged row: its layer and its token slot (page · page_size + position % page_size). Device code (the
 * CUDA store and attention kernels) computes the same keys with this function. */
#ifdef __CUDACC__
#define TSR_KV_HOST_DEVICE __host__ __device__
#else
#define TSR_KV_HOST_DEVICE
#endif
static inline TSR_KV_HOST_DEVICE int64_t tsr_kv_stage_key(int layer, int64_t slot)
{
    return ((int64_t)layer << 40) | slot;
}

/* Whether dtype is one of the quantized storage modes. */
static inline int tsr_kv_is_quant(tsr_dtype dtype)
{
    return dtype == TSR_KV_Q4 || dtype == TSR_KV_Q6 || dtype == TSR_KV_Q8;
}

/* Bits per K and V code of a quantized mode (4 or 8); both 0 for F16/F32. */
void tsr_kv_mode_bits(tsr_dtype dtype, int *k_bits, int *v_bits);

/* The --kv-dtype spelling of a storage mode: "f16", "f32", "q4", "q6", "q8" ("?" for anything else). */
const char *tsr_kv_dtype_name(tsr_dtype dtype);

/* Bytes of K+V storage per token over all layers (quantized: codes and scales). */
size_t tsr_kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, tsr_dtype dtype);

/* A backend may rebuild a step's context, one layer at a time, as plain fp16 K and V for attention over a quantized
 * cache (the CUDA prefill attention, kernels/cuda/attention_kvq.cu): at most TSR_KV_EXPAND_ROWS positions per row
 * of the longest step, or one sequence's whole context, whichever is more (a long prompt's later chunks). Steps
 * that would need more take a slower path that reads the codes. */
#define TSR_KV_EXPAND_ROWS 32

/* Positions of that rebuild for steps of up to max_tokens rows and sequences of up to max_context positions, in
 * pages of page_size. */
long tsr_kv_expand_positions(int max_tokens, long max_context, int page_size);

/* Device workspace of a rebuild of `positions` positions (0 for F16/F32): what a pool sized from free memory
 * leaves aside for it. */
size_t tsr_kv_expand_bytes(int n_kv_heads, int head_dim, tsr_dtype dtype, long positions);

struct tsr_ops;

/* Allocates the storage with the backend's allocator (zero-filled). Quantized modes need head_dim % 64 == 0. */
tsr_status tsr_kv_init(tsr_kv_cache *kv, const struct tsr_ops *ops, int n_layers, int n_kv_heads, int head_dim,
                       int page_size, int n_pages, tsr_dtype dtype);
void tsr_kv_free(tsr_kv_cache *kv);

/* Takes a free page; returns -1 when none is left. */
int32_t tsr_kv_alloc_page(tsr_kv_cache *kv);
/* Returns a page to the free list. */
void tsr_kv_release_page(tsr_kv_cache *kv, int32_t page);

/* Element offset of the slot of position t of a sequence with the given page table. For the quantized modes the
 * codes of that slot start at byte offset·bits/8 and its scales at scale index offset/32. */
static inline size_t tsr_kv_slot_offset(const tsr_kv_cache *kv, const int32_t *page_table, int t)
{
    size_t page = (size_t)page_table[t / kv->page_size];
    return ((page * (size_t)kv->page_size) + (size_t)(t % kv->page_size)) * (size_t)kv->n_kv_heads *
           (size_t)kv->head_dim;
}

/* ---- the quantized format (host reference; the CPU backend uses it, the CUDA backend mirrors it) ---- */

/* In place, on x[d] (d % 64 == 0): for every 64-element chunk and each parity p, the unnormalized 32-point
 * Walsh-Hadamard transform (natural order) of the elements 2j + p, in fp32. Applying it twice multiplies by 32. */
void tsr_kv_rotate(float *x, int d);

/* Quantizes one head vector x[d] (d % 64 == 0) as EXL2.md §11.3 does, with its fp16 arithmetic: rounds x to fp16,
 * rotates with every butterfly stage rounded to fp16, then per 32-element group amax, scale h(amax/8) or
 * h(amax/128) and codes rne(h(h(v/amax)·m + m)) clamped to [0, 2m-1] (m = 8 or 128). codes gets d·bits/8 bytes,
 * scales d/32 fp16 values. An all-zero group gets scale 0 and the zero code m. */
void tsr_kv_quantize(const float *x, int d, int bits, uint8_t *codes, uint16_t *scales);

/* The rotated-domain values of a quantized head vector: out[e] = (code_e - m)·scale (fp32). */
void tsr_kv_dequantize_rotated(const uint8_t *codes, const uint16_t *scales, int d, int bits, float *out);

/* Dequantizes one head vector: the rotated-domain values, rotated back and divided by 32 (fp32). */
void tsr_kv_dequantize(const uint8_t *codes, const uint16_t *scales, int d, int bits, float *out);

/* Reads the K and V of position t (all heads, [n_kv_heads][head_dim] each, dequantized for the quantized modes)
 * of one layer into host arrays, from any backend's storage (through ops->to_host). */
void tsr_kv_read(const tsr_kv_cache *kv, int layer, const int32_t *page_table, int t, float *k, float *v);

#endif
