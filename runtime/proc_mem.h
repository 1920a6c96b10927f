/* This process's peak resident memory, for reports (tessera bench, a worker rank's usage). */
#ifndef TSR_PROC_MEM_H
#define TSR_PROC_MEM_H

#include <stdint.h>

/* VmHWM of /proc/self/status in bytes; 0 where the system does not say. */
uint64_t tsr_peak_rss(void);

#endif
