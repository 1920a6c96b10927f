/* MPI comm (see comm_mpi.h). All-reduce: MPI_Iallreduce for two members (a + b is the same float either way round);
 * for more, a reduction to member 0 followed by a broadcast, so every member provably gets the same bits whatever
 * algorithm the MPI library picks. Counts above INT_MAX are split into pieces. */
#include "parallel/comm_mpi.h"

#include "parallel/mpi_util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#define TAG_DATA 11
#define PIECE    ((size_t)1 << 30)

typedef struct {
    MPI_Comm comm;
} mpi_impl;

static MPI_Comm comm_of(tsr_comm *c)
{
    return ((mpi_impl *)c->impl)->comm;
}

static tsr_status finish(tsr_comm *c, MPI_Request *reqs, int n, const char *op, int peer)
{
    char what[96];
    if (peer >= 0)
        snprintf(what, sizeof what, "MPI %s with member %d (this is member %d of %d)", op, peer, c->rank, c->size);
    else
        snprintf(what, sizeof what, "MPI %s (member %d of %d)", op, c->rank, c->size);
    tsr_status st = tsr_mpi_wait(reqs, n, c->timeout_s, what);
    if (st != TSR_OK) c->broken = 1;
    return st;
}

static tsr_status m_allreduce(tsr_comm *c, float *buf, size_t n)
{
    if (c->broken) return tsr_comm_refuse(c, "all-reduce");
    for (size_t off = 0; off < n; off += PIECE) {
        int cnt = (int)(n - off < PIECE ? n - off : PIECE);
        MPI_Request r[1];
        int err;
        if (c->size <= 2) {
            err = MPI_Iallreduce(MPI_IN_PLACE, buf + off, cnt, MPI_FLOAT, MPI_SUM, comm_of(c), r);
            if (err != MPI_SUCCESS) return c->broken = 1, tsr_mpi_fail(err, "MPI all-reduce");
            TSR_TRY(finish(c, r, 1, "all-reduce", -1));
        } else {
            err = MPI_Ireduce(c->rank == 0 ? MPI_IN_PLACE : buf + off, c->rank == 0 ? buf + off : NULL, cnt, MPI_FLOAT,
                              MPI_SUM, 0, comm_of(c), r);
            if (err != MPI_SUCCESS) return c->broken = 1, tsr_mpi_fail(err, "MPI reduce");
            TSR_TRY(finish(c, r, 1, "reduce", -1));
            err = MPI_Ibcast(buf + off, cnt, MPI_FLOAT, 0, comm_of(c), r);
            if (err != MPI_SUCCESS) return c->broken = 1, tsr_mpi_fail(err, "MPI broadcast");
            TSR_TRY(finish(c, r, 1, "broadcast", -1));
        }
    }
    return TSR_OK;
}

static tsr_status m_send(tsr_comm *c, const void *buf, size_t bytes, int peer)
{
    if (c->broken) return tsr_comm_refuse(c, "send");
    for (size_t off = 0; off < bytes || off == 0; off += PIECE) {
        int cnt = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        MPI_Request r;
        int err = MPI_Isend((const char *)buf + off, cnt, MPI_BYTE, peer, TAG_DATA, comm_of(c), &r);
        if (err != MPI_SUCCESS) return c->broken = 1, tsr_mpi_fail(err, "MPI send");
        TSR_TRY(finish(c, &r, 1, "send", peer));
        if (bytes == 0) break;
    }
    return TSR_OK;
}

static tsr_status m_recv(tsr_comm *c, void *buf, size_t bytes, int peer)
{
    if (c->broken) return tsr_comm_refuse(c, "receive");
    for (size_t off = 0; off < bytes || off == 0; off += PIECE) {
        int cnt = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        MPI_Request r;
        int err = MPI_Irecv((char *)buf + off, cnt, MPI_BYTE, peer, TAG_DATA, comm_of(c), &r);
        if (err != MPI_SUCCESS) return c->broken = 1, tsr_mpi_fail(err, "MPI receive");
        TSR_TRY(finish(c, &r, 1, "receive", peer));
        if (bytes == 0) break;
    }
    return TSR_OK;
}

