/* OpenAI response building (see openai.h): the service's events of every choice of a request become the
 * non-streaming body, or one chunk per event for stream: true, in the shapes the official clients parse.
 *
 * A result keeps per choice only what the response needs: the text (non-streaming only), the finish reason,
 * the usage counts and the log-probabilities in the endpoint's format (chat: {"content": [{"token", "logprob",
 * "bytes", "top_logprobs"}]}; completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}).
 * Token strings in log-probabilities are the token decoded alone (special tokens included). The end-of-sequence
 * token that stops a choice adds no text and no log-probability, as with OpenAI. Every JSON value built here is
 * checked: running out of memory fails the call (NULL or TSR_ERR_NOMEM), never drops a field. */
#include "launcher/openai.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct choice {
    int done;
    tsr_finish_reason finish;
    char *text;              /* non-streaming: everything released so far */
    size_t len, cap;
    size_t offset;           /* completions text_offset of the next token */
    int n_generated, n_cached;
    json_t *lp;              /* non-streaming log-probabilities (chat: content array; completions: object) */
    int lp_lost;             /* adding to lp ran out of memory: the response cannot be built */
} choice;

struct tsr_oai_result {
    const tsr_oai_request *rq;
    const tsr_oai_model *m;
    char id[64];
    int64_t created;
    choice *ch;
    int n_done;
    char *error;
};

static const char *finish_str(tsr_finish_reason f)
{
    switch (f) {
    case TSR_FINISH_NONE:
        return NULL;
    case TSR_FINISH_STOP:
        return "stop";
    case TSR_FINISH_LENGTH:
        return "length";
    case TSR_FINISH_ERROR:
        return "error";
    default:
        return "abort";
    }
}

void tsr_oai_make_id(tsr_oai_kind kind, char *buf, size_t cap)
{
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    uint64_t z = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 (0x9e3779b97f4a7c15ull * (uint64_t)(atomic_fetch_add(&counter, 1) + 1));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    snprintf(buf, cap, "%s-%016llx%08llx", kind == TSR_OAI_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)z,
             (unsigned long long)(atomic_load(&counter) & 0xffffffffu));
}

tsr_status tsr_oai_result_new(const tsr_oai_request *rq, const tsr_oai_model *m, const char *id, int64_t created,
                              tsr_oai_result **out)
{
    tsr_oai_result *r = calloc(1, sizeof *r);
    if (!r || !(r->ch = calloc((size_t)rq->n_choices, sizeof *r->ch))) {
        free(r);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    r->rq = rq;
    r->m = m;
    r->created = created;
    snprintf(r->id, sizeof r->id, "%s", id);
    for (int c = 0; c < rq->n_choices; c++) {
        choice *ch = &r->ch[c];
        if (rq->echo) ch->offset = rq->prompts[c / rq->n].text_len;
        if (!rq->stream && rq->echo) {
            const tsr_oai_prompt *p = &rq->prompts[c / rq->n];
            ch->cap = p->text_len + 64;
            if (!(ch->text = malloc(ch->cap))) {
                tsr_oai_result_free(r);
                return tsr_fail(TSR_ERR_NOMEM, "out of memory");
            }
            memcpy(ch->text, p->text, p->text_len);
            ch->len = p->text_len;
        }
    }
    *out = r;
    return TSR_OK;
}

void tsr_oai_result_free(tsr_oai_result *r)
{
    if (!r) return;
    for (int c = 0; c < r->rq->n_choices; c++) {
        free(r->ch[c].text);
        json_decref(r->ch[c].lp);
    }
    free(r->ch);
    free(r->error);
    free(r);
}

int tsr_oai_result_done(const tsr_oai_result *r)
{
    return r->n_done == r->rq->n_choices;
}

const char *tsr_oai_result_error(const tsr_oai_result *r)
{
    return r->error;
}

void tsr_oai_result_usage(const tsr_oai_result *r, int *prompt_tokens, int *completion_tokens, int *cached_tokens)
{
    const tsr_oai_request *rq = r->rq;
    int pt = 0, ct = 0, cached = 0;
    for (int p = 0; p < rq->n_prompts; p++) {
        pt += rq->prompts[p].n_ids;
        int least = rq->prompts[p].n_ids;
        for (int j = 0; j < rq->n; j++) {
            const choice *ch = &r->ch[p * rq->n + j];
            ct += ch->n_generated;
            if (ch->n_cached < least) least = ch->n_cached;
        }
        cached += least;
    }
    *prompt_tokens = pt;
    *completion_tokens = ct;
    *cached_tokens = cached;
}

static json_t *usage_json(const tsr_oai_result *r)
{
    int pt, ct, cached;
    tsr_oai_result_usage(r, &pt, &ct, &cached);
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", pt, "completion_tokens", ct, "total_tokens",
                     pt + ct, "prompt_tokens_details", "cached_tokens", cached);
}

