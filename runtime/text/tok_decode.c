/* Decoding: ids → text, as a stream. Full decoding is the stream fed with every id and flushed, so the two agree
 * by construction and both are checked against tokenizers' Tokenizer::decode.
 *
 * Each decoder step of tokenizer.json is a stage that receives chunks of token text (a flag marks the chunk that
 * starts a token) and passes chunks on; the last stage appends to the output. Before any Fuse or ByteLevel step the
 * chunks are whole tokens; after one, the rest of the stream is a single token, so per-token rules apply to the
 * whole text (e.g. Strip's start, Metaspace's first token). Stages hold back only what they must:
 *   ByteFallback: a run of <0xNN> tokens until a non-byte token (an invalid run becomes one U+FFFD per byte);
 *   ByteLevel: the bytes of an incomplete UTF-8 character (Rust's from_utf8_lossy at the end);
 *   Strip: up to `stop` trailing strip characters of the current token;
 *   Replace after a fusing step: a tail that could start the pattern.
 * Steps that need a whole token but come after a fusing step (rare) hold everything until the flush. Without a
 * decoder, tokens are joined with a space, like tokenizers. Unknown ids are skipped, as tokenizers does. */
#include "runtime/text/tok_internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int whole;         /* chunks arrive as whole tokens */
    tok_buf buf;       /* held bytes */
    tok_buf scratch;   /* output being built */
    size_t ntok;       /* tokens started (Metaspace) */
    int left;          /* Strip: leading characters that may still be stripped in this token */
    int held;          /* Strip: trailing strip characters held */
    int sent_first;    /* Fuse/ByteLevel: the single output token was started */
} stage;

struct tsr_detokenizer {
    const tsr_tokenizer *t;
    int skip_special;
    size_t n_pushed; /* tokens passed to the decoder (for the no-decoder join) */
    stage *st;
    tok_buf out;
};

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static int emit(tsr_detokenizer *d, size_t k, const char *s, size_t n, int start);

static int is_byte_token(const char *s, size_t n, unsigned char *b)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int x = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (x < 0) return 0;
        v = v * 16 + x;
    }
    *b = (unsigned char)v;
    return 1;
}

static int bytelevel_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 256 || cp > 256 + 67) return -1;
    uint32_t i = cp - 256;
    if (i <= 32) return (int)i;
    if (i <= 32 + 34) return (int)(0x7F + (i - 33));
    return 0xAD;
}

/* Appends the ByteLevel bytes of one token to b: its mapped bytes, or its raw UTF-8 when a character has no byte. */
static int bytelevel_token(const char *s, size_t n, tok_buf *b)
{
    size_t start = b->len;
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        int k = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
        int v = k > 0 ? bytelevel_byte(cp) : -1;
        if (v < 0) {
            b->len = start;
            return tok_buf_add(b, s, n);
        }
        unsigned char c = (unsigned char)v;
        if (tok_buf_add(b, &c, 1)) return -1;
        i += (size_t)k;
    }
    return 0;
}

/* Emits the valid part of st->buf (lossy), keeping an incomplete tail unless final. */
static int bytelevel_drain(tsr_detokenizer *d, size_t k, stage *st, int final)
{
    int err = 0;
    st->scratch.len = 0;
    size_t used = 0;
    if (st->buf.len) {
        used = tok_utf8_lossy((const unsigned char *)st->buf.data, st->buf.len, final, &st->scratch, &err);
        if (err) return -1;
        memmove(st->buf.data, st->buf.data + used, st->buf.len - used);
        st->buf.len -= used;
    }
    if (!st->scratch.len && st->sent_first) return 0;
    int first = !st->sent_first;
    st->sent_first = 1;
    /* scratch is this stage's: copy out before recursing would be needed only if k+1 wrote into it; it does not */
    return emit(d, k + 1, st->scratch.data ? st->scratch.data : "", st->scratch.len, first);
}

