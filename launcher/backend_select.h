/* Backend selection for the commands: `--device cpu` (default) or `--device cuda[:N]` (builds with a CUDA
 * toolkit only). */
#ifndef TSR_LAUNCHER_BACKEND_SELECT_H
#define TSR_LAUNCHER_BACKEND_SELECT_H

#include "kernels/ops.h"

/* Parses the device name and initializes that backend. Errors (unknown name, no CUDA in this build, no GPU)
 * are returned with a message. */
tsr_status tsr_select_backend(const char *device, const tsr_ops **ops);

/* A one-line description of the backend's device ("cpu: 16 threads", "cuda: NVIDIA H200 ..."). */
void tsr_backend_describe(const tsr_ops *ops, char *buf, size_t cap);

#endif
