// Router kernel of the whole-model GPU forward (model_kernels.h): the GPU twin of ops::route
// (scores, softmax denominator in index order, top-K with the CPU's tie rule).
#include <cfloat>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

// One block per token (ops::route). The scores and keys are computed by the whole block, one
// expert per thread, into shared memory (or, where 2E floats do not fit, the caller's scratch):
// the per-expert functions (double-precision exp / log1p) are long dependent chains, so spreading
// them over the block instead of one warp's lanes is most of the kernel's time. Then warp 0 runs
// ops::route's order: the softmax denominator in index order by lane 0, top-K by K warp argmaxes
// (value desc, lower expert id first), the weights by lane 0. Every value and sum is computed as
// in the warp-per-token form it replaces (the same expressions, the same orders).
constexpr int kRouteThreads = 256;
constexpr int64_t kRouteMaxSmemFloats = 11 * 1024;  // 2E floats in shared memory up to E = 5632 (44 KB)

__global__ void __launch_bounds__(kRouteThreads) route_kernel(RouteArgs a) {
  pdl_prologue();
  extern __shared__ float route_smem[];
  __shared__ float red[kRouteThreads / 32];
  const int64_t t = blockIdx.x;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int64_t E = a.E, K = a.K;
  const float* lg = a.logits + t * E;
  const bool in_smem = 2 * E <= kRouteMaxSmemFloats;
  float* score = in_smem ? route_smem : a.scratch + t * 2 * E;
  float* key = score + E;
  if (a.sqrtsoftplus) {
    for (int64_t e = tid; e < E; e += kRouteThreads) {
      const float x = lg[e] / a.gate_temp;
      score[e] = sqrtf(x > 20.0f ? x : dev_log1p(dev_exp(x)));
    }
  } else {
    // The max is order-free (fmaxf); the denominator keeps index order.
    float m = lg[0] / a.gate_temp;
    for (int64_t e = 1 + tid; e < E; e += kRouteThreads) m = fmaxf(m, lg[e] / a.gate_temp);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = red[0];
    for (int w = 1; w < kRouteThreads / 32; ++w) m = fmaxf(m, red[w]);
    for (int64_t e = tid; e < E; e += kRouteThreads) score[e] = dev_exp(lg[e] / a.gate_temp - m);
    __syncthreads();
    if (tid == 0) {
      float s = 0;
      for (int64_t e = 0; e < E; ++e) s += score[e];
      red[0] = s;
    }
    __syncthreads();
    const float s = red[0];
    for (int64_t e = tid; e < E; e += kRouteThreads) score[e] /= s;
  }
  if (!a.tid2eid)
    for (int64_t e = tid; e < E; e += kRouteThreads) key[e] = score[e] + (a.bias ? a.bias[e] : 0.0f);
  __syncthreads();
  if (warp != 0) return;
  int32_t* sel = a.sel + t * K;
  if (a.tid2eid) {
    for (int64_t i = lane; i < K; i += 32) sel[i] = a.tid2eid[int64_t(a.tokens[t]) * K + i];
  } else {
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
  if (a.T > INT32_MAX) return cudaErrorInvalidValue;
  const size_t smem = 2 * a.E <= kRouteMaxSmemFloats ? size_t(2 * a.E) * sizeof(float) : 0;
  return launch_kernel(route_kernel, unsigned(a.T), kRouteThreads, smem, s, a);
}

}  // namespace flashseek::ops::cuda::detail
