/* The nanomsg intake (see intake_nn.h and docs/intake.md): one thread polling the intake's PULL socket, the job
 * queue's pipe and the send descriptors of clients with unsent replies.
 *
 * Sections: replies (per-client outboxes sent without blocking), clients (table, vanishing, forgetting idle
 * ones), requests (submit, cancel, the final message), the thread's loop, and start/stop. Incoming messages are
 * decoded by launcher/intake_msg.c (no sockets there, so it is fuzzed on its own). A client that vanished
 * is taken out of the table at once (a new message from the same client_id starts afresh) and kept as a zombie
 * until the final events of its cancelled requests have come back from the service. */
#include "launcher/intake_nn.h"

#include "launcher/batch_job.h"
#include "launcher/intake_msg.h"

#include <errno.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_OUTBOX_BYTES (64u << 20)

typedef struct outmsg {
    struct outmsg *next;
    double t; /* when it was queued */
    size_t len;
    char data[];
} outmsg;

typedef struct ireq ireq;

typedef struct client {
    char *id;
    char *reply_to;
    int sock; /* NN_PUSH connected to reply_to */
    double last_seen;
    outmsg *out_head, *out_tail;
    size_t out_bytes;
    ireq *reqs; /* live requests */
    int n_reqs;
    int gone;            /* vanished or said bye: nothing more is sent */
    struct client *next; /* table or zombie list */
} client;

struct ireq {
    tsr_job *job;
    char *request_id;
    client *cl;
    ireq *next;
    int shutdown; /* cancelled because the intake stops */
};

struct tsr_intake {
    tsr_service *svc;
    const tsr_oai_model *model;
    tsr_intake_opts o;
    int sock;
    tsr_job_queue q;
    int qfd;
    pthread_t thread;
    atomic_int stop;
    client *clients, *zombies;
    int n_clients;
    double last_bad_log;
    pthread_mutex_t stats_mu;
    tsr_intake_stats stats;
};

static double now_s(void)
{
    return tsr_service_now();
}

static void count(tsr_intake *in, uint64_t *field, uint64_t k)
{
    pthread_mutex_lock(&in->stats_mu);
    *field += k;
    pthread_mutex_unlock(&in->stats_mu);
}

