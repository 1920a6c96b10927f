/* Page pool and prefix index: reference counts and the free list; chained keys, exact verification on hit
 * (tokens and parent entry, so a key collision or a re-registered parent page never yields a wrong hit), LRU
 * eviction of unreferenced pages only, counters, and each structure's own consistency check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "runtime/sched/prefix.h"

#include <string.h>

static void test_pool(void **state)
{
    (void)state;
    tsr_pages p;
    assert_int_equal(tsr_pages_init(&p, 0, 8), TSR_ERR_ARG);
    assert_int_equal(tsr_pages_init(&p, 4, 0), TSR_ERR_ARG);
    assert_int_equal(tsr_pages_init(&p, 4, 8), TSR_OK);
    int32_t a = tsr_pages_alloc(&p), b = tsr_pages_alloc(&p), c = tsr_pages_alloc(&p), d = tsr_pages_alloc(&p);
    assert_int_equal(a, 0);
    assert_true(a != b && b != c && c != d && a != d && b >= 0 && c >= 0 && d >= 0);
    assert_int_equal(tsr_pages_alloc(&p), -1);
    assert_int_equal(tsr_pages_check(&p), TSR_OK);
    assert_int_equal(tsr_pages_ref(&p, b), 2);
    assert_int_equal(tsr_pages_unref(&p, b), 1);
    assert_int_equal(p.n_free, 0);
    assert_int_equal(tsr_pages_unref(&p, b), 0);
    assert_int_equal(p.n_free, 1);
    assert_int_equal(tsr_pages_unref(&p, b), -1); /* already free: nothing changes */
    assert_int_equal(tsr_pages_ref(&p, b), -1);
    assert_int_equal(tsr_pages_ref(&p, 4), -1);
    assert_int_equal(tsr_pages_unref(&p, -1), -1);
    assert_int_equal(tsr_pages_refcount(&p, b), 0);
    assert_int_equal(tsr_pages_check(&p), TSR_OK);
    assert_int_equal(tsr_pages_alloc(&p), b); /* the page just freed comes back first */
    /* a corrupted free list is caught */
    p.free_stack[p.n_free++] = a;
    assert_int_equal(tsr_pages_check(&p), TSR_ERR_INTERNAL);
    tsr_pages_destroy(&p);
}

static void fill(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static void test_hash(void **state)
{
    (void)state;
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5}, c[4] = {2, 1, 3, 4};
    uint64_t ha = tsr_prefix_hash(TSR_PREFIX_ROOT_KEY, a, 4);
    assert_true(ha == tsr_prefix_hash(TSR_PREFIX_ROOT_KEY, a, 4));
    assert_true(ha != tsr_prefix_hash(TSR_PREFIX_ROOT_KEY, b, 4));
    assert_true(ha != tsr_prefix_hash(TSR_PREFIX_ROOT_KEY, c, 4));
    assert_true(ha != tsr_prefix_hash(ha, a, 4)); /* chained: the same page after another prefix differs */
    assert_true(ha != tsr_prefix_hash(TSR_PREFIX_ROOT_KEY, a, 3));
    /* flipping any one bit of one token changes about half the key's bits */
    int flips = 0;
    for (int bit = 0; bit < 31; bit++) {
        int32_t t[4] = {1, 2, 3, 4};
        t[2] ^= 1 << bit;
        flips += __builtin_popcountll(ha ^ tsr_prefix_hash(TSR_PREFIX_ROOT_KEY, t, 4));
    }
    assert_true(flips > 31 * 24 && flips < 31 * 40);
}

