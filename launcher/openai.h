/* OpenAI-compatible request and response mapping, shared by every front door (the HTTP gateway of `tessera
 * serve`, `tessera batch`, the nanomsg intake).
 *
 * Requests: tsr_oai_parse() turns a /v1/completions or /v1/chat/completions JSON body into prompts (token ids:
 * a completions prompt is encoded with the tokenizer's special tokens; chat messages are rendered through the
 * model's chat template with the generation prompt and encoded without adding special tokens again) plus
 * everything a tsr_gen_request needs, the number of choices (n), the stream options and the echo/logprobs
 * options. Every problem becomes a tsr_oai_error shaped like OpenAI's ({status, message, type, param, code}):
 * invalid JSON or fields -> 400, prompt + max tokens over the context -> 400 naming both numbers
 * (code "context_length_exceeded"), unknown model -> 404 (code "model_not_found").
 *
 * Choices: a request has n_prompts prompts (a completions prompt may be a list) and n choices per prompt; choice
 * c belongs to prompt c / n and is submitted as its own service request (tsr_oai_gen_request). With a seed,
 * choice c samples with seed + c % n, so n > 1 gives different samples that are still reproducible.
 *
 * Responses: a tsr_oai_result collects the service's events of every choice (tsr_oai_result_add) and builds the
 * non-streaming body (tsr_oai_response) or, for stream: true, the chunk of each event, the opening chunks and
 * the usage chunk (the caller frames each as `data: <json>\n\n` and ends with `data: [DONE]\n\n`).
 *
 * Ownership: every json_t returned is a new reference the caller releases with json_decref; a parsed request
 * owns all its arrays (tsr_oai_request_free); a result borrows its request, which must outlive it. Nothing here
 * is thread-safe per object, but distinct objects may be used from different threads; the model description is
 * read-only. Failures return a tsr_status with a tsr_fail message (NOMEM for allocation failures, ARG for
 * misuse); request problems are reported through tsr_oai_error, never by aborting. */
#ifndef TSR_LAUNCHER_OPENAI_H
#define TSR_LAUNCHER_OPENAI_H

#include "runtime/service.h"
#include "runtime/status.h"
#include "runtime/text/chat_template.h"
#include "runtime/text/tokenizer.h"

#include <jansson.h>
#include <stdint.h>

#define TSR_OAI_MAX_N 128       /* choices per prompt */
#define TSR_OAI_MAX_PROMPTS 256 /* prompts in one completions request */
#define TSR_OAI_MAX_STOP 16     /* stop strings per request */

typedef enum tsr_oai_kind {
    TSR_OAI_COMPLETIONS = 0, /* POST /v1/completions */
    TSR_OAI_CHAT,            /* POST /v1/chat/completions */
} tsr_oai_kind;

/* An error the way OpenAI reports it: HTTP status plus {"error": {"message", "type", "param", "code"}}. */
typedef struct tsr_oai_error {
    int status;        /* 400, 401, 404, 413, 429, 500, 503... */
    char message[512];
    const char *type;  /* "invalid_request_error", "authentication_error", "rate_limit_error", "server_error" */
    char param[64];    /* the request field at fault; "" gives null */
    const char *code;  /* e.g. "context_length_exceeded", "model_not_found", "invalid_api_key"; NULL gives null */
} tsr_oai_error;

/* Fills e (type chosen from the status: 401 authentication_error, 429 rate_limit_error, >= 500 server_error,
 * otherwise invalid_request_error). param and code may be NULL. */
