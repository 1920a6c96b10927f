/* Building, checking and (de)serializing step plans (see step.h).
 *
 * The flat form is a fixed header (magic, version, counts) followed by the five arrays, each padded to 8 bytes:
 * sequences as fixed-size records, then tokens, pages, penalty history and logit biases. Everything is
 * little-endian (every host we run on is). Unpacking checks each size against the buffer length before pointing
 * into it, and tsr_step_validate() then checks every offset and range, so a corrupt or hostile buffer is rejected
 * with a message instead of making a worker read or write outside its memory. */
#include "runtime/step.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define STEP_MAGIC 0x50545354u /* "TSTP" */

typedef struct step_header {
    uint32_t magic, version;
    int32_t n_seqs, n_tokens, n_pages, n_hist, n_bias, seq_size;
} step_header;

void tsr_step_clear(tsr_step *s)
{
    s->version = TSR_STEP_VERSION;
    s->n_seqs = s->n_tokens = s->n_pages = s->n_hist = s->n_bias = 0;
}

void tsr_step_free(tsr_step *s)
{
    if (s->cap_seqs || s->cap_tokens || s->cap_pages || s->cap_hist || s->cap_bias) {
        free(s->seqs);
        free(s->tokens);
        free(s->pages);
        free(s->hist);
        free(s->bias);
    }
    memset(s, 0, sizeof *s);
}

/* Grows *arr (elements of size `elem`) to hold `need`. */
static int grow(void **arr, int32_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap) return 1;
    if (need > INT32_MAX / 2) return 0;
    int32_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p) return 0;
    *arr = p;
    *cap = c;
    return 1;
}

tsr_status tsr_step_add(tsr_step *s, const tsr_step_seq *seq, const int32_t *tokens, const int32_t *pages,
                        const int32_t *hist, const tsr_logit_bias *bias)
{
    if (s->version == 0) s->version = TSR_STEP_VERSION;
    if (seq->n_tokens < 0 || seq->n_pages < 0 || seq->n_hist < 0 || seq->n_bias < 0)
        return tsr_fail(TSR_ERR_ARG, "step: negative count for sequence %llu", (unsigned long long)seq->id);
    if (!grow((void **)&s->seqs, &s->cap_seqs, (int64_t)s->n_seqs + 1, sizeof *s->seqs) ||
        !grow((void **)&s->tokens, &s->cap_tokens, (int64_t)s->n_tokens + seq->n_tokens, sizeof *s->tokens) ||
        !grow((void **)&s->pages, &s->cap_pages, (int64_t)s->n_pages + seq->n_pages, sizeof *s->pages) ||
        !grow((void **)&s->hist, &s->cap_hist, (int64_t)s->n_hist + seq->n_hist, sizeof *s->hist) ||
        !grow((void **)&s->bias, &s->cap_bias, (int64_t)s->n_bias + seq->n_bias, sizeof *s->bias))
        return tsr_fail(TSR_ERR_NOMEM, "step: out of memory");
    tsr_step_seq *q = &s->seqs[s->n_seqs++];
    *q = *seq;
    q->token0 = s->n_tokens;
    q->page0 = s->n_pages;
    q->hist0 = s->n_hist;
    q->bias0 = s->n_bias;
    if (seq->n_tokens) memcpy(s->tokens + s->n_tokens, tokens, (size_t)seq->n_tokens * sizeof *tokens);
    if (seq->n_pages) memcpy(s->pages + s->n_pages, pages, (size_t)seq->n_pages * sizeof *pages);
    if (seq->n_hist) memcpy(s->hist + s->n_hist, hist, (size_t)seq->n_hist * sizeof *hist);
    if (seq->n_bias) memcpy(s->bias + s->n_bias, bias, (size_t)seq->n_bias * sizeof *bias);
    s->n_tokens += seq->n_tokens;
    s->n_pages += seq->n_pages;
    s->n_hist += seq->n_hist;
    s->n_bias += seq->n_bias;
    return TSR_OK;
}

/* 1 when [off, off+n) lies inside [0, total). */
static int slice_ok(int32_t off, int32_t n, int32_t total)
{
    return off >= 0 && n >= 0 && (int64_t)off + n <= total;
}

tsr_status tsr_step_validate(const tsr_step *s, int vocab, int n_pages_total, int page_size)
{
    if (s->version != TSR_STEP_VERSION)
        return tsr_fail(TSR_ERR_FORMAT, "step: version %u, expected %u", s->version, TSR_STEP_VERSION);
    if (s->n_seqs < 0 || s->n_tokens < 0 || s->n_pages < 0 || s->n_hist < 0 || s->n_bias < 0)
        return tsr_fail(TSR_ERR_FORMAT, "step: negative array size");
    for (int32_t i = 0; i < s->n_seqs; i++) {
        const tsr_step_seq *q = &s->seqs[i];
        unsigned long long id = (unsigned long long)q->id;
        if (!slice_ok(q->token0, q->n_tokens, s->n_tokens) || !slice_ok(q->page0, q->n_pages, s->n_pages) ||
            !slice_ok(q->hist0, q->n_hist, s->n_hist) || !slice_ok(q->bias0, q->n_bias, s->n_bias))
            return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu has a slice outside the plan's arrays", id);
        if (q->n_tokens < 1 || q->pos0 < 0 || (int64_t)q->pos0 + q->n_tokens > (int64_t)q->n_pages * page_size)
            return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu: %d tokens at position %d exceed its %d pages", id,
                            q->n_tokens, q->pos0, q->n_pages);
        if (q->n_hist_prompt < 0 || q->n_hist_prompt > q->n_hist)
            return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu: bad penalty history split", id);
        if (q->n_logprobs < -1 || q->n_logprobs > TSR_MAX_LOGPROBS || q->logits < 0 || q->logits > 2 ||
            (q->sample != 0 && q->sample != 1))
            return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu: bad sample/logprobs/logits fields", id);
        for (int32_t t = 0; t < q->n_tokens; t++)
            if (s->tokens[q->token0 + t] < 0 || s->tokens[q->token0 + t] >= vocab)
                return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu: token id %d outside the vocabulary (%d)", id,
                                s->tokens[q->token0 + t], vocab);
        for (int32_t p = 0; p < q->n_pages; p++)
            if (s->pages[q->page0 + p] < 0 || s->pages[q->page0 + p] >= n_pages_total)
                return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu: page %d outside the pool (%d pages)", id,
                                s->pages[q->page0 + p], n_pages_total);
        for (int32_t h = 0; h < q->n_hist; h++)
            if (s->hist[q->hist0 + h] < 0 || s->hist[q->hist0 + h] >= vocab)
                return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu: history token outside the vocabulary", id);
        for (int32_t b = 0; b < q->n_bias; b++)
            if (s->bias[q->bias0 + b].token < 0 || s->bias[q->bias0 + b].token >= vocab)
                return tsr_fail(TSR_ERR_FORMAT, "step: sequence %llu: logit bias token outside the vocabulary", id);
    }
    return TSR_OK;
}

