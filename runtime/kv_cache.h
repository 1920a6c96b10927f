/* Paged KV cache storage: a pool of fixed-size pages holding keys (after RoPE) and values.
 *
 * Storage is FP16 by default; FP32 is available for exact comparisons against FP32 references (the quantized
 * Q4/Q6/Q8 modes come with the scheduler). Page p of layer l holds `page_size` token slots, each
 * [n_kv_heads][head_dim] elements for K and the same for V: k[l] is laid out [n_pages][page_size][n_kv_heads][head_dim]. A sequence addresses its tokens through a page
 * table: token position t lives in page table[t / page_size], slot t % page_size. Pages are handed out by
 * tsr_kv_alloc_page() from a free list (the scheduler's prefix-sharing allocator builds on this later).
 * The storage is allocated by the backend (host memory for the CPU backend, device memory for CUDA); the page
 * bookkeeping stays on the host. */
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
    tsr_dtype dtype;         /* TSR_F16 or TSR_F32 */
    void **k, **v;           /* [n_layers] → [n_pages][page_size][n_kv_heads][head_dim] elements of dtype */
    int32_t *free_list;      /* stack of free page numbers */
    const struct tsr_ops *ops; /* allocator of k and v */
    int n_free;
} tsr_kv_cache;

/* Bytes of K+V storage per token over all layers. */
size_t tsr_kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, tsr_dtype dtype);

struct tsr_ops;

/* Allocates the storage with the backend's allocator (zero-filled). */
tsr_status tsr_kv_init(tsr_kv_cache *kv, const struct tsr_ops *ops, int n_layers, int n_kv_heads, int head_dim,
                       int page_size, int n_pages, tsr_dtype dtype);
void tsr_kv_free(tsr_kv_cache *kv);

/* Takes a free page; returns -1 when none is left. */
int32_t tsr_kv_alloc_page(tsr_kv_cache *kv);
/* Returns a page to the free list. */
void tsr_kv_release_page(tsr_kv_cache *kv, int32_t page);

/* Element offset of the slot of position t of a sequence with the given page table. */
static inline size_t tsr_kv_slot_offset(const tsr_kv_cache *kv, const int32_t *page_table, int t)
{
    size_t page = (size_t)page_table[t / kv->page_size];
    return ((page * (size_t)kv->page_size) + (size_t)(t % kv->page_size)) * (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
}

#endif
