/* Peak resident memory from /proc (see proc_mem.h). */
#include "runtime/proc_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t tsr_peak_rss(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = strtoull(line + 6, NULL, 10);
    fclose(f);
    return kb * 1024;
}
