# CUDA is optional: on when nvcc is found unless -DFLASHSEEK_CUDA=OFF.
include(CheckLanguage)
check_language(CUDA)
set(_fs_cuda_default OFF)
if(CMAKE_CUDA_COMPILER)
  set(_fs_cuda_default ON)
endif()
option(FLASHSEEK_CUDA "Build the CUDA backend" ${_fs_cuda_default})
set(FLASHSEEK_CUDA_ARCHS "90a" CACHE STRING "CUDA architectures (e.g. 90a;100a;103a)")
# Line tables in the device code (nvcc -lineinfo; the generated code is the same), so that an
# Nsight Compute source view (--section SourceCounters) names the source lines a kernel spends
# its time on.
option(FLASHSEEK_CUDA_LINEINFO "Device code with line information for source-level profiles" OFF)
if(FLASHSEEK_CUDA)
  # Hopper without the "a" suffix would compile the sm_90a-only kernels (the wgmma GEMM, the
  # prefill attention's warpgroup kernel) as empty bodies, which an H100 / H200 would then run.
  foreach(_fs_arch IN LISTS FLASHSEEK_CUDA_ARCHS)
    if(_fs_arch MATCHES "^90($|-)")
      message(FATAL_ERROR "FLASHSEEK_CUDA_ARCHS: use 90a for Hopper, not ${_fs_arch} (the wgmma kernels need sm_90a)")
    endif()
  endforeach()
  set(CMAKE_CUDA_ARCHITECTURES ${FLASHSEEK_CUDA_ARCHS})
  enable_language(CUDA)
  # CMake 3.25 does not know a CUDA20 dialect for nvcc (and would inherit CXX_STANDARD 20):
  # .cu files are C++17; they include no project header that needs C++20 (see ops/cuda/*/*kernels.h).
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  if(FLASHSEEK_CUDA_LINEINFO)
    string(APPEND CMAKE_CUDA_FLAGS " -lineinfo")
  endif()
  find_package(CUDAToolkit REQUIRED)
  message(STATUS "flashseek: CUDA backend ON, archs ${FLASHSEEK_CUDA_ARCHS}")
else()
  message(STATUS "flashseek: CUDA backend OFF")
endif()
