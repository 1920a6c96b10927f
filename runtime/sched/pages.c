/* The page pool (see pages.h): reference counts and a stack of free pages.
 *
 * The free list is a stack so that the most recently freed page, likely still warm in the worker's caches, is
 * handed out first. Every operation is O(1) except the consistency check. */
#include "runtime/sched/pages.h"

#include <stdlib.h>
#include <string.h>

tsr_status tsr_pages_init(tsr_pages *p, int n_pages, int page_size)
{
    memset(p, 0, sizeof *p);
    if (n_pages < 1 || page_size < 1)
        return tsr_fail(TSR_ERR_ARG, "page pool: %d pages of %d tokens (both must be >= 1)", n_pages, page_size);
    p->refs = calloc((size_t)n_pages, sizeof *p->refs);
    p->free_stack = malloc((size_t)n_pages * sizeof *p->free_stack);
    if (!p->refs || !p->free_stack) {
        tsr_pages_destroy(p);
        return tsr_fail(TSR_ERR_NOMEM, "page pool: out of memory for %d pages", n_pages);
    }
    p->n_pages = n_pages;
    p->page_size = page_size;
    /* pushed in reverse so that page 0 is handed out first (readable tests and logs) */
    for (int i = 0; i < n_pages; i++) p->free_stack[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    return TSR_OK;
}

void tsr_pages_destroy(tsr_pages *p)
{
    free(p->refs);
    free(p->free_stack);
    memset(p, 0, sizeof *p);
}

int32_t tsr_pages_alloc(tsr_pages *p)
{
    if (p->n_free == 0) return -1;
    int32_t page = p->free_stack[--p->n_free];
    p->refs[page] = 1;
    return page;
}

int tsr_pages_ref(tsr_pages *p, int32_t page)
{
    if (page < 0 || page >= p->n_pages || p->refs[page] <= 0) return -1;
    return ++p->refs[page];
}

int tsr_pages_unref(tsr_pages *p, int32_t page)
{
    if (page < 0 || page >= p->n_pages || p->refs[page] <= 0) return -1;
    if (--p->refs[page] == 0) p->free_stack[p->n_free++] = page;
    return p->refs[page];
}

int tsr_pages_refcount(const tsr_pages *p, int32_t page)
{
    if (page < 0 || page >= p->n_pages) return -1;
    return p->refs[page];
}

tsr_status tsr_pages_check(const tsr_pages *p)
{
    if (p->n_free < 0 || p->n_free > p->n_pages)
        return tsr_fail(TSR_ERR_INTERNAL, "page pool: %d free of %d pages", p->n_free, p->n_pages);
    int zero = 0;
    for (int i = 0; i < p->n_pages; i++) {
        if (p->refs[i] < 0) return tsr_fail(TSR_ERR_INTERNAL, "page pool: page %d has count %d", i, p->refs[i]);
        zero += p->refs[i] == 0;
    }
    if (zero != p->n_free)
        return tsr_fail(TSR_ERR_INTERNAL, "page pool: %d pages have count 0 but the free list holds %d", zero,
                        p->n_free);
    /* every listed page has count 0 and is listed once; with the equal totals above, the list is exactly the
     * pages of count 0 */
    uint8_t *seen = calloc((size_t)p->n_pages, 1);
    if (!seen) return tsr_fail(TSR_ERR_NOMEM, "page pool check: out of memory");
    tsr_status st = TSR_OK;
    for (int i = 0; i < p->n_free && st == TSR_OK; i++) {
        int32_t page = p->free_stack[i];
        if (page < 0 || page >= p->n_pages)
            st = tsr_fail(TSR_ERR_INTERNAL, "page pool: free list entry %d is page %d (out of range)", i, page);
        else if (p->refs[page] != 0)
            st = tsr_fail(TSR_ERR_INTERNAL, "page pool: page %d is on the free list with count %d", page,
                          p->refs[page]);
        else if (seen[page]++)
            st = tsr_fail(TSR_ERR_INTERNAL, "page pool: page %d is on the free list twice", page);
    }
    free(seen);
    return st;
}
