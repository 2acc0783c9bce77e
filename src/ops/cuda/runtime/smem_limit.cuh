// Raising a kernel's dynamic shared-memory limit (cudaFuncSetAttribute) once per device. The
// attribute belongs to the current device's context, so a process driving several GPUs (tensor-
// parallel ranks, the multi-GPU benchmarks) must set it on each of them; and the driver call costs
// more than a decode kernel, so it must not run on every launch. One `done` mask per kernel
// (bit = device ordinal & 63).
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace flashseek::ops::cuda::detail {

inline cudaError_t ensure_smem_limit(const void* fn, int bytes, std::atomic<uint64_t>& done) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return cudaSuccess;
  if ((e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes)) != cudaSuccess) return e;
  done.fetch_or(bit, std::memory_order_release);
  return cudaSuccess;
}

}  // namespace flashseek::ops::cuda::detail
