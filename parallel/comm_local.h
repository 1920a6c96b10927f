/* An in-process comm: `size` members that are threads of this process (see comm.h).
 *
 * Tests use it to run the shards of a tensor split, or the stages of a layer split, side by side in one process and
 * compare them with the whole model without MPI. Host buffers only. Sums are taken in member order, so every member
 * gets the same bits. Transfers are synchronous (a send returns once the receiver has copied). Waits end after
 * timeout_s with TSR_ERR_REMOTE. */
#ifndef TSR_PARALLEL_COMM_LOCAL_H
#define TSR_PARALLEL_COMM_LOCAL_H

#include "parallel/comm.h"

/* Creates the group: members[0..size-1], each to be used by one thread and freed with tsr_comm_free. */
tsr_status tsr_comm_local_group(int size, double timeout_s, tsr_comm **members);

#endif
