# CPU kernels behind kernels/ops.h (the CUDA ones are in kernels/cuda/sources.cmake), and the host-side choices the
# CUDA ones share with the tests (kv_copy_plan.c).
list(APPEND TSR_CORE_SOURCES
  kernels/cpu/threadpool.c
  kernels/cpu/matmul_exl2.c
  kernels/cpu/matmul_dense.c
  kernels/cpu/attention.c
  kernels/cpu/elementwise.c
  kernels/cpu/ops_cpu.c
  kernels/kv_copy_plan.c
)
# The matmul and attention kernels' multiply-adds are written as a + x * t; contracting them into fused multiply-adds
# (on CPUs that have them) is what they are timed with. Every row and column goes through the same expression, so
# results stay independent of the batch (ISO C mode turns contraction off by default).
set_source_files_properties(kernels/cpu/matmul_exl2.c kernels/cpu/matmul_dense.c kernels/cpu/attention.c
  PROPERTIES COMPILE_OPTIONS "-ffp-contract=fast")
