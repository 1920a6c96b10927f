/* The parallel executor on rank 0 (see coordinator.h). */
#include "parallel/coordinator.h"

#include "parallel/mpi_util.h"
#include "parallel/protocol.h"
#include "parallel/rank.h"
#include "parallel/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A step sent to the workers whose RESULT has not been received yet. */
typedef struct sent_step {
    uint64_t step_no;      /* 0: an empty step (nothing was sent) */
    int n_seqs, rows;      /* what the RESULT must hold */
    tsr_step_result *results;
    float *logits;
    uint8_t *buf;          /* the message, until its sends complete */
    MPI_Request *reqs;     /* one send per worker */
} sent_step;

typedef struct coord {
    MPI_Comm ctrl;
    tsr_plan plan;
    int leader; /* world rank of the leader */
    double timeout;
    uint64_t step_no;
    sent_step flight[TSR_EXECUTOR_MAX_DEPTH]; /* a ring, oldest at head */
    int head, n_flight;
} coord;

static tsr_status broken(tsr_executor *x, tsr_status st)
{
    x->broken = 1;
    tsr_rank_mark_broken();
    return st;
}

/* Describes worker rank r for messages. */
static void who(const tsr_plan *p, int rank, char *buf, size_t cap)
{
    int w = rank - 1;
    if (w >= 0 && w < p->n_workers)
        snprintf(buf, cap, "rank %d (worker %d: stage %d, tensor rank %d, layers %d-%d)", rank, w, p->w[w].stage,
                 p->w[w].tp_rank, p->w[w].layer0, p->w[w].layer1 - 1);
    else
        snprintf(buf, cap, "rank %d", rank);
}

