/* Test hooks of the scheduler: levers and probes that tests use to force situations (a preemption, an empty
 * prefix cache) and to check plans against the pool. Not for production callers; the service never needs them.
 * Each leaves the scheduler consistent (tsr_sched_check passes before and after). */
#ifndef TSR_SCHED_DEBUG_H
#define TSR_SCHED_DEBUG_H

#include "runtime/sched/scheduler.h"

/* Preempts a running sequence now, as page pressure would (pages released, back to the queue in id order with
 * its tokens). TSR_ERR_ARG when the id is not running, or is in the step awaiting commit. */
tsr_status tsr_sched_preempt(tsr_sched *s, uint64_t id);

/* Evicts every unreferenced page of the prefix cache (back to the free list). */
void tsr_sched_flush_cache(tsr_sched *s);

/* Reference count of a page (-1 when out of range). */
int tsr_sched_page_refcount(const tsr_sched *s, int32_t page);

#endif
