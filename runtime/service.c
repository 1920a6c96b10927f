/* The coordinator's service loop (see service.h).
 *
 * Threads: front doors call submit/cancel/stats from any thread; they only touch the inbox, the counters and the
 * condition variables, under one mutex. The loop thread owns everything else: the scheduler, the table of live
 * requests, each request's detokenizer and stop-string matcher. One iteration moves the inbox into the scheduler,
 * plans a step, runs it on the executor (outside the lock), commits the results and turns the scheduler's events into
 * callbacks. With an executor that pipelines steps (depth > 1: layer stages on several ranks), an iteration plans and
 * submits steps until `depth` are in flight (each with its own sequences), then collects and commits the oldest, so
 * that the next step of those sequences is planned while the others still run. Text is released through the stop
 * matcher, so a stop string is never streamed; when one matches, the sequence is finished in the scheduler, whose
 * final event then reaches the callback like any other.
 *
 * Failure handling: an executor error fails the step's sequences; if it also marks the executor broken (a dead
 * rank), every live request is failed, new submits are refused with TSR_ERR_REMOTE, and /health can say so.
 * Nothing between a request's acceptance and its final event needs memory the request did not reserve: a cancel
 * marks the request on the list of outstanding requests, and events are handled where the scheduler keeps
 * them (a stop-string match is passed back to the scheduler once the batch of events is handled). Text that
 * cannot be made (the detokenizer or stop matcher out of memory) ends the request with an error rather than
 * streaming text with a hole in it.
 *
 * Test hook: TSR_TEST_STEP_SLEEP_MS=n makes the loop sleep n ms after each committed step, so that tests which act
 * on a request while it runs (a client killed mid-stream) do not depend on how fast the machine decodes. */
#include "runtime/service.h"

#include "runtime/text/stop_match.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A planned step between its submit and its commit. */
typedef struct flight {
    tsr_step step;
    tsr_step_result *results;
    int cap_results;
    int submitted;     /* on the executor: collect() it (depth > 1) */
    tsr_status status; /* depth 1: run()'s outcome; else a submit failure */
    char why[512];     /* the failure's message */
} flight;

typedef struct request {
    uint64_t id;              /* the service's id, returned by submit */
    uint64_t sched_id;        /* the scheduler's, once admitted */
    int32_t *prompt;
    int n_prompt;
    tsr_seq_params params;    /* stop_ids and bias point into the copies below */
    int32_t *stop_ids;
    tsr_logit_bias *bias;
    tsr_stop_matcher *stops;
    tsr_detokenizer *detok;
    tsr_gen_callback cb;
    void *user;
    int stop_matched;         /* a stop string ended it; later text is dropped */
    int text_failed;          /* the text could not be made (out of memory): the request ends with an error */
    tsr_finish_reason end_unsent; /* loop thread: an ending (stop string, failed text) the scheduler is not told
                                     of yet */
    int cancel_asked;         /* under mu: tsr_service_cancel() asked for it */
    int cancel_sent;          /* loop thread: the scheduler was told */
    double t_submit, t_first;
    char *error;
    struct request *next;     /* inbox link */
    struct request *out_prev, *out_next; /* the list of outstanding requests (under mu) */
} request;

struct tsr_service {
    tsr_executor *x;
    const tsr_tokenizer *tok;
    tsr_service_opts opts;
    tsr_sched *sched;
    pthread_t thread;
    int thread_started;

    pthread_mutex_t mu;
    pthread_cond_t wake, idle;
    request *inbox_head, *inbox_tail;
    request *out_head;        /* every outstanding request: submitted, final event not yet delivered */
    int cancels_pending;      /* some outstanding request has cancel_asked without cancel_sent */
    uint64_t next_id;
    long outstanding;         /* submitted, final event not yet delivered */
    int stopping;
    double stop_deadline;
    int broken;
    tsr_service_stats stats;

    /* loop thread only */
    request **live;           /* open-addressing table keyed by sched_id */
    size_t live_cap, live_n;
    flight fl[TSR_EXECUTOR_MAX_DEPTH]; /* steps planned and not yet committed, oldest at fl_head (a ring) */
    int fl_head, n_fl, depth;
    double usage_at;                   /* when the ranks' usage was last asked (service clock; < 0: never) */
    long step_sleep_ms;                /* TSR_TEST_STEP_SLEEP_MS */
};

