/* OpenAI request parsing (see openai.h): a /v1/completions or /v1/chat/completions body becomes prompts of token
 * ids and the sequence parameters of the service, or an OpenAI-style error naming the field at fault.
 *
 * The parser is strict about types and ranges of the fields it knows (a wrong type is a 400 naming the field,
 * never a guess) and ignores fields it does not know, as OpenAI clients send many optional ones ("user",
 * "metadata"...). Fields that would change the output in ways tessera does not implement ("suffix", "best_of"
 * above n, "response_format" other than text, non-text message parts, echo with logprobs) are refused with a
 * 400 rather than silently dropped. Also accepted, as vLLM does: top_k, min_p, typical_p, repetition_penalty,
 * ignore_eos, min_tokens, stop_token_ids, add_generation_prompt, chat_template_kwargs. */
#include "launcher/openai.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --- errors ---------------------------------------------------------------------------------------------- */

static const char *type_for(int status)
{
    if (status == 401) return "authentication_error";
    if (status == 429) return "rate_limit_error";
    if (status >= 500) return "server_error";
    return "invalid_request_error";
}

void tsr_oai_error_set(tsr_oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type_for(status);
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

void tsr_oai_error_from_status(tsr_oai_error *e, tsr_status st, const char *message)
{
    const char *msg = message && *message ? message : tsr_status_str(st);
    switch (st) {
    case TSR_ERR_BUSY:
        tsr_oai_error_set(e, 429, NULL, "rate_limit_exceeded", "the server is at capacity: %s", msg);
        break;
    case TSR_ERR_ARG:
        tsr_oai_error_set(e, 400, NULL, NULL, "%s", msg);
        break;
    case TSR_ERR_REMOTE:
        tsr_oai_error_set(e, 503, NULL, "service_unavailable", "the model executor is unavailable: %s", msg);
        break;
    default:
        tsr_oai_error_set(e, 500, NULL, NULL, "internal error: %s", msg);
        break;
    }
}

json_t *tsr_oai_error_json(const tsr_oai_error *e)
{
    json_t *inner = json_object();
    json_t *outer = json_object();
    if (!inner || !outer) {
        json_decref(inner);
        json_decref(outer);
        return NULL;
    }
    /* messages may quote request text cut at any byte: make sure they are UTF-8 for jansson */
    json_t *msg = json_string(e->message);
    if (!msg) msg = json_string("(the error message is not valid UTF-8)");
    json_object_set_new(inner, "message", msg);
    json_object_set_new(inner, "type", json_string(e->type ? e->type : type_for(e->status)));
    json_object_set_new(inner, "param", e->param[0] ? json_string(e->param) : json_null());
    json_object_set_new(inner, "code", e->code ? json_string(e->code) : json_null());
    json_object_set_new(outer, "error", inner);
    return outer;
}

/* --- small field readers --------------------------------------------------------------------------------- */

/* Each returns 0 when the field is absent or null (value left alone), 1 when read, -1 after filling err. */

static int get_bool(const json_t *o, const char *key, int *out, tsr_oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        tsr_oai_error_set(err, 400, key, NULL, "'%s' must be a boolean", key);
        return -1;
    }
    *out = json_is_true(v);
    return 1;
}

static int get_number(const json_t *o, const char *key, double lo, double hi, double *out, tsr_oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) {
        tsr_oai_error_set(err, 400, key, NULL, "'%s' must be a number", key);
        return -1;
    }
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) {
        tsr_oai_error_set(err, 400, key, NULL, "'%s' must be between %g and %g (got %g)", key, lo, hi, x);
        return -1;
    }
    *out = x;
    return 1;
}

static int as_integer(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double x = json_real_value(v);
        if (x == floor(x) && fabs(x) < 9.0e15) {
            *out = (int64_t)x;
            return 1;
        }
    }
    return 0;
}

