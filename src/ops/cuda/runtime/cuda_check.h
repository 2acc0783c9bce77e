// CUDA error handling as Status values: every runtime call and every launch is checked.
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "core/status.h"

namespace flashseek::ops::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return {};
  return Status(StatusCode::kInternal, std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                                           cudaGetErrorString(e) + ")");
}

// True when a CUDA device can be used; `why` explains otherwise (for skips and CLI errors).
inline bool cuda_device_available(std::string* why = nullptr) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = e != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(e)
                                     : std::string("no CUDA device found");
    return false;
  }
  return true;
}

}  // namespace flashseek::ops::cuda

#define FS_CUDA_RETURN_IF_ERROR(expr) \
  FS_RETURN_IF_ERROR(::flashseek::ops::cuda::cuda_status((expr), #expr))
// After a <<<...>>> launch: configuration errors surface through cudaGetLastError.
#define FS_CUDA_CHECK_LAUNCH(what) \
  FS_RETURN_IF_ERROR(::flashseek::ops::cuda::cuda_status(cudaGetLastError(), what))
