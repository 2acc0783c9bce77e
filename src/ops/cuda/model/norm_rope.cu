// RMSNorm and RoPE kernels, written to match the CPU reference's rounding: the RoPE products are
// kept unfused (__fmul_rn/__fadd_rn) and cos/sin are taken in double and rounded to FP32, as
// ops::apply_rope does, so results are bitwise equal to the CPU; RMSNorm is the model's kernel
// (launch_model_rms_norm: the CPU's double sum of squares in its order), bitwise as well.
#include <cuda_bf16.h>

#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// A block per (row, kRopeThreads pairs of the row's n_vec x rope_dim/2): the row's cos / sin per
// frequency once per block (in double, rounded to FP32, a shared-memory table) instead of once
// per pair, each thread's pair loaded before the table barrier; every pair gets the products and
// sums of ops::apply_rope.
constexpr int kRopeThreads = 256;
__global__ void rope_kernel(float* x, const int64_t* pos, const float* inv_freq, int64_t n_vec, int64_t vec_dim,
                            int64_t rope_dim, int64_t pblocks, bool inverse, bool bf16_out) {
  pdl_prologue();
  extern __shared__ float trig[];  // [half] cos, [half] sin
  const int64_t half = rope_dim / 2, r = blockIdx.x / pblocks;
  const int64_t id = (blockIdx.x % pblocks) * kRopeThreads + threadIdx.x;  // pair of the row
  const bool live = id < n_vec * half;
  const int64_t i = live ? id % half : 0;
  float* v = x + r * n_vec * vec_dim + (vec_dim - rope_dim) + (live ? (id / half) * vec_dim + 2 * i : 0);
  float a = 0, b = 0;
  if (live) a = v[0], b = v[1];
  const float p = float(pos[r]);
  for (int64_t f = threadIdx.x; f < half; f += blockDim.x) {
    const float ang = __fmul_rn(p, inv_freq[f]);
    const float sn = float(sin(double(ang)));
    trig[f] = float(cos(double(ang)));
    trig[half + f] = inverse ? -sn : sn;
  }
  __syncthreads();
  if (!live) return;
  const float cs = trig[i], sn = trig[half + i];
  float ra = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
  float rb = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
  if (bf16_out) ra = round_bf16(ra), rb = round_bf16(rb);
  v[0] = ra;
  v[1] = rb;
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                            float eps, bool bf16_out, cudaStream_t stream) {
  return launch_model_rms_norm(x, w, y, rows, dim, eps, bf16_out, stream);
}

cudaError_t launch_rope(float* x, const int64_t* pos, const float* inv_freq, int64_t rows,
                        int64_t n_vec, int64_t vec_dim, int64_t rope_dim, bool inverse,
                        bool bf16_out, cudaStream_t stream) {
  const int64_t half = rope_dim / 2, pairs = n_vec * half;
  if (rows <= 0 || pairs <= 0) return rows < 0 || pairs < 0 ? cudaErrorInvalidValue : cudaSuccess;
  const int64_t pblocks = (pairs + kRopeThreads - 1) / kRopeThreads;
  if (rows * pblocks > INT32_MAX || size_t(rope_dim) * sizeof(float) > 48 * 1024) return cudaErrorInvalidValue;
  const int threads = pairs >= kRopeThreads ? kRopeThreads : int((pairs + 31) / 32 * 32);
  return launch_kernel(rope_kernel, unsigned(rows * pblocks), threads, size_t(rope_dim) * sizeof(float), stream, x, pos,
                       inv_freq, n_vec, vec_dim, rope_dim, pblocks, inverse, bf16_out);
}

}  // namespace flashseek::ops::cuda::detail