static int bytefallback_run(tsr_detokenizer *d, size_t k, stage *st)
{
    if (!st->buf.len) return 0;
    size_t n = st->buf.len;
    int r = 0;
    if (tok_utf8_validate(st->buf.data, n) == n) {
        st->scratch.len = 0;
        if (tok_buf_add(&st->scratch, st->buf.data, n)) return -1;
        st->buf.len = 0;
        r = emit(d, k + 1, st->scratch.data, n, 1);
    } else {
        st->buf.len = 0;
        for (size_t i = 0; i < n && !r; i++) r = emit(d, k + 1, FFFD, 3, 1);
    }
    return r;
}

/* One token through ByteFallback. */
static int bytefallback_token(tsr_detokenizer *d, size_t k, stage *st, const char *s, size_t n)
{
    unsigned char b;
    if (is_byte_token(s, n, &b)) return tok_buf_add(&st->buf, &b, 1);
    if (bytefallback_run(d, k, st)) return -1;
    return emit(d, k + 1, s, n, 1);
}

static int replace_all(const tok_dec *dc, const char *s, size_t n, tok_buf *out, size_t *keep_from, int hold)
{
    const char *p = dc->pat.lit;
    size_t pl = dc->pat.lit_len, pos = 0;
    if (pl) {
        for (;;) {
            const char *hit = pos < n ? memmem(s + pos, n - pos, p, pl) : NULL;
            if (!hit) break;
            size_t h = (size_t)(hit - s);
            if (tok_buf_add(out, s + pos, h - pos) || tok_buf_add(out, dc->str, dc->str_len)) return -1;
            pos = h + pl;
        }
    }
    size_t end = n;
    if (hold && pl > 1) { /* keep the longest tail that is a proper prefix of the pattern */
        size_t from = n - pos > pl - 1 ? n - (pl - 1) : pos;
        for (size_t i = from; i < n; i++)
            if (!memcmp(s + i, p, n - i)) {
                end = i;
                break;
            }
    }
    *keep_from = end;
    return tok_buf_add(out, s + pos, end - pos);
}

static int emit(tsr_detokenizer *d, size_t k, const char *s, size_t n, int start)
{
    const tsr_tokenizer *t = d->t;
    if (k == t->n_decs) return tok_buf_add(&d->out, s, n);
    const tok_dec *dc = &t->decs[k];
    stage *st = &d->st[k];
    switch (dc->kind) {
    case DEC_REPLACE: {
        size_t keep;
        if (st->whole) {
            st->scratch.len = 0;
            if (replace_all(dc, s, n, &st->scratch, &keep, 0)) return -1;
            return emit(d, k + 1, st->scratch.data ? st->scratch.data : "", st->scratch.len, start);
        }
        if (tok_buf_add(&st->buf, s, n)) return -1;
        st->scratch.len = 0;
        if (replace_all(dc, st->buf.data, st->buf.len, &st->scratch, &keep, 1)) return -1;
        memmove(st->buf.data, st->buf.data + keep, st->buf.len - keep);
        st->buf.len -= keep;
        return emit(d, k + 1, st->scratch.data ? st->scratch.data : "", st->scratch.len, start);
    }
    case DEC_BYTEFALLBACK:
        if (!st->whole) return tok_buf_add(&st->scratch, s, n); /* whole stream is one token: keep it */
        return bytefallback_token(d, k, st, s, n);
    case DEC_FUSE: {
        int first = !st->sent_first;
        st->sent_first = 1;
        return emit(d, k + 1, s, n, first);
    }
    case DEC_STRIP: {
        if (start) {
            st->held = 0; /* trailing strip characters of the previous token are dropped */
            st->left = dc->start;
        }
        char c[4];
        size_t cl = (size_t)tok_utf8_encode(dc->content, c);
        st->scratch.len = 0;
        size_t i = 0;
        while (i < n) {
            uint32_t cp;
            int kk = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
            if (kk <= 0) kk = 1, cp = 0xFFFFFFFF;
            if (cp == dc->content && st->left > 0) {
                st->left--;
            } else if (cp == dc->content && dc->stop > 0) {
                st->left = 0;
                if (st->held == dc->stop) {
                    if (tok_buf_add(&st->scratch, c, cl)) return -1;
                } else {
                    st->held++;
                }
            } else {
                st->left = 0;
                for (; st->held > 0; st->held--)
                    if (tok_buf_add(&st->scratch, c, cl)) return -1;
                if (tok_buf_add(&st->scratch, s + i, (size_t)kk)) return -1;
            }
            i += (size_t)kk;
        }
        return emit(d, k + 1, st->scratch.data ? st->scratch.data : "", st->scratch.len, start);
    }
    case DEC_METASPACE: {
        if (start) st->ntok++;
        int first = st->ntok <= 1 && dc->scheme != PREPEND_NEVER;
        st->scratch.len = 0;
        size_t i = 0;
        while (i < n) {
            uint32_t cp;
            int kk = tok_utf8_next((const unsigned char *)s + i, n - i, &cp);
            if (kk <= 0) kk = 1, cp = 0xFFFFFFFF;
            if (cp == dc->content) {
                if (!first && tok_buf_add(&st->scratch, " ", 1)) return -1;
            } else if (tok_buf_add(&st->scratch, s + i, (size_t)kk)) {
                return -1;
            }
            i += (size_t)kk;
        }
        return emit(d, k + 1, st->scratch.data ? st->scratch.data : "", st->scratch.len, start);
    }
    case DEC_BYTELEVEL:
        if (!st->whole) return tok_buf_add(&st->scratch, s, n) ? -1 : 0;
        if (bytelevel_token(s, n, &st->buf)) return -1;
        return bytelevel_drain(d, k, st, 0);
    }
    return -1;
}

