/* NCCL comm (see comm_nccl.h). MPI carries only the unique id; every buffer given to NCCL is device memory. */
#include "parallel/comm_nccl.h"

#include "kernels/cuda/ops_cuda.h"
#include "kernels/cuda/peer_sum.h"
#include "parallel/mpi_util.h"

#include <cuda_runtime_api.h>
/* nccl.h declares some functions without prototypes */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The CUDA backend's stream (kernels/cuda/backend.cu). */
cudaStream_t tsr_cuda_stream(void);

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    pthread_t watchdog;
    pthread_mutex_t mu;
    int watching, stop, aborted;
    double deadline; /* when queued work must be done (0: nothing queued) */
    tsr_peer_sum *peer; /* the one-shot kernel for small sums (NULL: NCCL for all) */
} nccl_impl;

/* With TSR_PEER_SUM=1, sums of up to this many floats take the one-shot peer kernel (kernels/cuda/peer_sum.h) when
 * every member is on this host and can map the others' GPU memory: a 70B layer's sum is 8192 floats per token, so
 * batches up to 32 tokens; NCCL takes the larger ones (prefill). TSR_PEER_SUM_MAX (floats) sets the limit. Opt-in
 * until tests/parallel/gpu-check.sh has run it on two GPUs (so far only test_cuda's members sharing one GPU). */
#define PEER_SUM_CAP (256 * 1024)

static nccl_impl *impl_of(tsr_comm *c)
{
    return c->impl;
}

static tsr_status nccl_failed(tsr_comm *c, const char *op, int peer, ncclResult_t r)
{
    char why[256];
    snprintf(why, sizeof why, "%s", ncclGetErrorString(r));
    return tsr_comm_fail(c, op, peer, why);
}

static void abort_comm(tsr_comm *c)
{
    nccl_impl *n = impl_of(c);
    pthread_mutex_lock(&n->mu);
    int first = !n->aborted;
    n->aborted = 1;
    c->broken = 1;
    pthread_mutex_unlock(&n->mu);
    if (first) ncclCommAbort(n->comm);
}

/* Waits while the non-blocking communicator reports work in progress (set-up, lazy connection). */
static tsr_status settle(tsr_comm *c, ncclResult_t r, const char *op, int peer)
{
    nccl_impl *n = impl_of(c);
    const double end = c->timeout_s > 0 ? tsr_mpi_now() + c->timeout_s : 0;
    while (r == ncclInProgress) {
        if (end > 0 && tsr_mpi_now() > end) {
            abort_comm(c);
            return tsr_comm_fail(c, op, peer, "NCCL did not finish setting up within --comm-timeout (aborted)");
        }
        struct timespec t = {0, 100000};
        nanosleep(&t, NULL);
        if (ncclCommGetAsyncError(n->comm, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) return nccl_failed(c, op, peer, r);
    return TSR_OK;
}

/* Called after each queued operation: the work must drain within the timeout from now. */
static void arm(tsr_comm *c)
{
    nccl_impl *n = impl_of(c);
    if (c->timeout_s <= 0) return;
    pthread_mutex_lock(&n->mu);
    n->deadline = tsr_mpi_now() + c->timeout_s;
    pthread_mutex_unlock(&n->mu);
}

static void *watch(void *arg)
{
    tsr_comm *c = arg;
    nccl_impl *n = impl_of(c);
    for (;;) {
        struct timespec t = {0, 100000000};
        nanosleep(&t, NULL);
        pthread_mutex_lock(&n->mu);
        int stop = n->stop, fire = n->deadline > 0 && tsr_mpi_now() > n->deadline && !n->aborted;
        pthread_mutex_unlock(&n->mu);
        if (stop) return NULL;
        if (fire) {
            fprintf(stderr,
                    "tessera: NCCL comm (member %d of %d): queued work did not finish within %.0f s "
                    "(--comm-timeout); aborting the communicator\n",
                    c->rank, c->size, c->timeout_s);
            abort_comm(c);
        }
    }
}

static tsr_status enqueued(tsr_comm *c, ncclResult_t r, const char *op, int peer)
{
    TSR_TRY(settle(c, r, op, peer));
    arm(c);
    return TSR_OK;
}

static tsr_status n_allreduce(tsr_comm *c, float *buf, size_t n)
{
    if (c->broken) return tsr_comm_refuse(c, "all-reduce");
    nccl_impl *x = impl_of(c);
    if (x->peer && n <= tsr_peer_sum_cap(x->peer)) {
        tsr_peer_sum_run(x->peer, buf, n, x->stream);
        arm(c);
        return TSR_OK;
    }
    return enqueued(c, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, x->comm, x->stream), "all-reduce", -1);
}

static tsr_status n_send(tsr_comm *c, const void *buf, size_t bytes, int peer)
{
    if (c->broken) return tsr_comm_refuse(c, "send");
    nccl_impl *x = impl_of(c);
    return enqueued(c, ncclSend(buf, bytes, ncclUint8, peer, x->comm, x->stream), "send", peer);
}

static tsr_status n_recv(tsr_comm *c, void *buf, size_t bytes, int peer)
{
    if (c->broken) return tsr_comm_refuse(c, "receive");
    nccl_impl *x = impl_of(c);
    return enqueued(c, ncclRecv(buf, bytes, ncclUint8, peer, x->comm, x->stream), "receive", peer);
}

static tsr_status n_bcast(tsr_comm *c, void *buf, size_t bytes, int root)
{
    if (c->broken) return tsr_comm_refuse(c, "broadcast");
    nccl_impl *x = impl_of(c);
    return enqueued(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, x->comm, x->stream), "broadcast", -1);
}

