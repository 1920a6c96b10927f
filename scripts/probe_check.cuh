/* The error check of the stand-alone GPU probes in scripts/ (chain-probe.cu, stream-probe.cu): a failed CUDA call
 * is printed with its text and makes the calling function (main or a measurement returning int) return 1. */
#ifndef TSR_SCRIPTS_PROBE_CHECK_CUH
#define TSR_SCRIPTS_PROBE_CHECK_CUH

#include <cuda_runtime.h>
#include <stdio.h>

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                                   \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

#endif
