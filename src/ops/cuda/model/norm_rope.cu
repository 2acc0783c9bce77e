// RMSNorm and RoPE kernels, written to match the CPU reference's rounding: the RoPE products are
// kept unfused (__fmul_rn/__fadd_rn) and cos/sin are taken in double and rounded to FP32, as
// ops::apply_rope does, so results are bitwise equal to the CPU; RMSNorm sums squares in FP32
// (the CPU in double), so it agrees to a few ulps.
#include <cuda_bf16.h>

#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/runtime/launch.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// One block per row: [rows, dim].
__global__ void rms_norm_kernel(const float* x, const float* w, float* y, int64_t dim, float eps,
                                bool bf16_out) {
  __shared__ float part[32];
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x == 0) part[0] = ss;
  }
  __syncthreads();
  const float mean = part[0] / float(dim);
  const float r_inv = 1.0f / sqrtf(mean + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = __fmul_rn(xr[i], r_inv);
    if (w) v = __fmul_rn(v, w[i]);
    yr[i] = bf16_out ? round_bf16(v) : v;
  }
}

// One thread per rotated pair: [rows, n_vec, rope_dim/2].
__global__ void rope_kernel(float* x, const int64_t* pos, const float* inv_freq, int64_t rows,
                            int64_t n_vec, int64_t vec_dim, int64_t rope_dim, bool inverse,
                            bool bf16_out) {
  const int64_t half = rope_dim / 2;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * n_vec * half) return;
  const int64_t i = id % half, rv = id / half, r = rv / n_vec;
  const float ang = __fmul_rn(float(pos[r]), inv_freq[i]);
  const float cs = float(cos(double(ang)));
  float sn = float(sin(double(ang)));
  if (inverse) sn = -sn;
  float* v = x + rv * vec_dim + (vec_dim - rope_dim) + 2 * i;
  const float a = v[0], b = v[1];
  float ra = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
  float rb = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
  if (bf16_out) ra = round_bf16(ra), rb = round_bf16(rb);
  v[0] = ra;
  v[1] = rb;
}

}  // namespace

cudaError_t launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim,
                            float eps, bool bf16_out, cudaStream_t stream) {
  const int threads = dim >= 1024 ? 512 : 128;
  return launch_kernel(rms_norm_kernel, unsigned(rows), threads, 0, stream, x, w, y, dim, eps, bf16_out);
}

cudaError_t launch_rope(float* x, const int64_t* pos, const float* inv_freq, int64_t rows,
                        int64_t n_vec, int64_t vec_dim, int64_t rope_dim, bool inverse,
                        bool bf16_out, cudaStream_t stream) {
  const int64_t total = rows * n_vec * (rope_dim / 2);
  const int threads = 256;
  return launch_kernel(rope_kernel, unsigned((total + threads - 1) / threads), threads, 0, stream,
      x, pos, inv_freq, rows, n_vec, vec_dim, rope_dim, inverse, bf16_out);
}

}  // namespace flashseek::ops::cuda::detail
