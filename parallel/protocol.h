/* The messages between the coordinator (rank 0) and the workers, over MPI_COMM_WORLD (duplicated), host memory.
 *
 * Start-up: every worker sends a HELLO (its device, usable memory, host and CPU binding; gathered on rank 0), rank 0
 * broadcasts the PLAN (or the reason there is none), each worker loads its part and sends READY (with the load
 * error when it failed). Steps: rank 0 sends STEP (a header and the packed tsr_step, runtime/step.h) to every
 * worker; the leader (first tensor rank of the last stage) answers RESULT (a tsr_step_result per sequence and, when
 * asked, the logits rows); any worker that fails sends ERROR with its reason instead. Between steps rank 0 may send
 * USAGE to every worker, which answers USAGE with its tsr_rank_usage (runtime/executor.h). SHUTDOWN ends the worker
 * loop. Every message starts with a tsr_msg header whose magic and version are checked; lengths are checked
 * against the bytes received, so a malformed message is an error, never a crash. */
#ifndef TSR_PARALLEL_PROTOCOL_H
#define TSR_PARALLEL_PROTOCOL_H

#include "parallel/plan.h"
#include "runtime/step.h"

#include <mpi.h>
#include <stdint.h>

#define TSR_MSG_MAGIC        0x54535250u /* "TSRP" */
#define TSR_PROTOCOL_VERSION 2u /* 2: USAGE */

enum {
    TSR_TAG_CTRL = 201,  /* STEP, USAGE, SHUTDOWN (rank 0 → workers) */
    TSR_TAG_REPLY = 202, /* READY, RESULT, ERROR, USAGE (workers → rank 0) */
};

typedef enum tsr_msg_type {
    TSR_MSG_STEP = 1,
    TSR_MSG_SHUTDOWN = 2,
    TSR_MSG_READY = 3,
    TSR_MSG_RESULT = 4,
    TSR_MSG_ERROR = 5,
    TSR_MSG_USAGE = 6, /* rank 0 → a worker (no payload), then the worker → rank 0 (a tsr_rank_usage) */
} tsr_msg_type;

typedef struct tsr_msg {
    uint32_t magic, version;
    uint32_t type;                 /* tsr_msg_type */
    int32_t status;                /* tsr_status of READY / RESULT / ERROR */
    uint64_t step_no;              /* STEP, RESULT, ERROR: the step it concerns */
    int32_t sender;                /* world rank */
    int32_t want_logits;           /* STEP: hand back the logits rows */
    int32_t n_seqs, n_rows, vocab; /* RESULT */
    uint32_t payload;              /* bytes after the header */
} tsr_msg;

/* HELLO: what a worker tells rank 0 before the plan (fixed size, gathered). */
typedef struct tsr_hello {
    uint64_t capacity; /* usable device bytes (0: not limited) */
    int32_t gpu;       /* its backend is a GPU */
    int32_t cores;     /* CPU cores it is bound to (0: unbound) */
    char host[64];
    char device[160]; /* the backend's description */
    char cpuset[160]; /* hwloc list string of its binding, "" when unbound */
} tsr_hello;

/* PLAN broadcast: the plan, or why there is none. */
typedef struct tsr_plan_msg {
    int32_t status;
    char message[1024];
    tsr_plan plan;
} tsr_plan_msg;

/* Sends header + payload as one message to `dest` and waits (deadline timeout_s) until it is out. */
tsr_status tsr_msg_send(MPI_Comm comm, int dest, int tag, tsr_msg *hdr, const void *payload, size_t len,
                        double timeout_s);

/* Receives the message the probe status describes into a malloc'd buffer (*buf, *len) and checks its header. */
tsr_status tsr_msg_recv(MPI_Comm comm, const MPI_Status *probe, uint8_t **buf, size_t *len, tsr_msg *hdr);

/* A header for a message of `type`. */
tsr_msg tsr_msg_make(tsr_msg_type type, int sender);

#endif
