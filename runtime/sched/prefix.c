/* The prefix index (see prefix.h): chained page keys, exact verification, LRU eviction of unreferenced pages.
 *
 * Entries live in per-page arrays (a page is cached under at most one key), so the index allocates nothing after
 * init. The key table uses linear probing with backward-shift deletion (no tombstones, so probe lengths stay short
 * however long the index runs) and has at least twice as many slots as there are pages. The hash absorbs one
 * token at a time into a 64-bit state through the MurmurHash3 finalizer, which mixes every input bit into every
 * output bit. */
#include "runtime/sched/prefix.h"

#include <stdlib.h>
#include <string.h>

static uint64_t fmix64(uint64_t z)
{
    z ^= z >> 33;
    z *= 0xff51afd7ed558ccdull;
    z ^= z >> 33;
    z *= 0xc4ceb9fe1a85ec53ull;
    z ^= z >> 33;
    return z;
}

uint64_t tsr_prefix_hash(uint64_t prev_key, const int32_t *tokens, int n)
{
    uint64_t h = fmix64(prev_key ^ (0x9E3779B97F4A7C15ull * (uint64_t)(uint32_t)(n + 1)));
    for (int i = 0; i < n; i++) h = fmix64((h + 0x632BE59BD9B4E019ull) ^ (uint64_t)(uint32_t)tokens[i]);
    return h;
}

tsr_prefix_link tsr_prefix_root(void)
{
    tsr_prefix_link l = {TSR_PREFIX_ROOT_KEY, -1, 0};
    return l;
}

static tsr_prefix_link broken_link(void)
{
    tsr_prefix_link l = {0, -2, 0};
    return l;
}

tsr_status tsr_prefix_init(tsr_prefix_index *x, tsr_pages *pages)
{
    memset(x, 0, sizeof *x);
    int n = pages->n_pages, ps = pages->page_size;
    uint32_t slots = 16;
    while (slots < 2u * (uint32_t)n) slots *= 2;
    x->pages = pages;
    x->page_size = ps;
    x->n_pages = n;
    x->cached = calloc((size_t)n, 1);
    x->in_lru = calloc((size_t)n, 1);
    x->key = calloc((size_t)n, sizeof *x->key);
    x->parent_key = calloc((size_t)n, sizeof *x->parent_key);
    x->parent = calloc((size_t)n, sizeof *x->parent);
    x->parent_gen = calloc((size_t)n, sizeof *x->parent_gen);
    x->gen = calloc((size_t)n, sizeof *x->gen);
    x->tokens = calloc((size_t)n * (size_t)ps, sizeof *x->tokens);
    x->lru_prev = calloc((size_t)n, sizeof *x->lru_prev);
    x->lru_next = calloc((size_t)n, sizeof *x->lru_next);
    x->table = malloc((size_t)slots * sizeof *x->table);
    if (!x->cached || !x->in_lru || !x->key || !x->parent_key || !x->parent || !x->parent_gen || !x->gen ||
        !x->tokens || !x->lru_prev || !x->lru_next || !x->table) {
        tsr_prefix_destroy(x);
        return tsr_fail(TSR_ERR_NOMEM, "prefix index: out of memory for %d pages of %d tokens", n, ps);
    }
    for (uint32_t i = 0; i < slots; i++) x->table[i] = -1;
    x->mask = slots - 1;
    x->lru_head = x->lru_tail = -1;
    return TSR_OK;
}

void tsr_prefix_destroy(tsr_prefix_index *x)
{
    free(x->cached);
    free(x->in_lru);
    free(x->key);
    free(x->parent_key);
    free(x->parent);
    free(x->parent_gen);
    free(x->gen);
    free(x->tokens);
    free(x->lru_prev);
    free(x->lru_next);
    free(x->table);
    memset(x, 0, sizeof *x);
}

/* ---- LRU list ---- */

static void lru_push_mru(tsr_prefix_index *x, int32_t page)
{
    x->lru_prev[page] = x->lru_tail;
    x->lru_next[page] = -1;
    if (x->lru_tail >= 0) x->lru_next[x->lru_tail] = page;
    else x->lru_head = page;
    x->lru_tail = page;
    x->in_lru[page] = 1;
    x->n_lru++;
}

static void lru_remove(tsr_prefix_index *x, int32_t page)
{
    int32_t p = x->lru_prev[page], n = x->lru_next[page];
    if (p >= 0) x->lru_next[p] = n;
    else x->lru_head = n;
    if (n >= 0) x->lru_prev[n] = p;
    else x->lru_tail = p;
    x->in_lru[page] = 0;
    x->n_lru--;
}

