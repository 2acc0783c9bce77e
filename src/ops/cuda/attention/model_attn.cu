// Attention kernel of the whole-model GPU forward (model_kernels.h): the GPU twin of
// ops::sparse_attention over the model's key list (window rows, then compressed rows). The softmax
// denominator runs in the CPU's order so that sums resolve the same way.
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

// Key j of query row t: window rows first (oldest first), then compressed rows.
__device__ const float* attn_key(const ModelAttnArgs& a, int64_t t, int64_t j, int64_t n_win) {
  const int64_t p = a.start + t;
  if (j < n_win) {
    const int64_t s = p - n_win + 1 + j;
    return s >= a.start ? a.kv_chunk + (s - a.start) * a.Dh : a.ring + (s % a.ring_size) * a.Dh;
  }
  j -= n_win;
  const int64_t row = a.topk ? a.topk[t * a.topk_stride + j] : j;
  return a.ckv + row * a.Dh;
}

// One block per (query row, head). Shared: logits/probabilities of every key.
__global__ void model_attn_kernel(ModelAttnArgs a) {
  extern __shared__ float prob[];
  __shared__ float denom_s;
  const int64_t t = blockIdx.x / a.H, h = blockIdx.x % a.H, p = a.start + t;
  const int64_t n_win = p + 1 < a.window ? p + 1 : a.window;
  int64_t n_comp = 0;
  if (a.ckv) n_comp = a.topk ? a.topk_n[t] : (p + 1) / a.ratio;
  const int64_t n = n_win + n_comp;
  const float* q = a.q + (t * a.H + h) * a.Dh;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    prob[j] = __fmul_rn(dev_dot_f32(q, attn_key(a, t, j, n_win), a.Dh), a.scale);
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = fmaxf(m, prob[j]);
    float den = 0;
    for (int64_t j = 0; j < n; ++j) {
      const float e = dev_exp(prob[j] - m);
      den += e;
      prob[j] = a.bf16 ? dev_round_bf16(e) : e;
    }
    den += dev_exp(a.sink[h] - m);
    denom_s = den;
  }
  __syncthreads();
  float* o = a.out + (t * a.H + h) * a.Dh;
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j < n; ++j) acc = mul_add(prob[j], attn_key(a, t, j, n_win)[d], acc);
    acc /= denom_s;
    o[d] = a.bf16 ? dev_round_bf16(acc) : acc;
  }
}

}  // namespace

cudaError_t launch_model_attention(const ModelAttnArgs& a, cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (a.Dh <= 0 || a.H <= 0 || a.window <= 0 || (a.ckv && !a.topk && a.ratio <= 0)) return cudaErrorInvalidValue;
  const size_t smem = size_t(a.max_keys) * sizeof(float);
  if (smem > 200 * 1024) return cudaErrorInvalidValue;
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(model_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return cudaGetLastError();
  return launch_kernel(model_attn_kernel, unsigned(a.T * a.H), 128, smem, s, a);
}

}  // namespace flashseek::ops::cuda::detail
