/* Pre-tokenizers: split one normalized piece into words and hand each word to the BPE model.
 *
 * The steps of tokenizer.json's pre_tokenizer (Sequences flattened) run depth first: step k splits or transforms
 * its input and calls step k+1 on each result; after the last step the word goes to tok_bpe_word. This keeps no
 * list of all words. Splitting follows tokenizers' NormalizedString::split: the matches of the pattern and the gaps
 * between them cover the text, `invert` swaps which is which, the behavior (Removed, Isolated, MergedWithPrevious,
 * MergedWithNext, Contiguous) folds them, and empty results are dropped. ByteLevel maps every byte to its printable
 * stand-in character (GPT-2's bytes_to_unicode); Metaspace replaces spaces with the replacement character. */
#include "runtime/text/tok_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static char bl_enc[256][2];
static unsigned char bl_len[256];
static pthread_once_t bl_once = PTHREAD_ONCE_INIT;

int tok_bytelevel_char(int b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    if (b <= 0x20) return 256 + b;
    if (b >= 0x7F && b <= 0xA0) return 256 + 33 + (b - 0x7F);
    return 256 + 67; /* 0xAD */
}

static void bl_init(void)
{
    for (int b = 0; b < 256; b++)
        bl_len[b] = (unsigned char)tok_utf8_encode((uint32_t)tok_bytelevel_char(b), bl_enc[b]);
}

static tsr_status oom(void)
{
    return tsr_fail(TSR_ERR_NOMEM, "pre-tokenizer: out of memory");
}

static tsr_status run(const tsr_tokenizer *t, tok_work *w, size_t step, const char *s, size_t n, int at_start,
                      tok_ids *out);

static int add_span(tok_work *w, size_t d, size_t *cnt, size_t a, size_t b, size_t m)
{
    if ((*cnt + 1) * 3 > w->spans_cap[d]) {
        size_t cap = w->spans_cap[d] ? w->spans_cap[d] * 2 : 192;
        size_t *p = realloc(w->spans[d], cap * sizeof *p);
        if (!p) return -1;
        w->spans[d] = p;
        w->spans_cap[d] = cap;
    }
    size_t *e = w->spans[d] + *cnt * 3;
    e[0] = a;
    e[1] = b;
    e[2] = m;
    (*cnt)++;
    return 0;
}

/* The matches of a pattern and the gaps between them, as (start, end, is_match) triples covering s. */
static tsr_status find_matches(const tok_pattern *p, tok_work *w, size_t d, const char *s, size_t n, size_t *cnt)
{
    size_t prev = 0, from = 0;
    *cnt = 0;
    for (;;) {
        size_t ms, me;
        if (p->is_regex) {
            int r = tok_regex_find(&p->re, w->md, w->mc, s, n, from, &ms, &me);
            if (r < 0) return tsr_fail(TSR_ERR_INTERNAL, "pre-tokenizer: regex match failed (error %d)", r);
            if (!r) break;
        } else {
            if (!p->lit_len || from >= n) break;
            const char *hit = memmem(s + from, n - from, p->lit, p->lit_len);
            if (!hit) break;
            ms = (size_t)(hit - s);
            me = ms + p->lit_len;
        }
        if (prev != ms && add_span(w, d, cnt, prev, ms, 0)) return oom();
        if (add_span(w, d, cnt, ms, me, 1)) return oom();
        prev = me;
        if (me == ms) { /* empty match: continue after the next character */
            if (me >= n) break;
            size_t k = 1;
            while (me + k < n && ((unsigned char)s[me + k] & 0xC0) == 0x80) k++;
            from = me + k;
        } else {
            from = me;
        }
    }
    if (prev != n && add_span(w, d, cnt, prev, n, 0)) return oom();
    return TSR_OK;
}

/* Folds the triples in place into (start, end, keep) spans following the behavior. */
static size_t apply_behavior(size_t *e, size_t cnt, split_behavior b, int invert)
{
    if (invert)
        for (size_t i = 0; i < cnt; i++) e[i * 3 + 2] = !e[i * 3 + 2];
    size_t o = 0;
    int prev = 0;
    switch (b) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < cnt; i++) e[i * 3 + 2] = 1;
        return cnt;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < cnt; i++) e[i * 3 + 2] = !e[i * 3 + 2];
        return cnt;
    case SPLIT_CONTIGUOUS:
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < cnt; i++) {
            int m = (int)e[i * 3 + 2];
            int join = b == SPLIT_CONTIGUOUS ? m == prev : (m && !prev);
            if (join && o) {
                e[(o - 1) * 3 + 1] = e[i * 3 + 1];
            } else {
                e[o * 3] = e[i * 3];
                e[o * 3 + 1] = e[i * 3 + 1];
                o++;
            }
            prev = m;
        }
        break;
    case SPLIT_MERGED_NEXT: { /* fold from the end, writing from the end */
        size_t top = cnt; /* output occupies [top, cnt) */
        for (size_t i = cnt; i-- > 0;) {
            int m = (int)e[i * 3 + 2];
            if (m && !prev && top < cnt) {
                e[top * 3] = e[i * 3];
            } else {
                top--;
                size_t a = e[i * 3], z = e[i * 3 + 1];
                e[top * 3] = a;
                e[top * 3 + 1] = z;
            }
            prev = m;
        }
        memmove(e, e + top * 3, (cnt - top) * 3 * sizeof *e);
        o = cnt - top;
        break;
    }
    }
    for (size_t i = 0; i < o; i++) e[i * 3 + 2] = 1;
    return o;
}