/* ---- key table ---- */

static uint32_t home_slot(const tsr_prefix_index *x, uint64_t key) { return (uint32_t)(key >> 7) & x->mask; }

/* The slot holding a page of this key, or the empty slot where it would go. */
static uint32_t probe(const tsr_prefix_index *x, uint64_t key)
{
    uint32_t i = home_slot(x, key);
    while (x->table[i] >= 0 && x->key[x->table[i]] != key) i = (i + 1) & x->mask;
    return i;
}

static void table_remove(tsr_prefix_index *x, uint32_t i)
{
    x->table[i] = -1;
    for (uint32_t j = (i + 1) & x->mask; x->table[j] >= 0; j = (j + 1) & x->mask) {
        uint32_t k = home_slot(x, x->key[x->table[j]]);
        /* the entry at j may move to the hole at i unless its home lies cyclically in (i, j] */
        int stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            x->table[i] = x->table[j];
            x->table[j] = -1;
            i = j;
        }
    }
}

static int entry_matches(const tsr_prefix_index *x, int32_t page, const tsr_prefix_link *parent,
                         const int32_t *tokens)
{
    return x->parent[page] == parent->page && (parent->page < 0 || x->parent_gen[page] == parent->gen) &&
           x->parent_key[page] == parent->key &&
           memcmp(x->tokens + (size_t)page * (size_t)x->page_size, tokens,
                  (size_t)x->page_size * sizeof *tokens) == 0;
}

static tsr_prefix_link link_of(const tsr_prefix_index *x, int32_t page)
{
    tsr_prefix_link l = {x->key[page], page, x->gen[page]};
    return l;
}

int32_t tsr_prefix_find(const tsr_prefix_index *x, const tsr_prefix_link *parent, uint64_t key,
                        const int32_t *tokens, tsr_prefix_link *out)
{
    if (parent->page < -1) return -1;
    int32_t page = x->table[probe(x, key)];
    if (page < 0 || !entry_matches(x, page, parent, tokens)) return -1;
    if (out) *out = link_of(x, page);
    return page;
}

int tsr_prefix_insert(tsr_prefix_index *x, const tsr_prefix_link *parent, uint64_t key, const int32_t *tokens,
                      int32_t page, tsr_prefix_link *out)
{
    *out = broken_link();
    if (parent->page < -1 || page < 0 || page >= x->n_pages || x->cached[page] ||
        tsr_pages_refcount(x->pages, page) < 1)
        return -1;
    uint32_t slot = probe(x, key);
    int32_t other = x->table[slot];
    if (other >= 0) {
        if (!entry_matches(x, other, parent, tokens)) return -1; /* a different prefix owns this key */
        *out = link_of(x, other);
        return 0;
    }
    tsr_pages_ref(x->pages, page);
    x->table[slot] = page;
    x->cached[page] = 1;
    x->key[page] = key;
    x->parent_key[page] = parent->key;
    x->parent[page] = parent->page;
    x->parent_gen[page] = parent->page >= 0 ? parent->gen : 0;
    x->gen[page]++;
    memcpy(x->tokens + (size_t)page * (size_t)x->page_size, tokens, (size_t)x->page_size * sizeof *tokens);
    x->n_entries++;
    *out = link_of(x, page);
    return 1;
}

int tsr_prefix_register(tsr_prefix_index *x, tsr_prefix_link *link, const int32_t *tokens, int32_t page)
{
    if (link->page < -1) return -1;
    tsr_prefix_link parent = *link;
    return tsr_prefix_insert(x, &parent, tsr_prefix_hash(parent.key, tokens, x->page_size), tokens, page, link);
}

int tsr_prefix_match(const tsr_prefix_index *x, const int32_t *tokens, int max_pages, int32_t *pages,
                     tsr_prefix_link *last)
{
    tsr_prefix_link link = tsr_prefix_root();
    int n = 0;
    for (; n < max_pages && x->n_entries > 0; n++) {
        const int32_t *t = tokens + (size_t)n * (size_t)x->page_size;
        tsr_prefix_link next;
        int32_t page = tsr_prefix_find(x, &link, tsr_prefix_hash(link.key, t, x->page_size), t, &next);
        if (page < 0) break;
        pages[n] = page;
        link = next;
    }
    if (last) *last = link;
    return n;
}