static tsr_status m_bcast(tsr_comm *c, void *buf, size_t bytes, int root)
{
    if (c->broken) return tsr_comm_refuse(c, "broadcast");
    for (size_t off = 0; off < bytes; off += PIECE) {
        int cnt = (int)(bytes - off < PIECE ? bytes - off : PIECE);
        MPI_Request r;
        int err = MPI_Ibcast((char *)buf + off, cnt, MPI_BYTE, root, comm_of(c), &r);
        if (err != MPI_SUCCESS) return c->broken = 1, tsr_mpi_fail(err, "MPI broadcast");
        TSR_TRY(finish(c, &r, 1, "broadcast", -1));
    }
    return TSR_OK;
}

static tsr_status m_gatherv(tsr_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                            const size_t *displs, int root)
{
    if (c->broken) return tsr_comm_refuse(c, "gather");
    int *ic = NULL, *id = NULL;
    if (c->rank == root) {
        ic = malloc((size_t)c->size * sizeof *ic);
        id = malloc((size_t)c->size * sizeof *id);
        if (!ic || !id) {
            free(ic);
            free(id);
            return tsr_fail(TSR_ERR_NOMEM, "out of memory");
        }
        for (int i = 0; i < c->size; i++) {
            if (counts[i] > INT_MAX || displs[i] > INT_MAX) {
                free(ic);
                free(id);
                return tsr_fail(TSR_ERR_UNSUPPORTED, "MPI gather: %zu bytes exceed one message", counts[i] + displs[i]);
            }
            ic[i] = (int)counts[i];
            id[i] = (int)displs[i];
        }
    }
    if (bytes > INT_MAX) {
        free(ic);
        free(id);
        return tsr_fail(TSR_ERR_UNSUPPORTED, "MPI gather: %zu bytes exceed one message", bytes);
    }
    MPI_Request r;
    int err = MPI_Igatherv(send, (int)bytes, MPI_BYTE, recv, ic, id, MPI_BYTE, root, comm_of(c), &r);
    tsr_status st =
        err == MPI_SUCCESS ? finish(c, &r, 1, "gather", -1) : (c->broken = 1, tsr_mpi_fail(err, "MPI gather"));
    free(ic);
    free(id);
    return st;
}

static tsr_status m_sync(tsr_comm *c)
{
    (void)c;
    return TSR_OK;
}

static void m_destroy(tsr_comm *c)
{
    mpi_impl *m = c->impl;
    if (m) {
        /* a broken comm may still have requests pending: freeing it could block, so it is left to MPI_Abort */
        if (!c->broken) MPI_Comm_free(&m->comm);
        free(m);
    }
    free(c);
}

tsr_status tsr_comm_mpi_new(MPI_Comm group, double timeout_s, tsr_comm **out)
{
    tsr_comm *c = calloc(1, sizeof *c);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    tsr_status st = tsr_mpi_dup(group, &m->comm);
    if (st != TSR_OK) {
        free(c);
        free(m);
        return st;
    }
    int rank = 0, size = 1;
    MPI_Comm_rank(m->comm, &rank);
    MPI_Comm_size(m->comm, &size);
    *c = (tsr_comm){.name = "mpi",
                    .rank = rank,
                    .size = size,
                    .mem = TSR_COMM_HOST,
                    .capturable = 0,
                    .timeout_s = timeout_s,
                    .allreduce_sum = m_allreduce,
                    .send = m_send,
                    .recv = m_recv,
                    .bcast = m_bcast,
                    .gatherv = m_gatherv,
                    .sync = m_sync,
                    .destroy = m_destroy,
                    .impl = m};
    *out = c;
    return TSR_OK;
}
