/* Internals shared by the gateway's files (http_server.c, http_routes.c, http_job.c, http_stream.c); nothing
 * outside launcher/http_*.c includes this.
 *
 * Lifetimes: a connection context (http_conn) lives from the first call of the access handler to
 * MHD_OPTION_NOTIFY_COMPLETED. A generation request is an http_job, reference counted because three parties
 * hold it: the connection (until it completes), the streaming response (until libmicrohttpd frees it) and the
 * service (one reference per choice until its final event). The service callback only queues a copy of each
 * event and resumes the suspended connection; the HTTP threads turn events into JSON. Lock order: job->mu, then
 * the service's own lock (tsr_service_cancel) or h->mu; never the other way. */
#ifndef TSR_LAUNCHER_HTTP_INTERNAL_H
#define TSR_LAUNCHER_HTTP_INTERNAL_H

#include "launcher/http_metrics.h"
#include "launcher/http_server.h"

#include <microhttpd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdint.h>

typedef struct http_job http_job;
typedef struct http_key http_key;   /* http_auth.c */
typedef struct http_sock http_sock; /* http_conns.c */

#define HTTP_KEY_MAX 256             /* the longest API key */

struct tsr_http {
    struct MHD_Daemon *daemon;
    tsr_http_opts opts;
    http_key *keys;              /* copies of opts.api_keys (http_auth.c) */
    int n_keys;
    int loopback_only;           /* bound to a loopback address without allow_any_host: check Host and Origin */
    int port;

    pthread_rwlock_t svc_lock;   /* read: submit / stats; write: state changes below */
    const tsr_oai_model *model;
    tsr_service *svc;
    int ready;
    _Atomic int draining;        /* written under svc_lock; read without it where only a header depends on it */
    _Atomic int stopping;        /* tsr_http_stop has begun: nothing suspends any more */

    pthread_mutex_t mu;          /* the job list */
    pthread_cond_t idle;
    http_job *jobs;              /* open generation requests */
    int n_jobs;                  /* jobs not yet released by their connection */

    pthread_mutex_t socks_mu;    /* the open TCP connections (http_conns.c) */
    http_sock *socks;
    unsigned n_socks;
    double t_sweep;              /* the ticker's last sweep (0 before the first) */

    pthread_t ticker;
    int ticker_started, ticker_stop;
    pthread_mutex_t ticker_mu;
    pthread_cond_t ticker_cond;

    tsr_http_metrics metrics;

    pthread_mutex_t log_mu;      /* libmicrohttpd's messages: at most a burst per second */
    double log_t0;
    int log_n;
    unsigned long log_dropped;
};

/* One event of the service, copied on the loop thread. */
typedef struct http_event {
    int choice;
    tsr_gen_event ev;            /* text/error/result point into the copies below */
    tsr_step_result result;
    char *text;
    char *error;
    struct http_event *next;
} http_event;

typedef struct http_slot {
    http_job *job;
    int choice;
    uint64_t id;
    int submitted, final;
    double t_last;               /* time of its last token (inter-token latency) */
} http_slot;

struct http_job {
    tsr_http *h;
    tsr_service *svc;
    pthread_mutex_t mu;
    int refs;
    tsr_oai_request *rq;
    tsr_oai_result *res;
    http_slot *slots;
    int n_final;
    int n_aborted;               /* choices that ended cancelled or past a deadline */
    int failed;                  /* submitting failed: the error reply was sent */
    http_event *ev_head, *ev_tail;
    struct MHD_Connection *conn;
    int fd;                      /* the client's socket, peeked by the ticker while suspended */
    int suspended, conn_gone, cancelled;
    size_t backlog;              /* bytes of events queued and not yet taken by the connection's thread */
    int overflow;                /* a stream whose client stopped reading: cancelled, its socket to be shut */
    int shut;                    /* the ticker has shut its socket down */
    double t_start;
    /* owned by the thread serving the connection (no lock): res above, and the SSE bytes not yet handed to
     * libmicrohttpd */
    char *out;
    size_t out_len, out_off, out_cap;
    int stream_done;             /* [DONE] is in the buffer */
    http_job *prev, *next;       /* h->jobs */
};

typedef struct http_conn {
    tsr_http_route route;
    char *body;
    size_t len, cap;
    int too_large, answered;
    size_t discarded;            /* body bytes past max_body thrown away */
    http_job *job;
} http_conn;

