// Attention kernel of the whole-model GPU forward (model_kernels.h): the GPU twin of
// ops::sparse_attention over the model's key list (window rows, then compressed rows). The softmax
// denominator runs in the CPU's order so that sums resolve the same way.
#include <cfloat>
#include <cstdlib>
#include <cstring>

#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

// Key j of query row t: window rows first (oldest first), then compressed rows. Ring and
// compressed rows are in their row formats (decoded on load), chunk rows FP32.
__device__ CacheRowRef attn_key(const ModelAttnArgs& a, int64_t t, int64_t j, int64_t n_win) {
  const int64_t p = a.start + t;
  if (j < n_win) {
    const int64_t s = p - n_win + 1 + j;
    if (s >= a.start)
      return {reinterpret_cast<const uint8_t*>(a.kv_chunk + (s - a.start) * a.Dh), CacheRowFormat{}};
    return {static_cast<const uint8_t*>(a.ring) + (s % a.ring_size) * cache_row_stride(a.ring_fmt, a.Dh), a.ring_fmt};
  }
  j -= n_win;
  const int64_t row = a.topk ? a.topk[t * a.topk_stride + j] : j;
  return {static_cast<const uint8_t*>(a.ckv) + row * cache_row_stride(a.ckv_fmt, a.Dh), a.ckv_fmt};
}

// One block per (query row, head). Shared: logits/probabilities of every key. With `seqs`, the
// row's sequence replaces the per-sequence fields and t becomes the row's index in it.
__global__ void model_attn_kernel(ModelAttnArgs a, const ModelAttnSeq* seqs, const int32_t* row_seq) {
  extern __shared__ float prob[];
  __shared__ float denom_s;
  int64_t t = blockIdx.x / a.H;
  if (seqs) {
    const ModelAttnSeq sq = seqs[row_seq[t]];
    a.q += sq.row0 * a.H * a.Dh;
    a.out += sq.row0 * a.H * a.Dh;
    a.kv_chunk += sq.row0 * a.Dh;
    if (a.topk) a.topk += sq.row0 * a.topk_stride, a.topk_n += sq.row0;
    a.ring = sq.ring, a.ring_size = sq.ring_size, a.start = sq.start;
    if (a.ckv) a.ckv = sq.ckv ? sq.ckv : static_cast<const void*>(a.kv_chunk);  // no compressed rows yet: never read
    t -= sq.row0;
  }
  const int64_t h = blockIdx.x % a.H, p = a.start + t;
  const int64_t n_win = p + 1 < a.window ? p + 1 : a.window;
  int64_t n_comp = 0;
  if (a.ckv) n_comp = a.topk ? a.topk_n[t] : (p + 1) / a.ratio;
  const int64_t n = n_win + n_comp;
  const float* q = a.q + (t * a.H + h) * a.Dh;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
    prob[j] = __fmul_rn(dev_dot_f32_ld(q, attn_key(a, t, j, n_win), a.Dh), a.scale);
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
  if (a.Dh % 4 == 0) {  // four outputs per thread from one load per key; each output's sum as below
    for (int64_t d = 4 * int64_t(threadIdx.x); d < a.Dh; d += 4 * int64_t(blockDim.x)) {
      float acc[4] = {0, 0, 0, 0};
      for (int64_t j = 0; j < n; ++j) {
        float w[4];
        attn_key(a, t, j, n_win).load4(d, w);
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[c] = mul_add(prob[j], w[c], acc[c]);
      }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float r = acc[c] / denom_s;
        o[d + c] = a.bf16 ? dev_round_bf16(r) : r;
      }
    }
    return;
  }
  for (int64_t d = threadIdx.x; d < a.Dh; d += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j < n; ++j) acc = mul_add(prob[j], attn_key(a, t, j, n_win)(d), acc);
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
  return launch_kernel(model_attn_kernel, unsigned(a.T * a.H), 128, smem, s, a,
                       static_cast<const ModelAttnSeq*>(nullptr), static_cast<const int32_t*>(nullptr));
}

cudaError_t launch_model_attention_seqs(const ModelAttnArgs& a, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                        cudaStream_t s) {
  if (a.T == 0) return cudaSuccess;
  if (!seqs || !row_seq || a.Dh <= 0 || a.H <= 0 || a.window <= 0 || (a.ckv && !a.topk && a.ratio <= 0))
    return cudaErrorInvalidValue;
  const size_t smem = size_t(a.max_keys) * sizeof(float);
  if (smem > 200 * 1024 || a.T * a.H > INT32_MAX) return cudaErrorInvalidValue;
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(model_attn_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return cudaGetLastError();
  return launch_kernel(model_attn_kernel, unsigned(a.T * a.H), 128, smem, s, a, seqs, row_seq);
}

namespace {
__global__ void ring_write_seqs_kernel(const ModelAttnSeq* seqs, const int32_t* row_seq, const float* kv,
                                       const int64_t* pos, int64_t rows, int64_t dim) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * dim) return;
  const int64_t r = id / dim, d = id % dim;
  const ModelAttnSeq sq = seqs[row_seq[r]];
  if (r - sq.row0 < sq.T - sq.ring_size) return;  // overwritten later in the same chunk
  static_cast<float*>(sq.ring)[(pos[r] % sq.ring_size) * dim + d] = kv[r * dim + d];
}
}  // namespace

cudaError_t launch_ring_write_seqs(const ModelAttnSeq* seqs, const int32_t* row_seq, const float* kv, const int64_t* pos,
                                   int64_t rows, int64_t dim, cudaStream_t s) {
  if (rows * dim == 0) return cudaSuccess;
  if (!seqs || !row_seq) return cudaErrorInvalidValue;
  return launch_kernel(ring_write_seqs_kernel, unsigned((rows * dim + 255) / 256), 256, 0, s, seqs, row_seq, kv, pos, rows, dim);
}

}  // namespace flashseek::ops::cuda::detail
