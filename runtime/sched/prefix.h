/* The prefix index: full KV pages kept and shared by the token prefix they hold.
 *
 * A full page is registered under a 64-bit key chained over (the previous page's key, the page's token ids), so
 * a key names a whole prefix, not just one page. Hashes can collide, so an entry also stores its page's tokens
 * and the exact entry it follows (parent page and that page's registration number): a lookup walks the chain
 * from the root and accepts an entry only when its tokens and its parent both match, which makes a hit exact,
 * never probabilistic. A key taken by a different prefix blocks caching of that page (and of the rest of that
 * chain), nothing worse.
 *
 * The index holds one reference on every page it caches. A cached page whose only reference is the index's is
 * "unreferenced": it sits on an LRU list and may be evicted (its reference dropped, so it returns to the free
 * list); pages used by sequences are never evicted. Sequences take and drop their references on pages through
 * tsr_prefix_acquire()/tsr_prefix_release() so the LRU list stays exact, and allocate through tsr_prefix_alloc(),
 * which evicts the least recently used unreferenced page when the pool has no free page.
 *
 * Ownership: the index owns its tables; the page pool is the caller's and must outlive it. Misuse (a page out of
 * range) changes nothing; nothing here aborts. */
#ifndef TSR_SCHED_PREFIX_H
#define TSR_SCHED_PREFIX_H

#include "runtime/sched/pages.h"

#include <stdint.h>

#define TSR_PREFIX_ROOT_KEY 0x243F6A8885A308D3ull /* the key "before" a sequence's first page */

/* A position in a chain: the entry of the last page matched or registered. */
typedef struct tsr_prefix_link {
    uint64_t key; /* the chain key up to and including that page (TSR_PREFIX_ROOT_KEY at the root) */
    int32_t page; /* the cached page, -1 at the root, -2 when the chain is broken (nothing can follow) */
    uint32_t gen; /* that page's registration number (an evicted and re-registered page gets a new one) */
} tsr_prefix_link;

typedef struct tsr_prefix_index {
    tsr_pages *pages; /* the pool (not owned) */
    int page_size, n_pages;
    /* one entry per page, valid where cached[page] */
    uint8_t *cached;
    uint64_t *key, *parent_key;
    int32_t *parent;  /* parent page, -1 for a first page */
    uint32_t *parent_gen, *gen;
    int32_t *tokens;  /* [n_pages][page_size] */
    /* LRU list of unreferenced cached pages: head = least recently used */
    int32_t *lru_prev, *lru_next;
    uint8_t *in_lru;
    int32_t lru_head, lru_tail;
    int n_lru, n_entries;
    /* open-addressing hash table of cached pages by key (linear probing, -1 = empty) */
    int32_t *table;
    uint32_t mask;
    uint64_t lookups, hits, hit_tokens, evictions; /* counters (tsr_prefix_record, evictions) */
} tsr_prefix_index;

/* Sets up an empty index over `pages`. TSR_ERR_NOMEM; on failure *x is left empty (safe to destroy). */
tsr_status tsr_prefix_init(tsr_prefix_index *x, tsr_pages *pages);
/* Frees the tables. The index's page references are not dropped (the pool usually goes at the same time); call
 * tsr_prefix_flush() first to hand them back. */
void tsr_prefix_destroy(tsr_prefix_index *x);

tsr_prefix_link tsr_prefix_root(void);

/* The chain key of a page holding tokens[0..n) that follows a page of key prev_key. */
uint64_t tsr_prefix_hash(uint64_t prev_key, const int32_t *tokens, int n);

/* The cached page registered under `key` after `parent` holding exactly `tokens` (page_size of them), or -1.
 * On a hit *out (may be NULL) is the entry's link. Takes no reference, counts nothing. */
int32_t tsr_prefix_find(const tsr_prefix_index *x, const tsr_prefix_link *parent, uint64_t key,
                        const int32_t *tokens, tsr_prefix_link *out);

/* Registers a full page (held by the caller) under `key` after `parent`, taking one reference on it. Returns 1
 * when inserted (*out = its link); 0 when the same prefix is already cached in another page (*out = that entry's
 * link: the caller keeps its own page private and continues the chain from there); -1 when it cannot be cached
 * (the key belongs to a different prefix, the parent link is broken, or the page is already cached or not in
 * use): *out is a broken link. */
int tsr_prefix_insert(tsr_prefix_index *x, const tsr_prefix_link *parent, uint64_t key, const int32_t *tokens,
                      int32_t page, tsr_prefix_link *out);

/* tsr_prefix_insert with the key computed from link->key and tokens; advances *link. */
int tsr_prefix_register(tsr_prefix_index *x, tsr_prefix_link *link, const int32_t *tokens, int32_t page);

/* The longest chain of cached full pages holding tokens[0 .. max_pages*page_size): writes their page numbers to
 * pages[] and returns how many; *last (may be NULL) is the link of the last one (the root when none). Takes no
 * reference (see tsr_prefix_acquire), counts nothing (see tsr_prefix_record). */
int tsr_prefix_match(const tsr_prefix_index *x, const int32_t *tokens, int max_pages, int32_t *pages,
                     tsr_prefix_link *last);

/* Counts one lookup that found hit_pages pages. */
void tsr_prefix_record(tsr_prefix_index *x, int hit_pages);

/* A sequence takes / drops a reference on a page (cached or not). A cached page left with only the index's
 * reference goes to the most recently used end of the LRU list; a page left with none returns to the pool.
 * Return the new count, -1 for misuse (nothing changed). */
int tsr_prefix_acquire(tsr_prefix_index *x, int32_t page);
int tsr_prefix_release(tsr_prefix_index *x, int32_t page);

/* A page from the pool (count 1), evicting the least recently used unreferenced cached page when none is free;
 * -1 when every page is in use. */
int32_t tsr_prefix_alloc(tsr_prefix_index *x);

/* Evicts up to n unreferenced cached pages, least recently used first; returns how many. */
int tsr_prefix_evict(tsr_prefix_index *x, int n);
/* Evicts every unreferenced cached page. */
void tsr_prefix_flush(tsr_prefix_index *x);

/* Pages a caller could get right now: free ones plus evictable ones. */
int tsr_prefix_available(const tsr_prefix_index *x);

/* Checks the index: entries are cached pages with a reference, the LRU list is exactly the cached pages of
 * count 1, the hash table holds exactly the cached pages, each reachable from its home slot, and each key is the
 * chain hash of its parent key and tokens. TSR_ERR_INTERNAL with the first violation. */
tsr_status tsr_prefix_check(const tsr_prefix_index *x);

#endif