static int get_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, tsr_oai_error *err)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return 0;
    int64_t x;
    if (!as_integer(v, &x)) {
        tsr_oai_error_set(err, 400, key, NULL, "'%s' must be an integer", key);
        return -1;
    }
    if (x < lo || x > hi) {
        tsr_oai_error_set(err, 400, key, NULL, "'%s' must be between %" PRId64 " and %" PRId64 " (got %" PRId64 ")",
                          key, lo, hi, x);
        return -1;
    }
    *out = x;
    return 1;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static int nomem(tsr_oai_error *err)
{
    tsr_oai_error_set(err, 500, NULL, NULL, "out of memory");
    return -1;
}

/* --- the request ----------------------------------------------------------------------------------------- */

void tsr_oai_request_free(tsr_oai_request *rq)
{
    if (!rq) return;
    for (int i = 0; i < rq->n_prompts; i++) {
        free(rq->prompts[i].ids);
        free(rq->prompts[i].text);
    }
    free(rq->prompts);
    for (int i = 0; i < rq->n_stop; i++) free(rq->stop[i]);
    free(rq->stop);
    free(rq->stop_ids);
    free(rq->bias);
    free(rq->model);
    free(rq);
}

static int check_ids(const int32_t *ids, int n, int vocab, const char *param, tsr_oai_error *err)
{
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) {
            tsr_oai_error_set(err, 400, param, NULL, "token id %d is outside the vocabulary (0..%d)", (int)ids[i],
                              vocab - 1);
            return -1;
        }
    return 0;
}

/* Encodes text into prompt p; add_special: the tokenizer's BOS/EOS post-processing. */
static int encode_text(tsr_oai_prompt *p, const tsr_oai_model *m, const char *text, size_t len, int add_special,
                       int keep_text, const char *param, tsr_oai_error *err)
{
    size_t n = 0;
    tsr_status st = tsr_tokenizer_encode(m->tok, text, len, add_special, &p->ids, &n);
    if (st == TSR_ERR_NOMEM) return nomem(err);
    if (st != TSR_OK) {
        tsr_oai_error_set(err, 400, param, NULL, "the prompt cannot be tokenized: %s", tsr_last_error());
        return -1;
    }
    if (n == 0) {
        tsr_oai_error_set(err, 400, param, NULL, "the prompt is empty (it encodes to no tokens)");
        return -1;
    }
    if (n > (size_t)1 << 30) {
        tsr_oai_error_set(err, 400, param, NULL, "the prompt is too long");
        return -1;
    }
    p->n_ids = (int)n;
    if (keep_text) {
        if (!(p->text = dup_n(text, len))) return nomem(err);
        p->text_len = len;
    }
    return 0;
}

/* A prompt given as an array of token ids. */
static int prompt_from_ids(tsr_oai_prompt *p, const tsr_oai_model *m, const json_t *arr, int keep_text,
                           tsr_oai_error *err)
{
    size_t n = json_array_size(arr);
    if (n == 0) {
        tsr_oai_error_set(err, 400, "prompt", NULL, "the prompt is empty");
        return -1;
    }
    if (n > (size_t)1 << 30) {
        tsr_oai_error_set(err, 400, "prompt", NULL, "the prompt is too long");
        return -1;
    }
    if (!(p->ids = malloc(n * sizeof *p->ids))) return nomem(err);
    for (size_t i = 0; i < n; i++) {
        int64_t x;
        if (!as_integer(json_array_get(arr, i), &x) || x < 0 || x >= m->vocab) {
            tsr_oai_error_set(err, 400, "prompt", NULL,
                              "prompt token %zu is not a token id of the vocabulary (0..%d)", i, m->vocab - 1);
            return -1;
        }
        p->ids[i] = (int32_t)x;
    }
    p->n_ids = (int)n;
    if (keep_text) {
        tsr_status st = tsr_tokenizer_decode(m->tok, p->ids, n, 1, &p->text, &p->text_len);
        if (st != TSR_OK) return nomem(err);
    }
    return 0;
}