static void test_chain(void **state)
{
    (void)state;
    tsr_pages p;
    tsr_prefix_index x;
    assert_int_equal(tsr_pages_init(&p, 8, 4), TSR_OK);
    assert_int_equal(tsr_prefix_init(&x, &p), TSR_OK);
    int32_t toks[12];
    fill(toks, 12, 100);
    int32_t pg[3];
    for (int i = 0; i < 3; i++) pg[i] = tsr_prefix_alloc(&x);
    tsr_prefix_link link = tsr_prefix_root();
    assert_int_equal(tsr_prefix_register(&x, &link, toks, pg[0]), 1);
    assert_int_equal(tsr_prefix_register(&x, &link, toks + 4, pg[1]), 1);
    assert_int_equal(link.page, pg[1]);
    assert_int_equal(tsr_pages_refcount(&p, pg[0]), 2); /* the sequence's and the index's */
    assert_int_equal(tsr_prefix_register(&x, &link, toks + 4, pg[0]), -1); /* already cached under another key */
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);

    int32_t got[3];
    tsr_prefix_link last;
    assert_int_equal(tsr_prefix_match(&x, toks, 3, got, &last), 2);
    assert_int_equal(got[0], pg[0]);
    assert_int_equal(got[1], pg[1]);
    assert_int_equal(last.page, pg[1]);
    assert_int_equal(tsr_prefix_match(&x, toks, 1, got, NULL), 1);
    int32_t other[12];
    memcpy(other, toks, sizeof other);
    other[6] = 7; /* second page differs */
    assert_int_equal(tsr_prefix_match(&x, other, 3, got, NULL), 1);
    memcpy(other, toks, sizeof other);
    other[0] = 7; /* first page differs: the identical second page must not match (the chain is the prefix) */
    assert_int_equal(tsr_prefix_match(&x, other, 3, got, &last), 0);
    assert_int_equal(last.page, -1);

    /* a second copy of the same prefix in another page is a duplicate: not inserted, chain continues there */
    int32_t dup = tsr_prefix_alloc(&x);
    tsr_prefix_link l2 = tsr_prefix_root();
    assert_int_equal(tsr_prefix_register(&x, &l2, toks, dup), 0);
    assert_int_equal(l2.page, pg[0]);
    assert_int_equal(tsr_pages_refcount(&p, dup), 1);
    assert_int_equal(tsr_prefix_register(&x, &l2, toks + 4, pg[2]), 0);
    assert_int_equal(tsr_prefix_register(&x, &l2, toks + 8, pg[2]), 1); /* extends the shared chain */
    assert_int_equal(tsr_prefix_match(&x, toks, 3, got, NULL), 3);
    assert_int_equal(got[2], pg[2]);
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);

    tsr_prefix_release(&x, dup);
    for (int i = 2; i >= 0; i--) tsr_prefix_release(&x, pg[i]);
    assert_int_equal(x.n_lru, 3);
    tsr_prefix_flush(&x);
    assert_int_equal(p.n_free, 8);
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);
    assert_int_equal(tsr_pages_check(&p), TSR_OK);
    tsr_prefix_destroy(&x);
    tsr_pages_destroy(&p);
}

/* A hit is exact: the same key with other tokens, or under another parent, is a miss; a key owned by a different
 * prefix blocks insertion (and breaks the chain) instead of aliasing. */
static void test_verify(void **state)
{
    (void)state;
    tsr_pages p;
    tsr_prefix_index x;
    assert_int_equal(tsr_pages_init(&p, 8, 4), TSR_OK);
    assert_int_equal(tsr_prefix_init(&x, &p), TSR_OK);
    int32_t t[4] = {5, 6, 7, 8}, u[4] = {5, 6, 7, 9};
    const uint64_t key = 0xDEADBEEFull; /* a forced collision: both pages claim one key */
    tsr_prefix_link root = tsr_prefix_root(), out;
    int32_t a = tsr_prefix_alloc(&x), b = tsr_prefix_alloc(&x);
    assert_int_equal(tsr_prefix_insert(&x, &root, key, t, a, &out), 1);
    assert_int_equal(tsr_prefix_find(&x, &root, key, t, NULL), a);
    assert_int_equal(tsr_prefix_find(&x, &root, key, u, NULL), -1);
    tsr_prefix_link fake_parent = {TSR_PREFIX_ROOT_KEY, b, 1};
    assert_int_equal(tsr_prefix_find(&x, &fake_parent, key, t, NULL), -1);
    assert_int_equal(tsr_prefix_insert(&x, &root, key, u, b, &out), -1);
    assert_int_equal(out.page, -2);
    assert_int_equal(tsr_pages_refcount(&p, b), 1); /* not taken */
    tsr_prefix_link next = out;
    assert_int_equal(tsr_prefix_register(&x, &next, t, b), -1); /* broken chain: nothing follows */
    /* (the check would flag the forced key: it is not the hash of its tokens) */
    assert_int_equal(tsr_prefix_check(&x), TSR_ERR_INTERNAL);
    tsr_prefix_release(&x, a);
    tsr_prefix_release(&x, b);
    tsr_prefix_flush(&x);
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);
    assert_int_equal(p.n_free, 8);

    /* a parent page evicted and registered again (new generation) no longer leads to its old children */
    tsr_prefix_link l = tsr_prefix_root();
    int32_t toks[8];
    fill(toks, 8, 40);
    int32_t c = tsr_prefix_alloc(&x), d = tsr_prefix_alloc(&x);
    assert_int_equal(tsr_prefix_register(&x, &l, toks, c), 1);
    assert_int_equal(tsr_prefix_register(&x, &l, toks + 4, d), 1);
    int32_t got[2];
    assert_int_equal(tsr_prefix_match(&x, toks, 2, got, NULL), 2);
    tsr_prefix_release(&x, c);          /* c: cache only; d stays held */
    assert_int_equal(tsr_prefix_evict(&x, 8), 1); /* only c: d is still held */
    assert_int_equal(tsr_pages_refcount(&p, c), 0);
    int32_t c2 = tsr_prefix_alloc(&x);
    l = tsr_prefix_root();
    assert_int_equal(tsr_prefix_register(&x, &l, toks, c2), 1);
    assert_int_equal(tsr_prefix_match(&x, toks, 2, got, NULL), 1); /* d's parent link is stale */
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);
    tsr_prefix_destroy(&x);
    tsr_pages_destroy(&p);
}