/* Posts the step message to every worker without waiting (a worker busy with an earlier step takes it later). */
static tsr_status post_all(coord *c, tsr_msg *hdr, const void *payload, size_t len, sent_step *f)
{
    hdr->payload = (uint32_t)len;
    f->buf = malloc(sizeof *hdr + len);
    f->reqs = malloc((size_t)c->plan.n_workers * sizeof *f->reqs);
    if (!f->buf || !f->reqs) {
        free(f->buf);
        free(f->reqs);
        f->buf = NULL;
        f->reqs = NULL;
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    memcpy(f->buf, hdr, sizeof *hdr);
    if (len) memcpy(f->buf + sizeof *hdr, payload, len);
    for (int w = 0; w < c->plan.n_workers; w++) {
        int err = MPI_Isend(f->buf, (int)(sizeof *hdr + len), MPI_BYTE, w + 1, TSR_TAG_CTRL, c->ctrl, &f->reqs[w]);
        if (err != MPI_SUCCESS) {
            f->reqs = NULL; /* MPI may still read the buffer and the requests: leave them */
            f->buf = NULL;
            return tsr_mpi_fail(err, "sending a step");
        }
    }
    return TSR_OK;
}

static tsr_status c_submit(tsr_executor *x, const tsr_step *step, tsr_step_result *results, float *logits)
{
    coord *c = x->impl;
    if (x->broken) return tsr_fail(TSR_ERR_REMOTE, "the worker ranks are gone (an earlier step failed)");
    if (c->n_flight >= x->depth)
        return tsr_fail(TSR_ERR_ARG, "executor: %d steps in flight already (depth %d)", c->n_flight, x->depth);
    TSR_TRY(tsr_step_validate(step, x->vocab, x->n_pages, x->page_size));
    sent_step *f = &c->flight[(c->head + c->n_flight) % TSR_EXECUTOR_MAX_DEPTH];
    memset(f, 0, sizeof *f);
    if (step->n_seqs > 0) {
        uint8_t *packed = NULL;
        size_t len = 0;
        TSR_TRY(tsr_step_pack(step, &packed, &len));
        tsr_msg hdr = tsr_msg_make(TSR_MSG_STEP, 0);
        hdr.step_no = ++c->step_no;
        hdr.want_logits = logits != NULL;
        tsr_status st = post_all(c, &hdr, packed, len, f);
        free(packed);
        if (st != TSR_OK) return broken(x, st);
        f->step_no = c->step_no;
        f->n_seqs = step->n_seqs;
        f->rows = logits ? tsr_step_logit_rows(step) : 0;
        f->results = results;
        f->logits = logits;
    }
    c->n_flight++;
    return TSR_OK;
}

/* Receives the leader's RESULT for step f (or a worker's ERROR). */
static tsr_status receive_result(tsr_executor *x, coord *c, sent_step *f)
{
    for (;;) {
        MPI_Status probe;
        char what[160];
        snprintf(what, sizeof what, "waiting for step %llu's result", (unsigned long long)f->step_no);
        tsr_status st = tsr_mpi_probe(c->ctrl, MPI_ANY_SOURCE, TSR_TAG_REPLY, c->timeout, NULL, &probe, what);
        if (st != TSR_OK) {
            char w[128];
            who(&c->plan, c->leader, w, sizeof w);
            return broken(x, tsr_fail_context(st, "no answer from the leader, %s", w));
        }
        uint8_t *buf = NULL;
        size_t n = 0;
        tsr_msg m;
        if ((st = tsr_msg_recv(c->ctrl, &probe, &buf, &n, &m)) != TSR_OK) return broken(x, st);
        char w[128];
        who(&c->plan, probe.MPI_SOURCE, w, sizeof w);
        const uint8_t *pay = buf + sizeof m;
        if (m.type == TSR_MSG_ERROR) {
            st = tsr_fail(TSR_ERR_REMOTE, "%s failed: %.*s", w, (int)m.payload, (const char *)pay);
            free(buf);
            return broken(x, st);
        }
        if (m.type != TSR_MSG_RESULT || m.step_no != f->step_no || probe.MPI_SOURCE != c->leader) {
            st = tsr_fail(TSR_ERR_REMOTE, "unexpected message (type %u, step %llu) from %s while waiting for step %llu",
                          m.type, (unsigned long long)m.step_no, w, (unsigned long long)f->step_no);
            free(buf);
            return broken(x, st);
        }
        size_t want = (size_t)f->n_seqs * sizeof(tsr_step_result) + (size_t)f->rows * (size_t)x->vocab * sizeof(float);
        if (m.n_seqs != f->n_seqs || m.n_rows != f->rows || m.vocab != x->vocab || m.payload != want) {
            st = tsr_fail(TSR_ERR_REMOTE, "%s answered step %llu with a malformed result (%d sequences, %d rows)", w,
                          (unsigned long long)f->step_no, m.n_seqs, m.n_rows);
            free(buf);
            return broken(x, st);
        }
        memcpy(f->results, pay, (size_t)f->n_seqs * sizeof(tsr_step_result));
        if (f->rows)
            memcpy(f->logits, pay + (size_t)f->n_seqs * sizeof(tsr_step_result),
                   (size_t)f->rows * x->vocab * sizeof(float));
        free(buf);
        return TSR_OK;
    }
}

static tsr_status c_collect(tsr_executor *x)
{
    coord *c = x->impl;
    if (c->n_flight == 0) return tsr_fail(TSR_ERR_ARG, "executor: no step in flight to collect");
    sent_step *f = &c->flight[c->head];
    c->head = (c->head + 1) % TSR_EXECUTOR_MAX_DEPTH;
    c->n_flight--;
    if (f->step_no == 0) return TSR_OK;
    tsr_status st = x->broken ? tsr_fail(TSR_ERR_REMOTE, "the worker ranks are gone (an earlier step failed)")
                              : receive_result(x, c, f);
    /* every worker has taken the step once the leader answered it; otherwise MPI may still read the buffer */
    if (st == TSR_OK) st = tsr_mpi_wait(f->reqs, c->plan.n_workers, c->timeout, "sending a step to the workers");
    if (st == TSR_OK) {
        free(f->buf);
        free(f->reqs);
    } else if (!x->broken) {
        broken(x, st);
    }
    return st;
}

static tsr_status c_run(tsr_executor *x, const tsr_step *step, tsr_step_result *results, float *logits)
{
    coord *c = x->impl;
    if (c->n_flight > 0) return tsr_fail(TSR_ERR_ARG, "executor: run() with %d steps in flight", c->n_flight);
    TSR_TRY(c_submit(x, step, results, logits));
    return c_collect(x);
}

/* USAGE to every worker, then one answer from each (any order) into out[worker]. */
static tsr_status c_usage(tsr_executor *x, tsr_rank_usage *out, int max, int *n)
{
    coord *c = x->impl;
    const int W = c->plan.n_workers;
    *n = W;
    if (W > max) return tsr_fail(TSR_ERR_ARG, "executor: %d workers, room for the usage of %d", W, max);
    if (c->n_flight > 0) return tsr_fail(TSR_ERR_ARG, "executor: usage asked with %d steps in flight", c->n_flight);
    if (x->broken) return tsr_fail(TSR_ERR_REMOTE, "the worker ranks are gone (an earlier step failed)");
    tsr_msg hdr = tsr_msg_make(TSR_MSG_USAGE, 0);
    for (int w = 0; w < W; w++) {
        const tsr_status st = tsr_msg_send(c->ctrl, w + 1, TSR_TAG_CTRL, &hdr, NULL, 0, c->timeout);
        if (st != TSR_OK) return broken(x, tsr_fail_context(st, "asking rank %d for its usage", w + 1));
    }
    int seen[TSR_PLAN_MAX] = {0};
    for (int got = 0; got < W;) {
        MPI_Status probe;
        tsr_status st = tsr_mpi_probe(c->ctrl, MPI_ANY_SOURCE, TSR_TAG_REPLY, c->timeout, NULL, &probe,
                                      "waiting for the workers' usage");
        uint8_t *buf = NULL;
        size_t len = 0;
        tsr_msg m;
        if (st == TSR_OK) st = tsr_msg_recv(c->ctrl, &probe, &buf, &len, &m);
        if (st != TSR_OK) return broken(x, st);
        char w[128];
        who(&c->plan, probe.MPI_SOURCE, w, sizeof w);
        const int k = probe.MPI_SOURCE - 1;
        if (m.type == TSR_MSG_ERROR)
            st = tsr_fail(TSR_ERR_REMOTE, "%s failed: %.*s", w, (int)m.payload, (const char *)(buf + sizeof m));
        else if (m.type != TSR_MSG_USAGE || m.payload != sizeof(tsr_rank_usage) || k < 0 || k >= W || seen[k])
            st = tsr_fail(TSR_ERR_REMOTE, "unexpected message (type %u, %u bytes) from %s while waiting for its usage",
                          m.type, m.payload, w);
        if (st == TSR_OK) {
            memcpy(&out[k], buf + sizeof m, sizeof out[k]);
            seen[k] = 1, got++;
        }
        free(buf);
        if (st != TSR_OK) return broken(x, st);
    }
    return TSR_OK;
}

void tsr_coordinator_shutdown(MPI_Comm ctrl, int n_workers, double timeout_s)
{
    tsr_msg hdr = tsr_msg_make(TSR_MSG_SHUTDOWN, 0);
    for (int w = 0; w < n_workers; w++)
        if (tsr_msg_send(ctrl, w + 1, TSR_TAG_CTRL, &hdr, NULL, 0, timeout_s) != TSR_OK) tsr_rank_mark_broken();
}

static void c_close(tsr_executor *x)
{
    if (!x) return;
    coord *c = x->impl;
    if (!x->broken) tsr_coordinator_shutdown(c->ctrl, c->plan.n_workers, c->timeout);
    if (!x->broken) MPI_Comm_free(&c->ctrl);
    free(c);
    free(x);
}

tsr_status tsr_coordinator_executor(MPI_Comm ctrl, const tsr_plan *plan, const tsr_model_config *cfg, double timeout_s,
                                    int depth, tsr_executor **out)
{
    if (depth < 1 || depth > TSR_EXECUTOR_MAX_DEPTH)
        return tsr_fail(TSR_ERR_ARG, "executor: depth %d is outside 1..%d", depth, TSR_EXECUTOR_MAX_DEPTH);
    tsr_executor *x = calloc(1, sizeof *x);
    coord *c = calloc(1, sizeof *c);
    if (!x || !c) {
        free(x);
        free(c);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    c->ctrl = ctrl;
    c->plan = *plan;
    c->timeout = timeout_s;
    for (int w = 0; w < plan->n_workers; w++)
        if (tsr_stage_is_leader(plan, w)) c->leader = w + 1;
    x->vocab = cfg->vocab_size;
    x->page_size = plan->page_size;
    x->n_pages = plan->n_pages;
    x->max_step_tokens = plan->max_tokens;
    x->max_context = plan->max_context; /* at most the model's context (tsr_plan_make, tsr_plan_check) */
    x->depth = depth;
    x->run = c_run;
    if (depth > 1) {
        x->submit = c_submit;
        x->collect = c_collect;
    }
    x->usage = c_usage;
    x->close = c_close;
    x->impl = c;
    *out = x;
    return TSR_OK;
}