/* --- http_auth.c --- */
/* Copies the accepted keys (each 1..HTTP_KEY_MAX bytes; TSR_ERR_ARG otherwise). */
tsr_status tsr_http_keys_init(tsr_http *h, const char *const *keys, int n);
/* Wipes and frees them. */
void tsr_http_keys_free(tsr_http *h);
/* 1 when no keys are set or the request carries an accepted one; 0 with e set to the 401 otherwise. */
int tsr_http_authorized(tsr_http *h, struct MHD_Connection *c, tsr_oai_error *e);
/* 1 unless the gateway is loopback-only and the Host or Origin header names another host (e set to the 403). */
int tsr_http_host_allowed(tsr_http *h, struct MHD_Connection *c, tsr_oai_error *e);
/* 1 for 127.0.0.0/8, ::1 and ::ffff:127.x.x.x. */
int tsr_http_addr_is_loopback(const struct sockaddr *sa);

/* --- http_conns.c --- */
/* MHD_OPTION_NOTIFY_CONNECTION: registers and unregisters connections. */
void tsr_http_on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                            enum MHD_ConnectionNotificationCode code);
/* A request's headers are complete (busy 1) or its answer is done (busy 0: the header clock restarts). */
void tsr_http_conn_busy(tsr_http *h, struct MHD_Connection *c, int busy);
/* A request body begins (state 1), brings `bytes` more (0) or is complete (-1). */
void tsr_http_conn_body(tsr_http *h, struct MHD_Connection *c, int state, size_t bytes);
/* Shuts down the connections that have waited longer than the header timeout for a request, whose body
 * arrives too slowly, or whose client has not taken a byte of its answer for the connection timeout (ticker). */
void tsr_http_conns_sweep(tsr_http *h);
/* Open TCP connections. */
unsigned tsr_http_conns_open(tsr_http *h);

/* --- http_server.c --- */
/* The connection this thread is about to end on purpose: libmicrohttpd's message about it is not printed. */
void tsr_http_quiet_close(void);

/* --- http_routes.c --- */
/* Queues a JSON response (takes the reference of body); counts it in the metrics. */
enum MHD_Result tsr_http_reply_json(tsr_http *h, struct MHD_Connection *c, tsr_http_route route, unsigned status,
                                    json_t *body);
enum MHD_Result tsr_http_reply_error(tsr_http *h, struct MHD_Connection *c, tsr_http_route route,
                                     const tsr_oai_error *e);
enum MHD_Result tsr_http_route_health(tsr_http *h, struct MHD_Connection *c);
enum MHD_Result tsr_http_route_metrics(tsr_http *h, struct MHD_Connection *c);
enum MHD_Result tsr_http_route_models(tsr_http *h, struct MHD_Connection *c, const char *url);
/* POST /v1/completions and /v1/chat/completions once the body is complete (first call) or when resumed. */
enum MHD_Result tsr_http_route_generate(tsr_http *h, struct MHD_Connection *c, http_conn *cc);

/* --- http_job.c --- */
/* Parses nothing: takes a parsed request, submits its choices (on failure cancels those submitted and fills
 * err). The new job holds one reference for the connection. */
tsr_status tsr_http_job_start(tsr_http *h, tsr_oai_request *rq, struct MHD_Connection *c, http_job **out,
                              tsr_oai_error *err);
/* Detaches the queued events (job->mu held). */
http_event *tsr_http_job_take(http_job *j);
/* Moves detached events into the result and frees them; with stream, appends their SSE frames, and once every
 * choice is final the error frame (if any), the usage chunk and [DONE]. Called WITHOUT job->mu, only from the
 * thread serving the connection (the owner of res and the output buffer). */
tsr_status tsr_http_job_process(http_job *j, http_event *list);
/* Cancels the choices without a final event (job->mu held). */
void tsr_http_job_cancel(http_job *j);
/* Drops one reference (job->mu NOT held); frees at zero. */
void tsr_http_job_release(http_job *j);
/* The connection is done (completed or aborted): cancel what is left when aborted, drop its reference. */
void tsr_http_job_conn_done(http_job *j, int aborted);

/* --- http_stream.c --- */
/* Queues the SSE response of a streaming job (text/event-stream, chunked). */
enum MHD_Result tsr_http_stream_reply(tsr_http *h, struct MHD_Connection *c, http_job *j);
/* Appends one `data: <json>\n\n` frame (connection thread); takes the reference of obj. */
tsr_status tsr_http_stream_frame(http_job *j, json_t *obj);
tsr_status tsr_http_stream_raw(http_job *j, const char *s, size_t len);

#endif
