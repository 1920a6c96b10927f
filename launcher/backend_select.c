/* Backend selection (see backend_select.h). */
#include "launcher/backend_select.h"

#include "kernels/cpu/threadpool.h"
#ifdef TSR_HAVE_CUDA
#include "kernels/cuda/ops_cuda.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tsr_status tsr_select_backend(const char *device, const tsr_ops **ops)
{
    if (!device || !strcmp(device, "cpu")) {
        *ops = tsr_ops_cpu();
        return TSR_OK;
    }
    if (!strncmp(device, "cuda", 4) && (device[4] == '\0' || device[4] == ':')) {
#ifdef TSR_HAVE_CUDA
        int index = 0;
        if (device[4] == ':') {
            char *end;
            long v = strtol(device + 5, &end, 10);
            if (*end || end == device + 5 || v < 0 || v > 1024)
                return tsr_fail(TSR_ERR_ARG, "device '%s': expected cuda or cuda:N", device);
            index = (int)v;
        }
        TSR_TRY(tsr_cuda_init(index));
        *ops = tsr_ops_cuda();
        return TSR_OK;
#else
        return tsr_fail(TSR_ERR_UNSUPPORTED,
                        "device '%s': this build of tessera has no CUDA backend (no toolkit at build time)", device);
#endif
    }
    return tsr_fail(TSR_ERR_ARG, "unknown device '%s' (cpu, cuda, cuda:N)", device);
}

int tsr_default_max_running(const char *device)
{
    const int gpu = device && !strncmp(device, "cuda", 4) && (device[4] == '\0' || device[4] == ':');
    return gpu ? TSR_MAX_RUNNING_GPU : TSR_MAX_RUNNING_CPU;
}

void tsr_backend_describe(const tsr_ops *ops, char *buf, size_t cap)
{
#ifdef TSR_HAVE_CUDA
    if (!strcmp(ops->name, "cuda")) {
        char d[256];
        tsr_cuda_describe(d, sizeof d);
        snprintf(buf, cap, "cuda: %s", d);
        return;
    }
#endif
    snprintf(buf, cap, "cpu: %d threads", tsr_threads_count());
}
