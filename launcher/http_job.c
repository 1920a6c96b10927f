/* One generation request of the gateway (an http_job): its choices submitted to the service, the service's
 * events queued as copies, and its release when the connection, the response and every choice are done.
 *
 * The service callback runs on the service's loop thread and must be quick, so it only copies the event, records
 * latency metrics and resumes the suspended connection; turning events into JSON happens on the HTTP thread that
 * serves the connection, which takes the queued events under the job's lock and processes them outside it (only
 * that thread touches the result and the output buffer), so a callback never waits behind JSON work. A final
 * event can never be lost: each choice has its own preallocated slot for it, so running out of memory drops at
 * worst some text, never the end of a request.
 *
 * A stream's queue is bounded: a client that stops reading leaves its events queued (libmicrohttpd asks for
 * more bytes only when the socket takes them), and once they pass the stream backlog (--stream-backlog) the
 * request is cancelled (its KV pages freed), further events are dropped, and the ticker closes the connection. */
#include "launcher/http_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static http_event *final_of(http_job *j, int c);

static void event_free(http_job *j, http_event *e)
{
    free(e->text);
    free(e->error);
    e->text = e->error = NULL;
    if (e != final_of(j, e->choice)) free(e);
}

/* Each choice's preallocated final event; they live right after the slots, in the same allocation. */
static http_event *final_of(http_job *j, int c)
{
    return (http_event *)(void *)(j->slots + j->rq->n_choices) + c;
}

