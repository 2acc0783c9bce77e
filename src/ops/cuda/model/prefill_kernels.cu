// Glue kernels of the prefill layer benchmark (see prefill_kernels.h).
#include "ops/cuda/model/prefill_kernels.h"

#include <cuda_fp8.h>

#include "ops/cuda/model/model_device.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

int grid_for(int64_t threads) {
  const int64_t b = (threads + 255) / 256;
  return int(b < 132 * 32 ? b : 132 * 32);
}

// One thread per 16 code bytes (and, for the first chunk of each 32-block, its FP32 scale):
// `cpb` 16-byte chunks per 32-block (2: e4m3 codes, 4: f16 values).
__global__ void __launch_bounds__(256) gather_fp8_rows_kernel(const uint8_t* src_q, const float* src_s,
                                                              const int32_t* rows, int64_t n_rows,
                                                              int64_t k, uint8_t* dst_q, float* dst_s,
                                                              int cpb) {
  const int64_t per_row = k / 32 * cpb, row_bytes = per_row * 16;
  const int64_t total = n_rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / per_row, c = i % per_row;
    const int64_t r = rows[p];
    // Plain loads: the codes and scales are written by the step's quantisation (runtime/pdl.cuh).
    reinterpret_cast<uint4*>(dst_q + p * row_bytes)[c] =
        *(reinterpret_cast<const uint4*>(src_q + r * row_bytes) + c);
    if (c % cpb == 0) dst_s[p * (k / 32) + c / cpb] = src_s[r * (k / 32) + c / cpb];
  }
}

// Eight outputs per thread; the 4 threads of a 32-block share its amax by shuffles (n % 32 == 0
// keeps every group of 4 consecutive threads inside one block of one row).
__global__ void __launch_bounds__(256) swiglu_quant_kernel(const float* gu, const float* weight,
                                                           int64_t rows, int64_t n, float limit,
                                                           uint8_t* xq, float* xs) {
  const int64_t per_row = n / 8;
  const int64_t total = rows * per_row;
  const int64_t total_r = (total + 31) / 32 * 32;  // whole warps run every iteration
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total_r;
       t += int64_t(gridDim.x) * blockDim.x) {
    const bool live = t < total;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    if (live) {
      const int64_t r = t / per_row, c = (t % per_row) * 8;
      const float* g = gu + r * 2 * n + c;
      const float* u = g + n;
      // Plain loads: gu and the routing weights are written by the step (runtime/pdl.cuh).
      const float w = weight ? weight[r] : 1.0f;
      const float4 g0 = *reinterpret_cast<const float4*>(g), g1 = *(reinterpret_cast<const float4*>(g) + 1);
      const float4 u0 = *reinterpret_cast<const float4*>(u), u1 = *(reinterpret_cast<const float4*>(u) + 1);
      const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
      const float uv[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float a = gv[i], b = uv[i];
        if (limit > 0) a = fminf(a, limit), b = fminf(fmaxf(b, -limit), limit);
        v[i] = a / (1.0f + __expf(-a)) * b * w;
      }
    }
    const float s = dev_fp8_block_scale(dev_fp8_block_amax(v, 32));
    const uint2 codes = dev_fp8_pack8(v, 1.0f / s);  // exact: s is a power of two
    if (live) {
      *reinterpret_cast<uint2*>(xq + t * 8) = codes;
      if ((t & 3) == 0) xs[t >> 2] = s;
    }
  }
}

__global__ void __launch_bounds__(256) combine_rows_kernel(const float* y, const int32_t* inv, const float* ys,
                                                           int64_t T, int64_t k, int64_t dim, float* out) {
  const int64_t per_row = dim / 4;
  const int64_t total = T * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_row, c = i % per_row;
    // Plain loads: y and ys are the step's expert outputs (runtime/pdl.cuh).
    float4 s = ys ? *(reinterpret_cast<const float4*>(ys + t * dim) + c) : make_float4(0, 0, 0, 0);
    for (int64_t j = 0; j < k; ++j) {
      const float4 v = *(reinterpret_cast<const float4*>(y + int64_t(inv[t * k + j]) * dim) + c);
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    reinterpret_cast<float4*>(out + t * dim)[c] = s;
  }
}

__global__ void __launch_bounds__(256) merge_row_of_kernel(const int32_t* a, int64_t na, const int32_t* b,
                                                           int64_t nb, int32_t b_off, int32_t* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < na) {
    out[i] = a ? a[i] : int32_t(i);
  } else if (i < na + nb) {
    const int64_t j = i - na;
    out[i] = b ? (b[j] < 0 ? -1 : b[j] + b_off) : int32_t(j) + b_off;
  }
}

}  // namespace

cudaError_t launch_merge_row_of(const int32_t* a, int64_t na, const int32_t* b, int64_t nb, int32_t b_off,
                                int32_t* out, cudaStream_t s) {
  if (na < 0 || nb < 0 || !out) return cudaErrorInvalidValue;
  if (na + nb == 0) return cudaSuccess;
  merge_row_of_kernel<<<unsigned((na + nb + 255) / 256), 256, 0, s>>>(a, na, b, nb, b_off, out);
  return cudaGetLastError();
}

cudaError_t launch_gather_fp8_rows(const uint8_t* src_q, const float* src_s, const int32_t* rows,
                                   int64_t n_rows, int64_t k, uint8_t* dst_q, float* dst_s,
                                   cudaStream_t s, int code_bytes) {
  if (n_rows <= 0) return cudaSuccess;
  if (k % 128 != 0 || (code_bytes != 1 && code_bytes != 2)) return cudaErrorInvalidValue;
  gather_fp8_rows_kernel<<<grid_for(n_rows * (k / 16) * code_bytes), 256, 0, s>>>(
      src_q, src_s, rows, n_rows, k, dst_q, dst_s, 2 * code_bytes);
  return cudaGetLastError();
}

cudaError_t launch_swiglu_quant_fp8(const float* gu, const float* weight, int64_t rows, int64_t n,
                                    float limit, uint8_t* xq, float* xs, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (n % 32 != 0) return cudaErrorInvalidValue;
  swiglu_quant_kernel<<<grid_for(rows * (n / 8)), 256, 0, s>>>(gu, weight, rows, n, limit, xq, xs);
  return cudaGetLastError();
}

cudaError_t launch_combine_rows(const float* y, const int32_t* inv, const float* ys, int64_t T,
                                int64_t k, int64_t dim, float* out, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  if (dim % 4 != 0) return cudaErrorInvalidValue;
  combine_rows_kernel<<<grid_for(T * (dim / 4)), 256, 0, s>>>(y, inv, ys, T, k, dim, out);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
