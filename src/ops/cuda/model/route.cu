// Router kernel of the whole-model GPU forward (model_kernels.h): the GPU twin of ops::route
// (scores, softmax denominator in index order, top-K with the CPU's tie rule).
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

// One warp per token (ops::route): scores in parallel, the softmax denominator in index order by
// lane 0, top-K by K warp argmaxes (value desc, lower expert id first), the weights by lane 0.
constexpr int kRouteThreads = 128;
__global__ void route_kernel(RouteArgs a) {
  pdl_prologue();
  const int64_t t = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x & 31);
  if (t >= a.T) return;  // whole warps leave together
  const int64_t E = a.E, K = a.K;
  const float* lg = a.logits + t * E;
  float* score = a.scratch + t * 2 * E;
  float* key = score + E;
  if (a.sqrtsoftplus) {
    for (int64_t e = lane; e < E; e += 32) {
      const float x = lg[e] / a.gate_temp;
      score[e] = sqrtf(x > 20.0f ? x : dev_log1p(dev_exp(x)));
    }
  } else {
    float m = lg[0] / a.gate_temp;
    for (int64_t e = 1 + lane; e < E; e += 32) m = fmaxf(m, lg[e] / a.gate_temp);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    for (int64_t e = lane; e < E; e += 32) score[e] = dev_exp(lg[e] / a.gate_temp - m);
    __syncwarp();
    float s = 0;
    if (lane == 0)
      for (int64_t e = 0; e < E; ++e) s += score[e];
    s = __shfl_sync(0xffffffffu, s, 0);
    for (int64_t e = lane; e < E; e += 32) score[e] /= s;
  }
  __syncwarp();
  int32_t* sel = a.sel + t * K;
  if (a.tid2eid) {
    for (int64_t i = lane; i < K; i += 32) sel[i] = a.tid2eid[int64_t(a.tokens[t]) * K + i];
  } else {
    for (int64_t e = lane; e < E; e += 32) key[e] = score[e] + (a.bias ? a.bias[e] : 0.0f);
    __syncwarp();
    for (int64_t i = 0; i < K; ++i) {
      float bv = 0;
      int64_t bi = -1;
      for (int64_t e = lane; e < E; e += 32) {
        const float x = key[e];
        if (isnan(x)) continue;  // taken
        if (bi < 0 || x > bv) bv = x, bi = e;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
      }
      if (lane == 0) sel[i] = int32_t(bi);
      if (bi >= 0 && lane == int(bi & 31)) key[bi] = NAN;
      __syncwarp();
    }
  }
  __syncwarp();
  if (lane != 0) return;
  for (int64_t i = 1; i < K; ++i)  // ascending expert id
    for (int64_t j = i; j > 0 && sel[j] < sel[j - 1]; --j) {
      const int32_t x = sel[j];
      sel[j] = sel[j - 1];
      sel[j - 1] = x;
    }
  float sum = 0;
  for (int64_t i = 0; i < K; ++i) sum += score[sel[i]];
  for (int64_t i = 0; i < K; ++i) {
    float w = score[sel[i]];
    if (a.norm_topk) {
      if (!a.renorm_eps) w /= sum;
      else if (K > 1) w /= (sum + 1e-20f);
    }
    // A repeated hash id (tid2eid) counts in the denominator but contributes once (ops::route).
    a.weight[t * K + i] = i > 0 && sel[i] == sel[i - 1] ? 0.0f : w * a.route_scale;
  }
}

}  // namespace

cudaError_t launch_route(const RouteArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.K <= 0 || a.K > a.E) return cudaErrorInvalidValue;
  const int64_t per_block = kRouteThreads / 32;
  return launch_kernel(route_kernel, unsigned((a.T + per_block - 1) / per_block), kRouteThreads, 0, s, a);
}

}  // namespace flashseek::ops::cuda::detail
