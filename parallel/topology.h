/* CPU and memory binding with hwloc: each worker next to its GPU, the coordinator away from the workers.
 *
 * A GPU worker is bound to the cores and NUMA node of the PCI device with its bus id (found through hwloc's PCI
 * objects: Debian's hwloc has no CUDA plugin, so the CUDA side only hands over the bus-id string). A CPU worker gets an
 * even share of the host's cores (hwloc_distrib over the workers of its host). The coordinator takes the cores no local
 * worker uses, and stays unbound when there are none. Binding covers the process's threads (the CPU thread pool starts
 * after it) and its memory (first touch lands on the local node). Nothing here is fatal: when hwloc cannot load the
 * topology or bind, the description says so and the process runs unbound. */
#ifndef TSR_PARALLEL_TOPOLOGY_H
#define TSR_PARALLEL_TOPOLOGY_H

#include <stddef.h>

/* Binds worker `index` of `count` workers on this host; busid ("0000:3b:00.0") for a GPU worker ("" when its bus id
 * is unknown: an even share of the host, as for a CPU worker), NULL for a CPU worker. Writes a one-line description
 * and the bound cpuset as an hwloc list string ("" when unbound); returns the number of cores bound to (0 when
 * unbound). */
int tsr_topo_bind_worker(int index, int count, const char *busid, char *desc, size_t desc_cap, char *cpuset,
                         size_t cpuset_cap);

/* Binds the coordinator to the cores outside the given workers' cpusets (hwloc list strings; empty ones are
 * ignored). Same outputs. */
int tsr_topo_bind_coordinator(const char *const *worker_sets, int n, char *desc, size_t desc_cap);

#endif