static int parse_completions_prompt(tsr_oai_request *rq, const json_t *body, const tsr_oai_model *m,
                                    tsr_oai_error *err)
{
    const json_t *pr = json_object_get(body, "prompt");
    if (!pr || json_is_null(pr)) {
        tsr_oai_error_set(err, 400, "prompt", NULL, "'prompt' is required");
        return -1;
    }
    int single_text = json_is_string(pr);
    int single_ids = json_is_array(pr) && json_array_size(pr) > 0 && json_is_number(json_array_get(pr, 0));
    size_t n = (single_text || single_ids) ? 1 : json_is_array(pr) ? json_array_size(pr) : 0;
    if (!single_text && !json_is_array(pr)) {
        tsr_oai_error_set(err, 400, "prompt", NULL,
                          "'prompt' must be a string, an array of strings, an array of token ids or an array of "
                          "arrays of token ids");
        return -1;
    }
    if (n == 0) {
        tsr_oai_error_set(err, 400, "prompt", NULL, "'prompt' is empty");
        return -1;
    }
    if (n > TSR_OAI_MAX_PROMPTS) {
        tsr_oai_error_set(err, 400, "prompt", NULL, "at most %d prompts per request (got %zu)", TSR_OAI_MAX_PROMPTS,
                          n);
        return -1;
    }
    if (!(rq->prompts = calloc(n, sizeof *rq->prompts))) return nomem(err);
    rq->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *item = (single_text || single_ids) ? pr : json_array_get(pr, i);
        int rc;
        if (json_is_string(item))
            rc = encode_text(&rq->prompts[i], m, json_string_value(item), json_string_length(item), 1, rq->echo,
                             "prompt", err);
        else if (json_is_array(item) && (single_ids || json_array_size(item) == 0 ||
                                         json_is_number(json_array_get(item, 0))))
            rc = prompt_from_ids(&rq->prompts[i], m, item, rq->echo, err);
        else {
            tsr_oai_error_set(err, 400, "prompt", NULL, "prompt %zu must be a string or an array of token ids", i);
            rc = -1;
        }
        if (rc) return rc;
    }
    return 0;
}

/* Appends the text of message content parts ([{"type": "text", "text": ...}]) into one string. */
static json_t *flatten_parts(const json_t *parts, size_t mi, tsr_oai_error *err)
{
    size_t total = 0, np = json_array_size(parts);
    for (size_t j = 0; j < np; j++) {
        const json_t *part = json_array_get(parts, j);
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !type || strcmp(type, "text") || !json_is_string(text)) {
            tsr_oai_error_set(err, 400, "messages", NULL,
                              "message %zu: only text content parts ({\"type\": \"text\", \"text\": ...}) are "
                              "supported",
                              mi);
            return NULL;
        }
        total += json_string_length(text) + 1;
    }
    char *buf = malloc(total + 1), *w = buf;
    if (!buf) {
        nomem(err);
        return NULL;
    }
    for (size_t j = 0; j < np; j++) {
        const json_t *text = json_object_get(json_array_get(parts, j), "text");
        if (j) *w++ = '\n';
        memcpy(w, json_string_value(text), json_string_length(text));
        w += json_string_length(text);
    }
    json_t *s = json_stringn(buf, (size_t)(w - buf));
    free(buf);
    if (!s) nomem(err);
    return s;
}

/* Copies the messages for the template: content parts joined into a string, null content as "", the
 * "developer" role as "system". */
