/* Encoding: text → ids, the order of tokenizers' Tokenizer::encode.
 *
 * 1. The input is checked to be valid UTF-8 (TSR_ERR_ARG otherwise).
 * 2. Added tokens with normalized=false are split out of the raw text (leftmost-longest match, honouring
 *    single_word, lstrip and rstrip), 3. each remaining piece is normalized and the normalized=true added tokens
 *    are split out of it, 4. the pieces left go through the pre-tokenizers and the BPE model (tok_pretok.c),
 * 5. with add_special the post-processor template wraps the ids (BOS/EOS). */
#include "runtime/text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

static tsr_status oom(void)
{
    return tsr_fail(TSR_ERR_NOMEM, "encode: out of memory");
}

tok_work *tok_work_new(void)
{
    tok_work *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->md = pcre2_match_data_create(8, NULL);
    w->mc = pcre2_match_context_create(NULL);
    w->jit_stack = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, NULL);
    if (!w->md || !w->mc || !w->jit_stack) {
        tok_work_free(w);
        return NULL;
    }
    pcre2_jit_stack_assign(w->mc, NULL, w->jit_stack);
    return w;
}

void tok_work_free(tok_work *w)
{
    if (!w) return;
    if (w->md) pcre2_match_data_free(w->md);
    if (w->mc) pcre2_match_context_free(w->mc);
    if (w->jit_stack) pcre2_jit_stack_free(w->jit_stack);
    for (int i = 0; i < TOK_MAX_DEPTH; i++) {
        tok_buf_free(&w->depth_a[i]);
        tok_buf_free(&w->depth_b[i]);
        free(w->spans[i]);
    }
    free(w->sym_id);
    free(w->sym_prev);
    free(w->sym_next);
    free(w->sym_len);
    free(w->heap);
    free(w->cache);
    tok_buf_free(&w->norm);
    free(w);
}

tok_work *tok_work_get(const tsr_tokenizer *ct)
{
    tsr_tokenizer *t = (tsr_tokenizer *)ct; /* the pool is the only mutable part, under its lock */
    tok_work *w = NULL;
    pthread_mutex_lock(&t->pool_lock);
    if (t->n_pool) w = t->pool[--t->n_pool];
    pthread_mutex_unlock(&t->pool_lock);
    return w ? w : tok_work_new();
}

void tok_work_put(const tsr_tokenizer *ct, tok_work *w)
{
    tsr_tokenizer *t = (tsr_tokenizer *)ct;
    if (!w) return;
    /* do not keep very large scratch buffers around */
    if (w->sym_cap > (1u << 20) || w->heap_cap > (1u << 20) || w->norm.cap > (16u << 20)) {
        tok_work_free(w);
        return;
    }
    pthread_mutex_lock(&t->pool_lock);
    if (t->n_pool < sizeof t->pool / sizeof t->pool[0]) {
        t->pool[t->n_pool++] = w;
        w = NULL;
    }
    pthread_mutex_unlock(&t->pool_lock);
    tok_work_free(w);
}

static const char *am_str(const tsr_tokenizer *t, int set, uint32_t i, size_t *len)
{
    const tok_added *a = &t->added[i];
    if (set == 1 && a->norm) {
        *len = a->norm_len;
        return a->norm;
    }
    *len = a->len;
    return a->content;
}

typedef struct {
    const tsr_tokenizer *t;
    int set;
} sort_ctx;

static int by_first_then_longest(const void *x, const void *y, void *arg)
{
    const sort_ctx *c = arg;
    size_t lx, ly;
    const unsigned char *a = (const unsigned char *)am_str(c->t, c->set, *(const uint32_t *)x, &lx);
    const unsigned char *b = (const unsigned char *)am_str(c->t, c->set, *(const uint32_t *)y, &ly);
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    if (lx != ly) return lx > ly ? -1 : 1;
    return *(const uint32_t *)x < *(const uint32_t *)y ? -1 : 1;
}

tsr_status tok_build_matchers(tsr_tokenizer *t)
{
    for (int set = 0; set < 2; set++) {
        uint32_t *order = malloc((t->n_added ? t->n_added : 1) * sizeof *order);
        if (!order) return oom();
        size_t n = 0;
        for (uint32_t i = 0; i < t->n_added; i++) {
            size_t len;
            am_str(t, set, i, &len);
            if (len && (t->added[i].normalized ? 1 : 0) == set) order[n++] = i;
        }
        sort_ctx sc = {t, set};
        qsort_r(order, n, sizeof *order, by_first_then_longest, &sc);
        size_t k = 0;
        for (int c = 0; c < 256; c++) {
            t->am_first[set][c] = (uint32_t)k;
            while (k < n) {
                size_t len;
                const unsigned char *s = (const unsigned char *)am_str(t, set, order[k], &len);
                if (s[0] != c) break;
                k++;
            }
        }
        t->am_first[set][256] = (uint32_t)k;
        t->am_order[set] = order;
    }
    return TSR_OK;
}

static int prev_char(const char *s, size_t end, uint32_t *cp)
{
    if (!end) return 0;
    size_t p = end - 1;
    while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
    return tok_utf8_next((const unsigned char *)s + p, end - p, cp) > 0 ? 1 : 0;
}

/* Finds the next added-token match in s[from..n) and applies its flags. Returns the token index or -1; sets the
 * match span [*ms, *me) (after lstrip/rstrip) and *resume (where scanning goes on). `floor` is where the previous
 * match ended (lstrip does not reach before it). */
