# Sources of parallel/ (ranks, comm, planner, shards, coordinator and worker loops): the tessera_parallel library,
# linked into the tessera command and the MPI tests. MPI, hwloc and inih are required (MPI and hwloc are found by the
# top-level CMakeLists.txt). In CUDA builds NCCL is used for GPU workers when nccl.h and libnccl are found
# (-DTSR_NCCL_ROOT=DIR hints where; -DTSR_NCCL=OFF leaves it out).
pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
add_library(tessera_parallel STATIC
  ${PROJECT_SOURCE_DIR}/parallel/bench.c
  ${PROJECT_SOURCE_DIR}/parallel/comm.c
  ${PROJECT_SOURCE_DIR}/parallel/comm_local.c
  ${PROJECT_SOURCE_DIR}/parallel/comm_mpi.c
  ${PROJECT_SOURCE_DIR}/parallel/config_ini.c
  ${PROJECT_SOURCE_DIR}/parallel/coordinator.c
  ${PROJECT_SOURCE_DIR}/parallel/mpi_util.c
  ${PROJECT_SOURCE_DIR}/parallel/options.c
  ${PROJECT_SOURCE_DIR}/parallel/plan.c
  ${PROJECT_SOURCE_DIR}/parallel/protocol.c
  ${PROJECT_SOURCE_DIR}/parallel/rank.c
  ${PROJECT_SOURCE_DIR}/parallel/session.c
  ${PROJECT_SOURCE_DIR}/parallel/shard.c
  ${PROJECT_SOURCE_DIR}/parallel/stage.c
  ${PROJECT_SOURCE_DIR}/parallel/topology.c
  ${PROJECT_SOURCE_DIR}/parallel/worker.c
)
target_include_directories(tessera_parallel PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(tessera_parallel PUBLIC tessera_core MPI::MPI_C PkgConfig::HWLOC PkgConfig::INIH)

# GPU workers: the CUDA device's PCI bus id for hwloc, and NCCL for device buffers
if(TSR_HAVE_CUDA)
  target_sources(tessera_parallel PRIVATE ${PROJECT_SOURCE_DIR}/parallel/cuda_info.c)
  target_compile_definitions(tessera_parallel PRIVATE TSR_HAVE_CUDA)
  target_link_libraries(tessera_parallel PUBLIC CUDA::cudart)
  option(TSR_NCCL "Use NCCL between GPU workers (CUDA builds)" ON)
  set(TSR_NCCL_ROOT "" CACHE PATH "NCCL installation (include/nccl.h, lib/libnccl.so); also $NCCL_HOME")
  if(TSR_NCCL)
    find_path(TSR_NCCL_INCLUDE nccl.h HINTS ${TSR_NCCL_ROOT}/include $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS})
    find_library(TSR_NCCL_LIB nccl HINTS ${TSR_NCCL_ROOT}/lib ${TSR_NCCL_ROOT}/lib64 $ENV{NCCL_HOME}/lib
                 ${CUDAToolkit_LIBRARY_DIR})
    if(TSR_NCCL_INCLUDE AND TSR_NCCL_LIB)
      message(STATUS "tessera: NCCL for GPU workers: ${TSR_NCCL_LIB}")
      target_sources(tessera_parallel PRIVATE ${PROJECT_SOURCE_DIR}/parallel/comm_nccl.c)
      target_include_directories(tessera_parallel SYSTEM PRIVATE ${TSR_NCCL_INCLUDE})
      target_compile_definitions(tessera_parallel PRIVATE TSR_HAVE_NCCL)
      target_link_libraries(tessera_parallel PUBLIC ${TSR_NCCL_LIB} tessera_cuda)
    else()
      message(STATUS "tessera: no NCCL found (TSR_NCCL_ROOT): GPU workers exchange data over MPI through host memory")
    endif()
  endif()
endif()
