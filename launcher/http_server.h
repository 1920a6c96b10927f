/* The HTTP gateway of `tessera serve`: an OpenAI-compatible API over libmicrohttpd.
 *
 * The gateway starts listening before the model is loaded (GET /health answers 503 "loading" meanwhile) and is
 * handed the model and the service with tsr_http_set_ready(). Endpoints: GET /health, GET /metrics (Prometheus
 * text), GET /v1/models, GET /v1/models/{name}, POST /v1/completions, POST /v1/chat/completions (stream: true
 * gives server-sent events). docs/api.md describes every field.
 *
 * Threads: libmicrohttpd's internal thread pool in epoll mode; a connection waiting for tokens is suspended (it
 * costs no thread) and resumed by the service callback. A ticker thread notices clients that hang up while
 * their request waits or generates, and cancels it in the service at once.
 *
 * Ownership: the gateway borrows the model description and the service; the model must outlive tsr_http_stop(),
 * the service may be stopped once tsr_http_drain() has returned (and must be, before tsr_http_stop(), so that no
 * service callback can still arrive). Errors: tsr_http_start fails with TSR_ERR_IO when the address cannot be
 * bound (the message names it) and TSR_ERR_ARG when the host cannot be resolved or an API key is empty or too
 * long. Nothing a client sends can crash or stall the gateway: every bad request gets an OpenAI-style error, and
 * every resource a client can hold is bounded (connections in all and per address, header and body bytes, the
 * time to send headers, idle time, the events a stream queues for a client that does not read: docs/api.md,
 * "Limits and security"). */
#ifndef TSR_LAUNCHER_HTTP_SERVER_H
#define TSR_LAUNCHER_HTTP_SERVER_H

#include "launcher/openai.h"
#include "runtime/service.h"
#include "runtime/status.h"

#include <stddef.h>

typedef struct tsr_http_opts {
    const char *host;            /* address to bind (default "127.0.0.1"); a name or an IPv4/IPv6 literal */
    int port;                    /* 0: any free port (tsr_http_port() tells which) */
    const char *const *api_keys; /* accepted "Authorization: Bearer" keys for /v1/...; none: no check */
    int n_api_keys;              /* each key 1..256 bytes */
    size_t max_body;             /* request bodies above this get 413 (default 8 MiB) */
    size_t max_header;           /* memory of one connection for its request line and headers: larger requests
                                    get 431 (default 64 KiB; at least 16 KiB) */
    unsigned conn_limit;         /* simultaneous connections (default: the descriptor limit less a reserve, see
                                    tsr_http_conn_limit) */
    unsigned per_ip_limit;       /* simultaneous connections from one address (default 0: no limit) */
    unsigned conn_timeout_s;     /* seconds without a byte moving before a connection is closed (default 60;
                                    one waiting for tokens is not idle) */
    unsigned header_timeout_s;   /* seconds a connection may take to send a request's headers, from its opening
                                    or the end of its previous request (default 30, at most conn_timeout_s) */
    size_t stream_backlog;       /* bytes of events a stream may queue for a client that does not read before
                                    its request is cancelled and the connection closed (default 1 MiB) */
    unsigned threads;            /* HTTP threads (default 2) */
    int allow_any_host;          /* on a loopback address, also answer requests whose Host or Origin header names
                                    another host (default 0: 403, against DNS rebinding) */
} tsr_http_opts;

typedef struct tsr_http tsr_http;

tsr_status tsr_http_start(const tsr_http_opts *opts, tsr_http **out);

/* Lifts the soft limit on open files to the hard one (call once at start); returns the limit now in force. */
long tsr_http_raise_fd_limit(void);
/* The connection limit to use: `asked` (0: the default) within the descriptor limit less a reserve for model
 * files and pipes, capped at 65536 by default; prints a line when it has to lower `asked`. */
unsigned tsr_http_conn_limit(unsigned asked);
/* The port actually bound. */
int tsr_http_port(const tsr_http *h);

/* Makes the API available: /health turns 200, /v1/... accept requests. */
void tsr_http_set_ready(tsr_http *h, const tsr_oai_model *model, tsr_service *svc);

/* Graceful shutdown, first half: stops accepting connections, answers 503 to new requests on kept-alive ones,
 * and stops calling into the service except to cancel requests that have not had their final event; requests in
 * flight continue. The caller may then tsr_service_stop() (whose final events complete the requests). */
void tsr_http_drain(tsr_http *h);
/* Waits until every in-flight HTTP request has been answered and its connection closed, or `timeout_s` passed.
 * Returns the number of requests still open. */
int tsr_http_wait_idle(tsr_http *h, double timeout_s);
/* Stops the server and frees it (NULL is ignored). */
void tsr_http_stop(tsr_http *h);

#endif