/* --- log-probabilities ----------------------------------------------------------------------------------- */

static json_t *real(float x)
{
    return json_real(isfinite(x) ? (double)x : -9999.0);
}

/* The token's text (decoded alone, special tokens kept) and, when bytes is not NULL, its bytes as an array of
 * integers; NULL (and *bytes NULL) when out of memory. */
static json_t *token_string(const tsr_oai_model *m, int32_t id, json_t **bytes)
{
    char *text = NULL;
    size_t len = 0;
    json_t *s = NULL;
    if (bytes) *bytes = NULL;
    if (tsr_tokenizer_decode(m->tok, &id, 1, 0, &text, &len) != TSR_OK) return NULL;
    s = json_stringn(text, len);
    if (s && bytes) {
        *bytes = json_array();
        for (size_t i = 0; i < len && *bytes; i++)
            if (json_array_append_new(*bytes, json_integer((unsigned char)text[i]))) {
                json_decref(*bytes);
                *bytes = NULL;
            }
        if (!*bytes) {
            json_decref(s);
            s = NULL;
        }
    }
    free(text);
    return s;
}

static json_t *chat_logprob_entry(const tsr_oai_model *m, int32_t id, float lp)
{
    json_t *bytes = NULL, *tok = token_string(m, id, &bytes);
    if (!tok) return NULL;
    return json_pack("{s:o, s:o, s:o}", "token", tok, "logprob", real(lp), "bytes", bytes);
}

/* One token's log-probabilities in the chat format: {"token", "logprob", "bytes", "top_logprobs": [...]};
 * NULL when out of memory. */
static json_t *chat_logprob(const tsr_oai_model *m, const tsr_step_result *res, int top)
{
    json_t *e = chat_logprob_entry(m, res->token, res->logprob), *tops = json_array();
    int ok = e && tops;
    for (int i = 0; i < res->n_top && i < top && ok; i++)
        ok = !json_array_append_new(tops, chat_logprob_entry(m, res->top_ids[i], res->top_logprobs[i]));
    if (ok) ok = !json_object_set_new(e, "top_logprobs", tops);
    else json_decref(tops);
    if (ok) return e;
    json_decref(e);
    return NULL;
}

/* Appends one token to a completions logprobs object {"tokens", "token_logprobs", "top_logprobs",
 * "text_offset"}. On failure (out of memory) lp may hold part of the token's entries: it is then dropped. */
static tsr_status completions_logprob(const tsr_oai_model *m, json_t *lp, const tsr_step_result *res, int top,
                                      size_t *offset)
{
    json_t *tok = token_string(m, res->token, NULL);
    if (!tok) return tsr_fail(TSR_ERR_NOMEM, "out of memory for a token's log-probabilities");
    size_t tok_len = json_string_length(tok);
    json_t *alts = json_object();
    int ok = alts != NULL;
    for (int i = 0; i < res->n_top && i < top && ok; i++) {
        json_t *t = token_string(m, res->top_ids[i], NULL);
        ok = t && !json_object_set_new(alts, json_string_value(t), real(res->top_logprobs[i]));
        json_decref(t);
    }
    ok = !json_array_append_new(json_object_get(lp, "tokens"), tok) && ok;
    ok = !json_array_append_new(json_object_get(lp, "token_logprobs"), real(res->logprob)) && ok;
    ok = !json_array_append_new(json_object_get(lp, "top_logprobs"), alts) && ok;
    ok = !json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)*offset)) && ok;
    if (!ok) return tsr_fail(TSR_ERR_NOMEM, "out of memory for a token's log-probabilities");
    *offset += tok_len;
    return TSR_OK;
}

