// Whether the current device runs the sm_90a-only kernels (wgmma: the FP8 / FP4 prefill GEMM, the
// prefill attention's warpgroup kernel): compute capability 9.0, the one architecture those
// kernels are built for. Cached per device ordinal, because the attribute queries cost more than a
// decode kernel and the launchers ask on every launch.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>

namespace flashseek::ops::cuda::detail {

inline bool current_device_is_sm90a() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return false;
  if (const int c = cache[dev].load(std::memory_order_acquire); c != 0) return c == 2;
  int major = 0, minor = 0;
  const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                  major == 9 && minor == 0;
  cache[dev].store(ok ? 2 : 1, std::memory_order_release);
  return ok;
}

}  // namespace flashseek::ops::cuda::detail