static tsr_status n_gatherv(tsr_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                            const size_t *displs, int root)
{
    (void)send, (void)bytes, (void)recv, (void)counts, (void)displs, (void)root;
    return tsr_fail(TSR_ERR_UNSUPPORTED, "%s comm: gathers of host buffers go through the MPI comm", c->name);
}

static tsr_status n_sync(tsr_comm *c)
{
    nccl_impl *n = impl_of(c);
    const double end = c->timeout_s > 0 ? tsr_mpi_now() + c->timeout_s : 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery(n->stream);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) {
            char why[160];
            snprintf(why, sizeof why, "CUDA: %s", cudaGetErrorString(e));
            return tsr_comm_fail(c, "waiting for queued work", -1, why);
        }
        ncclResult_t r = ncclSuccess;
        ncclCommGetAsyncError(n->comm, &r);
        if (r != ncclSuccess && r != ncclInProgress) return nccl_failed(c, "waiting for queued work", -1, r);
        if (c->broken || (end > 0 && tsr_mpi_now() > end)) {
            abort_comm(c);
            return tsr_comm_fail(c, "waiting for queued work", -1, "not done within --comm-timeout (aborted)");
        }
        struct timespec t = {0, 50000};
        nanosleep(&t, NULL);
    }
    pthread_mutex_lock(&n->mu);
    n->deadline = 0;
    pthread_mutex_unlock(&n->mu);
    if (n->peer && !c->broken && tsr_peer_sum_failed(n->peer))
        return tsr_comm_fail(c, "all-reduce", -1, "a member did not join a one-shot sum within --comm-timeout");
    return c->broken ? tsr_comm_fail(c, "waiting for queued work", -1, "the communicator was aborted") : TSR_OK;
}

static void n_destroy(tsr_comm *c)
{
    nccl_impl *n = impl_of(c);
    if (n) {
        if (n->watching) {
            pthread_mutex_lock(&n->mu);
            n->stop = 1;
            pthread_mutex_unlock(&n->mu);
            pthread_join(n->watchdog, NULL);
        }
        /* A communicator whose collectives were captured into CUDA graphs must outlive those graphs (NCCL frees
         * its captured plans when a graph is destroyed): the backend's graphs go first, then the communicator. */
        if (n->comm) {
            if (c->broken && !n->aborted) {
                ncclCommAbort(n->comm);
            } else if (!c->broken) {
                tsr_cuda_release_graphs();
                ncclCommDestroy(n->comm);
            }
        }
        tsr_peer_sum_free(n->peer); /* after the graphs that captured its kernels */
        pthread_mutex_destroy(&n->mu);
        free(n);
    }
    free(c);
}

/* The same flag on every member: the smallest of the members' values (an MPI failure counts as 0). */
static int agree(MPI_Comm group, int mine, double timeout_s)
{
    int all = 0;
    MPI_Request req;
    if (MPI_Iallreduce(&mine, &all, 1, MPI_INT, MPI_MIN, group, &req) != MPI_SUCCESS) return 0;
    return tsr_mpi_wait(&req, 1, timeout_s, "agreeing on the one-shot sums") == TSR_OK ? all : 0;
}

/* Sets up the one-shot peer sums when every member runs on this host and can map every other member's exchange
 * area (collective over group; every member reaches the same decision, and falls back to NCCL alone otherwise).
 * Returns an error only when the group's MPI exchange itself failed. */
