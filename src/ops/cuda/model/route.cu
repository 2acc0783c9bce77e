// Router kernel of the whole-model GPU forward (model_kernels.h): the GPU twin of ops::route
// (scores, softmax denominator in index order, top-K with the CPU's tie rule).
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/route_row.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

// One warp per token: route_row (route_row.cuh).
constexpr int kRouteThreads = 128;
__global__ void route_kernel(RouteArgs a) {
  pdl_prologue();
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (t >= a.T) return;  // whole warps leave together
  route_row(a, t);
}

}  // namespace

cudaError_t launch_route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.K <= 0 || a.K > a.E) return cudaErrorInvalidValue;
  const int64_t per_block = kRouteThreads / 32;
  return launch_kernel(route_kernel, unsigned((a.T + per_block - 1) / per_block), kRouteThreads, 0, s, a);
}

}  // namespace flashseek::ops::cuda::detail
