/* CUDA facts for parallel/ (see cuda_info.h). */
#include "parallel/cuda_info.h"

#include <cuda_runtime_api.h>
#include <ctype.h>

int tsr_par_cuda_busid(int dev, char *buf, size_t cap)
{
    if (!cap) return -1;
    buf[0] = '\0';
    char id[64];
    if (cudaDeviceGetPCIBusId(id, (int)sizeof id, dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    /* hwloc wants lower-case hex */
    size_t i = 0;
    for (; id[i] && i + 1 < cap; i++)
        buf[i] = (char)tolower((unsigned char)id[i]);
    buf[i] = '\0';
    return 0;
}
