/* What parallel/ needs to know from CUDA without going through the ops table (CUDA builds only): a device's PCI
 * bus id, which hwloc uses to find the cores and NUMA node next to the GPU (parallel/topology.h). */
#ifndef TSR_PARALLEL_CUDA_INFO_H
#define TSR_PARALLEL_CUDA_INFO_H

#include <stddef.h>

/* Writes device `dev`'s PCI bus id ("0000:3b:00.0") into buf; returns 0, or -1 (buf empty) when CUDA cannot say. */
int tsr_par_cuda_busid(int dev, char *buf, size_t cap);

#endif