static void job_free(http_job *j)
{
    for (http_event *e = j->ev_head, *next; e; e = next) {
        next = e->next;
        event_free(j, e);
    }
    tsr_oai_result_free(j->res);
    tsr_oai_request_free(j->rq);
    free(j->slots);
    free(j->out);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void tsr_http_job_release(http_job *j)
{
    pthread_mutex_lock(&j->mu);
    int last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    tsr_http *h = j->h;
    pthread_mutex_lock(&h->mu);
    if (j->prev) j->prev->next = j->next;
    else h->jobs = j->next;
    if (j->next) j->next->prev = j->prev;
    h->n_jobs--;
    pthread_cond_broadcast(&h->idle);
    pthread_mutex_unlock(&h->mu);
    job_free(j);
}

static char *copy_bytes(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        if (n) memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* The service callback (loop thread). */
static void on_event(const tsr_gen_event *ev, void *user)
{
    http_slot *s = user;
    http_job *j = s->job;
    tsr_http *h = j->h;
    int final = ev->finish != TSR_FINISH_NONE;
    double now = tsr_service_now();
    if (ev->token >= 0) {
        if (s->t_last == 0)
            tsr_http_metrics_ttft(&h->metrics, (ev->t_first_token > 0 ? ev->t_first_token : now) - ev->t_submit);
        else
            tsr_http_metrics_itl(&h->metrics, now - s->t_last);
        s->t_last = now;
    }
    pthread_mutex_lock(&j->mu);
    /* a stream whose client does not read: past its backlog, cancel the request (the ticker closes the
     * connection) and queue nothing but final events from then on */
    size_t cost = sizeof(http_event) + ev->text_len + (ev->error ? strlen(ev->error) : 0);
    if (!final && !j->overflow && j->rq->stream && j->backlog + cost > h->opts.stream_backlog) {
        j->overflow = 1;
        tsr_http_metrics_stream_overflow(&h->metrics);
        if (!j->cancelled) tsr_http_job_cancel(j);
    }
    int keep = final || !j->overflow;
    if (keep) j->backlog += cost;
    pthread_mutex_unlock(&j->mu);
    http_event *e = !keep ? NULL : final ? final_of(j, s->choice) : calloc(1, sizeof *e);
    if (e) {
        e->choice = s->choice;
        e->ev = *ev;
        e->next = NULL;
        e->text = copy_bytes(ev->text, ev->text_len);
        e->ev.text = e->text ? e->text : "";
        e->ev.text_len = e->text ? ev->text_len : 0;
        if (ev->result) {
            e->result = *ev->result;
            e->ev.result = &e->result;
        }
        e->error = ev->error ? copy_bytes(ev->error, strlen(ev->error)) : NULL;
        e->ev.error = e->error;
    }
    pthread_mutex_lock(&j->mu);
    if (e) {
        if (j->ev_tail) j->ev_tail->next = e;
        else j->ev_head = e;
        j->ev_tail = e;
    }
    if (final) {
        s->final = 1;
        j->n_final++;
        if (ev->finish == TSR_FINISH_CANCELLED) j->n_aborted++; /* a deadline is an ordinary end: "abort" */
        if (j->n_final == j->rq->n_choices) tsr_http_metrics_e2e(&h->metrics, now - j->t_start);
    }
    if (j->suspended && !j->conn_gone) {
        j->suspended = 0;
        MHD_resume_connection(j->conn);
    }
    pthread_mutex_unlock(&j->mu);
    if (final) tsr_http_job_release(j);
}

void tsr_http_job_cancel(http_job *j)
{
    for (int c = 0; c < j->rq->n_choices; c++)
        if (j->slots[c].submitted && !j->slots[c].final) tsr_service_cancel(j->svc, j->slots[c].id);
    j->cancelled = 1;
}

void tsr_http_job_conn_done(http_job *j, int aborted)
{
    pthread_mutex_lock(&j->mu);
    j->conn_gone = 1;
    if (aborted && j->n_final < j->rq->n_choices && !j->cancelled) {
        tsr_http_metrics_disconnect(&j->h->metrics);
        tsr_http_job_cancel(j);
    }
    pthread_mutex_unlock(&j->mu);
    tsr_http_job_release(j);
}

http_event *tsr_http_job_take(http_job *j)
{
    http_event *list = j->ev_head;
    j->ev_head = j->ev_tail = NULL;
    j->backlog = 0;
    return list;
}

tsr_status tsr_http_job_process(http_job *j, http_event *list)
{
    const tsr_oai_request *rq = j->rq;
    tsr_status st = TSR_OK;
    while (list) {
        http_event *e = list;
        list = e->next;
        json_t *chunk = NULL;
        if (st == TSR_OK) st = tsr_oai_result_add(j->res, e->choice, &e->ev, rq->stream ? &chunk : NULL);
        if (st == TSR_OK && chunk) st = tsr_http_stream_frame(j, chunk);
        event_free(j, e); /* every event, also after a failure */
    }
    TSR_TRY(st);
    if (rq->stream && !j->stream_done && tsr_oai_result_done(j->res)) {
        const char *err = tsr_oai_result_error(j->res);
        if (err) {
            tsr_oai_error e;
            tsr_oai_error_set(&e, 500, NULL, NULL, "generation failed: %s", err);
            TSR_TRY(tsr_http_stream_frame(j, tsr_oai_error_json(&e)));
        }
        json_t *usage = tsr_oai_stream_usage(j->res);
        if (usage) TSR_TRY(tsr_http_stream_frame(j, usage));
        TSR_TRY(tsr_http_stream_raw(j, "data: [DONE]\n\n", 14));
        j->stream_done = 1;
    }
    return TSR_OK;
}

tsr_status tsr_http_job_start(tsr_http *h, tsr_oai_request *rq, struct MHD_Connection *c, http_job **out,
                              tsr_oai_error *err)
{
    *out = NULL;
    http_job *j = calloc(1, sizeof *j);
    char id[64];
    tsr_oai_make_id(rq->kind, id, sizeof id);
    if (j) j->slots = calloc((size_t)rq->n_choices, sizeof(http_slot) + sizeof(http_event));
    if (!j || !j->slots || tsr_oai_result_new(rq, h->model, id, (int64_t)time(NULL), &j->res) != TSR_OK) {
        if (j) free(j->slots);
        free(j);
        tsr_oai_request_free(rq);
        tsr_oai_error_set(err, 500, NULL, NULL, "out of memory");
        return TSR_ERR_NOMEM;
    }
    pthread_mutex_init(&j->mu, NULL);
    j->h = h;
    j->rq = rq;
    j->refs = 1;
    j->conn = c;
    j->fd = -1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) j->fd = ci->connect_fd;
    j->t_start = tsr_service_now();
    for (int i = 0; i < rq->n_choices; i++) j->slots[i] = (http_slot){.job = j, .choice = i};

    pthread_mutex_lock(&h->mu);
    j->next = h->jobs;
    if (h->jobs) h->jobs->prev = j;
    h->jobs = j;
    h->n_jobs++;
    pthread_mutex_unlock(&h->mu);
    *out = j;

    tsr_status st = TSR_OK;
    pthread_mutex_lock(&j->mu); /* callbacks wait until every choice is submitted */
    pthread_rwlock_rdlock(&h->svc_lock);
    j->svc = h->svc;
    if (h->draining || !h->ready) {
        tsr_oai_error_set(err, 503, NULL, "service_unavailable",
                          h->draining ? "the server is shutting down" : "the model is loading");
        st = TSR_ERR_BUSY;
    }
    for (int i = 0; i < rq->n_choices && st == TSR_OK; i++) {
        tsr_gen_request g;
        tsr_oai_gen_request(rq, i, &g);
        j->refs++;
        st = tsr_service_submit(h->svc, &g, on_event, &j->slots[i], &j->slots[i].id);
        if (st != TSR_OK) {
            j->refs--;
            tsr_oai_error_from_status(err, st, tsr_last_error());
            tsr_http_job_cancel(j);
            break;
        }
        j->slots[i].submitted = 1;
    }
    pthread_rwlock_unlock(&h->svc_lock);
    if (st != TSR_OK) {
        /* choices never submitted count as final, so the job completes with the submitted ones */
        for (int i = 0; i < rq->n_choices; i++)
            if (!j->slots[i].submitted) {
                j->slots[i].final = 1;
                j->n_final++;
            }
        j->failed = 1;
    }
    pthread_mutex_unlock(&j->mu);
    return st;
}