static json_t *normalize_messages(const json_t *msgs, tsr_oai_error *err)
{
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        tsr_oai_error_set(err, 400, "messages", NULL, "'messages' must be a non-empty array");
        return NULL;
    }
    json_t *out = json_array();
    if (!out) {
        nomem(err);
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *msg = json_array_get(msgs, i);
        const json_t *role = json_object_get(msg, "role");
        if (!json_is_object(msg) || !json_is_string(role)) {
            tsr_oai_error_set(err, 400, "messages", NULL, "message %zu must be an object with a string 'role'", i);
            goto fail;
        }
        json_t *copy = json_object();
        if (!copy || json_array_append_new(out, copy)) {
            nomem(err);
            goto fail;
        }
        const char *key;
        json_t *val;
        json_object_foreach(msg, key, val) {
            if (json_object_set(copy, key, val)) {
                nomem(err);
                goto fail;
            }
        }
        if (!strcmp(json_string_value(role), "developer") &&
            json_object_set_new(copy, "role", json_string("system"))) {
            nomem(err);
            goto fail;
        }
        const json_t *content = json_object_get(msg, "content");
        json_t *flat = NULL;
        if (!content || json_is_null(content)) {
            if (!(flat = json_string(""))) {
                nomem(err);
                goto fail;
            }
        } else if (json_is_array(content)) {
            if (!(flat = flatten_parts(content, i, err))) goto fail;
        } else if (!json_is_string(content)) {
            tsr_oai_error_set(err, 400, "messages", NULL, "message %zu: 'content' must be a string or an array", i);
            goto fail;
        }
        if (flat && json_object_set_new(copy, "content", flat)) {
            nomem(err);
            goto fail;
        }
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static int parse_chat_prompt(tsr_oai_request *rq, const json_t *body, const tsr_oai_model *m, tsr_oai_error *err)
{
    if (!m->tpl) {
        tsr_oai_error_set(err, 400, "messages", NULL,
                          "this model has no chat template (give one with --chat-template), use /v1/completions");
        return -1;
    }
    const json_t *tools = json_object_get(body, "tools"), *extra = json_object_get(body, "chat_template_kwargs");
    if (tools && json_is_null(tools)) tools = NULL;
    if (extra && json_is_null(extra)) extra = NULL;
    if (tools && !json_is_array(tools)) {
        tsr_oai_error_set(err, 400, "tools", NULL, "'tools' must be an array");
        return -1;
    }
    if (extra && !json_is_object(extra)) {
        tsr_oai_error_set(err, 400, "chat_template_kwargs", NULL, "'chat_template_kwargs' must be an object");
        return -1;
    }
    int add_gen = 1;
    if (get_bool(body, "add_generation_prompt", &add_gen, err) < 0) return -1;
    json_t *msgs = normalize_messages(json_object_get(body, "messages"), err);
    if (!msgs) return -1;
    char *text = NULL;
    tsr_status st = tsr_chat_template_render(m->tpl, msgs, tools, add_gen, m->bos_token, m->eos_token, extra, &text);
    json_decref(msgs);
    if (st != TSR_OK) {
        tsr_oai_error_set(err, 400, "messages", NULL, "the chat template could not render these messages: %s",
                          tsr_last_error());
        return -1;
    }
    if (!(rq->prompts = calloc(1, sizeof *rq->prompts))) {
        free(text);
        return nomem(err);
    }
    rq->n_prompts = 1;
    int rc = encode_text(&rq->prompts[0], m, text, strlen(text), 0, 0, "messages", err);
    free(text);
    return rc;
}

static int parse_stop(tsr_oai_request *rq, const json_t *body, tsr_oai_error *err)
{
    const json_t *stop = json_object_get(body, "stop");
    if (!stop || json_is_null(stop)) return 0;
    size_t n = json_is_string(stop) ? 1 : json_array_size(stop);
    if (!json_is_string(stop) && !json_is_array(stop)) {
        tsr_oai_error_set(err, 400, "stop", NULL, "'stop' must be a string or an array of strings");
        return -1;
    }
    if (n > TSR_OAI_MAX_STOP) {
        tsr_oai_error_set(err, 400, "stop", NULL, "at most %d stop strings (got %zu)", TSR_OAI_MAX_STOP, n);
        return -1;
    }
    if (n && !(rq->stop = calloc(n, sizeof *rq->stop))) return nomem(err);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
        if (!json_is_string(s)) {
            tsr_oai_error_set(err, 400, "stop", NULL, "'stop' must be a string or an array of strings");
            return -1;
        }
        if (json_string_length(s) == 0) continue; /* an empty stop string can never match: ignore it */
        if (!(rq->stop[rq->n_stop] = dup_n(json_string_value(s), json_string_length(s)))) return nomem(err);
        rq->n_stop++;
    }
    return 0;
}

