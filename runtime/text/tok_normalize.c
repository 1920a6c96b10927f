/* Normalizers: the steps of tokenizer.json's "normalizer" applied in order to one piece of text (the pieces between
 * added tokens), as tokenizers' NormalizedString does: Unicode normalization forms through utf8proc (skipped for
 * pure ASCII, which they leave unchanged), Lowercase per character, Strip of Unicode whitespace, Prepend (only to
 * non-empty text) and Replace of every non-overlapping match of a string or regex. */
#include "runtime/text/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static int all_ascii(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static tsr_status oom(void)
{
    return tsr_fail(TSR_ERR_NOMEM, "normalizer: out of memory");
}

static tsr_status unicode_form(norm_kind k, const char *in, size_t n, tok_buf *out)
{
    if (all_ascii(in, n)) return tok_buf_add(out, in, n) ? oom() : TSR_OK;
    int opt = UTF8PROC_STABLE;
    if (k == NORM_NFC) opt |= UTF8PROC_COMPOSE;
    else if (k == NORM_NFD) opt |= UTF8PROC_DECOMPOSE;
    else if (k == NORM_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opt);
    if (r < 0) {
        free(dst);
        return tsr_fail(TSR_ERR_ARG, "normalizer: utf8proc: %s", utf8proc_errmsg(r));
    }
    int e = tok_buf_add(out, dst, (size_t)r);
    free(dst);
    return e ? oom() : TSR_OK;
}

static tsr_status lowercase(const char *in, size_t n, tok_buf *out)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tok_utf8_next(s + i, n - i, &cp);
        if (k <= 0) return tsr_fail(TSR_ERR_ARG, "normalizer: invalid UTF-8");
        char enc[8];
        int m;
        if (cp == 0x130) { /* Rust: 'İ'.to_lowercase() = "i\u0307" */
            memcpy(enc, "i\xcc\x87", 3);
            m = 3;
        } else {
            m = tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        if (tok_buf_add(out, enc, (size_t)m)) return oom();
        i += (size_t)k;
    }
    return TSR_OK;
}

static tsr_status strip(const tok_norm *nm, const char *in, size_t n, tok_buf *out)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t a = 0, b = n;
    if (nm->strip_left) {
        while (a < n) {
            uint32_t cp;
            int k = tok_utf8_next(s + a, n - a, &cp);
            if (k <= 0 || !tok_is_whitespace(cp)) break;
            a += (size_t)k;
        }
    }
    if (nm->strip_right) {
        while (b > a) {
            size_t p = b - 1;
            while (p > a && (s[p] & 0xC0) == 0x80) p--;
            uint32_t cp;
            int k = tok_utf8_next(s + p, b - p, &cp);
            if (k <= 0 || !tok_is_whitespace(cp)) break;
            b = p;
        }
    }
    return tok_buf_add(out, in + a, b - a) ? oom() : TSR_OK;
}

static tsr_status replace(const tok_norm *nm, const char *in, size_t n, tok_buf *out)
{
    size_t pos = 0;
    if (!nm->pat.is_regex) {
        const char *p = nm->pat.lit;
        size_t pl = nm->pat.lit_len;
        if (pl) {
            for (;;) {
                const char *hit = pos < n ? memmem(in + pos, n - pos, p, pl) : NULL;
                if (!hit) break;
                size_t h = (size_t)(hit - in);
                if (tok_buf_add(out, in + pos, h - pos) || tok_buf_add(out, nm->str, nm->str_len)) return oom();
                pos = h + pl;
            }
        }
        return tok_buf_add(out, in + pos, n - pos) ? oom() : TSR_OK;
    }
    pcre2_match_data *md = pcre2_match_data_create(8, NULL);
    if (!md) return oom();
    size_t from = 0;
    tsr_status st = TSR_OK;
    while (from <= n) {
        size_t ms, me;
        int r = tok_regex_find(&nm->pat.re, md, NULL, in, n, from, &ms, &me);
        if (r < 0) {
            st = tsr_fail(TSR_ERR_INTERNAL, "normalizer Replace: regex match failed");
            break;
        }
        if (!r) break;
        if (tok_buf_add(out, in + pos, ms - pos) || tok_buf_add(out, nm->str, nm->str_len)) {
            st = oom();
            break;
        }
        pos = me;
        if (me == ms) { /* empty match: step over one character */
            if (me >= n) break;
            size_t k = 1;
            while (me + k < n && ((unsigned char)in[me + k] & 0xC0) == 0x80) k++;
            if (tok_buf_add(out, in + me, k)) {
                st = oom();
                break;
            }
            pos = from = me + k;
        } else {
            from = me;
        }
    }
    pcre2_match_data_free(md);
    if (st) return st;
    return tok_buf_add(out, in + pos, n - pos) ? oom() : TSR_OK;
}

static tsr_status step(const tok_norm *nm, const char *in, size_t n, tok_buf *out)
{
    switch (nm->kind) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD:
        return unicode_form(nm->kind, in, n, out);
    case NORM_LOWER:
        return lowercase(in, n, out);
    case NORM_STRIP:
        return strip(nm, in, n, out);
    case NORM_PREPEND:
        if (n && tok_buf_add(out, nm->str, nm->str_len)) return oom();
        return tok_buf_add(out, in, n) ? oom() : TSR_OK;
    case NORM_REPLACE:
        return replace(nm, in, n, out);
    }
    return tsr_fail(TSR_ERR_INTERNAL, "normalizer: unknown step");
}

tsr_status tok_normalize(const tsr_tokenizer *t, const char *in, size_t n, tok_buf *out)
{
    out->len = 0;
    if (tok_buf_add(out, in, n)) return oom();
    if (!t->n_norms) return TSR_OK;
    tok_buf tmp = {0};
    for (size_t i = 0; i < t->n_norms; i++) {
        tmp.len = 0;
        if (tok_buf_reserve(&tmp, out->len)) {
            tok_buf_free(&tmp);
            return oom();
        }
        tmp.data[0] = 0;
        tsr_status st = step(&t->norms[i], out->data, out->len, &tmp);
        if (st) {
            tok_buf_free(&tmp);
            return st;
        }
        tok_buf sw = *out;
        *out = tmp;
        tmp = sw;
    }
    tok_buf_free(&tmp);
    return TSR_OK;
}