int tsr_step_logit_rows(const tsr_step *s)
{
    int rows = 0;
    for (int32_t i = 0; i < s->n_seqs; i++)
        rows += s->seqs[i].logits == 2 ? s->seqs[i].n_tokens : s->seqs[i].logits == 1;
    return rows;
}

static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }

/* Byte sizes of the five arrays, in order. */
static void array_sizes(const step_header *h, size_t sz[5])
{
    sz[0] = (size_t)h->n_seqs * sizeof(tsr_step_seq);
    sz[1] = (size_t)h->n_tokens * sizeof(int32_t);
    sz[2] = (size_t)h->n_pages * sizeof(int32_t);
    sz[3] = (size_t)h->n_hist * sizeof(int32_t);
    sz[4] = (size_t)h->n_bias * sizeof(tsr_logit_bias);
}

tsr_status tsr_step_pack(const tsr_step *s, uint8_t **buf, size_t *len)
{
    step_header h = {STEP_MAGIC, s->version ? s->version : TSR_STEP_VERSION, s->n_seqs, s->n_tokens, s->n_pages,
                     s->n_hist, s->n_bias, (int32_t)sizeof(tsr_step_seq)};
    size_t sz[5];
    array_sizes(&h, sz);
    size_t total = pad8(sizeof h);
    for (int i = 0; i < 5; i++) total += pad8(sz[i]);
    uint8_t *b = calloc(1, total);
    if (!b) return tsr_fail(TSR_ERR_NOMEM, "step: out of memory for a %zu-byte plan", total);
    const void *src[5] = {s->seqs, s->tokens, s->pages, s->hist, s->bias};
    memcpy(b, &h, sizeof h);
    size_t off = pad8(sizeof h);
    for (int i = 0; i < 5; i++) {
        if (sz[i]) memcpy(b + off, src[i], sz[i]);
        off += pad8(sz[i]);
    }
    *buf = b;
    *len = total;
    return TSR_OK;
}

tsr_status tsr_step_unpack(const uint8_t *buf, size_t len, tsr_step *out)
{
    memset(out, 0, sizeof *out);
    step_header h;
    if (((uintptr_t)buf & 7) != 0) return tsr_fail(TSR_ERR_ARG, "step: buffer is not 8-byte aligned");
    if (len < sizeof h) return tsr_fail(TSR_ERR_FORMAT, "step: %zu-byte buffer is shorter than its header", len);
    memcpy(&h, buf, sizeof h);
    if (h.magic != STEP_MAGIC) return tsr_fail(TSR_ERR_FORMAT, "step: bad magic 0x%08x", h.magic);
    if (h.version != TSR_STEP_VERSION)
        return tsr_fail(TSR_ERR_FORMAT, "step: version %u, this build speaks %u", h.version, TSR_STEP_VERSION);
    if (h.seq_size != (int32_t)sizeof(tsr_step_seq))
        return tsr_fail(TSR_ERR_FORMAT, "step: sequence records of %d bytes, expected %zu (mixed builds?)",
                        h.seq_size, sizeof(tsr_step_seq));
    if (h.n_seqs < 0 || h.n_tokens < 0 || h.n_pages < 0 || h.n_hist < 0 || h.n_bias < 0)
        return tsr_fail(TSR_ERR_FORMAT, "step: negative array size");
    size_t sz[5];
    array_sizes(&h, sz);
    size_t off = pad8(sizeof h);
    const uint8_t *at[5];
    for (int i = 0; i < 5; i++) {
        if (pad8(sz[i]) > len - off) return tsr_fail(TSR_ERR_FORMAT, "step: buffer of %zu bytes is truncated", len);
        at[i] = buf + off;
        off += pad8(sz[i]);
    }
    if (off != len) return tsr_fail(TSR_ERR_FORMAT, "step: %zu trailing bytes", len - off);
    out->version = h.version;
    out->n_seqs = h.n_seqs;
    out->n_tokens = h.n_tokens;
    out->n_pages = h.n_pages;
    out->n_hist = h.n_hist;
    out->n_bias = h.n_bias;
    /* the buffer comes from malloc or an MPI receive buffer: 8-byte aligned, and every array starts on 8 */
    out->seqs = (tsr_step_seq *)(void *)at[0];
    out->tokens = (int32_t *)(void *)at[1];
    out->pages = (int32_t *)(void *)at[2];
    out->hist = (int32_t *)(void *)at[3];
    out->bias = (tsr_logit_bias *)(void *)at[4];
    return TSR_OK;
}
