/* The BPE model: one pre-tokenized word → token ids, exactly as tokenizers' BPE::merge_word + Word::merge_all.
 *
 * With ignore_merges, a word that is itself in the vocab is one token. Otherwise the word is split into characters
 * (continuing_subword_prefix on all but the first, end_of_word_suffix on the last), unknown characters go to
 * <0xNN> byte tokens (byte_fallback) or to the unk token (fused when fuse_unk). Then the adjacent pair with the
 * lowest merge rank (leftmost on ties) is merged until no pair has a rank. Short words keep each pair's rank in an
 * array and scan it; long words (e.g. whole SentencePiece segments, which have no pre-tokenizer) use a binary heap
 * with lazy invalidation, the same procedure as tokenizers. */
#include "runtime/text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t rank, pos, id;
} heap_ent;

static int grow_syms(tok_work *w, size_t n)
{
    if (n <= w->sym_cap) return 0;
    size_t cap = w->sym_cap ? w->sym_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(w->sym_id, cap * sizeof *a);
    if (!a) return -1;
    w->sym_id = a;
    int32_t *b = realloc(w->sym_prev, cap * sizeof *b);
    if (!b) return -1;
    w->sym_prev = b;
    int32_t *c = realloc(w->sym_next, cap * sizeof *c);
    if (!c) return -1;
    w->sym_next = c;
    uint32_t *d = realloc(w->sym_len, cap * sizeof *d); /* here: rank of the pair starting at each symbol */
    if (!d) return -1;
    w->sym_len = d;
    w->sym_cap = cap;
    return 0;
}

static tsr_status oom(void)
{
    return tsr_fail(TSR_ERR_NOMEM, "BPE: out of memory");
}

/* Initial symbols of a word; returns the count or -1 on out of memory. */
static long initial_symbols(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    long ns = 0;
    int32_t unk = -1; /* pending unk */
    char key[64];
    tok_buf big = {0};
    size_t i = 0;
    int plain = !t->cont_prefix_len && !t->eow_suffix_len;
    while (i < n) {
        size_t k = 1;
        while (i + k < n && (u[i + k] & 0xC0) == 0x80) k++;
        int first = i == 0, last = i + k == n;
        int32_t id;
        const char *ks = s + i;
        size_t kl = k;
        if (plain && k == 1) {
            id = t->char_ids[u[i]];
        } else {
            if (!plain) {
                size_t need = k + (first ? 0 : t->cont_prefix_len) + (last ? t->eow_suffix_len : 0);
                char *dst = key;
                if (need > sizeof key) {
                    big.len = 0;
                    if (tok_buf_reserve(&big, need)) goto fail;
                    dst = big.data;
                }
                kl = 0;
                if (!first) {
                    memcpy(dst, t->cont_prefix, t->cont_prefix_len);
                    kl += t->cont_prefix_len;
                }
                memcpy(dst + kl, s + i, k);
                kl += k;
                if (last) {
                    memcpy(dst + kl, t->eow_suffix, t->eow_suffix_len);
                    kl += t->eow_suffix_len;
                }
                ks = dst;
            }
            id = tok_strmap_get(&t->vocab, ks, kl);
        }
        if (id >= 0) {
            if (unk >= 0) {
                if (grow_syms(w, (size_t)ns + 1)) goto fail;
                w->sym_id[ns++] = unk;
                unk = -1;
            }
            if (grow_syms(w, (size_t)ns + 1)) goto fail;
            w->sym_id[ns++] = id;
        } else {
            int done = 0;
            if (t->byte_fallback) {
                const unsigned char *b = (const unsigned char *)ks;
                size_t j = 0;
                while (j < kl && t->byte_ids[b[j]] >= 0) j++;
                if (j == kl) {
                    if (grow_syms(w, (size_t)ns + kl)) goto fail;
                    for (j = 0; j < kl; j++) w->sym_id[ns++] = t->byte_ids[b[j]];
                    done = 1;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (unk >= 0 && !t->fuse_unk) {
                    if (grow_syms(w, (size_t)ns + 1)) goto fail;
                    w->sym_id[ns++] = unk;
                }
                unk = t->unk_id;
            }
        }
        i += k;
    }
    if (unk >= 0) {
        if (grow_syms(w, (size_t)ns + 1)) goto fail;
        w->sym_id[ns++] = unk;
    }
    tok_buf_free(&big);
    return ns;
fail:
    tok_buf_free(&big);
    return -1;
}

static inline int heap_less(const heap_ent *a, const heap_ent *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static int heap_push(tok_work *w, size_t *hn, heap_ent e)
{
    if (*hn == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 256;
        void *p = realloc(w->heap, cap * sizeof(heap_ent));
        if (!p) return -1;
        w->heap = p;
        w->heap_cap = cap;
    }
    heap_ent *h = w->heap;
    size_t i = (*hn)++;
    h[i] = e;
    while (i) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&h[i], &h[p])) break;
        heap_ent tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
    return 0;
}

static heap_ent heap_pop(tok_work *w, size_t *hn)
{
    heap_ent *h = w->heap;
    heap_ent top = h[0];
    h[0] = h[--*hn];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && heap_less(&h[l], &h[m])) m = l;
        if (r < n && heap_less(&h[r], &h[m])) m = r;
        if (m == i) break;
        heap_ent tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
    return top;
}

#define NO_RANK UINT32_MAX