static int parse_stop_ids(tsr_oai_request *rq, const json_t *body, const tsr_oai_model *m, tsr_oai_error *err)
{
    const json_t *extra = json_object_get(body, "stop_token_ids");
    if (extra && json_is_null(extra)) extra = NULL;
    if (extra && !json_is_array(extra)) {
        tsr_oai_error_set(err, 400, "stop_token_ids", NULL, "'stop_token_ids' must be an array of token ids");
        return -1;
    }
    size_t n_extra = json_array_size(extra);
    if (n_extra > 1024) {
        tsr_oai_error_set(err, 400, "stop_token_ids", NULL, "at most 1024 stop token ids");
        return -1;
    }
    rq->stop_ids = malloc((n_extra + (size_t)m->n_eos + 1) * sizeof *rq->stop_ids);
    if (!rq->stop_ids) return nomem(err);
    for (int i = 0; i < m->n_eos; i++) rq->stop_ids[rq->n_stop_ids++] = m->eos_ids[i];
    for (size_t i = 0; i < n_extra; i++) {
        int64_t x;
        if (!as_integer(json_array_get(extra, i), &x) || x < 0 || x >= m->vocab) {
            tsr_oai_error_set(err, 400, "stop_token_ids", NULL,
                              "stop_token_ids[%zu] is not a token id of the vocabulary (0..%d)", i, m->vocab - 1);
            return -1;
        }
        rq->stop_ids[rq->n_stop_ids++] = (int32_t)x;
    }
    return check_ids(rq->stop_ids, rq->n_stop_ids, m->vocab, "stop_token_ids", err);
}

static int parse_bias(tsr_oai_request *rq, const json_t *body, const tsr_oai_model *m, tsr_oai_error *err)
{
    const json_t *lb = json_object_get(body, "logit_bias");
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb)) {
        tsr_oai_error_set(err, 400, "logit_bias", NULL, "'logit_bias' must be an object of token id -> bias");
        return -1;
    }
    size_t n = json_object_size(lb);
    if (n > 4096) {
        tsr_oai_error_set(err, 400, "logit_bias", NULL, "at most 4096 logit_bias entries");
        return -1;
    }
    if (n && !(rq->bias = malloc(n * sizeof *rq->bias))) return nomem(err);
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)lb, key, val)
    {
        char *end = NULL;
        long id = strtol(key, &end, 10);
        if (!*key || *end || id < 0 || id >= m->vocab) {
            tsr_oai_error_set(err, 400, "logit_bias", NULL,
                              "logit_bias key '%.64s' is not a token id of the vocabulary (0..%d)", key, m->vocab - 1);
            return -1;
        }
        double b = json_is_number(val) ? json_number_value(val) : NAN;
        if (!(b >= -100 && b <= 100)) {
            tsr_oai_error_set(err, 400, "logit_bias", NULL, "logit_bias values must be numbers in [-100, 100]");
            return -1;
        }
        rq->bias[rq->n_bias++] = (tsr_logit_bias){(int32_t)id, (float)b};
    }
    return 0;
}

static int parse_sampling(tsr_oai_request *rq, const json_t *body, tsr_oai_error *err)
{
    tsr_sampling *s = &rq->params.sampling;
    double x;
    int64_t k;
    int rc;
    if ((rc = get_number(body, "temperature", 0, 100, &x, err)) < 0) return -1;
    if (rc) s->temperature = (float)x;
    if ((rc = get_number(body, "top_p", 0, 1, &x, err)) < 0) return -1;
    if (rc) {
        if (x <= 0) {
            tsr_oai_error_set(err, 400, "top_p", NULL, "'top_p' must be in (0, 1]");
            return -1;
        }
        s->top_p = (float)x;
    }
    if ((rc = get_int(body, "top_k", -1, 1 << 30, &k, err)) < 0) return -1;
    if (rc) s->top_k = k < 0 ? 0 : (int)k;
    if ((rc = get_number(body, "min_p", 0, 1, &x, err)) < 0) return -1;
    if (rc) s->min_p = (float)x;
    if ((rc = get_number(body, "typical_p", 0, 1, &x, err)) < 0) return -1;
    if (rc) {
        if (x <= 0) {
            tsr_oai_error_set(err, 400, "typical_p", NULL, "'typical_p' must be in (0, 1]");
            return -1;
        }
        s->typical_p = (float)x;
    }
    if ((rc = get_number(body, "repetition_penalty", 0, 100, &x, err)) < 0) return -1;
    if (rc) {
        if (x <= 0) {
            tsr_oai_error_set(err, 400, "repetition_penalty", NULL, "'repetition_penalty' must be > 0");
            return -1;
        }
        s->repetition_penalty = (float)x;
    }
    if ((rc = get_number(body, "frequency_penalty", -2, 2, &x, err)) < 0) return -1;
    if (rc) s->frequency_penalty = (float)x;
    if ((rc = get_number(body, "presence_penalty", -2, 2, &x, err)) < 0) return -1;
    if (rc) s->presence_penalty = (float)x;
    return 0;
}

