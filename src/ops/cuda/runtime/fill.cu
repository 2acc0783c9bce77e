// Random data made on the device for benchmarks (weights of a layer slice never leave the GPU).
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

__device__ __forceinline__ uint64_t mix(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_bytes_kernel(uint8_t* p, int64_t n, uint64_t seed, int kind) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint8_t b = uint8_t(mix(seed + uint64_t(i)));
    if (kind == 1 && (b & 0x7f) == 0x7f) b &= 0xfe;
    if (kind == 2) b = uint8_t(119 + b % 5);
    p[i] = b;
  }
}

__global__ void fill_floats_kernel(float* p, int64_t n, uint64_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t r = uint32_t(mix(seed + uint64_t(i)) >> 40);  // 24 bits
    p[i] = (float(r) * (1.0f / 8388608.0f) - 1.0f) * scale;
  }
}

}  // namespace

cudaError_t launch_fill_bytes(uint8_t* p, int64_t n, uint64_t seed, int kind, cudaStream_t stream) {
  fill_bytes_kernel<<<1024, 256, 0, stream>>>(p, n, seed, kind);
  return cudaGetLastError();
}

cudaError_t launch_fill_floats(float* p, int64_t n, uint64_t seed, float scale, cudaStream_t stream) {
  fill_floats_kernel<<<1024, 256, 0, stream>>>(p, n, seed, scale);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