static int flush_stage(tsr_detokenizer *d, size_t k)
{
    const tok_dec *dc = &d->t->decs[k];
    stage *st = &d->st[k];
    switch (dc->kind) {
    case DEC_REPLACE:
        if (st->buf.len) {
            int r = emit(d, k + 1, st->buf.data, st->buf.len, 0);
            st->buf.len = 0;
            return r;
        }
        return 0;
    case DEC_BYTEFALLBACK:
        if (!st->whole) { /* the whole stream as one token */
            if (!st->scratch.len) return 0;
            tok_buf all = st->scratch;
            st->scratch = (tok_buf){0};
            int r = bytefallback_token(d, k, st, all.data, all.len);
            tok_buf_free(&all);
            return r ? r : bytefallback_run(d, k, st);
        }
        return bytefallback_run(d, k, st);
    case DEC_STRIP:
        st->held = 0;
        return 0;
    case DEC_BYTELEVEL:
        if (!st->whole) {
            if (!st->scratch.len) return 0;
            tok_buf all = st->scratch;
            st->scratch = (tok_buf){0};
            int r = bytelevel_token(all.data, all.len, &st->buf);
            tok_buf_free(&all);
            if (r) return r;
        }
        return bytelevel_drain(d, k, st, 1);
    case DEC_FUSE:
    case DEC_METASPACE:
        return 0;
    }
    return 0;
}

static void reset(tsr_detokenizer *d)
{
    d->n_pushed = 0;
    int whole = 1;
    for (size_t k = 0; k < d->t->n_decs; k++) {
        stage *st = &d->st[k];
        st->whole = whole;
        st->buf.len = 0;
        st->scratch.len = 0;
        st->ntok = 0;
        st->left = 0;
        st->held = 0;
        st->sent_first = 0;
        if (d->t->decs[k].kind == DEC_FUSE || d->t->decs[k].kind == DEC_BYTELEVEL) whole = 0;
    }
}

