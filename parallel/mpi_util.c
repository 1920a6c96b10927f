/* MPI waits with deadlines (see mpi_util.h). */
#include "parallel/mpi_util.h"

#include <sched.h>
#include <time.h>

double tsr_mpi_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

tsr_status tsr_mpi_fail(int err, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    return tsr_fail(TSR_ERR_REMOTE, "%s: MPI error: %s", what, len ? msg : "unknown");
}

/* Polling policy: back-to-back tests for the first 5 ms (yielding the core, so that a peer sharing it under
 * oversubscription can run), then sleeps growing from 50 us to 1 ms. `start` is when the wait began. */
static void backoff(int round, double start)
{
    if (round < 32) return;
    double waited = tsr_mpi_now() - start;
    if (waited < 5e-3) {
        sched_yield();
        return;
    }
    long ns = waited < 20e-3 ? 50000L : waited < 100e-3 ? 200000L : 1000000L;
    struct timespec t = {0, ns};
    nanosleep(&t, NULL);
}

tsr_status tsr_mpi_wait(MPI_Request *reqs, int n, double timeout_s, const char *what)
{
    const double start = tsr_mpi_now(), end = timeout_s > 0 ? start + timeout_s : 0;
    for (int round = 0;; round++) {
        int done = 0;
        int err = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (err != MPI_SUCCESS) return tsr_mpi_fail(err, what);
        if (done) return TSR_OK;
        if (end > 0 && tsr_mpi_now() > end)
            return tsr_fail(TSR_ERR_REMOTE, "%s: no answer within %.0f s (--comm-timeout)", what, timeout_s);
        backoff(round, start);
    }
}

tsr_status tsr_mpi_probe(MPI_Comm comm, int source, int tag, double timeout_s, const volatile int *stop,
                         MPI_Status *status, const char *what)
{
    const double start = tsr_mpi_now(), end = timeout_s > 0 ? start + timeout_s : 0;
    for (int round = 0;; round++) {
        int flag = 0;
        int err = MPI_Iprobe(source, tag, comm, &flag, status);
        if (err != MPI_SUCCESS) return tsr_mpi_fail(err, what);
        if (flag) return TSR_OK;
        if (stop && *stop) return TSR_ERR_BUSY;
        if (end > 0 && tsr_mpi_now() > end)
            return tsr_fail(TSR_ERR_REMOTE, "%s: no answer within %.0f s (--comm-timeout)", what, timeout_s);
        backoff(round, start);
    }
}

tsr_status tsr_mpi_dup(MPI_Comm in, MPI_Comm *out)
{
    int err = MPI_Comm_dup(in, out);
    if (err != MPI_SUCCESS) return tsr_mpi_fail(err, "MPI_Comm_dup");
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return TSR_OK;
}