static uint64_t random_seed(void)
{
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    uint64_t z = (uint64_t)ts.tv_sec * 1000000007u + (uint64_t)ts.tv_nsec +
                 0x9e3779b97f4a7c15ull * (uint64_t)(atomic_fetch_add(&counter, 1) + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Logprobs, echo, n, stream and the fields tessera refuses. */
static int parse_options(tsr_oai_request *rq, const json_t *body, tsr_oai_error *err)
{
    int64_t k;
    int rc;
    if ((rc = get_int(body, "n", 1, TSR_OAI_MAX_N, &k, err)) < 0) return -1;
    if (rc) rq->n = (int)k;
    if (get_bool(body, "stream", &rq->stream, err) < 0) return -1;
    const json_t *so = json_object_get(body, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            tsr_oai_error_set(err, 400, "stream_options", NULL, "'stream_options' must be an object");
            return -1;
        }
        if (get_bool(so, "include_usage", &rq->include_usage, err) < 0) {
            snprintf(err->param, sizeof err->param, "stream_options.include_usage");
            return -1;
        }
        if (!rq->stream) rq->include_usage = 0;
    }
    if (rq->kind == TSR_OAI_CHAT) {
        if (get_bool(body, "logprobs", &rq->logprobs, err) < 0) return -1;
        if ((rc = get_int(body, "top_logprobs", 0, TSR_MAX_LOGPROBS, &k, err)) < 0) return -1;
        if (rc) {
            if (!rq->logprobs && k > 0) {
                tsr_oai_error_set(err, 400, "top_logprobs", NULL, "'top_logprobs' needs 'logprobs': true");
                return -1;
            }
            rq->top_logprobs = (int)k;
        }
    } else {
        const json_t *lp = json_object_get(body, "logprobs");
        if (json_is_boolean(lp)) {
            tsr_oai_error_set(err, 400, "logprobs", NULL, "'logprobs' of /v1/completions is an integer (0..%d)",
                              TSR_MAX_LOGPROBS);
            return -1;
        }
        if ((rc = get_int(body, "logprobs", 0, TSR_MAX_LOGPROBS, &k, err)) < 0) return -1;
        if (rc) {
            rq->logprobs = 1;
            rq->top_logprobs = (int)k;
        }
        if (get_bool(body, "echo", &rq->echo, err) < 0) return -1;
        if (rq->echo && rq->logprobs) {
            tsr_oai_error_set(err, 400, "echo", NULL, "'echo' together with 'logprobs' is not supported");
            return -1;
        }
        const json_t *suffix = json_object_get(body, "suffix");
        if (suffix && !json_is_null(suffix) && !(json_is_string(suffix) && json_string_length(suffix) == 0)) {
            tsr_oai_error_set(err, 400, "suffix", NULL, "'suffix' is not supported");
            return -1;
        }
    }
    if ((rc = get_int(body, "best_of", 1, TSR_OAI_MAX_N, &k, err)) < 0) return -1;
    if (rc && k != rq->n) {
        tsr_oai_error_set(err, 400, "best_of", NULL, "'best_of' other than n is not supported");
        return -1;
    }
    const json_t *rf = json_object_get(body, "response_format");
    if (rf && !json_is_null(rf)) {
        const char *type = json_string_value(json_object_get(rf, "type"));
        if (!type || strcmp(type, "text")) {
            tsr_oai_error_set(err, 400, "response_format", NULL, "only 'response_format' {\"type\": \"text\"} is "
                                                                "supported");
            return -1;
        }
    }
    rq->params.n_logprobs = rq->logprobs ? rq->top_logprobs : -1;
    const json_t *seed = json_object_get(body, "seed");
    if (seed && !json_is_null(seed)) {
        int64_t sv;
        if (!as_integer(seed, &sv)) {
            tsr_oai_error_set(err, 400, "seed", NULL, "'seed' must be an integer");
            return -1;
        }
        rq->has_seed = 1;
        rq->params.seed = (uint64_t)sv;
    } else {
        rq->params.seed = random_seed();
    }
    if (get_bool(body, "ignore_eos", &rq->params.ignore_eos, err) < 0) return -1;
    /* a per-request deadline (not an OpenAI field; clients that do not send it get none) */
    double t;
    int got = get_number(body, "timeout", 0, 1e7, &t, err);
    if (got < 0) return -1;
    if (got) rq->timeout_s = t;
    return 0;
}

/* max_tokens / max_completion_tokens / min_tokens against the context. */
static int parse_lengths(tsr_oai_request *rq, const json_t *body, const tsr_oai_model *m, tsr_oai_error *err)
{
    int64_t k = 0;
    int given = 0, rc;
    const char *which = "max_tokens";
    if ((rc = get_int(body, "max_tokens", 1, INT32_MAX, &k, err)) < 0) return -1;
    given |= rc;
    if ((rc = get_int(body, "max_completion_tokens", 1, INT32_MAX, &k, err)) < 0) return -1;
    if (rc) which = "max_completion_tokens";
    given |= rc;
    int longest = 0;
    for (int i = 0; i < rq->n_prompts; i++)
        if (rq->prompts[i].n_ids > longest) longest = rq->prompts[i].n_ids;
    const char *where = rq->kind == TSR_OAI_CHAT ? "messages" : "prompt";
    if (longest >= m->max_context) {
        tsr_oai_error_set(err, 400, where, "context_length_exceeded",
                          "This model's maximum context length is %d tokens. However, your %s %d tokens, "
                          "which leaves no room for the completion.",
                          m->max_context, rq->kind == TSR_OAI_CHAT ? "messages are" : "prompt is", longest);
        return -1;
    }
    if (given) {
        if ((int64_t)longest + k > m->max_context) {
            tsr_oai_error_set(err, 400, which, "context_length_exceeded",
                              "This model's maximum context length is %d tokens. However, you requested %" PRId64
                              " tokens (%d in the %s, %" PRId64 " in the completion). Please reduce the length of "
                              "the %s or the completion.",
                              m->max_context, (int64_t)longest + k, longest, where, k, where);
            return -1;
        }
        rq->params.max_tokens = (int)k;
    } else {
        int room = m->max_context - longest;
        rq->params.max_tokens = rq->kind == TSR_OAI_COMPLETIONS && room > 16 ? 16 : room;
    }
    if ((rc = get_int(body, "min_tokens", 0, INT32_MAX, &k, err)) < 0) return -1;
    if (rc) {
        if (k > rq->params.max_tokens) {
            tsr_oai_error_set(err, 400, "min_tokens", NULL, "'min_tokens' (%" PRId64 ") exceeds max tokens (%d)", k,
                              rq->params.max_tokens);
            return -1;
        }
        rq->params.min_tokens = (int)k;
    }
    return 0;
}

static int parse_model(tsr_oai_request *rq, const json_t *body, const tsr_oai_model *m, tsr_oai_error *err)
{
    const json_t *model = json_object_get(body, "model");
    const char *name = m->name;
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) {
            tsr_oai_error_set(err, 400, "model", NULL, "'model' must be a string");
            return -1;
        }
        name = json_string_value(model);
        if (strcmp(name, m->name)) {
            tsr_oai_error_set(err, 404, "model", "model_not_found", "The model `%.200s` does not exist.", name);
            return -1;
        }
    }
    if (!(rq->model = strdup(name))) return nomem(err);
    return 0;
}

