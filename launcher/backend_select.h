/* Backend selection for the commands: `--device cpu` (default) or `--device cuda[:N]` (builds with a CUDA
 * toolkit only). */
#ifndef TSR_LAUNCHER_BACKEND_SELECT_H
#define TSR_LAUNCHER_BACKEND_SELECT_H

#include "kernels/ops.h"

/* Parses the device name and initializes that backend. Errors (unknown name, no CUDA in this build, no GPU)
 * are returned with a message. */
tsr_status tsr_select_backend(const char *device, const tsr_ops **ops);

/* The default ceiling on sequences running at once (--max-running) for a device name: 256 on a GPU ("cuda",
 * "cuda:N"), whose decode step costs little more at 256 rows than at 64 (H100, 8B 4.0 bpw: through the service 16.9k
 * generated tokens/s at 256 running against 7.1k at 64, BENCHMARKS.md stop 68); 64 elsewhere, where a step's cost
 * grows with its rows. The KV pool's pages still bound what runs. */
#define TSR_MAX_RUNNING_GPU 256
#define TSR_MAX_RUNNING_CPU 64
int tsr_default_max_running(const char *device);

/* A one-line description of the backend's device ("cpu: 16 threads", "cuda: NVIDIA H200 ..."). */
void tsr_backend_describe(const tsr_ops *ops, char *buf, size_t cap);

#endif