static tsr_status split_and_run(const tsr_tokenizer *t, tok_work *w, size_t step, const tok_pattern *p,
                                split_behavior b, int invert, const char *s, size_t n, int at_start, tok_ids *out)
{
    size_t cnt;
    TSR_TRY(find_matches(p, w, step, s, n, &cnt));
    cnt = apply_behavior(w->spans[step], cnt, b, invert);
    for (size_t i = 0; i < cnt; i++) {
        size_t *e = w->spans[step] + i * 3; /* re-read: deeper steps use other arrays */
        if (!e[2] || e[1] <= e[0]) continue;
        TSR_TRY(run(t, w, step + 1, s + e[0], e[1] - e[0], at_start && e[0] == 0, out));
    }
    return TSR_OK;
}

static tsr_status bytelevel_word(const tsr_tokenizer *t, tok_work *w, size_t step, const char *s, size_t n,
                                 int at_start, tok_ids *out)
{
    tok_buf *b = &w->depth_b[step];
    b->len = 0;
    if (tok_buf_reserve(b, n * 2)) return oom();
    char *d = b->data;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        d[k] = bl_enc[c][0];
        if (bl_len[c] == 2) d[k + 1] = bl_enc[c][1];
        k += bl_len[c];
    }
    b->len = k;
    return run(t, w, step + 1, d, k, at_start, out);
}

static tsr_status run(const tsr_tokenizer *t, tok_work *w, size_t step, const char *s, size_t n, int at_start,
                      tok_ids *out)
{
    if (!n) return TSR_OK;
    if (step == t->n_pretoks) return tok_bpe_word(t, w, s, n, out);
    const tok_pretok *p = &t->pretoks[step];
    switch (p->kind) {
    case PT_SPLIT:
        return split_and_run(t, w, step, &p->pat, p->behavior, p->invert, s, n, at_start, out);
    case PT_BYTELEVEL: {
        pthread_once(&bl_once, bl_init);
        if (p->add_prefix_space && s[0] != ' ') {
            tok_buf *a = &w->depth_a[step];
            a->len = 0;
            if (tok_buf_add(a, " ", 1) || tok_buf_add(a, s, n)) return oom();
            s = a->data;
            n = a->len;
        }
        if (!p->use_regex) return bytelevel_word(t, w, step, s, n, at_start, out);
        size_t cnt;
        TSR_TRY(find_matches(&p->pat, w, step, s, n, &cnt));
        for (size_t i = 0; i < cnt; i++) {
            size_t *e = w->spans[step] + i * 3;
            if (e[1] <= e[0]) continue;
            TSR_TRY(bytelevel_word(t, w, step, s + e[0], e[1] - e[0], at_start && e[0] == 0, out));
        }
        return TSR_OK;
    }
    case PT_METASPACE: {
        tok_buf *a = &w->depth_a[step];
        a->len = 0;
        int starts = n >= p->repl_len && !memcmp(s, p->repl, p->repl_len);
        if (((p->scheme == PREPEND_ALWAYS) || (p->scheme == PREPEND_FIRST && at_start)) && !starts) {
            /* a leading space becomes the replacement below, so check for it too */
            if (s[0] != ' ' && tok_buf_add(a, p->repl, p->repl_len)) return oom();
        }
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ') {
                if (tok_buf_add(a, p->repl, p->repl_len)) return oom();
            } else {
                size_t j = i;
                while (j < n && s[j] != ' ') j++;
                if (tok_buf_add(a, s + i, j - i)) return oom();
                i = j - 1;
            }
        }
        if (!p->split) return run(t, w, step + 1, a->data, a->len, at_start, out);
        tok_pattern pat = {0};
        pat.lit = (char *)p->repl;
        pat.lit_len = p->repl_len;
        /* the buffer of this step stays untouched while deeper steps run */
        return split_and_run(t, w, step, &pat, SPLIT_MERGED_NEXT, 0, a->data, a->len, at_start, out);
    }
    }
    return tsr_fail(TSR_ERR_INTERNAL, "pre-tokenizer: unknown step");
}

tsr_status tok_pretok_run(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n, int at_start, tok_ids *out)
{
    return run(t, w, 0, s, n, at_start, out);
}
