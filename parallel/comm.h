/* The comm layer: one interface for the collectives and point-to-point transfers of a group of ranks.
 *
 * Three implementations: MPI (comm_mpi.h) for host buffers, NCCL (comm_nccl.h, CUDA builds) for device buffers,
 * and an in-process group of threads (comm_local.h) that tests use to run several shards in one process. A comm
 * says where its buffers live (mem): MPI never sees a device pointer, so a caller with device buffers and a host
 * comm stages them (tsr_comm_stage below does).
 *
 * Every operation returns when its buffers may be reused, or, for a device comm, once it is queued on the
 * backend's stream in order with the kernels around it (sync() waits). Operations never hang: a host comm waits at
 * most `timeout_s` seconds (then TSR_ERR_REMOTE, naming the operation and peer), a device comm has a watchdog that
 * aborts the communicator after the same time. After any failure the comm is `broken` and refuses further work;
 * the rank should report and leave, since the other members may be stuck in the same operation.
 *
 * Ownership: the creator frees the comm with tsr_comm_free(). One thread at a time per comm. */
#ifndef TSR_PARALLEL_COMM_H
#define TSR_PARALLEL_COMM_H

#include "runtime/status.h"

#include <stddef.h>

struct tsr_ops;

typedef enum tsr_comm_mem { TSR_COMM_HOST, TSR_COMM_DEVICE } tsr_comm_mem;

typedef struct tsr_comm tsr_comm;
struct tsr_comm {
    const char *name; /* "mpi", "nccl", "local" */
    int rank, size;   /* this member and the group size */
    tsr_comm_mem mem; /* where buffers live */
    int capturable;   /* operations may be recorded into backend graphs (ops->run_cached) */
    double timeout_s; /* longest wait of one operation (<= 0: no limit) */
    int broken;       /* set by the first failure */

    /* buf[n] summed over the group in place; every member gets the same bits */
    tsr_status (*allreduce_sum)(tsr_comm *c, float *buf, size_t n);
    tsr_status (*send)(tsr_comm *c, const void *buf, size_t bytes, int peer);
    tsr_status (*recv)(tsr_comm *c, void *buf, size_t bytes, int peer);
    tsr_status (*bcast)(tsr_comm *c, void *buf, size_t bytes, int root);
    /* root receives member i's counts[i] bytes at offset displs[i] of recv (host comms only; others return
     * TSR_ERR_UNSUPPORTED) */
    tsr_status (*gatherv)(tsr_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                          const size_t *displs, int root);
    /* waits until queued operations are done (host comms: nothing to wait for) */
    tsr_status (*sync)(tsr_comm *c);
    /* device comms (NULL otherwise): work queued from now on must be done within timeout_s, or the watchdog aborts
     * the communicator (covers work replayed from backend graphs, which queues nothing through the comm) */
    void (*watch)(tsr_comm *c);
    void (*destroy)(tsr_comm *c);
    void *impl;
};

void tsr_comm_free(tsr_comm *c);

/* Fails the comm: marks it broken and records the message (TSR_ERR_REMOTE). For implementations. */
tsr_status tsr_comm_fail(tsr_comm *c, const char *op, int peer, const char *why);

/* The refusal every operation of a broken comm returns. */
tsr_status tsr_comm_refuse(const tsr_comm *c, const char *op);

/* All-reduce of a buffer in the backend's memory: directly on a device comm or for host buffers, else staged
 * through a host buffer (to_host, sum, to_device) that *scratch caches (*scratch_n bytes, grown with realloc; free
 * it with free()). */
tsr_status tsr_comm_allreduce_backend(tsr_comm *c, const struct tsr_ops *ops, float *buf, size_t n, void **scratch,
                                      size_t *scratch_n);
/* Send / receive of backend memory, staged likewise when needed. */
tsr_status tsr_comm_send_backend(tsr_comm *c, const struct tsr_ops *ops, const void *buf, size_t bytes, int peer,
                                 void **scratch, size_t *scratch_n);
tsr_status tsr_comm_recv_backend(tsr_comm *c, const struct tsr_ops *ops, void *buf, size_t bytes, int peer,
                                 void **scratch, size_t *scratch_n);

#endif
