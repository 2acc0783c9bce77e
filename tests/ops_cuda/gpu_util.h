// GPU test helpers: skip visibly without a device, RAII device buffers, poisoned outputs.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/cuda/runtime/cuda_check.h"

namespace flashseek::ops::cuda::testing {

#define FS_REQUIRE_GPU()                                                 \
  do {                                                                   \
    std::string _why;                                                    \
    if (!::flashseek::ops::cuda::cuda_device_available(&_why))           \
      GTEST_SKIP() << "GPU test skipped: " << _why;                      \
  } while (0)

#define FS_ASSERT_OK(expr)                                   \
  do {                                                       \
    const ::flashseek::Status _s = (expr);                   \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.to_string(); \
  } while (0)

// Device copy of a host vector; `poison` fills the device memory with 0xFF bytes (NaN floats) so
// that unwritten outputs show up.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(1, n) * sizeof(T)) != cudaSuccess) p_ = nullptr;
    if (p_) cudaMemset(p_, 0xFF, std::max<size_t>(1, n) * sizeof(T));
  }
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) {
    if (p_ && !h.empty()) cudaMemcpy(p_, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { if (p_) cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  bool ok() const { return p_ != nullptr; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    if (p_ && n_) cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace flashseek::ops::cuda::testing