static tsr_status peer_setup(tsr_comm *c, MPI_Comm group)
{
    nccl_impl *n = impl_of(c);
    const char *env = getenv("TSR_PEER_SUM"), *env_max = getenv("TSR_PEER_SUM_MAX");
    const long cap = env_max && atol(env_max) > 0 ? atol(env_max) : PEER_SUM_CAP;
    /* off (the default) on any member: one small agreement, nothing more at start-up */
    if (!agree(group, c->size > 1 && c->size <= TSR_PEER_MAX && env && atoi(env) == 1, c->timeout_s)) return TSR_OK;
    MPI_Comm shm;
    if (MPI_Comm_split_type(group, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &shm) != MPI_SUCCESS)
        return tsr_fail(TSR_ERR_REMOTE, "NCCL comm: MPI_Comm_split_type failed");
    int on_host = 0;
    MPI_Comm_size(shm, &on_host);
    MPI_Comm_free(&shm);
    int ok = on_host == c->size; /* the same answer on every member: one missing from a host is missing from all */
    char handle[TSR_PEER_HANDLE_BYTES];
    memset(handle, 0, sizeof handle);
    char why[256] = "";
    if (ok && tsr_peer_sum_new(c->rank, c->size, (size_t)cap, c->timeout_s, handle, &n->peer) != TSR_OK) {
        snprintf(why, sizeof why, "%s", tsr_last_error());
        ok = 0;
    }
    if (agree(group, ok, c->timeout_s)) {
        char *handles = calloc((size_t)c->size, TSR_PEER_HANDLE_BYTES);
        MPI_Request req;
        int got = handles && MPI_Iallgather(handle, TSR_PEER_HANDLE_BYTES, MPI_BYTE, handles, TSR_PEER_HANDLE_BYTES,
                                            MPI_BYTE, group, &req) == MPI_SUCCESS;
        if (got && tsr_mpi_wait(&req, 1, c->timeout_s, "exchanging the one-shot sum areas") != TSR_OK) {
            free(handles);
            return tsr_fail(TSR_ERR_REMOTE, "NCCL comm: exchanging the one-shot sum areas timed out");
        }
        if (got && tsr_peer_sum_connect(n->peer, handles) != TSR_OK) {
            snprintf(why, sizeof why, "%s", tsr_last_error());
            got = 0;
        }
        free(handles);
        ok = agree(group, got, c->timeout_s);
    } else {
        ok = 0;
    }
    if (!ok) {
        tsr_peer_sum_free(n->peer);
        n->peer = NULL;
        if (why[0]) fprintf(stderr, "tessera: NCCL comm (member %d of %d): sums through NCCL only: %s\n", c->rank,
                            c->size, why);
        return TSR_OK;
    }
    if (c->rank == 0)
        fprintf(stderr, "tessera: tensor group of %d: sums of up to %ld floats by the one-shot peer kernel, "
                        "larger ones by NCCL\n", c->size, cap);
    /* NCCL connects lazily at its first operation, which must not fall inside a CUDA graph's capture: callers warm
     * the comm with a small sum (parallel/stage.c), which now takes the peer kernel, so connect NCCL here */
    float *one = NULL;
    if (cudaMalloc((void **)&one, sizeof *one) != cudaSuccess) {
        cudaGetLastError();
        return tsr_fail(TSR_ERR_NOMEM, "NCCL comm: out of device memory");
    }
    tsr_status st = TSR_OK;
    if (cudaMemsetAsync(one, 0, sizeof *one, n->stream) != cudaSuccess)
        st = tsr_fail(TSR_ERR_INTERNAL, "NCCL comm: cudaMemsetAsync failed");
    else
        st = enqueued(c, ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, n->comm, n->stream), "connecting", -1);
    if (st == TSR_OK) st = n_sync(c);
    cudaFree(one);
    return st;
}

tsr_status tsr_comm_nccl_new(MPI_Comm group, double timeout_s, tsr_comm **out)
{
    int rank = 0, size = 1;
    MPI_Comm_rank(group, &rank);
    MPI_Comm_size(group, &size);
    tsr_comm *c = calloc(1, sizeof *c);
    nccl_impl *n = calloc(1, sizeof *n);
    if (!c || !n) {
        free(c);
        free(n);
        return tsr_fail(TSR_ERR_NOMEM, "out of memory");
    }
    pthread_mutex_init(&n->mu, NULL);
    n->stream = tsr_cuda_stream();
    *c = (tsr_comm){.name = "nccl",
                    .rank = rank,
                    .size = size,
                    .mem = TSR_COMM_DEVICE,
                    .capturable = 1,
                    .timeout_s = timeout_s,
                    .allreduce_sum = n_allreduce,
                    .send = n_send,
                    .recv = n_recv,
                    .bcast = n_bcast,
                    .gatherv = n_gatherv,
                    .sync = n_sync,
                    .watch = arm,
                    .destroy = n_destroy,
                    .impl = n};
    /* member 0's unique id, over MPI (host memory) */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    tsr_status st = TSR_OK;
    if (rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) st = nccl_failed(c, "ncclGetUniqueId", -1, r);
    }
    /* the id goes out even after a failure (zeroed), so that no member waits forever */
    MPI_Request req;
    int err = MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, group, &req);
    tsr_status bst = err == MPI_SUCCESS ? tsr_mpi_wait(&req, 1, timeout_s, "broadcasting the NCCL id")
                                        : tsr_mpi_fail(err, "MPI_Ibcast");
    if (st == TSR_OK) st = bst;
    if (st == TSR_OK) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        ncclResult_t r = ncclCommInitRankConfig(&n->comm, size, id, rank, &cfg);
        if (r != ncclSuccess && r != ncclInProgress) {
            st = nccl_failed(c, "ncclCommInitRankConfig", -1, r);
        } else {
            if (r == ncclInProgress && ncclCommGetAsyncError(n->comm, &r) != ncclSuccess) r = ncclInternalError;
            st = settle(c, r, "creating the communicator", -1);
        }
    }
    if (st == TSR_OK) st = peer_setup(c, group);
    if (st == TSR_OK && pthread_create(&n->watchdog, NULL, watch, c) == 0) n->watching = 1;
    if (st != TSR_OK) {
        n_destroy(c);
        return st;
    }
    *out = c;
    return TSR_OK;
}
