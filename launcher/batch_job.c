/* OpenAI requests over the service for batch and the intake (see batch_job.h): the event queue, the callbacks
 * that fill it, and the job's bookkeeping on the owner thread. */
#include "launcher/batch_job.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct tsr_job_event {
    tsr_job_event *next;
    tsr_job *job;
    int choice;
    tsr_gen_event ev; /* text/error/result point into this node */
    tsr_step_result res;
    char buf[]; /* text, NUL, error, NUL */
};

typedef struct tsr_job_choice {
    tsr_job *job;
    int c;
    int lost;             /* an event copy could not be allocated (loop thread writes, owner reads later) */
    tsr_job_event *spare; /* reserved for the final event */
} tsr_job_choice;

/* ---- the queue ---- */

tsr_status tsr_job_queue_init(tsr_job_queue *q)
{
    memset(q, 0, sizeof *q);
    q->pipe_rd = q->pipe_wr = -1;
    if (pthread_mutex_init(&q->mu, NULL)) return tsr_fail(TSR_ERR_NOMEM, "cannot create a mutex");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&q->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc) {
        pthread_mutex_destroy(&q->mu);
        return tsr_fail(TSR_ERR_NOMEM, "cannot create a condition variable");
    }
    return TSR_OK;
}

void tsr_job_queue_destroy(tsr_job_queue *q)
{
    tsr_job_event *e = q->head;
    while (e) {
        tsr_job_event *n = e->next;
        free(e);
        e = n;
    }
    if (q->pipe_rd >= 0) close(q->pipe_rd);
    if (q->pipe_wr >= 0) close(q->pipe_wr);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

int tsr_job_queue_fd(tsr_job_queue *q)
{
    pthread_mutex_lock(&q->mu);
    if (q->pipe_rd < 0) {
        int fds[2];
        if (pipe2(fds, O_NONBLOCK | O_CLOEXEC)) {
            tsr_fail(TSR_ERR_IO, "cannot create a pipe: %s", strerror(errno));
        } else {
            q->pipe_rd = fds[0];
            q->pipe_wr = fds[1];
            if (q->head) { /* events already waiting */
                ssize_t k = write(q->pipe_wr, "x", 1);
                q->signalled = k == 1;
            }
        }
    }
    int fd = q->pipe_rd;
    pthread_mutex_unlock(&q->mu);
    return fd;
}

static void signal_locked(tsr_job_queue *q)
{
    if (q->pipe_wr >= 0 && !q->signalled) {
        ssize_t k = write(q->pipe_wr, "x", 1);
        q->signalled = k == 1;
    }
    pthread_cond_signal(&q->cv);
}

static void push(tsr_job_queue *q, tsr_job_event *e)
{
    e->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = e;
    else
        q->head = e;
    q->tail = e;
    signal_locked(q);
    pthread_mutex_unlock(&q->mu);
}

void tsr_job_queue_kick(tsr_job_queue *q)
{
    pthread_mutex_lock(&q->mu);
    signal_locked(q);
    pthread_mutex_unlock(&q->mu);
}

void tsr_job_queue_wait(tsr_job_queue *q, double timeout_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double t = (double)ts.tv_nsec * 1e-9 + timeout_s;
    ts.tv_sec += (time_t)t;
    ts.tv_nsec = (long)((t - (double)(time_t)t) * 1e9);
    pthread_mutex_lock(&q->mu);
    if (!q->head) pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    pthread_mutex_unlock(&q->mu);
}

tsr_job_event *tsr_job_queue_drain(tsr_job_queue *q)
{
    pthread_mutex_lock(&q->mu);
    tsr_job_event *e = q->head;
    q->head = q->tail = NULL;
    if (q->signalled) {
        char b[64];
        while (read(q->pipe_rd, b, sizeof b) > 0) {
        }
        q->signalled = 0;
    }
    pthread_mutex_unlock(&q->mu);
    return e;
}

tsr_job_event *tsr_job_event_next(const tsr_job_event *e)
{
    return e->next;
}
tsr_job *tsr_job_event_job(const tsr_job_event *e)
{
    return e->job;
}
void tsr_job_event_free(tsr_job_event *e)
{
    free(e);
}

/* ---- the service callback (loop thread) ---- */

static void on_event(const tsr_gen_event *ev, void *user)
{
    tsr_job_choice *ch = user;
    const char *err = ev->finish == TSR_FINISH_ERROR && ev->error ? ev->error : NULL;
    size_t tlen = ev->text ? ev->text_len : 0, elen = err ? strlen(err) : 0;
    tsr_job_event *e = malloc(sizeof *e + tlen + elen + 2);
    if (!e) {
        ch->lost = 1;
        if (ev->finish == TSR_FINISH_NONE) return; /* the final event will say the text is incomplete */
        e = ch->spare;
        ch->spare = NULL;
        if (!e) return; /* cannot happen: the spare is reserved before submission */
        tlen = elen = 0;
        err = NULL;
    }
    e->job = ch->job;
    e->choice = ch->c;
    e->ev = *ev;
    if (tlen) memcpy(e->buf, ev->text, tlen);
    e->buf[tlen] = '\0';
    e->ev.text = e->buf;
    e->ev.text_len = tlen;
    if (err) memcpy(e->buf + tlen + 1, err, elen);
    e->buf[tlen + 1 + elen] = '\0';
    e->ev.error = err ? e->buf + tlen + 1 : NULL;
    if (ev->result) {
        e->res = *ev->result;
        e->ev.result = &e->res;
    }
    push(ch->job->q, e);
}

/* ---- jobs (owner thread) ---- */

tsr_status tsr_job_new(tsr_service *svc, tsr_job_queue *q, const tsr_oai_model *m, tsr_oai_kind kind,
                       const json_t *body, int no_stream, tsr_job **out)
{
    *out = NULL;
    tsr_job *j = calloc(1, sizeof *j);
    if (!j) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    j->svc = svc;
    j->q = q;
    tsr_oai_make_id(kind, j->id, sizeof j->id);
    tsr_status st = tsr_oai_parse(kind, body, m, &j->rq, &j->err);
    if (st == TSR_ERR_NOMEM) {
        tsr_job_free(j);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory parsing a request");
    }
    if (st != TSR_OK) {
        j->failed = j->stopped = 1;
        *out = j;
        return TSR_OK;
    }
    if (no_stream) j->rq->stream = j->rq->include_usage = 0;
    j->n_choices = j->rq->n_choices;
    j->ids = calloc((size_t)j->n_choices, sizeof *j->ids);
    j->final = calloc((size_t)j->n_choices, 1);
    j->choices = calloc((size_t)j->n_choices, sizeof *j->choices);
    if (!j->ids || !j->final || !j->choices ||
        tsr_oai_result_new(j->rq, m, j->id, (int64_t)time(NULL), &j->res) != TSR_OK) {
        tsr_job_free(j);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    for (int c = 0; c < j->n_choices; c++)
        j->choices[c] = (tsr_job_choice){.job = j, .c = c};
    *out = j;
    return TSR_OK;
}

static void fail_job(tsr_job *j, tsr_status st)
{
    tsr_oai_error_from_status(&j->err, st, tsr_last_error());
    j->failed = 1;
    tsr_job_cancel(j);
}

int tsr_job_pump(tsr_job *j, int budget, int *busy)
{
    int submitted = 0;
    *busy = 0;
    while (!j->stopped && j->n_submitted < j->n_choices && submitted < budget) {
        tsr_job_choice *ch = &j->choices[j->n_submitted];
        if (!ch->spare && !(ch->spare = malloc(sizeof(tsr_job_event) + 2))) {
            fail_job(j, tsr_fail(TSR_ERR_NOMEM, "out of memory"));
            break;
        }
        tsr_gen_request g;
        tsr_oai_gen_request(j->rq, ch->c, &g);
        tsr_status st = tsr_service_submit(j->svc, &g, on_event, ch, &j->ids[ch->c]);
        if (st == TSR_ERR_BUSY) {
            *busy = 1;
            break;
        }
        if (st != TSR_OK) {
            fail_job(j, st);
            break;
        }
        j->n_submitted++;
        submitted++;
    }
    if (j->n_submitted == j->n_choices) j->stopped = 1;
    return submitted;
}

tsr_status tsr_job_apply(tsr_job_event *e, json_t **chunk)
{
    if (chunk) *chunk = NULL;
    tsr_job *j = e->job;
    tsr_job_choice *ch = &j->choices[e->choice];
    if (e->ev.finish != TSR_FINISH_NONE) {
        if (j->final[e->choice]) return tsr_fail(TSR_ERR_INTERNAL, "a second final event for one choice");
        j->final[e->choice] = 1;
        j->n_final++;
        if (ch->lost && e->ev.finish != TSR_FINISH_ERROR) {
            e->ev.finish = TSR_FINISH_ERROR;
            e->ev.error = "out of memory: part of the generated text was lost";
        }
    }
    if (e->ev.token >= 0) j->tokens_out++;
    return tsr_oai_result_add(j->res, e->choice, &e->ev, j->rq->stream ? chunk : NULL);
}

void tsr_job_cancel(tsr_job *j)
{
    j->stopped = 1;
    for (int c = 0; c < j->n_submitted; c++)
        if (!j->final[c]) tsr_service_cancel(j->svc, j->ids[c]);
}

int tsr_job_finished(const tsr_job *j)
{
    return j->stopped && j->n_final == j->n_submitted;
}

int tsr_job_running(const tsr_job *j)
{
    return j->n_submitted - j->n_final;
}

json_t *tsr_job_response(const tsr_job *j, int *status_code)
{
    if (j->failed) {
        *status_code = j->err.status;
        return tsr_oai_error_json(&j->err);
    }
    const char *err = tsr_oai_result_error(j->res);
    if (err) {
        tsr_oai_error e;
        tsr_oai_error_set(&e, 500, NULL, NULL, "the request failed while running: %s", err);
        *status_code = 500;
        return tsr_oai_error_json(&e);
    }
    *status_code = 200;
    return tsr_oai_response(j->res);
}

void tsr_job_free(tsr_job *j)
{
    if (!j) return;
    if (j->choices)
        for (int c = 0; c < j->n_choices; c++)
            free(j->choices[c].spare);
    free(j->choices);
    free(j->ids);
    free(j->final);
    tsr_oai_result_free(j->res);
    tsr_oai_request_free(j->rq);
    free(j);
}
