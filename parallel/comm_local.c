/* In-process comm over threads (see comm_local.h): a shared board of buffer pointers, a reusable barrier with a
 * deadline for collectives, and one mailbox per (sender, receiver) pair for transfers. */
#include "parallel/comm_local.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOCAL_MAX 64

typedef struct {
    const void *p;
    size_t bytes;
    int full;
} mailbox;

typedef struct {
    int size, refs;
    double timeout_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long gen; /* barrier generation */
    int arrived;
    const void *board[LOCAL_MAX];
    mailbox box[LOCAL_MAX][LOCAL_MAX];
} shared;

static struct timespec deadline_after(double s)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    if (s <= 0) s = 1e7;
    double whole = (double)(long)s;
    t.tv_sec += (time_t)whole;
    t.tv_nsec += (long)((s - whole) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* Waits until every member arrived; 0 on success, -1 on timeout. Called with the lock held. */
static int barrier(shared *s, const struct timespec *dl)
{
    unsigned long g = s->gen;
    if (++s->arrived == s->size) {
        s->arrived = 0;
        s->gen++;
        pthread_cond_broadcast(&s->cv);
        return 0;
    }
    while (s->gen == g)
        if (pthread_cond_timedwait(&s->cv, &s->mu, dl) == ETIMEDOUT && s->gen == g) return -1;
    return 0;
}

static shared *sh(tsr_comm *c)
{
    return c->impl;
}

static tsr_status l_allreduce(tsr_comm *c, float *buf, size_t n)
{
    if (c->broken) return tsr_comm_refuse(c, "all-reduce");
    shared *s = sh(c);
    float *tmp = malloc(n * sizeof(float) + 1);
    if (!tmp) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    struct timespec dl = deadline_after(c->timeout_s);
    pthread_mutex_lock(&s->mu);
    s->board[c->rank] = buf;
    int bad = barrier(s, &dl);
    pthread_mutex_unlock(&s->mu);
    if (!bad) {
        const float *first = s->board[0];
        for (size_t i = 0; i < n; i++)
            tmp[i] = first[i];
        for (int r = 1; r < s->size; r++) {
            const float *b = s->board[r];
            for (size_t i = 0; i < n; i++)
                tmp[i] += b[i];
        }
        pthread_mutex_lock(&s->mu);
        bad = barrier(s, &dl);
        pthread_mutex_unlock(&s->mu);
        if (!bad) memcpy(buf, tmp, n * sizeof(float));
    }
    free(tmp);
    return bad ? tsr_comm_fail(c, "all-reduce", -1, "timed out waiting for the other members") : TSR_OK;
}

static tsr_status l_send(tsr_comm *c, const void *buf, size_t bytes, int peer)
{
    if (c->broken) return tsr_comm_refuse(c, "send");
    if (peer < 0 || peer >= c->size || peer == c->rank) return tsr_fail(TSR_ERR_ARG, "local comm: send to %d", peer);
    shared *s = sh(c);
    mailbox *m = &s->box[c->rank][peer];
    struct timespec dl = deadline_after(c->timeout_s);
    int bad = 0;
    pthread_mutex_lock(&s->mu);
    while (m->full && !bad)
        bad = pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT;
    if (!bad) {
        *m = (mailbox){buf, bytes, 1};
        pthread_cond_broadcast(&s->cv);
        while (m->full && !bad)
            bad = pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT && m->full;
        if (bad) m->full = 0;
    }
    pthread_mutex_unlock(&s->mu);
    return bad ? tsr_comm_fail(c, "send", peer, "timed out") : TSR_OK;
}

static tsr_status l_recv(tsr_comm *c, void *buf, size_t bytes, int peer)
{
    if (c->broken) return tsr_comm_refuse(c, "receive");
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return tsr_fail(TSR_ERR_ARG, "local comm: receive from %d", peer);
    shared *s = sh(c);
    mailbox *m = &s->box[peer][c->rank];
    struct timespec dl = deadline_after(c->timeout_s);
    int bad = 0;
    tsr_status st = TSR_OK;
    pthread_mutex_lock(&s->mu);
    while (!m->full && !bad)
        bad = pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT && !m->full;
    if (!bad) {
        if (m->bytes != bytes)
            st = tsr_comm_fail(c, "receive", peer, "message size differs from the expected size");
        else
            memcpy(buf, m->p, bytes);
        m->full = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    if (bad) return tsr_comm_fail(c, "receive", peer, "timed out");
    return st;
}

/* Collective copy: every member posts `mine`, then `fn` runs on each member, then all leave together. */
static tsr_status board_op(tsr_comm *c, const char *op, const void *mine, void (*fn)(tsr_comm *c, shared *s, void *arg),
                           void *arg)
{
    if (c->broken) return tsr_comm_refuse(c, op);
    shared *s = sh(c);
    struct timespec dl = deadline_after(c->timeout_s);
    pthread_mutex_lock(&s->mu);
    s->board[c->rank] = mine;
    int bad = barrier(s, &dl);
    pthread_mutex_unlock(&s->mu);
    if (!bad) {
        fn(c, s, arg);
        pthread_mutex_lock(&s->mu);
        bad = barrier(s, &dl);
        pthread_mutex_unlock(&s->mu);
    }
    return bad ? tsr_comm_fail(c, op, -1, "timed out waiting for the other members") : TSR_OK;
}

typedef struct {
    void *buf;
    size_t bytes;
    int root;
    const size_t *counts, *displs;
} copy_arg;

static void do_bcast(tsr_comm *c, shared *s, void *arg)
{
    copy_arg *a = arg;
    if (c->rank != a->root) memcpy(a->buf, s->board[a->root], a->bytes);
}

static tsr_status l_bcast(tsr_comm *c, void *buf, size_t bytes, int root)
{
    copy_arg a = {buf, bytes, root, NULL, NULL};
    return board_op(c, "broadcast", buf, do_bcast, &a);
}

static void do_gather(tsr_comm *c, shared *s, void *arg)
{
    copy_arg *a = arg;
    if (c->rank != a->root) return;
    for (int r = 0; r < s->size; r++)
        memcpy((char *)a->buf + a->displs[r], s->board[r], a->counts[r]);
}

static tsr_status l_gatherv(tsr_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                            const size_t *displs, int root)
{
    (void)bytes;
    copy_arg a = {recv, 0, root, counts, displs};
    return board_op(c, "gather", send, do_gather, &a);
}

static tsr_status l_sync(tsr_comm *c)
{
    (void)c;
    return TSR_OK;
}

static void l_destroy(tsr_comm *c)
{
    shared *s = sh(c);
    pthread_mutex_lock(&s->mu);
    int last = --s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        free(s);
    }
    free(c);
}

tsr_status tsr_comm_local_group(int size, double timeout_s, tsr_comm **members)
{
    if (size < 1 || size > LOCAL_MAX) return tsr_fail(TSR_ERR_ARG, "local comm: %d members (1..%d)", size, LOCAL_MAX);
    shared *s = calloc(1, sizeof *s);
    if (!s) return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    s->size = size;
    s->timeout_s = timeout_s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    for (int r = 0; r < size; r++) {
        tsr_comm *c = calloc(1, sizeof *c);
        if (!c) {
            for (int i = 0; i < r; i++)
                tsr_comm_free(members[i]);
            if (r == 0) free(s);
            return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        }
        *c = (tsr_comm){.name = "local",
                        .rank = r,
                        .size = size,
                        .mem = TSR_COMM_HOST,
                        .capturable = 0,
                        .timeout_s = timeout_s,
                        .allreduce_sum = l_allreduce,
                        .send = l_send,
                        .recv = l_recv,
                        .bcast = l_bcast,
                        .gatherv = l_gatherv,
                        .sync = l_sync,
                        .destroy = l_destroy,
                        .impl = s};
        s->refs++;
        members[r] = c;
    }
    return TSR_OK;
}
