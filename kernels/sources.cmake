# CPU kernels behind kernels/ops.h (the CUDA ones are in kernels/cuda/sources.cmake).
list(APPEND TSR_CORE_SOURCES
)