double tsr_service_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void request_free(request *r)
{
    if (!r) return;
    free(r->prompt);
    free(r->stop_ids);
    free(r->bias);
    tsr_stop_matcher_free(r->stops);
    tsr_detokenizer_free(r->detok);
    free(r->error);
    free(r);
}

/* ---- live table (loop thread) ---- */

static size_t slot_of(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static int live_put(tsr_service *s, request *r)
{
    if ((s->live_n + 1) * 2 > s->live_cap) {
        size_t cap = s->live_cap ? s->live_cap * 2 : 256;
        request **t = calloc(cap, sizeof *t);
        if (!t) return 0;
        for (size_t i = 0; i < s->live_cap; i++)
            if (s->live[i]) {
                size_t j = slot_of(s->live[i]->sched_id, cap);
                while (t[j]) j = (j + 1) & (cap - 1);
                t[j] = s->live[i];
            }
        free(s->live);
        s->live = t;
        s->live_cap = cap;
    }
    size_t j = slot_of(r->sched_id, s->live_cap);
    while (s->live[j]) j = (j + 1) & (s->live_cap - 1);
    s->live[j] = r;
    s->live_n++;
    return 1;
}

static request *live_get(tsr_service *s, uint64_t sched_id)
{
    if (!s->live_cap) return NULL;
    for (size_t j = slot_of(sched_id, s->live_cap);; j = (j + 1) & (s->live_cap - 1)) {
        if (!s->live[j]) return NULL;
        if (s->live[j]->sched_id == sched_id) return s->live[j];
    }
}

static void live_del(tsr_service *s, uint64_t sched_id)
{
    size_t cap = s->live_cap, j = slot_of(sched_id, cap);
    while (s->live[j] && s->live[j]->sched_id != sched_id) j = (j + 1) & (cap - 1);
    if (!s->live[j]) return;
    s->live[j] = NULL;
    s->live_n--;
    /* re-seat the rest of the cluster (backward-shift deletion by reinsertion) */
    for (size_t k = (j + 1) & (cap - 1); s->live[k]; k = (k + 1) & (cap - 1)) {
        request *r = s->live[k];
        s->live[k] = NULL;
        size_t m = slot_of(r->sched_id, cap);
        while (s->live[m]) m = (m + 1) & (cap - 1);
        s->live[m] = r;
    }
}

/* ---- events to callbacks (loop thread) ---- */

static void emit(request *r, const char *text, size_t len, int32_t token, const tsr_step_result *res,
                 tsr_finish_reason finish, int n_generated, int n_cached)
{
    tsr_gen_event ev = {r->id, text ? text : "", text ? len : 0, token, res, finish,
                        finish == TSR_FINISH_ERROR ? (r->error ? r->error : "request failed") : NULL,
                        r->n_prompt, n_generated, n_cached, r->t_submit, r->t_first};
    r->cb(&ev, r->user);
}

static void set_error(request *r, const char *msg)
{
    if (r->error) return;
    r->error = strdup(msg && *msg ? msg : "request failed");
}

/* Delivers a request's final event and forgets it. */
static void finish_request(tsr_service *s, request *r, tsr_finish_reason reason, int n_generated, int n_cached)
{
    const char *tail = NULL;
    size_t tail_len = 0;
    if (r->text_failed) reason = TSR_FINISH_ERROR;
    if (r->detok && !r->stop_matched && reason != TSR_FINISH_ERROR && reason != TSR_FINISH_CANCELLED) {
        /* what the detokenizer and the stop matcher still hold belongs to the text */
        char *piece = NULL;
        size_t plen = 0;
        tsr_status st = tsr_detokenizer_flush(r->detok, &piece, &plen);
        if (st == TSR_OK && plen) {
            const char *out;
            size_t out_len = 0;
            int matched = 0;
            st = tsr_stop_push(r->stops, piece, plen, &out, &out_len, &matched);
            if (st == TSR_OK && out_len) emit(r, out, out_len, -1, NULL, TSR_FINISH_NONE, n_generated, n_cached);
            if (st == TSR_OK) r->stop_matched = matched;
        }
        if (st == TSR_OK && !r->stop_matched) st = tsr_stop_flush(r->stops, &tail, &tail_len);
        if (st != TSR_OK) {
            set_error(r, tsr_last_error());
            reason = TSR_FINISH_ERROR;
            tail = NULL;
            tail_len = 0;
        }
    }
    if (r->stop_matched) reason = TSR_FINISH_STOP;
    emit(r, tail, tail_len, -1, NULL, reason, n_generated, n_cached);
    if (r->sched_id) live_del(s, r->sched_id);
    pthread_mutex_lock(&s->mu);
    s->stats.requests_finished++;
    if (reason == TSR_FINISH_ERROR) s->stats.requests_failed++;
    if (reason == TSR_FINISH_CANCELLED) s->stats.requests_cancelled++;
    s->stats.tokens_out += (uint64_t)n_generated;
    if (r->out_prev) r->out_prev->out_next = r->out_next;
    else s->out_head = r->out_next;
    if (r->out_next) r->out_next->out_prev = r->out_prev;
    s->outstanding--;
    if (s->outstanding == 0) pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    request_free(r);
}

static void handle_event(tsr_service *s, const tsr_sched_event *ev)
{
    request *r = live_get(s, ev->id);
    if (!r) return;
    const char *text = NULL;
    size_t len = 0;
    if (ev->token >= 0) {
        if (r->t_first == 0) r->t_first = tsr_service_now();
        int is_stop_token = ev->finish == TSR_FINISH_STOP;
        if (r->detok && !r->stop_matched && !r->text_failed && !is_stop_token) {
            char *piece = NULL;
            size_t plen = 0;
            int matched = 0;
            tsr_status st = tsr_detokenizer_push(r->detok, ev->token, &piece, &plen);
            if (st == TSR_OK && plen) st = tsr_stop_push(r->stops, piece, plen, &text, &len, &matched);
            if (st != TSR_OK) {
                set_error(r, tsr_last_error());
                r->text_failed = 1;
                text = NULL;
                len = 0;
                if (ev->finish == TSR_FINISH_NONE) r->end_unsent = TSR_FINISH_ERROR;
            } else if (matched) {
                r->stop_matched = 1;
                if (ev->finish == TSR_FINISH_NONE) r->end_unsent = TSR_FINISH_STOP;
            }
        }
        /* the token is reported on its own; a token that also ends the sequence is followed by the final event */
        emit(r, text, len, ev->token, ev->result, TSR_FINISH_NONE, ev->n_generated, ev->n_cached);
    }
    if (ev->finish != TSR_FINISH_NONE) {
        if (ev->finish == TSR_FINISH_ERROR) set_error(r, tsr_last_error());
        finish_request(s, r, ev->finish, ev->n_generated, ev->n_cached);
    }
}

/* Handles the scheduler's events in place (they stay valid until the next call into the scheduler, and handling
 * one makes none), then ends the sequences whose text matched a stop string or failed, which queues more
 * events. */
static void drain_events(tsr_service *s)
{
    const tsr_sched_event *evs;
    int n;
    while ((n = tsr_sched_drain_events(s->sched, &evs)) > 0) {
        int ends = 0;
        for (int i = 0; i < n; i++) {
            handle_event(s, &evs[i]);
            request *r = live_get(s, evs[i].id);
            ends += r && r->end_unsent != TSR_FINISH_NONE;
        }
        for (size_t j = 0; ends && j < s->live_cap; j++) {
            request *r = s->live[j];
            if (!r || r->end_unsent == TSR_FINISH_NONE) continue;
            tsr_finish_reason why = r->end_unsent;
            r->end_unsent = TSR_FINISH_NONE;
            ends--;
            tsr_sched_finish(s->sched, r->sched_id, why);
        }
    }
}

/* ---- the loop ---- */

/* Moves submissions and cancellations into the scheduler. Returns 1 when the loop should exit. */
static int take_inbox(tsr_service *s, double now, int *stop_now)
{
    pthread_mutex_lock(&s->mu);
    request *head = s->inbox_head;
    s->inbox_head = s->inbox_tail = NULL;
    int exiting = s->stopping && (s->outstanding == 0 || now >= s->stop_deadline);
    *stop_now = s->stopping && now >= s->stop_deadline;
    pthread_mutex_unlock(&s->mu);

    while (head) {
        request *r = head;
        head = r->next;
        r->next = NULL;
        tsr_status st = tsr_sched_submit(s->sched, r->prompt, r->n_prompt, &r->params, now, &r->sched_id);
        if (st == TSR_OK && !live_put(s, r)) {
            tsr_sched_cancel(s->sched, r->sched_id);
            st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
            r->sched_id = 0;
        }
        if (st != TSR_OK) {
            r->sched_id = 0;
            set_error(r, tsr_last_error());
            finish_request(s, r, TSR_FINISH_ERROR, 0, 0);
        }
    }
    /* cancels of admitted requests go to the scheduler; those of requests still in the inbox wait for them */
    pthread_mutex_lock(&s->mu);
    if (s->cancels_pending) {
        s->cancels_pending = 0;
        for (request *r = s->out_head; r; r = r->out_next) {
            if (!r->cancel_asked || r->cancel_sent) continue;
            if (!r->sched_id) {
                s->cancels_pending = 1;
                continue;
            }
            r->cancel_sent = 1;
            tsr_sched_cancel(s->sched, r->sched_id);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return exiting;
}

static void fail_all(tsr_service *s, tsr_finish_reason reason, const char *why)
{
    for (size_t j = 0; j < s->live_cap; j++)
        if (s->live[j]) {
            if (why) set_error(s->live[j], why);
            if (reason == TSR_FINISH_CANCELLED) tsr_sched_cancel(s->sched, s->live[j]->sched_id);
            else tsr_sched_finish(s->sched, s->live[j]->sched_id, reason);
        }
}

/* Waits on the wake-up condition (s->mu held) for at most ms milliseconds. */
static void wait_ms(tsr_service *s, long ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += ms * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->wake, &s->mu, &ts);
}

/* Plans the next step into a free flight slot and submits it (depth 1: runs it). Returns 1 when a step was
 * planned, 0 when there was nothing to run. */
static int plan_and_submit(tsr_service *s, double *sched_s, double *busy_s)
{
    flight *f = &s->fl[(s->fl_head + s->n_fl) % s->depth];
    double t0 = tsr_service_now();
    tsr_status st = tsr_sched_plan(s->sched, t0, &f->step);
    drain_events(s); /* deadlines and cancellations found while planning */
    double t1 = tsr_service_now();
    *sched_s += t1 - t0;
    if (st != TSR_OK || f->step.n_seqs == 0) return 0;
    if (f->step.n_seqs > f->cap_results) {
        tsr_step_result *r = realloc(f->results, (size_t)f->step.n_seqs * sizeof *r);
        if (r) {
            f->results = r;
            f->cap_results = f->step.n_seqs;
        }
    }
    f->submitted = 0;
    if (f->step.n_seqs > f->cap_results) st = tsr_fail(TSR_ERR_NOMEM, "out of memory for step results");
    else if (s->depth > 1) st = s->x->submit(s->x, &f->step, f->results, NULL);
    else st = s->x->run(s->x, &f->step, f->results, NULL);
    f->submitted = s->depth > 1 && st == TSR_OK;
    f->status = st;
    if (st != TSR_OK) strncpy(f->why, tsr_last_error(), sizeof f->why - 1);
    s->n_fl++;
    *busy_s += tsr_service_now() - t1;
    return 1;
}

/* Waits for the oldest step in flight and commits it (a failed step fails its sequences; a broken executor fails
 * every live request). */
static void collect_and_commit(tsr_service *s, double *sched_s, double *busy_s)
{
    flight *f = &s->fl[s->fl_head];
    double t1 = tsr_service_now();
    tsr_status st = f->status;
    if (f->submitted) {
        st = s->x->collect(s->x);
        if (st != TSR_OK) strncpy(f->why, tsr_last_error(), sizeof f->why - 1);
    }
    double t2 = tsr_service_now();
    *busy_s += t2 - t1;
    if (st != TSR_OK) {
        for (int i = 0; i < f->step.n_seqs; i++) {
            request *r = live_get(s, f->step.seqs[i].id);
            if (r) set_error(r, f->why);
        }
    }
    tsr_sched_commit(s->sched, &f->step, st == TSR_OK ? f->results : NULL, t2);
    s->fl_head = (s->fl_head + 1) % s->depth;
    s->n_fl--;
    if (st != TSR_OK && s->x->broken) {
        fail_all(s, TSR_FINISH_ERROR, f->why); /* sequences still in flight end at their commit */
        pthread_mutex_lock(&s->mu);
        s->broken = 1;
        pthread_mutex_unlock(&s->mu);
    }
    drain_events(s);
    *sched_s += tsr_service_now() - t2;
}

/* With no step in flight, the ranks' usage into the stats when it was last asked long enough ago. Over ranks a failure
 * means a dead worker: the executor is broken and the next step fails its requests, as any step of a dead rank
 * does. */
static void refresh_usage(tsr_service *s, double now)
{
    if (!s->x->usage || s->x->broken || (s->usage_at >= 0 && now - s->usage_at < TSR_SERVICE_USAGE_PERIOD)) return;
    s->usage_at = now;
    tsr_rank_usage u[TSR_SERVICE_MAX_WORKERS];
    int n = 0;
    if (s->x->usage(s->x, u, TSR_SERVICE_MAX_WORKERS, &n) != TSR_OK) return;
    pthread_mutex_lock(&s->mu);
    s->stats.n_ranks = n;
    memcpy(s->stats.ranks, u, (size_t)n * sizeof *u);
    pthread_mutex_unlock(&s->mu);
}

static void *loop_main(void *arg)
{
    tsr_service *s = arg;
    for (;;) {
        double now = tsr_service_now();
        int stop_now = 0;
        int exiting = take_inbox(s, now, &stop_now);
        if (stop_now) fail_all(s, TSR_FINISH_CANCELLED, NULL);
        drain_events(s);
        if (exiting && s->live_n == 0 && s->n_fl == 0) break;

        double sched_s = 0, busy_s = 0;
        while (s->n_fl < s->depth && plan_and_submit(s, &sched_s, &busy_s)) {
        }
        if (s->n_fl == 0) {
            refresh_usage(s, now);
            tsr_sched_stats sched_stats;
            tsr_sched_get_stats(s->sched, &sched_stats);
            pthread_mutex_lock(&s->mu);
            s->stats.sched = sched_stats;
            if (!s->inbox_head && !s->cancels_pending && !s->stopping) {
                if (tsr_sched_idle(s->sched)) {
                    pthread_cond_wait(&s->wake, &s->mu);
                } else {
                    /* queued work that cannot run yet (deadlines, a failing plan): look again shortly */
                    wait_ms(s, 10);
                }
            } else if (s->stopping && !s->inbox_head && !s->cancels_pending) {
                wait_ms(s, 5);
            }
            pthread_mutex_unlock(&s->mu);
            continue;
        }
        collect_and_commit(s, &sched_s, &busy_s);
        if (s->step_sleep_ms > 0) {
            const struct timespec nap = {s->step_sleep_ms / 1000, s->step_sleep_ms % 1000 * 1000000L};
            nanosleep(&nap, NULL);
        }
        tsr_sched_stats sched_stats;
        tsr_sched_get_stats(s->sched, &sched_stats);
        pthread_mutex_lock(&s->mu);
        s->stats.sched = sched_stats;
        s->stats.busy_s += busy_s;
        s->stats.sched_s += sched_s;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

tsr_status tsr_service_start(tsr_executor *x, const tsr_tokenizer *tok, const tsr_service_opts *opts,
                             tsr_service **out)
{
    tsr_service *s = calloc(1, sizeof *s);
    if (!s) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    s->x = x;
    s->usage_at = -1;
    s->tok = tok;
    const char *sleep_ms = getenv("TSR_TEST_STEP_SLEEP_MS");
    s->step_sleep_ms = sleep_ms ? strtol(sleep_ms, NULL, 10) : 0;
    s->opts = opts ? *opts : (tsr_service_opts){0};
    tsr_sched_opts *so = &s->opts.sched;
    if (so->page_size <= 0) so->page_size = x->page_size;
    if (so->n_pages <= 0) so->n_pages = x->n_pages;
    if (so->max_step_tokens <= 0 || so->max_step_tokens > x->max_step_tokens) so->max_step_tokens = x->max_step_tokens;
    if (so->max_context <= 0) so->max_context = x->max_context;
    so->vocab = x->vocab;
    if (so->max_running <= 0) so->max_running = TSR_SCHED_RUNNING_DEFAULT;
    if (so->max_waiting <= 0) so->max_waiting = TSR_SCHED_WAITING_DEFAULT;
    const int depth = x->depth > 1 && x->submit && x->collect ? x->depth : 1;
    if (depth > TSR_EXECUTOR_MAX_DEPTH || depth > TSR_SCHED_MAX_PLANS) {
        free(s);
        return tsr_fail(TSR_ERR_ARG, "service: the executor's depth %d is over %d", depth, TSR_EXECUTOR_MAX_DEPTH);
    }
    so->max_plans = depth;
    if (so->page_size != x->page_size || so->n_pages > x->n_pages) {
        tsr_status bad = tsr_fail(TSR_ERR_ARG, "service: the scheduler's pages (%d x %d tokens) do not match the "
                                  "executor's pool (%d x %d)", so->n_pages, so->page_size, x->n_pages, x->page_size);
        free(s);
        return bad;
    }
    s->next_id = 1;
    s->depth = depth;
    tsr_status st = tsr_sched_new(so, &s->sched);
    if (st != TSR_OK) {
        free(s);
        return st;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (pthread_create(&s->thread, NULL, loop_main, s) != 0) {
        tsr_sched_free(s->sched);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->wake);
        pthread_cond_destroy(&s->idle);
        free(s);
        return tsr_fail(TSR_ERR_NOMEM, "service: cannot start its thread");
    }
    s->thread_started = 1;
    *out = s;
    return TSR_OK;
}

static tsr_status check_request(const tsr_service *s, const tsr_gen_request *q, int *max_tokens)
{
    const int ctx = s->opts.sched.max_context;
    if (!q->prompt || q->n_prompt < 1) return tsr_fail(TSR_ERR_ARG, "the prompt is empty");
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= s->x->vocab)
            return tsr_fail(TSR_ERR_ARG, "prompt token %d is outside the vocabulary (%d)", q->prompt[i], s->x->vocab);
    if (q->n_prompt >= ctx)
        return tsr_fail(TSR_ERR_ARG, "the prompt has %d tokens; the model's context is %d", q->n_prompt, ctx);
    *max_tokens = q->params.max_tokens > 0 ? q->params.max_tokens : ctx - q->n_prompt;
    if ((long)q->n_prompt + *max_tokens > ctx)
        return tsr_fail(TSR_ERR_ARG,
                        "the prompt has %d tokens and max_tokens is %d: %ld in all, over the model's context of %d",
                        q->n_prompt, *max_tokens, (long)q->n_prompt + *max_tokens, ctx);
    if (q->params.n_logprobs < -1 || q->params.n_logprobs > TSR_MAX_LOGPROBS)
        return tsr_fail(TSR_ERR_ARG, "logprobs must be between 0 and %d", TSR_MAX_LOGPROBS);
    for (int i = 0; i < q->params.n_bias; i++)
        if (q->params.bias[i].token < 0 || q->params.bias[i].token >= s->x->vocab)
            return tsr_fail(TSR_ERR_ARG, "logit_bias names token %d, outside the vocabulary", q->params.bias[i].token);
    for (int i = 0; i < q->params.n_stop_ids; i++)
        if (q->params.stop_ids[i] < 0 || q->params.stop_ids[i] >= s->x->vocab)
            return tsr_fail(TSR_ERR_ARG, "stop token %d is outside the vocabulary", q->params.stop_ids[i]);
    return tsr_sampling_check(&q->params.sampling);
}

tsr_status tsr_service_submit(tsr_service *s, const tsr_gen_request *q, tsr_gen_callback cb, void *user,
                              uint64_t *id)
{
    int max_tokens = 0;
    TSR_TRY(check_request(s, q, &max_tokens));
    request *r = calloc(1, sizeof *r);
    if (!r) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    r->n_prompt = q->n_prompt;
    r->params = q->params;
    r->params.max_tokens = max_tokens;
    r->cb = cb;
    r->user = user;
    r->prompt = malloc((size_t)q->n_prompt * sizeof *r->prompt);
    r->stop_ids = malloc((size_t)(q->params.n_stop_ids + 1) * sizeof *r->stop_ids);
    r->bias = malloc((size_t)(q->params.n_bias + 1) * sizeof *r->bias);
    tsr_status st = TSR_OK;
    if (!r->prompt || !r->stop_ids || !r->bias) st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
    if (st == TSR_OK) {
        memcpy(r->prompt, q->prompt, (size_t)q->n_prompt * sizeof *r->prompt);
        if (q->params.n_stop_ids)
            memcpy(r->stop_ids, q->params.stop_ids, (size_t)q->params.n_stop_ids * sizeof *r->stop_ids);
        if (q->params.n_bias) memcpy(r->bias, q->params.bias, (size_t)q->params.n_bias * sizeof *r->bias);
        r->params.stop_ids = r->stop_ids;
        r->params.bias = r->bias;
        st = tsr_stop_matcher_new(q->stop, q->n_stop, &r->stops);
    }
    if (st == TSR_OK && !s->tok && q->n_stop > 0)
        st = tsr_fail(TSR_ERR_ARG, "stop strings need the model's tokenizer, and this service has none");
    if (st == TSR_OK && s->tok) st = tsr_detokenizer_new(s->tok, s->opts.skip_special >= 0, &r->detok);
    if (st != TSR_OK) {
        request_free(r);
        return st;
    }
    pthread_mutex_lock(&s->mu);
    if (s->broken) st = tsr_fail(TSR_ERR_REMOTE, "a worker rank failed; this server cannot run requests any more");
    else if (s->stopping) st = tsr_fail(TSR_ERR_BUSY, "the server is shutting down");
    else if (s->outstanding >= (long)s->opts.sched.max_waiting + s->opts.sched.max_running)
        st = tsr_fail(TSR_ERR_BUSY, "the queue is full (%ld requests waiting or running)", s->outstanding);
    if (st == TSR_OK) {
        r->id = s->next_id++;
        r->t_submit = tsr_service_now();
        *id = r->id;
        if (s->inbox_tail) s->inbox_tail->next = r;
        else s->inbox_head = r;
        s->inbox_tail = r;
        r->out_next = s->out_head;
        if (s->out_head) s->out_head->out_prev = r;
        s->out_head = r;
        s->outstanding++;
        s->stats.requests_total++;
        s->stats.tokens_in += (uint64_t)q->n_prompt;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    if (st != TSR_OK) request_free(r);
    return st;
}

void tsr_service_cancel(tsr_service *s, uint64_t id)
{
    pthread_mutex_lock(&s->mu);
    for (request *r = s->out_head; r; r = r->out_next)
        if (r->id == id) {
            if (!r->cancel_asked) {
                r->cancel_asked = 1;
                s->cancels_pending = 1;
                pthread_cond_signal(&s->wake);
            }
            break;
        }
    pthread_mutex_unlock(&s->mu);
}

void tsr_service_wait_idle(tsr_service *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->outstanding > 0) pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void tsr_service_get_stats(tsr_service *s, tsr_service_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    out->executor_broken = s->broken || s->x->broken;
    pthread_mutex_unlock(&s->mu);
}

void tsr_service_stop(tsr_service *s, double grace_s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    s->stop_deadline = tsr_service_now() + (grace_s > 0 ? grace_s : 0);
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    if (s->thread_started) pthread_join(s->thread, NULL);
    tsr_sched_free(s->sched);
    for (int k = 0; k < TSR_EXECUTOR_MAX_DEPTH; k++) {
        tsr_step_free(&s->fl[k].step);
        free(s->fl[k].results);
    }
    free(s->live);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->idle);
    free(s);
}