tsr_status tsr_oai_parse(tsr_oai_kind kind, const json_t *body, const tsr_oai_model *m, tsr_oai_request **out,
                         tsr_oai_error *err)
{
    *out = NULL;
    if (!json_is_object(body)) {
        tsr_oai_error_set(err, 400, NULL, NULL, "the request body must be a JSON object");
        return TSR_ERR_ARG;
    }
    tsr_oai_request *rq = calloc(1, sizeof *rq);
    if (!rq) {
        nomem(err);
        return TSR_ERR_NOMEM;
    }
    rq->kind = kind;
    rq->n = 1;
    rq->params.sampling = tsr_sampling_default();
    rq->params.n_logprobs = -1;
    /* the cheap checks first: a wrong model or field costs no tokenization */
    int rc = parse_model(rq, body, m, err);
    if (!rc) rc = parse_options(rq, body, err);
    if (!rc) rc = parse_sampling(rq, body, err);
    if (!rc) rc = parse_stop(rq, body, err);
    if (!rc) rc = parse_stop_ids(rq, body, m, err);
    if (!rc) rc = parse_bias(rq, body, m, err);
    if (!rc)
        rc = kind == TSR_OAI_CHAT ? parse_chat_prompt(rq, body, m, err) : parse_completions_prompt(rq, body, m, err);
    if (!rc) rc = parse_lengths(rq, body, m, err);
    if (rc) {
        tsr_status st = err->status >= 500 ? TSR_ERR_NOMEM : TSR_ERR_ARG;
        tsr_oai_request_free(rq);
        return st;
    }
    rq->n_choices = rq->n_prompts * rq->n;
    rq->params.stop_ids = rq->stop_ids;
    rq->params.n_stop_ids = rq->n_stop_ids;
    rq->params.bias = rq->bias;
    rq->params.n_bias = rq->n_bias;
    *out = rq;
    return TSR_OK;
}