void tsr_prefix_record(tsr_prefix_index *x, int hit_pages)
{
    x->lookups++;
    if (hit_pages > 0) {
        x->hits++;
        x->hit_tokens += (uint64_t)hit_pages * (uint64_t)x->page_size;
    }
}

int tsr_prefix_acquire(tsr_prefix_index *x, int32_t page)
{
    if (page < 0 || page >= x->n_pages) return -1;
    int c = tsr_pages_ref(x->pages, page);
    if (c > 0 && x->in_lru[page]) lru_remove(x, page);
    return c;
}

int tsr_prefix_release(tsr_prefix_index *x, int32_t page)
{
    if (page < 0 || page >= x->n_pages || (x->cached[page] && tsr_pages_refcount(x->pages, page) < 2))
        return -1; /* a sequence never holds the index's own reference */
    int c = tsr_pages_unref(x->pages, page);
    if (c == 1 && x->cached[page]) lru_push_mru(x, page);
    return c;
}

static void evict_one(tsr_prefix_index *x)
{
    int32_t page = x->lru_head;
    lru_remove(x, page);
    table_remove(x, probe(x, x->key[page]));
    x->cached[page] = 0;
    x->n_entries--;
    x->evictions++;
    tsr_pages_unref(x->pages, page);
}

int tsr_prefix_evict(tsr_prefix_index *x, int n)
{
    int done = 0;
    while (done < n && x->n_lru > 0) {
        evict_one(x);
        done++;
    }
    return done;
}

void tsr_prefix_flush(tsr_prefix_index *x) { tsr_prefix_evict(x, x->n_lru); }

int32_t tsr_prefix_alloc(tsr_prefix_index *x)
{
    int32_t page = tsr_pages_alloc(x->pages);
    if (page < 0 && x->n_lru > 0) {
        evict_one(x);
        page = tsr_pages_alloc(x->pages);
    }
    return page;
}

int tsr_prefix_available(const tsr_prefix_index *x) { return x->pages->n_free + x->n_lru; }

tsr_status tsr_prefix_check(const tsr_prefix_index *x)
{
    int n_cached = 0, n_lru = 0, in_table = 0;
    for (int32_t p = 0; p < x->n_pages; p++) {
        int c = tsr_pages_refcount(x->pages, p);
        if (!x->cached[p]) {
            if (x->in_lru[p])
                return tsr_fail(TSR_ERR_INTERNAL, "prefix index: page %d is on the LRU but not cached", p);
            continue;
        }
        n_cached++;
        if (c < 1) return tsr_fail(TSR_ERR_INTERNAL, "prefix index: cached page %d has count %d", p, c);
        if ((c == 1) != (x->in_lru[p] != 0))
            return tsr_fail(TSR_ERR_INTERNAL, "prefix index: cached page %d has count %d but is%s on the LRU", p, c,
                            x->in_lru[p] ? "" : " not");
        if (x->table[probe(x, x->key[p])] != p)
            return tsr_fail(TSR_ERR_INTERNAL, "prefix index: cached page %d is not found under its key", p);
        if (tsr_prefix_hash(x->parent_key[p], x->tokens + (size_t)p * (size_t)x->page_size, x->page_size) !=
            x->key[p])
            return tsr_fail(TSR_ERR_INTERNAL, "prefix index: page %d's key is not the hash of its parent and tokens",
                            p);
    }
    for (int32_t p = x->lru_head, prev = -1; p >= 0; prev = p, p = x->lru_next[p]) {
        if (p >= x->n_pages || !x->in_lru[p] || x->lru_prev[p] != prev || ++n_lru > x->n_pages)
            return tsr_fail(TSR_ERR_INTERNAL, "prefix index: LRU list broken at page %d", p);
    }
    for (uint32_t i = 0; i <= x->mask; i++) {
        int32_t p = x->table[i];
        if (p < 0) continue;
        if (p >= x->n_pages || !x->cached[p])
            return tsr_fail(TSR_ERR_INTERNAL, "prefix index: table slot %u holds page %d, not cached", i, p);
        in_table++;
    }
    if (n_cached != x->n_entries || in_table != n_cached || n_lru != x->n_lru)
        return tsr_fail(TSR_ERR_INTERNAL, "prefix index: %d cached pages, %d entries, %d in the table, LRU %d/%d",
                        n_cached, x->n_entries, in_table, n_lru, x->n_lru);
    return TSR_OK;
}
