/* The MPI comm: host buffers, every operation non-blocking underneath and waited for with the comm's deadline
 * (mpi_util.h), so a dead or stuck member yields TSR_ERR_REMOTE instead of a hang. See comm.h. */
#ifndef TSR_PARALLEL_COMM_MPI_H
#define TSR_PARALLEL_COMM_MPI_H

#include "parallel/comm.h"

#include <mpi.h>

/* A comm over the members of `group` (duplicated; the caller keeps its own). */
tsr_status tsr_comm_mpi_new(MPI_Comm group, double timeout_s, tsr_comm **out);

#endif
