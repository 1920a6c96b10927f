/* MPI waiting with deadlines: every blocking wait of tessera's MPI code goes through these, so that a dead or stuck
 * peer turns into TSR_ERR_REMOTE after a bounded time instead of a hang.
 *
 * Waits poll (MPI_Testall / MPI_Iprobe) back to back for the first 5 ms, yielding the core between tests, then with
 * sleeps growing to 1 ms: low latency for the collectives inside a forward pass, and idle ranks (a worker waiting
 * for the next step) leave the cores to the computing ones (CPU workers share cores under oversubscription).
 * Communicators must use MPI_ERRORS_RETURN (tsr_mpi_dup does). timeout_s <= 0 waits forever. */
#ifndef TSR_PARALLEL_MPI_UTIL_H
#define TSR_PARALLEL_MPI_UTIL_H

#include "runtime/status.h"

#include <mpi.h>

/* Waits for n requests. On timeout returns TSR_ERR_REMOTE (the requests stay pending); on an MPI error returns it
 * with the MPI message. `what` names the operation in messages. */
tsr_status tsr_mpi_wait(MPI_Request *reqs, int n, double timeout_s, const char *what);

/* Waits for a message matching (source, tag) on comm and returns its status (MPI_ANY_SOURCE / MPI_ANY_TAG
 * allowed). If `stop` is given, the wait also ends (TSR_ERR_BUSY) as soon as *stop becomes non-zero. */
tsr_status tsr_mpi_probe(MPI_Comm comm, int source, int tag, double timeout_s, const volatile int *stop,
                         MPI_Status *status, const char *what);

/* MPI_Comm_dup with MPI_ERRORS_RETURN set. */
tsr_status tsr_mpi_dup(MPI_Comm in, MPI_Comm *out);

/* Seconds on a monotonic clock. */
double tsr_mpi_now(void);

/* Records an MPI error code as a tsr_fail message. */
tsr_status tsr_mpi_fail(int err, const char *what);

#endif
