/* Paged KV cache pool (see kv_cache.h). */
#include "runtime/kv_cache.h"

#include "kernels/ops.h"

#include <stdlib.h>
#include <string.h>

size_t tsr_kv_bytes_per_token(int n_layers, int n_kv_heads, int head_dim, tsr_dtype dtype)
{
    return (size_t)2 * (size_t)n_layers * (size_t)n_kv_heads * (size_t)head_dim * tsr_dtype_size(dtype);
}

void tsr_kv_free(tsr_kv_cache *kv)
{
    if (!kv) return;
    for (int l = 0; kv->k && l < kv->n_layers; l++)
        if (kv->k[l]) kv->ops->release(kv->k[l]);
    for (int l = 0; kv->v && l < kv->n_layers; l++)
        if (kv->v[l]) kv->ops->release(kv->v[l]);
    free(kv->k);
    free(kv->v);
    free(kv->free_list);
    memset(kv, 0, sizeof *kv);
}

tsr_status tsr_kv_init(tsr_kv_cache *kv, const tsr_ops *ops, int n_layers, int n_kv_heads, int head_dim,
                       int page_size, int n_pages, tsr_dtype dtype)
{
    memset(kv, 0, sizeof *kv);
    if (dtype != TSR_F16 && dtype != TSR_F32)
        return tsr_fail(TSR_ERR_UNSUPPORTED, "KV cache: storage type %s is not supported (F16, F32)", tsr_dtype_name(dtype));
    if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || page_size <= 0 || n_pages <= 0)
        return tsr_fail(TSR_ERR_ARG, "KV cache: invalid geometry (%d layers, %d heads, dim %d, page %d, %d pages)", n_layers,
                        n_kv_heads, head_dim, page_size, n_pages);
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    kv->page_size = page_size;
    kv->n_pages = n_pages;
    kv->dtype = dtype;
    kv->ops = ops;
    size_t per_layer = (size_t)n_pages * (size_t)page_size * (size_t)n_kv_heads * (size_t)head_dim;
    kv->k = calloc((size_t)n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)n_layers, sizeof *kv->v);
    kv->free_list = malloc((size_t)n_pages * sizeof *kv->free_list);
    if (!kv->k || !kv->v || !kv->free_list) goto oom;
    for (int l = 0; l < n_layers; l++) {
        /* zero-filled: pages never written read as zeros, never as garbage */
        kv->k[l] = ops->alloc(per_layer * tsr_dtype_size(dtype));
        kv->v[l] = ops->alloc(per_layer * tsr_dtype_size(dtype));
        if (!kv->k[l] || !kv->v[l]) goto oom;
    }
    for (int i = 0; i < n_pages; i++) kv->free_list[i] = n_pages - 1 - i; /* pop gives page 0 first */
    kv->n_free = n_pages;
    return TSR_OK;
oom:
    tsr_kv_free(kv);
    return tsr_fail(TSR_ERR_NOMEM, "KV cache: cannot allocate %d pages of %d tokens", n_pages, page_size);
}

int32_t tsr_kv_alloc_page(tsr_kv_cache *kv)
{
    if (kv->n_free == 0) return -1;
    return kv->free_list[--kv->n_free];
}

void tsr_kv_release_page(tsr_kv_cache *kv, int32_t page)
{
    if (page >= 0 && page < kv->n_pages && kv->n_free < kv->n_pages) kv->free_list[kv->n_free++] = page;
}
