/* The KV page pool of the scheduler: fixed-size pages, a reference count per page and a free list.
 *
 * Pages are numbered 0..n_pages-1, the same numbering every worker's KV storage uses; this pool only does the
 * bookkeeping (no KV data lives here). A page is free exactly when its count is 0. Every holder of a page (a
 * sequence's page table, the prefix index) holds one reference, so a page shared by two sequences and cached has
 * count 3. Allocation pops the free list (O(1)); dropping the last reference pushes the page back.
 *
 * Ownership: the pool owns its arrays; tsr_pages_destroy() frees them. Misuse (a page number out of range, a
 * reference taken on a free page, a count going below 0) changes nothing and is reported by the return value and
 * by tsr_pages_check(); nothing here aborts. */
#ifndef TSR_SCHED_PAGES_H
#define TSR_SCHED_PAGES_H

#include "runtime/status.h"

#include <stdint.h>

typedef struct tsr_pages {
    int n_pages, page_size;
    int32_t *refs;       /* [n_pages] reference count */
    int32_t *free_stack; /* [n_pages] free pages; the top is free_stack[n_free-1] */
    int n_free;
} tsr_pages;

/* Allocates the bookkeeping for n_pages pages of page_size tokens, all free. TSR_ERR_ARG for sizes < 1,
 * TSR_ERR_NOMEM. On failure *p is left empty (safe to destroy). */
tsr_status tsr_pages_init(tsr_pages *p, int n_pages, int page_size);
void tsr_pages_destroy(tsr_pages *p);

/* Takes a free page (count 1); -1 when none is free. */
int32_t tsr_pages_alloc(tsr_pages *p);

/* Adds a reference to a page in use. Returns the new count, or -1 (nothing changed) for a page out of range or
 * free. */
int tsr_pages_ref(tsr_pages *p, int32_t page);

/* Drops a reference; the page goes back to the free list when its count reaches 0. Returns the new count, or -1
 * (nothing changed) for a page out of range or already free. */
int tsr_pages_unref(tsr_pages *p, int32_t page);

/* Reference count of a page (-1 when out of range). */
int tsr_pages_refcount(const tsr_pages *p, int32_t page);

/* Checks the pool: the free list holds distinct pages in range, exactly the pages of count 0, and no count is
 * negative. TSR_ERR_INTERNAL with the first violation. */
tsr_status tsr_pages_check(const tsr_pages *p);

#endif