static void log_bad(tsr_intake *in, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Malformed messages are counted always and logged at most once a second. */
static void log_bad(tsr_intake *in, const char *fmt, ...)
{
    count(in, &in->stats.bad_messages, 1);
    double t = now_s();
    if (t - in->last_bad_log < 1.0) return;
    in->last_bad_log = t;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tessera intake: dropped a message: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- replies ---- */

static void vanish(tsr_intake *in, client *cl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void outbox_clear(client *cl)
{
    outmsg *m = cl->out_head;
    while (m) {
        outmsg *n = m->next;
        free(m);
        m = n;
    }
    cl->out_head = cl->out_tail = NULL;
    cl->out_bytes = 0;
}

static void flush(tsr_intake *in, client *cl)
{
    while (!cl->gone && cl->out_head) {
        outmsg *m = cl->out_head;
        if (nn_send(cl->sock, m->data, m->len, NN_DONTWAIT) < 0) {
            int err = nn_errno();
            if (err == EAGAIN || err == EINTR) return;
            vanish(in, cl, "sending to %s failed: %s", cl->reply_to, nn_strerror(err));
            return;
        }
        cl->out_head = m->next;
        if (!cl->out_head) cl->out_tail = NULL;
        cl->out_bytes -= m->len;
        free(m);
    }
}

/* Queues msg (stolen) for cl and tries to send it. */
static void send_msg(tsr_intake *in, client *cl, json_t *msg)
{
    if (!msg) return;
    if (cl->gone) {
        json_decref(msg);
        return;
    }
    if (cl->id) json_object_set_new(msg, "client_id", json_string(cl->id));
    char *text = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    size_t len = text ? strlen(text) : 0;
    outmsg *m = text ? malloc(sizeof *m + len) : NULL;
    if (!m) {
        free(text);
        vanish(in, cl, "out of memory queueing a reply");
        return;
    }
    memcpy(m->data, text, len);
    free(text);
    m->len = len;
    m->t = now_s();
    m->next = NULL;
    if (cl->out_tail)
        cl->out_tail->next = m;
    else
        cl->out_head = m;
    cl->out_tail = m;
    cl->out_bytes += len;
    if (cl->out_bytes > MAX_OUTBOX_BYTES) {
        vanish(in, cl, "more than %u bytes of replies are waiting", MAX_OUTBOX_BYTES);
        return;
    }
    flush(in, cl);
}

static json_t *reply(const char *type, const char *request_id)
{
    return json_pack("{s:s, s:o}", "type", type, "request_id", request_id ? json_string(request_id) : json_null());
}

static void send_error(tsr_intake *in, client *cl, const char *request_id, const tsr_oai_error *e)
{
    json_t *m = reply("error", request_id);
    json_t *wrapped = tsr_oai_error_json(e);
    if (m && wrapped) {
        json_object_set_new(m, "status_code", json_integer(e->status));
        json_object_set(m, "error", json_object_get(wrapped, "error"));
    }
    json_decref(wrapped);
    send_msg(in, cl, m);
}

static void send_errorf(tsr_intake *in, client *cl, const char *request_id, int status, const char *code,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void send_errorf(tsr_intake *in, client *cl, const char *request_id, int status, const char *code,
                        const char *fmt, ...)
{
    tsr_oai_error e;
    tsr_oai_error_set(&e, status, NULL, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    send_error(in, cl, request_id, &e);
}

/* ---- clients ---- */

static void client_free(client *cl)
{
    if (!cl) return;
    if (cl->sock >= 0) nn_close(cl->sock);
    outbox_clear(cl);
    free(cl->id);
    free(cl->reply_to);
    free(cl);
}

static client *find_client(tsr_intake *in, const char *id)
{
    for (client *c = in->clients; c; c = c->next)
        if (!strcmp(c->id, id)) return c;
    return NULL;
}

static void unlink_client(tsr_intake *in, client *cl)
{
    for (client **p = &in->clients; *p; p = &(*p)->next)
        if (*p == cl) {
            *p = cl->next;
            in->n_clients--;
            break;
        }
    cl->next = NULL;
}

/* The client is gone (vanished or said bye): cancel its requests, send it nothing more. */
static void drop_client(tsr_intake *in, client *cl)
{
    cl->gone = 1;
    outbox_clear(cl);
    unlink_client(in, cl);
    for (ireq *r = cl->reqs; r; r = r->next)
        tsr_job_cancel(r->job);
    if (cl->n_reqs) { /* freed when the last final event is back */
        cl->next = in->zombies;
        in->zombies = cl;
    } else {
        client_free(cl);
    }
}

static void vanish(tsr_intake *in, client *cl, const char *fmt, ...)
{
    if (cl->gone) return;
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tessera intake: client %s vanished (%s): cancelling %d request%s\n", cl->id, why, cl->n_reqs,
            cl->n_reqs == 1 ? "" : "s");
    pthread_mutex_lock(&in->stats_mu);
    in->stats.clients_vanished++;
    in->stats.requests_cancelled_vanished += (uint64_t)cl->n_reqs;
    pthread_mutex_unlock(&in->stats_mu);
    drop_client(in, cl);
}

/* The client named by a message, created or re-pointed when it gives a reply address. NULL (message dropped)
 * when it cannot be reached. */
static client *client_for(tsr_intake *in, const tsr_intake_msg *msg)
{
    const char *id = msg->client_id, *reply_to = msg->reply_to;
    client *cl = find_client(in, id);
    if (!reply_to || (cl && !strcmp(cl->reply_to, reply_to))) return cl;
    if (!msg->reply_to_ok) {
        log_bad(in, "client %.64s: reply_to must be an ipc://, tcp:// or inproc:// address", id);
        return NULL;
    }
    if (!cl && in->n_clients >= in->o.max_clients) {
        log_bad(in, "client %.64s: too many clients (%d)", id, in->o.max_clients);
        return NULL;
    }
    int sock = nn_socket(AF_SP, NN_PUSH);
    if (sock < 0 || nn_connect(sock, reply_to) < 0) {
        log_bad(in, "client %.64s: cannot connect to %.256s: %s", id, reply_to, nn_strerror(nn_errno()));
        if (sock >= 0) nn_close(sock);
        return NULL;
    }
    char *addr = strdup(reply_to);
    if (!addr) {
        nn_close(sock);
        return NULL;
    }
    if (cl) { /* the client moved its reply socket: replies go to the new one */
        nn_close(cl->sock);
        free(cl->reply_to);
        cl->sock = sock;
        cl->reply_to = addr;
        return cl;
    }
    cl = calloc(1, sizeof *cl);
    if (!cl || !(cl->id = strdup(id))) {
        free(cl);
        free(addr);
        nn_close(sock);
        return NULL;
    }
    cl->sock = sock;
    cl->reply_to = addr;
    cl->last_seen = now_s();
    cl->next = in->clients;
    in->clients = cl;
    in->n_clients++;
    if (in->o.verbose) fprintf(stderr, "tessera intake: client %s at %s\n", cl->id, cl->reply_to);
    return cl;
}

/* ---- requests ---- */

static ireq *find_req(client *cl, const char *request_id)
{
    for (ireq *r = cl->reqs; r; r = r->next)
        if (!strcmp(r->request_id, request_id)) return r;
    return NULL;
}

/* The request's last message ("done" or "error"), then it is forgotten. */
static void finish_req(tsr_intake *in, ireq *r)
{
    client *cl = r->cl;
    tsr_job *j = r->job;
    int ok = 0;
    if (!cl->gone) {
        if (j->failed) {
            send_error(in, cl, r->request_id, &j->err);
        } else if (r->shutdown) {
            send_errorf(in, cl, r->request_id, 503, "shutdown", "the server is shutting down");
        } else if (j->rq->stream && tsr_oai_result_error(j->res)) {
            send_errorf(in, cl, r->request_id, 500, NULL, "the request failed while running: %s",
                        tsr_oai_result_error(j->res));
        } else if (j->rq->stream) {
            if (j->rq->include_usage) {
                json_t *u = tsr_oai_stream_usage(j->res);
                json_t *m = reply("chunk", r->request_id);
                if (m && u) json_object_set_new(m, "chunk", u), u = NULL;
                json_decref(u);
                send_msg(in, cl, m);
            }
            json_t *m = reply("done", r->request_id);
            if (m) json_object_set_new(m, "status_code", json_integer(200));
            send_msg(in, cl, m);
            ok = 1;
        } else {
            int status = 0;
            json_t *body = tsr_job_response(j, &status);
            json_t *m = reply(status == 200 ? "done" : "error", r->request_id);
            if (m && body) {
                json_object_set_new(m, "status_code", json_integer(status));
                if (status == 200)
                    json_object_set(m, "body", body);
                else
                    json_object_set(m, "error", json_object_get(body, "error"));
            }
            json_decref(body);
            send_msg(in, cl, m);
            ok = status == 200;
        }
    }
    count(in, ok ? &in->stats.requests_done : &in->stats.requests_failed, 1);
    for (ireq **p = &cl->reqs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    cl->n_reqs--;
    tsr_job_free(j);
    free(r->request_id);
    free(r);
    if (cl->gone && cl->n_reqs == 0) {
        for (client **p = &in->zombies; *p; p = &(*p)->next)
            if (*p == cl) {
                *p = cl->next;
                break;
            }
        client_free(cl);
    }
}

static void handle_submit(tsr_intake *in, client *cl, const tsr_intake_msg *msg)
{
    const char *request_id = msg->request_id;
    if (!msg->request_id_ok) {
        send_errorf(in, cl, NULL, 400, "invalid_request_id", "'request_id' must be a string of 1 to %d bytes",
                    TSR_INTAKE_MAX_ID);
        return;
    }
    if (find_req(cl, request_id)) {
        send_errorf(in, cl, request_id, 400, "duplicate_request_id",
                    "request_id '%s' is already in use by a running request of this client", request_id);
        return;
    }
    if (cl->n_reqs >= in->o.max_requests) {
        send_errorf(in, cl, request_id, 429, "rate_limit_exceeded", "this client already has %d requests running",
                    cl->n_reqs);
        return;
    }
    if (!msg->url_ok) {
        send_errorf(in, cl, request_id, 404, "unknown_url", "'url' must be /v1/completions or /v1/chat/completions");
        return;
    }
    if (!msg->body) {
        send_errorf(in, cl, request_id, 400, "invalid_body", "'body' must be a JSON object (the request body)");
        return;
    }
    ireq *r = calloc(1, sizeof *r);
    if (!r || !(r->request_id = strdup(request_id)) ||
        tsr_job_new(in->svc, &in->q, in->model, msg->kind, msg->body, 0, &r->job) != TSR_OK) {
        if (r) free(r->request_id);
        free(r);
        send_errorf(in, cl, request_id, 500, NULL, "out of memory");
        return;
    }
    r->cl = cl;
    r->job->user = r;
    r->next = cl->reqs;
    cl->reqs = r;
    cl->n_reqs++;
    count(in, &in->stats.requests, 1);
    tsr_job *j = r->job;
    if (!j->failed) {
        int busy = 0;
        tsr_job_pump(j, j->n_choices, &busy);
        if (busy && !j->failed) {
            tsr_oai_error_from_status(&j->err, TSR_ERR_BUSY, "the request queue is full");
            j->failed = 1;
            tsr_job_cancel(j);
        }
    }
    if (!j->failed) {
        json_t *a = reply("accepted", request_id);
        if (a) json_object_set_new(a, "id", json_string(j->id));
        send_msg(in, cl, a);
        if (j->rq->stream) {
            json_t *open = tsr_oai_stream_open(j->res);
            size_t i;
            json_t *chunk;
            json_array_foreach(open, i, chunk)
            {
                json_t *c = reply("chunk", request_id);
                if (c) json_object_set(c, "chunk", chunk);
                send_msg(in, cl, c);
            }
            json_decref(open);
        }
    }
    if (tsr_job_finished(j)) finish_req(in, r);
}

static void handle_message(tsr_intake *in, const char *data, size_t len)
{
    count(in, &in->stats.messages, 1);
    tsr_intake_msg msg;
    if (tsr_intake_msg_decode(data, len, &msg) != TSR_OK) {
        log_bad(in, "%s", msg.why);
        tsr_intake_msg_clear(&msg);
        return;
    }
    const char *id = msg.client_id, *type = msg.type_name;
    client *cl = client_for(in, &msg);
    if (!cl) {
        if (!msg.reply_to) log_bad(in, "client %.64s is unknown and gave no reply_to", id);
        tsr_intake_msg_clear(&msg);
        return;
    }
    cl->last_seen = now_s();
    switch (msg.type) {
    case TSR_INTAKE_MSG_NONE:
        send_errorf(in, cl, NULL, 400, "invalid_message", "'type' must be submit, cancel, ping or bye");
        break;
    case TSR_INTAKE_MSG_SUBMIT:
        handle_submit(in, cl, &msg);
        break;
    case TSR_INTAKE_MSG_PING: {
        json_t *p = json_pack("{s:s, s:i}", "type", "pong", "requests", cl->n_reqs);
        send_msg(in, cl, p);
        break;
    }
    case TSR_INTAKE_MSG_CANCEL: {
        const char *rid = msg.request_id;
        ireq *r = rid ? find_req(cl, rid) : NULL;
        if (r)
            tsr_job_cancel(r->job); /* its "done" (finish_reason "abort") or "error" follows */
        else
            send_errorf(in, cl, rid, 404, "request_not_found", "no running request '%.256s' for this client",
                        rid ? rid : "(none)");
        break;
    }
    case TSR_INTAKE_MSG_BYE:
        if (in->o.verbose) fprintf(stderr, "tessera intake: client %s said bye\n", cl->id);
        drop_client(in, cl);
        break;
    case TSR_INTAKE_MSG_OTHER:
        send_errorf(in, cl, NULL, 400, "invalid_message", "unknown message type '%.64s'", type);
        break;
    }
    tsr_intake_msg_clear(&msg);
}

/* ---- the loop ---- */

static void apply_events(tsr_intake *in)
{
    tsr_job_event *e = tsr_job_queue_drain(&in->q);
    while (e) {
        tsr_job_event *next = tsr_job_event_next(e);
        tsr_job *j = tsr_job_event_job(e);
        ireq *r = j->user;
        json_t *chunk = NULL;
        if (tsr_job_apply(e, &chunk) != TSR_OK)
            fprintf(stderr, "tessera intake: request %s: %s\n", r->request_id, tsr_last_error());
        tsr_job_event_free(e);
        if (chunk && !r->cl->gone && !r->shutdown) {
            json_t *c = reply("chunk", r->request_id);
            if (c) json_object_set_new(c, "chunk", chunk), chunk = NULL;
            send_msg(in, r->cl, c);
        }
        json_decref(chunk);
        if (tsr_job_finished(j)) finish_req(in, r);
        e = next;
    }
}

static void receive_all(tsr_intake *in)
{
    for (int k = 0; k < 1024; k++) { /* bounded, so replies and events get their turn */
        void *buf = NULL;
        int n = nn_recv(in->sock, &buf, NN_MSG, NN_DONTWAIT);
        if (n < 0) {
            int err = nn_errno();
            if (err != EAGAIN && err != EINTR && err != ETERM)
                fprintf(stderr, "tessera intake: receiving: %s\n", nn_strerror(err));
            return;
        }
        handle_message(in, buf, (size_t)n);
        nn_freemsg(buf);
    }
}

/* A client that fell silent may still be listening (a stalled process, a slow link): each of its requests gets
 * an "error" (code "client_timeout") if it can be sent right away, so it is not left waiting for nothing. */
static void tell_timeout(client *cl)
{
    for (ireq *r = cl->reqs; r; r = r->next) {
        json_t *m = reply("error", r->request_id);
        tsr_oai_error e;
        tsr_oai_error_set(&e, 408, NULL, "client_timeout",
                          "no message from this client for too long (ping at least every few seconds): the request "
                          "was cancelled");
        json_t *w = tsr_oai_error_json(&e);
        char *text = NULL;
        if (m && w) {
            json_object_set_new(m, "client_id", json_string(cl->id));
            json_object_set_new(m, "status_code", json_integer(e.status));
            json_object_set(m, "error", json_object_get(w, "error"));
            text = json_dumps(m, JSON_COMPACT);
        }
        if (text) nn_send(cl->sock, text, strlen(text), NN_DONTWAIT);
        free(text);
        json_decref(w);
        json_decref(m);
    }
}

/* Vanished (silent with requests, or replies stuck) and idle clients. */
static void check_clients(tsr_intake *in)
{
    double t = now_s();
    client *next;
    for (client *cl = in->clients; cl; cl = next) {
        next = cl->next;
        if (cl->out_head && t - cl->out_head->t > in->o.send_timeout_s)
            vanish(in, cl, "replies undeliverable for %.1f s", t - cl->out_head->t);
        else if (cl->n_reqs && t - cl->last_seen > in->o.client_timeout_s) {
            tell_timeout(cl);
            vanish(in, cl, "no message for %.1f s", t - cl->last_seen);
        } else if (!cl->n_reqs && !cl->out_head && t - cl->last_seen > in->o.client_timeout_s) {
            if (in->o.verbose) fprintf(stderr, "tessera intake: forgetting idle client %s\n", cl->id);
            unlink_client(in, cl);
            client_free(cl);
        }
    }
}

/* Polls the intake socket, the event pipe and the send descriptors of clients waiting to send. */
static void wait_io(tsr_intake *in, int with_intake, int timeout_ms)
{
    struct pollfd fds[64];
    int n = 0;
    size_t sz = sizeof(int);
    int fd;
    if (with_intake && nn_getsockopt(in->sock, NN_SOL_SOCKET, NN_RCVFD, &fd, &sz) == 0)
        fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
    if (in->qfd >= 0) fds[n++] = (struct pollfd){.fd = in->qfd, .events = POLLIN};
    int waiting = 0;
    for (client *cl = in->clients; cl; cl = cl->next) {
        if (!cl->out_head) continue;
        waiting = 1;
        sz = sizeof(int);
        if (n < 64 && nn_getsockopt(cl->sock, NN_SOL_SOCKET, NN_SNDFD, &fd, &sz) == 0)
            fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
    }
    if (waiting && timeout_ms > 50) timeout_ms = 50;
    if (in->qfd < 0 && timeout_ms > 20) timeout_ms = 20; /* no pipe: poll the queue */
    poll(fds, (nfds_t)n, timeout_ms);
}

static void flush_all(tsr_intake *in)
{
    client *next;
    for (client *cl = in->clients; cl; cl = next) {
        next = cl->next;
        flush(in, cl);
    }
}

static int live_requests(tsr_intake *in)
{
    int n = 0;
    for (client *cl = in->clients; cl; cl = cl->next)
        n += cl->n_reqs;
    for (client *cl = in->zombies; cl; cl = cl->next)
        n += cl->n_reqs;
    return n;
}

static void shut_down(tsr_intake *in)
{
    client *lists[2] = {in->clients, in->zombies};
    for (int l = 0; l < 2; l++)
        for (client *cl = lists[l]; cl; cl = cl->next)
            for (ireq *r = cl->reqs; r; r = r->next) {
                r->shutdown = 1;
                tsr_job_cancel(r->job);
            }
    /* requests that had submitted nothing are finished already */
    for (int l = 0; l < 2; l++) {
        client *cl = l ? in->zombies : in->clients, *cnext;
        for (; cl; cl = cnext) {
            cnext = cl->next;
            ireq *rnext;
            for (ireq *r = cl->reqs; r; r = rnext) {
                rnext = r->next;
                if (tsr_job_finished(r->job)) finish_req(in, r);
            }
        }
    }
    while (live_requests(in)) { /* every cancelled choice still sends its final event */
        wait_io(in, 0, 100);
        apply_events(in);
    }
    double t0 = now_s(); /* let the last replies go out: nanomsg does not linger on close */
    for (;;) {
        flush_all(in);
        int waiting = 0;
        for (client *cl = in->clients; cl; cl = cl->next)
            waiting |= cl->out_head != NULL;
        if (!waiting || now_s() - t0 > 0.5) break;
        wait_io(in, 0, 20);
    }
    if (in->clients) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    while (in->clients) {
        client *cl = in->clients;
        in->clients = cl->next;
        client_free(cl);
    }
}

static void *intake_main(void *arg)
{
    tsr_intake *in = arg;
    while (!atomic_load(&in->stop)) {
        wait_io(in, 1, 500);
        receive_all(in);
        apply_events(in);
        flush_all(in);
        check_clients(in);
        pthread_mutex_lock(&in->stats_mu);
        in->stats.clients = in->n_clients;
        in->stats.live_requests = live_requests(in);
        pthread_mutex_unlock(&in->stats_mu);
    }
    shut_down(in);
    return NULL;
}

/* ---- start and stop ---- */

tsr_status tsr_intake_start(tsr_service *svc, const tsr_oai_model *model, const char *addr, const tsr_intake_opts *opts,
                            tsr_intake **out)
{
    *out = NULL;
    if (!addr || !tsr_intake_addr_valid(addr))
        return tsr_fail(TSR_ERR_ARG, "intake address '%s' must start with ipc:// or tcp://", addr ? addr : "");
    tsr_intake *in = calloc(1, sizeof *in);
    if (!in) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    in->svc = svc;
    in->model = model;
    if (opts) in->o = *opts;
    if (in->o.client_timeout_s <= 0) in->o.client_timeout_s = 15;
    if (in->o.send_timeout_s <= 0) in->o.send_timeout_s = 5;
    if (in->o.max_clients <= 0) in->o.max_clients = 1024;
    if (in->o.max_requests <= 0) in->o.max_requests = 256;
    if (in->o.max_message <= 0) in->o.max_message = 16 << 20;
    in->sock = -1;
    in->qfd = -1;
    tsr_status st = tsr_job_queue_init(&in->q);
    if (st != TSR_OK) {
        free(in);
        return st;
    }
    pthread_mutex_init(&in->stats_mu, NULL);
    in->qfd = tsr_job_queue_fd(&in->q); /* -1: the loop polls the queue every 20 ms instead */
    in->sock = nn_socket(AF_SP, NN_PULL);
    if (in->sock < 0) {
        st = tsr_fail(TSR_ERR_IO, "cannot create the intake socket: %s", nn_strerror(nn_errno()));
        goto fail;
    }
    int maxsize = in->o.max_message;
    nn_setsockopt(in->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsize, sizeof maxsize);
    if (nn_bind(in->sock, addr) < 0) {
        st = tsr_fail(TSR_ERR_IO, "cannot listen on %s: %s", addr, nn_strerror(nn_errno()));
        goto fail;
    }
    if (pthread_create(&in->thread, NULL, intake_main, in)) {
        st = tsr_fail(TSR_ERR_NOMEM, "cannot start the intake thread");
        goto fail;
    }
    *out = in;
    return TSR_OK;
fail:
    if (in->sock >= 0) nn_close(in->sock);
    tsr_job_queue_destroy(&in->q);
    pthread_mutex_destroy(&in->stats_mu);
    free(in);
    return st;
}

void tsr_intake_stop(tsr_intake *in)
{
    if (!in) return;
    atomic_store(&in->stop, 1);
    tsr_job_queue_kick(&in->q);
    pthread_join(in->thread, NULL);
    nn_close(in->sock);
    tsr_job_queue_destroy(&in->q);
    pthread_mutex_destroy(&in->stats_mu);
    free(in);
}

void tsr_intake_get_stats(tsr_intake *in, tsr_intake_stats *out)
{
    pthread_mutex_lock(&in->stats_mu);
    *out = in->stats;
    pthread_mutex_unlock(&in->stats_mu);
}