static void test_lru(void **state)
{
    (void)state;
    tsr_pages p;
    tsr_prefix_index x;
    assert_int_equal(tsr_pages_init(&p, 4, 2), TSR_OK);
    assert_int_equal(tsr_prefix_init(&x, &p), TSR_OK);
    int32_t toks[6];
    fill(toks, 6, 1);
    int32_t pg[3];
    tsr_prefix_link l = tsr_prefix_root();
    for (int i = 0; i < 3; i++) {
        pg[i] = tsr_prefix_alloc(&x);
        assert_int_equal(tsr_prefix_register(&x, &l, toks + 2 * i, pg[i]), 1);
    }
    for (int i = 2; i >= 0; i--) assert_int_equal(tsr_prefix_release(&x, pg[i]), 1); /* last page first */
    assert_int_equal(x.n_lru, 3);
    assert_int_equal(tsr_prefix_available(&x), 4);
    assert_int_equal(tsr_prefix_release(&x, pg[0]), -1); /* a sequence cannot drop the index's reference */
    assert_int_equal(tsr_prefix_acquire(&x, pg[0]), 2);   /* a hit takes it off the LRU */
    assert_int_equal(x.n_lru, 2);
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);
    int32_t f = tsr_prefix_alloc(&x); /* the free page first */
    assert_true(f >= 0 && x.evictions == 0);
    assert_int_equal(tsr_prefix_alloc(&x), pg[2]); /* then the least recently used: the chain's last page */
    assert_int_equal(tsr_prefix_alloc(&x), pg[1]);
    assert_int_equal(x.evictions, 2);
    assert_int_equal(tsr_prefix_alloc(&x), -1); /* pg[0] is in use: never evicted */
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);
    int32_t got[3];
    assert_int_equal(tsr_prefix_match(&x, toks, 3, got, NULL), 1);
    tsr_prefix_record(&x, 0);
    tsr_prefix_record(&x, 3);
    assert_int_equal(x.lookups, 2);
    assert_int_equal(x.hits, 1);
    assert_int_equal(x.hit_tokens, 6);
    assert_int_equal(tsr_prefix_release(&x, pg[0]), 1);
    tsr_prefix_release(&x, f);
    tsr_prefix_release(&x, pg[1]);
    tsr_prefix_release(&x, pg[2]);
    tsr_prefix_flush(&x);
    assert_int_equal(p.n_free, 4);
    assert_int_equal(x.n_entries, 0);
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);
    assert_int_equal(tsr_pages_check(&p), TSR_OK);
    tsr_prefix_destroy(&x);
    tsr_pages_destroy(&p);
}

/* Many registrations and evictions through a small table keep probing consistent (backward-shift deletion). */
static void test_churn(void **state)
{
    (void)state;
    tsr_pages p;
    tsr_prefix_index x;
    assert_int_equal(tsr_pages_init(&p, 32, 1), TSR_OK);
    assert_int_equal(tsr_prefix_init(&x, &p), TSR_OK);
    uint64_t r = 7;
    for (int it = 0; it < 20000; it++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int32_t tok = (int32_t)((r >> 33) % 200);
        int32_t page = tsr_prefix_alloc(&x);
        if (page < 0) {
            fail_msg("alloc failed with everything evictable");
            return;
        }
        tsr_prefix_link root = tsr_prefix_root();
        tsr_prefix_register(&x, &root, &tok, page);
        tsr_prefix_release(&x, page);
        if (it % 97 == 0) assert_int_equal(tsr_prefix_check(&x), TSR_OK);
        int32_t got;
        if (x.cached[page]) assert_int_equal(tsr_prefix_match(&x, &tok, 1, &got, NULL), 1);
    }
    assert_int_equal(tsr_prefix_check(&x), TSR_OK);
    tsr_prefix_flush(&x);
    assert_int_equal(p.n_free, 32);
    tsr_prefix_destroy(&x);
    tsr_pages_destroy(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool), cmocka_unit_test(test_hash), cmocka_unit_test(test_chain),
        cmocka_unit_test(test_verify), cmocka_unit_test(test_lru), cmocka_unit_test(test_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
