# CPU kernels behind kernels/ops.h (the CUDA ones are in kernels/cuda/sources.cmake).
list(APPEND TSR_CORE_SOURCES
  kernels/cpu/threadpool.c
  kernels/cpu/matmul_exl2.c
  kernels/cpu/matmul_dense.c
  kernels/cpu/attention.c
  kernels/cpu/elementwise.c
  kernels/cpu/ops_cpu.c
)