tsr_status tsr_oai_parse_bytes(tsr_oai_kind kind, const char *data, size_t len, const tsr_oai_model *m,
                               tsr_oai_request **out, tsr_oai_error *err)
{
    *out = NULL;
    json_error_t jerr;
    json_t *body = json_loadb(data, len, 0, &jerr); /* a repeated key: the last one wins, as in Python */
    if (!body && json_error_code(&jerr) == json_error_out_of_memory) {
        nomem(err);
        return TSR_ERR_NOMEM;
    }
    if (!body) {
        tsr_oai_error_set(err, 400, NULL, NULL, "invalid JSON in the request body (line %d, column %d): %s",
                          jerr.line, jerr.column, jerr.text);
        return TSR_ERR_ARG;
    }
    tsr_status st = tsr_oai_parse(kind, body, m, out, err);
    json_decref(body);
    return st;
}

void tsr_oai_gen_request(const tsr_oai_request *rq, int c, tsr_gen_request *out)
{
    const tsr_oai_prompt *p = &rq->prompts[c / rq->n];
    *out = (tsr_gen_request){
        .prompt = p->ids,
        .n_prompt = p->n_ids,
        .params = rq->params,
        .stop = (const char *const *)rq->stop,
        .n_stop = rq->n_stop,
    };
    out->params.seed = rq->params.seed + (uint64_t)(c % rq->n);
    if (rq->timeout_s > 0) out->params.deadline = tsr_service_now() + rq->timeout_s;
}

json_t *tsr_oai_models_json(const tsr_oai_model *m)
{
    return json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:s, s:i}]}", "object", "list", "data", "id", m->name, "object",
                     "model", "created", (json_int_t)m->created, "owned_by", "tessera", "root", m->name,
                     "max_model_len", m->max_context);
}
