/* The fault-injection sweep: runs one operation under every single allocation failure it can meet.
 *
 * An operation is a function that does something and cleans up after itself (open then close, parse then free,
 * start, submit, cancel then stop), returning its tsr_status. fault_sweep() runs it once to warm up per-thread
 * caches, once counting its allocations (N) and call sites, then again with allocation i failing for i = 1..N
 * (every i when N <= max_runs, else every stride-th i plus, for each distinct call site of the counting run, a
 * run failing the first allocation from that site), and finally once more without failures. Every run must
 * return (a crash fails the test), must leave nothing allocated after its start still live, and must report a
 * failure with a message or succeed (the failure was tolerated); the clean runs must succeed. An operation that
 * reports what it produced through fault_result() must produce the same in every successful run: a tolerated
 * failure may cost time, never content. For debugging, TSR_FAULT_NTH=i runs only the failing run of allocation i,
 * TSR_FAULT_BACKTRACE=1 prints where each injected failure lands and TSR_FAULT_VERBOSE=1 lists the tolerated
 * ones. */
#ifndef TSR_TESTS_FAULT_SWEEP_H
#define TSR_TESTS_FAULT_SWEEP_H

#include "runtime/status.h"

#include <stddef.h>

typedef tsr_status (*fault_op_fn)(void *ctx);

typedef struct fault_report {
    long allocs;          /* N: allocations of one clean run */
    long sites;           /* distinct call sites among them */
    long runs;            /* runs with a failure armed */
    long injected;        /* of which the failure happened */
    long failed;          /* of which the operation reported an error */
    long tolerated;       /* of which the operation still succeeded */
    long stride;          /* 1: every allocation was failed */
    double seconds;
} fault_report;

/* Adds bytes of what the current run produced to its fingerprint (a hash; nothing is allocated). */
void fault_result(const void *data, size_t len);

/* What the sweep is running now ("warm-up run", "failing allocation 7 of 324"...), for messages of ops. */
const char *fault_current_run(void);

/* Sweeps op (see above) and checks it with cmocka assertions; prints one summary line. */
void fault_sweep(const char *name, fault_op_fn op, void *ctx, long max_runs, fault_report *out);

#endif
