/* The worker loop (see worker.h). */
#include "parallel/worker.h"

#include "parallel/mpi_util.h"
#include "parallel/protocol.h"
#include "parallel/rank.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tsr_worker_fail(MPI_Comm ctrl, int rank, const char *what, tsr_status st, double timeout_s)
{
    char msg[2048];
    snprintf(msg, sizeof msg, "%s: %s: %s", what, tsr_status_str(st), tsr_last_error());
    tsr_msg hdr = tsr_msg_make(TSR_MSG_ERROR, rank);
    hdr.status = st;
    if (tsr_msg_send(ctrl, 0, TSR_TAG_REPLY, &hdr, msg, strlen(msg), timeout_s) != TSR_OK) {
        fprintf(stderr, "tessera: rank %d: %s (and rank 0 cannot be told)\n", rank, msg);
        tsr_rank_mark_broken();
        return 1;
    }
    /* rank 0 ends the job; wait for its SHUTDOWN (or the abort) */
    for (;;) {
        MPI_Status probe;
        if (tsr_mpi_probe(ctrl, 0, TSR_TAG_CTRL, timeout_s > 0 ? timeout_s : 60, NULL, &probe,
                          "waiting for shutdown") != TSR_OK) {
            tsr_rank_mark_broken();
            return 1;
        }
        uint8_t *buf = NULL;
        size_t len = 0;
        tsr_msg m;
        if (tsr_msg_recv(ctrl, &probe, &buf, &len, &m) != TSR_OK) {
            tsr_rank_mark_broken();
            return 1;
        }
        free(buf);
        if (m.type == TSR_MSG_SHUTDOWN) return 1;
    }
}

/* Answers rank 0's USAGE: the device memory this worker's backend allocated at most, its peak resident memory, the
 * capacity it was planned with, the steps it ran. */
static tsr_status send_usage(const tsr_worker *wk, long steps)
{
    const tsr_stage *s = &wk->stage;
    const tsr_rank_usage u = tsr_rank_usage_of(wk->rank, s->engine, s->plan->w[s->worker].capacity, steps);
    tsr_msg hdr = tsr_msg_make(TSR_MSG_USAGE, wk->rank);
    return tsr_msg_send(wk->ctrl, 0, TSR_TAG_REPLY, &hdr, &u, sizeof u, wk->timeout_s);
}

static long env_long(const char *name, long dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

int tsr_worker_loop(tsr_worker *wk)
{
    tsr_stage *s = &wk->stage;
    const tsr_plan *p = s->plan;
    const int leader = tsr_stage_is_leader(p, s->worker);
    const long die_after = env_long("TSR_TEST_DIE_AFTER_STEPS", -1);
    const long die_rank = env_long("TSR_TEST_DIE_RANK", p->n_workers);
    char me[160];
    snprintf(me, sizeof me, "rank %d (worker %d: stage %d, tensor rank %d)", wk->rank, s->worker, p->w[s->worker].stage,
             p->w[s->worker].tp_rank);
    long steps = 0;
    tsr_step_result *results = NULL;
    float *logits = NULL;
    size_t cap_seqs = 0, cap_logits = 0;
    for (;;) {
        MPI_Status probe;
        tsr_status st = tsr_mpi_probe(wk->ctrl, 0, TSR_TAG_CTRL, 0, NULL, &probe, "waiting for a step");
        uint8_t *buf = NULL;
        size_t len = 0;
        tsr_msg m;
        if (st == TSR_OK) st = tsr_msg_recv(wk->ctrl, &probe, &buf, &len, &m);
        if (st != TSR_OK) {
            free(results);
            free(logits);
            return tsr_worker_fail(wk->ctrl, wk->rank, me, st, wk->timeout_s);
        }
        if (m.type == TSR_MSG_SHUTDOWN) {
            free(buf);
            break;
        }
        if (m.type == TSR_MSG_USAGE) {
            free(buf);
            if ((st = send_usage(wk, steps)) != TSR_OK) {
                free(results);
                free(logits);
                return tsr_worker_fail(wk->ctrl, wk->rank, me, st, wk->timeout_s);
            }
            continue;
        }
        if (die_after >= 0 && steps >= die_after && die_rank == wk->rank) {
            const char *mode = getenv("TSR_TEST_DIE_MODE");
            if (mode && !strcmp(mode, "hang")) {
                fprintf(stderr, "tessera: %s: TSR_TEST_DIE_AFTER_STEPS=%ld: hanging now\n", me, die_after);
                for (;;)
                    sleep(1000);
            }
            fprintf(stderr, "tessera: %s: TSR_TEST_DIE_AFTER_STEPS=%ld: exiting now\n", me, die_after);
            _exit(9);
        }
        tsr_step step;
        st = m.type == TSR_MSG_STEP ? tsr_step_unpack(buf + sizeof m, m.payload, &step)
                                    : tsr_fail(TSR_ERR_FORMAT, "unexpected message type %u from rank 0", m.type);
        int rows = 0;
        if (st == TSR_OK && leader) {
            rows = m.want_logits ? tsr_step_logit_rows(&step) : 0;
            if ((size_t)step.n_seqs > cap_seqs) {
                tsr_step_result *r = realloc(results, (size_t)step.n_seqs * sizeof *r);
                if (r)
                    results = r, cap_seqs = (size_t)step.n_seqs;
                else
                    st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
            }
            size_t need = (size_t)rows * (size_t)s->engine->model->cfg.vocab_size;
            if (st == TSR_OK && need > cap_logits) {
                float *l = realloc(logits, need * sizeof *l);
                if (l)
                    logits = l, cap_logits = need;
                else
                    st = tsr_fail(TSR_ERR_NOMEM, "out of memory for %d rows of logits", rows);
            }
        }
        if (st == TSR_OK) st = tsr_stage_run(s, &step, leader ? results : NULL, leader && rows ? logits : NULL);
        if (st == TSR_OK && leader) {
            const int vocab = s->engine->model->cfg.vocab_size;
            size_t rbytes = (size_t)step.n_seqs * sizeof(tsr_step_result),
                   lbytes = (size_t)rows * vocab * sizeof(float);
            uint8_t *pay = malloc(rbytes + lbytes + 1);
            if (!pay) {
                st = tsr_fail(TSR_ERR_NOMEM, "out of memory");
            } else {
                memcpy(pay, results, rbytes);
                if (lbytes) memcpy(pay + rbytes, logits, lbytes);
                tsr_msg r = tsr_msg_make(TSR_MSG_RESULT, wk->rank);
                r.step_no = m.step_no;
                r.n_seqs = step.n_seqs;
                r.n_rows = rows;
                r.vocab = vocab;
                st = tsr_msg_send(wk->ctrl, 0, TSR_TAG_REPLY, &r, pay, rbytes + lbytes, wk->timeout_s);
                free(pay);
            }
        }
        free(buf);
        if (st != TSR_OK) {
            free(results);
            free(logits);
            return tsr_worker_fail(wk->ctrl, wk->rank, me, st, wk->timeout_s);
        }
        steps++;
    }
    free(results);
    free(logits);
    return 0;
}