static void merge_small(const tsr_tokenizer *t, tok_work *w, long ns)
{
    int32_t *id = w->sym_id;
    uint32_t *rank = w->sym_len;
    int32_t *res = w->sym_prev; /* merged id of the pair starting at i */
    long n = ns;
    for (long i = 0; i + 1 < n; i++) {
        const tok_pairmap_slot *m = tok_pairmap_get(&t->merges, id[i], id[i + 1]);
        rank[i] = m ? (uint32_t)m->rank : NO_RANK;
        res[i] = m ? m->id : -1;
    }
    if (n) rank[n - 1] = NO_RANK;
    while (n > 1) {
        long best = -1;
        uint32_t br = NO_RANK;
        for (long i = 0; i + 1 < n; i++)
            if (rank[i] < br) {
                br = rank[i];
                best = i;
            }
        if (best < 0) break;
        id[best] = res[best];
        memmove(id + best + 1, id + best + 2, (size_t)(n - best - 2) * sizeof *id);
        memmove(rank + best + 1, rank + best + 2, (size_t)(n - best - 2) * sizeof *rank);
        memmove(res + best + 1, res + best + 2, (size_t)(n - best - 2) * sizeof *res);
        n--;
        rank[n - 1] = NO_RANK;
        for (long j = best - 1; j <= best; j++) {
            if (j < 0 || j + 1 >= n) continue;
            const tok_pairmap_slot *m = tok_pairmap_get(&t->merges, id[j], id[j + 1]);
            rank[j] = m ? (uint32_t)m->rank : NO_RANK;
            res[j] = m ? m->id : -1;
        }
    }
    /* mark the live symbols as a compact list */
    for (long i = 0; i < n; i++) w->sym_next[i] = (int32_t)(i + 1 < n ? i + 1 : -1);
    for (long i = n; i < ns; i++) id[i] = -1;
}

static int merge_heap(const tsr_tokenizer *t, tok_work *w, long ns)
{
    int32_t *id = w->sym_id, *prev = w->sym_prev, *next = w->sym_next;
    size_t hn = 0;
    for (long i = 0; i < ns; i++) {
        prev[i] = (int32_t)(i - 1);
        next[i] = (int32_t)(i + 1 < ns ? i + 1 : -1);
    }
    for (long i = 0; i + 1 < ns; i++) {
        const tok_pairmap_slot *m = tok_pairmap_get(&t->merges, id[i], id[i + 1]);
        if (m && heap_push(w, &hn, (heap_ent){m->rank, (int32_t)i, m->id})) return -1;
    }
    while (hn) {
        heap_ent top = heap_pop(w, &hn);
        int32_t p = top.pos;
        if (id[p] < 0 || next[p] < 0) continue;
        int32_t r = next[p];
        const tok_pairmap_slot *m = tok_pairmap_get(&t->merges, id[p], id[r]);
        if (!m || m->id != top.id) continue;
        id[p] = top.id;
        id[r] = -1;
        next[p] = next[r];
        if (next[r] >= 0) prev[next[r]] = p;
        if (prev[p] >= 0) {
            const tok_pairmap_slot *a = tok_pairmap_get(&t->merges, id[prev[p]], id[p]);
            if (a && heap_push(w, &hn, (heap_ent){a->rank, prev[p], a->id})) return -1;
        }
        if (next[p] >= 0) {
            const tok_pairmap_slot *b = tok_pairmap_get(&t->merges, id[p], id[next[p]]);
            if (b && heap_push(w, &hn, (heap_ent){b->rank, p, b->id})) return -1;
        }
    }
    return 0;
}

static tsr_status bpe_merge(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n, tok_ids *out);

tsr_status tok_bpe_word(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n, tok_ids *out)
{
    if (!n) return TSR_OK;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, s, n);
        if (id >= 0) return tok_ids_push(out, id) ? oom() : TSR_OK;
    }
    struct tok_cache_ent *ce = NULL;
    if (n <= TOK_CACHE_WORD) {
        if (!w->cache && !(w->cache = calloc(TOK_CACHE_SLOTS, sizeof *w->cache))) return oom();
        ce = &w->cache[tok_hash(s, n) & (TOK_CACHE_SLOTS - 1)];
        if (ce->len == n && !memcmp(ce->word, s, n)) {
            for (int i = 0; i < ce->n_ids; i++)
                if (tok_ids_push(out, ce->ids[i])) return oom();
            return TSR_OK;
        }
    }
    size_t before = out->n;
    tsr_status st = bpe_merge(t, w, s, n, out);
    if (st || !ce || out->n - before > TOK_CACHE_IDS) return st;
    ce->len = (uint8_t)n;
    ce->n_ids = (uint8_t)(out->n - before);
    memcpy(ce->word, s, n);
    memcpy(ce->ids, out->v + before, ce->n_ids * sizeof *ce->ids);
    return TSR_OK;
}

static tsr_status bpe_merge(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n, tok_ids *out)
{
    long ns = initial_symbols(t, w, s, n);
    if (ns < 0) return oom();
    if (ns <= 1) {
        if (ns == 1 && tok_ids_push(out, w->sym_id[0])) return oom();
        return TSR_OK;
    }
    if (ns <= 48) {
        merge_small(t, w, ns);
    } else if (merge_heap(t, w, ns)) {
        return oom();
    }
    for (long i = 0; i < ns; i++)
        if (w->sym_id[i] >= 0 && tok_ids_push(out, w->sym_id[i])) return oom();
    return TSR_OK;
}