static json_t *new_logprobs(tsr_oai_kind kind)
{
    if (kind == TSR_OAI_CHAT) return json_array();
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

static int is_stop_id(const tsr_oai_request *rq, int32_t id)
{
    for (int i = 0; i < rq->n_stop_ids; i++)
        if (rq->stop_ids[i] == id) return 1;
    return 0;
}

/* Adds this event's token to lp (a fresh object for a chunk, or the choice's running one). */
static tsr_status add_logprob(tsr_oai_result *r, choice *ch, json_t *lp, const tsr_step_result *res)
{
    if (r->rq->kind != TSR_OAI_CHAT) return completions_logprob(r->m, lp, res, r->rq->top_logprobs, &ch->offset);
    if (json_array_append_new(lp, chat_logprob(r->m, res, r->rq->top_logprobs)))
        return tsr_fail(TSR_ERR_NOMEM, "out of memory for a token's log-probabilities");
    return TSR_OK;
}

static json_t *logprobs_value(const tsr_oai_request *rq, json_t *lp)
{
    if (!lp) return json_null();
    if (rq->kind == TSR_OAI_CHAT) return json_pack("{s:O, s:n}", "content", lp, "refusal");
    return json_incref(lp);
}

/* --- chunks and bodies ----------------------------------------------------------------------------------- */

static json_t *envelope(const tsr_oai_result *r, const char *object, json_t *choices)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", r->id, "object", object, "created",
                          (json_int_t)r->created, "model", r->rq->model, "choices", choices);
    if (o && r->rq->stream && r->rq->include_usage && json_object_set_new(o, "usage", json_null())) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *chunk_for(const tsr_oai_result *r, int c, const char *text, size_t len, json_t *lp,
                         tsr_finish_reason finish, int with_role)
{
    const tsr_oai_request *rq = r->rq;
    const char *fin = finish_str(finish);
    json_t *item;
    if (rq->kind == TSR_OAI_CHAT) {
        json_t *delta = json_object();
        if (delta && ((with_role && json_object_set_new(delta, "role", json_string("assistant"))) ||
                      ((len || with_role) && json_object_set_new(delta, "content", json_stringn(text, len))))) {
            json_decref(delta);
            delta = NULL;
        }
        item = json_pack("{s:i, s:o, s:o, s:s?}", "index", c, "delta", delta, "logprobs", logprobs_value(rq, lp),
                           "finish_reason", fin);
    } else {
        item = json_pack("{s:i, s:s%, s:o, s:s?}", "index", c, "text", text ? text : "", len, "logprobs",
                           logprobs_value(rq, lp), "finish_reason", fin);
    }
        return envelope(r, rq->kind == TSR_OAI_CHAT ? "chat.completion.chunk" : "text_completion",
                    json_pack("[o]", item));
}

static tsr_status append_text(choice *ch, const char *text, size_t len)
{
    if (ch->len + len + 1 > ch->cap) {
        size_t cap = ch->cap ? ch->cap : 256;
        while (ch->len + len + 1 > cap) cap *= 2;
        char *t = realloc(ch->text, cap);
        if (!t) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        ch->text = t;
        ch->cap = cap;
    }
    memcpy(ch->text + ch->len, text, len);
    ch->len += len;
    ch->text[ch->len] = 0;
    return TSR_OK;
}

