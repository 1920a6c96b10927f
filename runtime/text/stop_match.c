/* Stop strings over streamed text (see stop_match.h).
 *
 * The matcher keeps the text it has not released yet in one buffer. Each push appends the new piece and looks
 * for the stop occurrence that ends first in the text (on a tie, the one that starts first, i.e. the longest):
 * that is the stop a reader scanning the text would meet first, whatever the piece boundaries were. Nothing
 * released earlier can be part of it, because the matcher only releases text before the longest suffix of the
 * buffer that is still a proper prefix of some stop. The release point also never splits a UTF-8 character: an
 * incomplete character at the end is held until its last byte arrives (or until the flush), and a cut that would
 * fall inside a character moves back to its first byte. When a stop starts inside a character (a stop string
 * beginning with a continuation byte), the released text ends before that character and its leading bytes are
 * dropped with the stop. The bytes handed out stay in the buffer until the next call, which discards them. */
#include "runtime/text/stop_match.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct tsr_stop_matcher {
    char **stops;
    size_t *lens;
    int n;
    size_t max_len;
    char *buf;       /* text not yet discarded: buf[0..released) was handed out by the last call */
    size_t len, cap;
    size_t released;
    int which;       /* the stop that matched, or -1 */
};

void tsr_stop_matcher_free(tsr_stop_matcher *m)
{
    if (!m) return;
    for (int i = 0; i < m->n; i++) free(m->stops[i]);
    free(m->stops);
    free(m->lens);
    free(m->buf);
    free(m);
}

tsr_status tsr_stop_matcher_new(const char *const *stops, int n, tsr_stop_matcher **out)
{
    if (!out) return tsr_fail(TSR_ERR_ARG, "stop strings: no output");
    *out = NULL;
    if (n < 0 || (n > 0 && !stops)) return tsr_fail(TSR_ERR_ARG, "stop strings: bad list (%d entries)", n);
    for (int i = 0; i < n; i++)
        if (!stops[i] || !stops[i][0]) return tsr_fail(TSR_ERR_ARG, "stop strings: stop %d is empty", i);
    tsr_stop_matcher *m = calloc(1, sizeof *m);
    if (!m) return tsr_fail(TSR_ERR_NOMEM, "stop strings: out of memory");
    m->which = -1;
    if (n > 0) {
        m->stops = calloc((size_t)n, sizeof *m->stops);
        m->lens = calloc((size_t)n, sizeof *m->lens);
        if (!m->stops || !m->lens) {
            tsr_stop_matcher_free(m);
            return tsr_fail(TSR_ERR_NOMEM, "stop strings: out of memory");
        }
        for (int i = 0; i < n; i++) {
            size_t l = strlen(stops[i]);
            m->stops[i] = malloc(l + 1);
            if (!m->stops[i]) {
                m->n = i;
                tsr_stop_matcher_free(m);
                return tsr_fail(TSR_ERR_NOMEM, "stop strings: out of memory");
            }
            memcpy(m->stops[i], stops[i], l + 1);
            m->lens[i] = l;
            if (l > m->max_len) m->max_len = l;
        }
    }
    m->n = n;
    *out = m;
    return TSR_OK;
}

int tsr_stop_which(const tsr_stop_matcher *m) { return m ? m->which : -1; }

/* Discards what the last call handed out. */
static void discard_released(tsr_stop_matcher *m)
{
    if (!m->released) return;
    memmove(m->buf, m->buf + m->released, m->len - m->released);
    m->len -= m->released;
    m->released = 0;
}

/* The largest cut <= pos of buf[0..len) that splits no UTF-8 character: when the bytes just before pos are a
 * lead byte and fewer continuation bytes than it announces, and the character goes on past pos (or may, because
 * pos is the end of the text so far), the cut moves back to the lead byte. Malformed bytes are left alone. */