void tsr_oai_error_set(tsr_oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Maps a failed tsr_service_submit() (status + tsr_last_error() text): BUSY -> 429 ("rate_limit_exceeded"),
 * ARG -> 400, REMOTE -> 503 (the executor is gone), anything else -> 500. */
void tsr_oai_error_from_status(tsr_oai_error *e, tsr_status st, const char *message);

/* {"error": {...}}; NULL only when out of memory. */
json_t *tsr_oai_error_json(const tsr_oai_error *e);

/* What the front door serves: read-only, shared by every request; all pointers borrowed. */
typedef struct tsr_oai_model {
    const char *name;             /* the served model name: requests must name it (or omit "model") */
    const tsr_tokenizer *tok;
    const tsr_chat_template *tpl; /* NULL: chat requests fail with 400 */
    const char *bos_token, *eos_token; /* strings the chat template sees (NULL: undefined) */
    const int32_t *eos_ids;       /* end-of-sequence ids, always stop ids unless ignore_eos */
    int n_eos;
    int vocab;                    /* token ids must be below this */
    int max_context;              /* prompt + max tokens must fit */
    int64_t created;              /* "created" of /v1/models (Unix seconds) */
} tsr_oai_model;

/* One prompt of a request (owned by the request). */
typedef struct tsr_oai_prompt {
    int32_t *ids;
    int n_ids;
    char *text;        /* the prompt as text (given, rendered, or decoded from ids): what echo prints */
    size_t text_len;
} tsr_oai_prompt;

/* A parsed request. Fields not given by the request hold their defaults. */
typedef struct tsr_oai_request {
    tsr_oai_kind kind;
    char *model;                  /* as requested (the served name when omitted) */
    tsr_oai_prompt *prompts;
    int n_prompts;
    int n;                        /* choices per prompt, 1..TSR_OAI_MAX_N */
    int n_choices;                /* n_prompts * n */
    int stream;                   /* "stream": true */
    int include_usage;            /* "stream_options": {"include_usage": true} */
    int echo;                     /* completions: prepend the prompt text to each choice */
    int logprobs;                 /* 1 when log-probabilities are returned (chat "logprobs": true, completions
                                     "logprobs": N) */
    int top_logprobs;             /* alternatives per token (chat "top_logprobs", completions "logprobs") */
    int has_seed;
    tsr_seq_params params;        /* sampling, seed, max_tokens, min_tokens, stop ids, ignore_eos, n_logprobs,
                                     bias; stop_ids/bias point into the arrays below */
    char **stop;                  /* stop strings (non-empty) */
    int n_stop;
    int32_t *stop_ids;            /* EOS ids + "stop_token_ids" */
    int n_stop_ids;
    tsr_logit_bias *bias;
    int n_bias;
    double timeout_s;             /* "timeout": seconds from submission after which the request ends with
                                     finish_reason "abort" (0 = none) */
} tsr_oai_request;

/* Parses a request body. On success *out is a new request (free with tsr_oai_request_free) and TSR_OK is
 * returned. A request problem returns TSR_ERR_ARG with *err filled (status 400/404); TSR_ERR_NOMEM (err filled
 * with a 500) when memory runs out. body may be NULL (the caller could not parse JSON: pass the jansson error
 * text as json_error). Never keeps a reference to body. */
tsr_status tsr_oai_parse(tsr_oai_kind kind, const json_t *body, const tsr_oai_model *m, tsr_oai_request **out,
                         tsr_oai_error *err);
/* Parses raw bytes (any length, not NUL-terminated) and then the JSON: invalid JSON is a 400 naming the line and
 * column. */
tsr_status tsr_oai_parse_bytes(tsr_oai_kind kind, const char *data, size_t len, const tsr_oai_model *m,
                               tsr_oai_request **out, tsr_oai_error *err);
void tsr_oai_request_free(tsr_oai_request *rq);

/* The service request of choice c (0 <= c < n_choices): its prompt, parameters (seed + c % n; a deadline of now +
 * timeout_s on the service clock when a timeout was given) and stop strings. Everything points into rq. */
void tsr_oai_gen_request(const tsr_oai_request *rq, int c, tsr_gen_request *out);

/* GET /v1/models body: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by",
 * "max_model_len"}]}. */
json_t *tsr_oai_models_json(const tsr_oai_model *m);

/* --- responses ------------------------------------------------------------------------------------------- */

typedef struct tsr_oai_result tsr_oai_result;

/* id: the response id ("cmpl-..." / "chatcmpl-..."; tsr_oai_make_id makes one); created: Unix seconds. The
 * request and model are borrowed and must outlive the result. */
tsr_status tsr_oai_result_new(const tsr_oai_request *rq, const tsr_oai_model *m, const char *id, int64_t created,
                              tsr_oai_result **out);
void tsr_oai_result_free(tsr_oai_result *r);

/* Writes a fresh random id with the kind's prefix into buf (at least 40 bytes). */
void tsr_oai_make_id(tsr_oai_kind kind, char *buf, size_t cap);

/* Records one service event of choice c (the text, token log-probabilities, usage and finish reason are copied).
 * With rq->stream, *chunk (when chunk is not NULL) receives the chunk to send for it, or NULL when there is
 * nothing to send (an empty event). Events after a choice's final one are an ARG error. */
tsr_status tsr_oai_result_add(tsr_oai_result *r, int c, const tsr_gen_event *ev, json_t **chunk);

/* 1 when every choice had its final event. */
int tsr_oai_result_done(const tsr_oai_result *r);
/* The first error of a choice that ended with TSR_FINISH_ERROR (its event's message), or NULL. */
const char *tsr_oai_result_error(const tsr_oai_result *r);
/* Usage over every choice: prompt tokens counted once per prompt; cached: prompt tokens served from the
 * prefix cache. */
void tsr_oai_result_usage(const tsr_oai_result *r, int *prompt_tokens, int *completion_tokens, int *cached_tokens);

/* The non-streaming response body: {"id", "object": "text_completion" | "chat.completion", "created", "model",
 * "choices": [...], "usage": {...}}. Finish reasons: "stop", "length", "abort" (cancelled or deadline),
 * "error". */
json_t *tsr_oai_response(const tsr_oai_result *r);

/* Streaming: the chunks that open the stream (a JSON array, possibly empty: chat sends each choice's role delta
 * first; completions with echo send each choice's prompt text) and the usage chunk ({"choices": [], "usage":
 * {...}}; only when rq->include_usage, else NULL). With include_usage, every other chunk carries "usage": null,
 * as OpenAI's do. A stream that fails midway sends tsr_oai_error_json() as a frame before [DONE]. */
json_t *tsr_oai_stream_open(const tsr_oai_result *r);
json_t *tsr_oai_stream_usage(const tsr_oai_result *r);

#endif
