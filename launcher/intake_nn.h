/* The nanomsg intake: external gateways and tools submit OpenAI requests to the coordinator over nanomsg and get
 * streamed tokens back (docs/intake.md is the protocol; `tessera submit` is the reference client).
 *
 * Sockets: the intake binds one NN_PULL socket at the given address (ipc:// or tcp://) and every client PUSHes its
 * JSON messages there ({"type": "submit" | "cancel" | "ping" | "bye", ...}). Each client binds its own NN_PULL
 * socket and names it in its messages ("reply_to"); the intake connects one NN_PUSH socket per client to it and
 * sends that client's replies ("accepted", "chunk", "done", "error", "pong"). Request and response bodies, stream
 * chunks and errors are exactly those of the HTTP API (launcher/openai.h).
 *
 * Acknowledgements and vanished clients: a submit is answered by "accepted" (or "error"), and every accepted
 * request ends with exactly one "done" or "error". Replies are sent without blocking; a reply that cannot be
 * delivered for send_timeout_s (the client's socket is gone) or a client with requests that has sent nothing
 * (not even a ping) for client_timeout_s is taken as vanished: its requests are cancelled in the service at once
 * and its pages freed.
 *
 * Threads: one intake thread owns both sockets, every client and every request; it talks to the service through
 * tsr_service_submit/cancel and the service's callbacks only copy events into its queue (launcher/batch_job.h).
 * Start and stop are called from one controlling thread. Stop the intake before stopping the service.
 *
 * Ownership: the service and the model description are borrowed and must outlive the intake.
 * Errors: tsr_intake_start() fails with TSR_ERR_ARG (an address that is not ipc:// or tcp://), TSR_ERR_IO (the
 * socket cannot be created or bound; the message has nanomsg's reason), TSR_ERR_NOMEM. Nothing a client sends
 * can stop the intake: malformed messages are answered with an "error" where a reply address is known and
 * dropped otherwise. */
#ifndef TSR_LAUNCHER_INTAKE_NN_H
#define TSR_LAUNCHER_INTAKE_NN_H

#include "launcher/openai.h"

#include <stdint.h>

typedef struct tsr_intake_opts {
    double client_timeout_s; /* silence after which a client with requests is gone (default 15) */
    double send_timeout_s;   /* a reply undeliverable this long makes its client gone (default 5) */
    int max_clients;         /* clients known at once (default 1024) */
    int max_requests;        /* live requests per client (default 256) */
    int max_message;         /* bytes in one incoming message (default 16 MiB) */
    int verbose;             /* 1: log clients coming and going on stderr (vanished clients are always logged) */
} tsr_intake_opts;

typedef struct tsr_intake_stats {
    uint64_t messages, bad_messages;
    uint64_t requests, requests_done, requests_failed;
    uint64_t clients_vanished, requests_cancelled_vanished;
    int clients, live_requests;
} tsr_intake_stats;

typedef struct tsr_intake tsr_intake;

/* Binds addr and starts the intake thread. opts may be NULL (defaults). */
tsr_status tsr_intake_start(tsr_service *svc, const tsr_oai_model *model, const char *addr, const tsr_intake_opts *opts,
                            tsr_intake **out);

/* Stops taking messages, cancels every live request (each client gets an "error" with code "shutdown", best
 * effort), waits for their final events, closes the sockets and frees the intake. NULL accepted. */
void tsr_intake_stop(tsr_intake *in);

/* A snapshot of the counters (thread-safe). */
void tsr_intake_get_stats(tsr_intake *in, tsr_intake_stats *out);

#endif
