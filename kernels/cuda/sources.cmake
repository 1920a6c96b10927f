# The CUDA backend (kernels/cuda): built only when CMake finds a CUDA toolkit (see the top-level CMakeLists.txt).
find_package(CUDAToolkit REQUIRED)
add_library(tessera_cuda STATIC
  ${PROJECT_SOURCE_DIR}/kernels/cuda/backend.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/elementwise.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/attention.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/attention_prefill.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/attention_prefill_wgmma.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/attention_decode.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/attention_kvq.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/kv_store_quant.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/matmul.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/gemm_dq_wgmma.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/gemv.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/mlp_decode.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/exl2_pack.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/argmax.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/top.cu
  ${PROJECT_SOURCE_DIR}/kernels/cuda/peer_sum.cu
)
target_include_directories(tessera_cuda PUBLIC ${PROJECT_SOURCE_DIR})
# A diagnostic build: every kernel notes its release time, and TSR_CUDA_TRACE=1 prints each kernel's share of a
# replayed decode step (kernels/cuda/trace.cuh). Off in every normal build: it adds a branch to every kernel.
option(TSR_CUDA_TRACE "Build the kernel trace into kernels/cuda (a diagnostic build)" OFF)
if(TSR_CUDA_TRACE)
  target_sources(tessera_cuda PRIVATE ${PROJECT_SOURCE_DIR}/kernels/cuda/trace.cu)
  target_compile_definitions(tessera_cuda PUBLIC TSR_CUDA_TRACE=1)
endif()
target_compile_options(tessera_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
if(TSR_WERROR)
  target_compile_options(tessera_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
endif()
# tessera_core after tessera_cuda on every link line: the CUDA code calls host helpers of the core
# (kernels/kv_copy_plan.c).
target_link_libraries(tessera_cuda PUBLIC CUDA::cudart CUDA::cublas tessera_core)
set_target_properties(tessera_cuda PROPERTIES CUDA_ARCHITECTURES "${TSR_CUDA_ARCHS}" POSITION_INDEPENDENT_CODE ON)
set(TSR_HAVE_CUDA ON)
