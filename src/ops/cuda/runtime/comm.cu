// Small kernels of the tensor/expert-parallel path (declared in comm.h).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

__global__ void remap_experts_kernel(int32_t* sel, float* weight, int64_t n, int32_t e0, int32_t n_local) {
  pdl_prologue();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t e = sel[i] - e0;
  if (e >= 0 && e < n_local) {
    sel[i] = e;
  } else {  // dispatch by masking: the expert linears skip sel < 0 (they write zeros)
    sel[i] = -1;
    weight[i] = 0.0f;
  }
}

}  // namespace

cudaError_t launch_tp_remap_experts(int32_t* sel, float* weight, int64_t n, int32_t e0, int32_t n_local,
                                    cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int threads = 256;
  return launch_kernel(remap_experts_kernel, unsigned((n + threads - 1) / threads), threads, 0, s, sel, weight, n, e0, n_local);
}

}  // namespace flashseek::ops::cuda::detail