tsr_status tsr_detokenizer_new(const tsr_tokenizer *t, int skip_special, tsr_detokenizer **out)
{
    if (!t || !out) return tsr_fail(TSR_ERR_ARG, "tsr_detokenizer_new: NULL argument");
    tsr_detokenizer *d = calloc(1, sizeof *d);
    if (!d || !(d->st = calloc(t->n_decs ? t->n_decs : 1, sizeof *d->st))) {
        free(d);
        return tsr_fail(TSR_ERR_NOMEM, "detokenizer: out of memory");
    }
    d->t = t;
    d->skip_special = skip_special;
    reset(d);
    if (tok_buf_add(&d->out, "", 0)) {
        tsr_detokenizer_free(d);
        return tsr_fail(TSR_ERR_NOMEM, "detokenizer: out of memory");
    }
    *out = d;
    return TSR_OK;
}

void tsr_detokenizer_free(tsr_detokenizer *d)
{
    if (!d) return;
    if (d->st)
        for (size_t k = 0; k < d->t->n_decs; k++) {
            tok_buf_free(&d->st[k].buf);
            tok_buf_free(&d->st[k].scratch);
        }
    free(d->st);
    tok_buf_free(&d->out);
    free(d);
}

/* Appends the text of one id to d->out. */
static tsr_status push_one(tsr_detokenizer *d, int32_t id)
{
    const tsr_tokenizer *t = d->t;
    if (id < 0 || (size_t)id >= t->n_ids || !t->dec_str[id]) return TSR_OK;
    if (d->skip_special && t->dec_special[id]) return TSR_OK;
    const char *s = t->dec_str[id];
    size_t n = t->dec_len[id];
    int r = 0;
    if (!t->has_decoder) {
        if (d->n_pushed) r = tok_buf_add(&d->out, " ", 1);
        if (!r) r = tok_buf_add(&d->out, s, n);
    } else {
        r = emit(d, 0, s, n, 1);
    }
    d->n_pushed++;
    return r ? tsr_fail(TSR_ERR_NOMEM, "detokenizer: out of memory") : TSR_OK;
}

static tsr_status flush_all(tsr_detokenizer *d)
{
    for (size_t k = 0; k < d->t->n_decs; k++)
        if (flush_stage(d, k)) return tsr_fail(TSR_ERR_NOMEM, "detokenizer: out of memory");
    reset(d);
    return TSR_OK;
}

tsr_status tsr_detokenizer_push(tsr_detokenizer *d, int32_t id, char **text, size_t *len)
{
    if (!d || !text || !len) return tsr_fail(TSR_ERR_ARG, "tsr_detokenizer_push: NULL argument");
    d->out.len = 0;
    d->out.data[0] = 0;
    tsr_status st = push_one(d, id);
    *text = d->out.data;
    *len = d->out.len;
    return st;
}

tsr_status tsr_detokenizer_flush(tsr_detokenizer *d, char **text, size_t *len)
{
    if (!d || !text || !len) return tsr_fail(TSR_ERR_ARG, "tsr_detokenizer_flush: NULL argument");
    d->out.len = 0;
    d->out.data[0] = 0;
    tsr_status st = flush_all(d);
    *text = d->out.data;
    *len = d->out.len;
    return st;
}

tsr_status tsr_tokenizer_decode(const tsr_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                                size_t *len)
{
    if (!t || (!ids && n) || !text || !len) return tsr_fail(TSR_ERR_ARG, "tsr_tokenizer_decode: NULL argument");
    *text = NULL;
    *len = 0;
    tsr_detokenizer *d;
    TSR_TRY(tsr_detokenizer_new(t, skip_special, &d));
    tsr_status st = TSR_OK;
    for (size_t i = 0; i < n && !st; i++) st = push_one(d, ids[i]);
    if (!st) st = flush_all(d);
    if (st) {
        tsr_detokenizer_free(d);
        return st;
    }
    *text = d->out.data;
    *len = d->out.len;
    d->out.data = NULL;
    tsr_detokenizer_free(d);
    return TSR_OK;
}