static size_t utf8_cut(const char *buf, size_t pos, size_t len)
{
    for (size_t k = 1; k <= 3 && k <= pos; k++) {
        unsigned char c = (unsigned char)buf[pos - k];
        if ((c & 0xC0) == 0x80) continue;
        size_t need = c >= 0xF0 && c <= 0xF7 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC0 && c <= 0xDF ? 2 : 1;
        if (need > k && (pos == len || ((unsigned char)buf[pos] & 0xC0) == 0x80)) return pos - k;
        return pos;
    }
    return pos;
}

/* First occurrence of needle in hay, or NULL. */
static const char *find(const char *hay, size_t hlen, const char *needle, size_t nlen)
{
    if (nlen > hlen) return NULL;
    const char *end = hay + (hlen - nlen);
    for (const char *p = hay; p <= end; p++) {
        p = memchr(p, (unsigned char)needle[0], (size_t)(end - p) + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, nlen) == 0) return p;
    }
    return NULL;
}

tsr_status tsr_stop_push(tsr_stop_matcher *m, const char *text, size_t len, const char **out, size_t *out_len,
                         int *matched)
{
    if (!m || !out || !out_len || (len > 0 && !text)) return tsr_fail(TSR_ERR_ARG, "stop strings: bad arguments");
    discard_released(m);
    *out = m->buf ? m->buf : "";
    *out_len = 0;
    if (matched) *matched = m->which >= 0;
    if (m->which >= 0) return TSR_OK;
    if (len > SIZE_MAX - m->len - 1) return tsr_fail(TSR_ERR_ARG, "stop strings: text too long");
    if (m->len + len > m->cap || !m->buf) {
        size_t cap = m->cap ? m->cap : 256;
        while (cap < m->len + len) cap = cap > SIZE_MAX / 2 ? m->len + len : cap * 2;
        char *b = realloc(m->buf, cap);
        if (!b) return tsr_fail(TSR_ERR_NOMEM, "stop strings: out of memory");
        m->buf = b;
        m->cap = cap;
    }
    if (len) memcpy(m->buf + m->len, text, len);
    m->len += len;
    *out = m->buf;

    /* the occurrence that ends first; no occurrence ends inside the text held before this push */
    size_t best_end = SIZE_MAX, best_start = 0;
    int best = -1;
    for (int i = 0; i < m->n; i++) {
        const char *at = find(m->buf, m->len, m->stops[i], m->lens[i]);
        if (!at) continue;
        size_t start = (size_t)(at - m->buf), end = start + m->lens[i];
        if (end < best_end || (end == best_end && start < best_start)) {
            best = i;
            best_end = end;
            best_start = start;
        }
    }
    if (best >= 0) {
        m->which = best;
        *out_len = utf8_cut(m->buf, best_start, m->len);
        m->released = m->len; /* nothing more is ever released */
        if (matched) *matched = 1;
        return TSR_OK;
    }

    /* hold the longest suffix that is a proper prefix of a stop */
    size_t hold = m->len;
    size_t longest = m->max_len ? m->max_len - 1 : 0;
    size_t from = m->len > longest ? m->len - longest : 0;
    for (size_t p = from; p < m->len && hold == m->len; p++) {
        size_t tail = m->len - p;
        for (int i = 0; i < m->n; i++)
            if (m->lens[i] > tail && memcmp(m->buf + p, m->stops[i], tail) == 0) {
                hold = p;
                break;
            }
    }
    *out_len = m->released = utf8_cut(m->buf, hold, m->len);
    return TSR_OK;
}

tsr_status tsr_stop_flush(tsr_stop_matcher *m, const char **out, size_t *out_len)
{
    if (!m || !out || !out_len) return tsr_fail(TSR_ERR_ARG, "stop strings: bad arguments");
    discard_released(m);
    *out = m->buf ? m->buf : "";
    *out_len = 0;
    if (m->which >= 0) return TSR_OK;
    *out_len = m->released = m->len;
    return TSR_OK;
}
