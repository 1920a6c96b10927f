# CTest cuda_trace_build: compiles the kernel trace's host half (kernels/cuda/trace.cu) and elementwise.cu (kernels
# launched through launch.cuh, whose wait notes the release in a trace build) with TSR_CUDA_TRACE=1, so that the
# diagnostic build that no CI configuration builds in full does not rot. Arguments: NVCC, ROOT, ARCH, OUT.
file(MAKE_DIRECTORY "${OUT}")
foreach(src trace elementwise)
  execute_process(
    COMMAND "${NVCC}" -std=c++17 -DTSR_CUDA_TRACE=1 -D_GNU_SOURCE -I${ROOT}
            --generate-code=arch=compute_${ARCH},code=sm_${ARCH} -Xcompiler=-Wall -Werror=all-warnings
            -c "${ROOT}/kernels/cuda/${src}.cu" -o "${OUT}/${src}.o"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "kernels/cuda/${src}.cu does not compile with TSR_CUDA_TRACE=1 (nvcc exit ${rc})")
  endif()
endforeach()