tsr_status tsr_oai_result_add(tsr_oai_result *r, int c, const tsr_gen_event *ev, json_t **chunk)
{
    if (chunk) *chunk = NULL;
    if (c < 0 || c >= r->rq->n_choices || r->ch[c].done)
        return tsr_fail(TSR_ERR_ARG, "event for choice %d, which is unknown or finished", c);
    const tsr_oai_request *rq = r->rq;
    choice *ch = &r->ch[c];
    ch->n_generated = ev->n_generated;
    ch->n_cached = ev->n_cached;
    int final = ev->finish != TSR_FINISH_NONE;
    if (final) {
        ch->done = 1;
        ch->finish = ev->finish;
        r->n_done++;
        if (ev->finish == TSR_FINISH_ERROR && !r->error)
            r->error = strdup(ev->error && *ev->error ? ev->error : "the model failed to run this request");
    }
    /* a stop token that ended the choice (past min_tokens, EOS not ignored) is not part of the completion */
    int stop_token = ev->token >= 0 && !rq->params.ignore_eos && ev->n_generated > rq->params.min_tokens &&
                     is_stop_id(rq, ev->token);
    int want_lp = rq->logprobs && ev->result && ev->token >= 0 && !stop_token;
    if (!rq->stream) {
        if (ev->text_len && append_text(ch, ev->text, ev->text_len) != TSR_OK) return TSR_ERR_NOMEM;
        if (want_lp) {
            if (!ch->lp && !(ch->lp = new_logprobs(rq->kind))) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
            tsr_status st = add_logprob(r, ch, ch->lp, ev->result);
            if (st != TSR_OK) { /* a half-added token would misalign the arrays: the log-probabilities are lost */
                json_decref(ch->lp);
                ch->lp = NULL;
                ch->lp_lost = 1;
                return st;
            }
        }
        return TSR_OK;
    }
    if (!chunk || (!ev->text_len && !want_lp && !final)) return TSR_OK;
    json_t *lp = NULL;
    if (want_lp) {
        if (!(lp = new_logprobs(rq->kind))) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        tsr_status st = add_logprob(r, ch, lp, ev->result);
        if (st != TSR_OK) {
            json_decref(lp);
            return st;
        }
    }
    *chunk = chunk_for(r, c, ev->text, ev->text_len, lp, ev->finish, 0);
    json_decref(lp);
    return *chunk ? TSR_OK : tsr_fail(TSR_ERR_NOMEM, "out of memory building a chunk");
}

json_t *tsr_oai_stream_open(const tsr_oai_result *r)
{
    const tsr_oai_request *rq = r->rq;
    json_t *arr = json_array();
    if (!arr) return NULL;
    for (int c = 0; c < rq->n_choices; c++) {
        json_t *chunk = NULL;
        if (rq->kind == TSR_OAI_CHAT)
            chunk = chunk_for(r, c, "", 0, NULL, TSR_FINISH_NONE, 1);
        else if (rq->echo) {
            const tsr_oai_prompt *p = &rq->prompts[c / rq->n];
            chunk = chunk_for(r, c, p->text, p->text_len, NULL, TSR_FINISH_NONE, 0);
        } else
            continue;
        if (!chunk || json_array_append_new(arr, chunk)) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

json_t *tsr_oai_stream_usage(const tsr_oai_result *r)
{
    if (!r->rq->include_usage) return NULL;
    json_t *o = envelope(r, r->rq->kind == TSR_OAI_CHAT ? "chat.completion.chunk" : "text_completion", json_array());
    if (o && json_object_set_new(o, "usage", usage_json(r))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *tsr_oai_response(const tsr_oai_result *r)
{
    const tsr_oai_request *rq = r->rq;
    json_t *choices = json_array();
    if (!choices) return NULL;
    for (int c = 0; c < rq->n_choices; c++) {
        const choice *ch = &r->ch[c];
        const char *fin = finish_str(ch->finish);
        json_t *lp = rq->logprobs ? (ch->lp ? json_incref(ch->lp) : new_logprobs(rq->kind)) : NULL;
        if ((rq->logprobs && !lp) || ch->lp_lost) {
            json_decref(lp);
            json_decref(choices);
            return NULL;
        }
        json_t *item;
        if (rq->kind == TSR_OAI_CHAT)
            item = json_pack("{s:i, s:{s:s, s:s%, s:n}, s:o, s:s?}", "index", c, "message", "role", "assistant",
                             "content", ch->text ? ch->text : "", ch->len, "refusal", "logprobs",
                             logprobs_value(rq, lp), "finish_reason", fin);
        else
            item = json_pack("{s:i, s:s%, s:o, s:s?}", "index", c, "text", ch->text ? ch->text : "", ch->len,
                             "logprobs", logprobs_value(rq, lp), "finish_reason", fin);
        json_decref(lp);
        if (!item || json_array_append_new(choices, item)) {
            json_decref(choices);
            return NULL;
        }
    }
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object",
                          rq->kind == TSR_OAI_CHAT ? "chat.completion" : "text_completion", "created",
                          (json_int_t)r->created, "model", rq->model, "choices", choices, "usage", usage_json(r));
    if (o && json_object_set_new(o, "system_fingerprint", json_null())) {
        json_decref(o);
        return NULL;
    }
    return o;
}