static long next_added(const tsr_tokenizer *t, int set, const char *s, size_t n, size_t from, size_t floor,
                       size_t *ms, size_t *me, size_t *resume)
{
    const unsigned char *u = (const unsigned char *)s;
    const uint32_t *first = t->am_first[set], *order = t->am_order[set];
    if (first[256] == 0) return -1;
    size_t i = from;
    while (i < n) {
        uint32_t lo = first[u[i]], hi = first[u[i] + 1];
        long hit = -1;
        size_t hl = 0;
        for (uint32_t k = lo; k < hi; k++) {
            size_t len;
            const char *c = am_str(t, set, order[k], &len);
            if (len <= n - i && !memcmp(s + i, c, len)) {
                hit = (long)order[k];
                hl = len;
                break;
            }
        }
        if (hit < 0) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[hit];
        size_t start = i, stop = i + hl;
        if (a->single_word) {
            uint32_t cp;
            int start_space = start == 0 || !(prev_char(s, start, &cp) && tok_is_word_char(cp));
            int stop_space = stop == n || !(tok_utf8_next(u + stop, n - stop, &cp) > 0 && tok_is_word_char(cp));
            if (!start_space || !stop_space) {
                i = stop; /* the matcher moves past a discarded match */
                continue;
            }
        }
        *resume = stop;
        if (a->lstrip) {
            size_t ns = start;
            uint32_t cp;
            while (ns > 0 && prev_char(s, ns, &cp) && tok_is_whitespace(cp)) {
                size_t p = ns - 1;
                while (p > 0 && (u[p] & 0xC0) == 0x80) p--;
                ns = p;
            }
            start = ns > floor ? ns : floor;
        }
        if (a->rstrip) {
            uint32_t cp;
            int k;
            while (stop < n && (k = tok_utf8_next(u + stop, n - stop, &cp)) > 0 && tok_is_whitespace(cp))
                stop += (size_t)k;
            *resume = stop;
        }
        *ms = start;
        *me = stop;
        return hit;
    }
    return -1;
}

static tsr_status normalized_piece(const tsr_tokenizer *t, tok_work *w, const char *s, size_t n, int at_start,
                                   tok_ids *out)
{
    if (!n) return TSR_OK;
    TSR_TRY(tok_normalize(t, s, n, &w->norm));
    /* the normalized buffer is reused by the next piece only after this one is done */
    const char *ns = w->norm.data ? w->norm.data : "";
    size_t nn = w->norm.len;
    if (t->am_first[1][256] == 0) return tok_pretok_run(t, w, ns, nn, at_start, out);
    /* copy: pre-tokenization of a gap must not see w->norm change (it does not, but keep the pieces stable) */
    char *copy = malloc(nn + 1);
    if (!copy) return oom();
    memcpy(copy, ns, nn);
    size_t pos = 0, from = 0, ms, me, resume;
    long k;
    tsr_status st = TSR_OK;
    while ((k = next_added(t, 1, copy, nn, from, pos, &ms, &me, &resume)) >= 0) {
        if (ms > pos && (st = tok_pretok_run(t, w, copy + pos, ms - pos, at_start && pos == 0, out))) break;
        if (tok_ids_push(out, t->added[k].id)) {
            st = oom();
            break;
        }
        pos = me > pos ? me : pos;
        from = resume > pos ? resume : pos;
    }
    if (!st && pos < nn) st = tok_pretok_run(t, w, copy + pos, nn - pos, at_start && pos == 0, out);
    free(copy);
    return st;
}

static tsr_status encode(const tsr_tokenizer *t, tok_work *w, const char *text, size_t len, tok_ids *out)
{
    size_t pos = 0, from = 0, ms, me, resume;
    long k;
    while ((k = next_added(t, 0, text, len, from, pos, &ms, &me, &resume)) >= 0) {
        if (ms > pos) TSR_TRY(normalized_piece(t, w, text + pos, ms - pos, pos == 0, out));
        if (tok_ids_push(out, t->added[k].id)) return oom();
        pos = me > pos ? me : pos;
        from = resume > pos ? resume : pos;
    }
    if (pos < len) TSR_TRY(normalized_piece(t, w, text + pos, len - pos, pos == 0, out));
    return TSR_OK;
}

tsr_status tsr_tokenizer_encode(const tsr_tokenizer *t, const char *text, size_t len, int add_special,
                                int32_t **ids, size_t *n_ids)
{
    if (!t || (!text && len) || !ids || !n_ids) return tsr_fail(TSR_ERR_ARG, "tsr_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    if (!text) text = "";
    size_t bad = tok_utf8_validate(text, len);
    if (bad != len)
        return tsr_fail(TSR_ERR_ARG, "encode: input is not valid UTF-8 (byte 0x%02X at offset %zu)",
                        (unsigned char)text[bad], bad);
    tok_work *w = tok_work_get(t);
    if (!w) return oom();
    tok_ids body = {0}, full = {0};
    tsr_status st = encode(t, w, text, len, &body);
    tok_work_put(t, w);
    if (st) {
        free(body.v);
        return st;
    }
    if (add_special && t->n_post) {
        for (size_t i = 0; i < t->n_post && !st; i++) {
            const tok_post_item *it = &t->post[i];
            const int32_t *src = it->is_seq ? body.v : it->ids;
            size_t n = it->is_seq ? body.n : it->n;
            for (size_t j = 0; j < n; j++)
                if (tok_ids_push(&full, src[j])) {
                    st = oom();
                    break;
                }
        }
        free(body.v);
        body = full;
        if (st) {
            free(body.v);
            return st;
        }
    }
    if (!body.v && !(body.v = malloc(sizeof *body.v))) return oom();
    *ids = body.v;
    *n_ids = body.n;
    return TSR_OK;
}
