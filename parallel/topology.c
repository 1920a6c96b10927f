/* hwloc binding (see topology.h). The topology is loaded with important I/O objects kept (hwloc 2 drops them by
 * default), so PCI devices can be found by bus id. */
#include "parallel/topology.h"

#include <hwloc.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static hwloc_topology_t load(void)
{
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0) return NULL;
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
        hwloc_topology_destroy(t);
        return NULL;
    }
    return t;
}

/* Binds the process's threads and memory to set; writes the description. Returns cores bound to, 0 on failure. */
static int apply(hwloc_topology_t t, hwloc_const_cpuset_t set, const char *what, char *desc, size_t cap, char *list,
                 size_t list_cap)
{
    char *s = NULL, *ns = NULL;
    hwloc_bitmap_list_asprintf(&s, set);
    hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
    hwloc_cpuset_to_nodeset(t, set, nodes);
    hwloc_bitmap_list_asprintf(&ns, nodes);
    int cores = hwloc_get_nbobjs_inside_cpuset_by_type(t, set, HWLOC_OBJ_CORE);
    if (cores <= 0) cores = hwloc_bitmap_weight(set);
    int ok = hwloc_set_cpubind(t, set, HWLOC_CPUBIND_PROCESS) == 0;
    if (ok) hwloc_set_membind(t, nodes, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_PROCESS | HWLOC_MEMBIND_BYNODESET);
    if (ok) {
        snprintf(desc, cap, "%s, bound to PUs %s (%d core%s), NUMA node %s", what, s ? s : "?", cores,
                 cores == 1 ? "" : "s", ns ? ns : "?");
        if (list) snprintf(list, list_cap, "%s", s ? s : "");
    } else {
        snprintf(desc, cap, "%s, unbound (binding to PUs %s failed)", what, s ? s : "?");
        if (list) list[0] = '\0';
        cores = 0;
    }
    free(s);
    free(ns);
    hwloc_bitmap_free(nodes);
    return cores;
}

int tsr_topo_bind_worker(int index, int count, const char *busid, char *desc, size_t desc_cap, char *cpuset,
                         size_t cpuset_cap)
{
    cpuset[0] = '\0';
    hwloc_topology_t t = load();
    if (!t) {
        snprintf(desc, desc_cap, "unbound (hwloc cannot read the topology)");
        return 0;
    }
    if (count < 1) count = 1;
    hwloc_cpuset_t set = hwloc_bitmap_dup(hwloc_topology_get_topology_cpuset(t));
    char what[256];
    hwloc_obj_t pci = busid && *busid ? hwloc_get_pcidev_by_busidstring(t, busid) : NULL;
    if (pci) {
        hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(t, pci);
        hwloc_bitmap_copy(set, near->cpuset);
        snprintf(what, sizeof what, "GPU %s", busid);
    } else if (busid && *busid) {
        snprintf(what, sizeof what, "GPU %s (not in the hwloc topology: spread)", busid);
    } else if (busid) {
        snprintf(what, sizeof what, "GPU worker %d of %d on this host (bus id unknown: spread)", index, count);
    } else {
        snprintf(what, sizeof what, "CPU worker %d of %d on this host", index, count);
    }
    if (!pci) {
        /* an even share of the host: hwloc_distrib spreads `count` sets over the machine */
        hwloc_cpuset_t *sets = calloc((size_t)count, sizeof *sets);
        hwloc_obj_t root = hwloc_get_root_obj(t);
        if (sets && hwloc_distrib(t, &root, 1, sets, (unsigned)count, INT_MAX, 0) == 0) {
            hwloc_bitmap_copy(set, sets[index % count]);
        }
        for (int i = 0; sets && i < count; i++)
            hwloc_bitmap_free(sets[i]);
        free(sets);
    }
    int cores = apply(t, set, what, desc, desc_cap, cpuset, cpuset_cap);
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(t);
    return cores;
}

int tsr_topo_bind_coordinator(const char *const *worker_sets, int n, char *desc, size_t desc_cap)
{
    hwloc_topology_t t = load();
    if (!t) {
        snprintf(desc, desc_cap, "coordinator, unbound (hwloc cannot read the topology)");
        return 0;
    }
    hwloc_cpuset_t used = hwloc_bitmap_alloc(), one = hwloc_bitmap_alloc();
    for (int i = 0; i < n; i++) {
        if (!worker_sets[i] || !worker_sets[i][0]) continue;
        if (hwloc_bitmap_list_sscanf(one, worker_sets[i]) == 0) hwloc_bitmap_or(used, used, one);
    }
    hwloc_cpuset_t free_set = hwloc_bitmap_dup(hwloc_topology_get_topology_cpuset(t));
    hwloc_bitmap_andnot(free_set, free_set, used);
    int cores = 0;
    if (hwloc_bitmap_iszero(free_set) || hwloc_bitmap_iszero(used))
        snprintf(desc, desc_cap, "coordinator, unbound (%s)",
                 hwloc_bitmap_iszero(used) ? "no local worker is bound" : "every core serves a local worker");
    else
        cores = apply(t, free_set, "coordinator (away from the workers)", desc, desc_cap, NULL, 0);
    hwloc_bitmap_free(used);
    hwloc_bitmap_free(one);
    hwloc_bitmap_free(free_set);
    hwloc_topology_destroy(t);
    return cores;
}
