// RMSNorm and RoPE kernels, written to match the CPU reference's rounding: the RoPE products are
// kept unfused and cos/sin are taken in double and rounded to FP32, as ops::apply_rope does
// (model_device.cuh dev_rope_trig / dev_rope_pair), so results are bitwise equal to the CPU;
// RMSNorm is the model's kernel (launch_model_rms_norm: the CPU's double sum of squares in its
// order), bitwise as well.
#include <cuda_bf16.h>

#include <algorithm>

#include "ops/cuda/cache/cache_pack.cuh"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

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
  for (int64_t f = threadIdx.x; f < half; f += blockDim.x)
    dev_rope_trig(p, inv_freq[f], inverse, trig[f], trig[half + f]);
  __syncthreads();
  if (!live) return;
  dev_rope_pair(a, b, trig[i], trig[half + i], bf16_out);
  v[0] = a;
  v[1] = b;
}

// ops::rms_norm, ops::apply_rope (forward, one vector per row) and the FP8 simulation of a row
// prefix (ops::fp8_quant_dequant) in one launch, for the window KV rows (<= kSumChunk values): one
// block per row, warp i holding values 128i + 4·lane + q, the layout of rms_norm_kernel's one
// chunk. The squares go through shared memory to warp 0, which adds them in rms_norm_kernel's
// per-lane order and folds the lanes as it does (lane 0's sum); the RoPE table is made as
// rope_kernel makes it, while the loads are in flight; a quantisation block is qblock / 4 lanes of
// one warp (its max by shuffles: order-free). Every value takes the three kernels' expressions, so
// the bits are theirs, from one launch of ~dim / 4 threads instead of three. With a ring, the
// block then writes the finished row to ring slot pos % ring_size in format rf, each warp packing
// units of it as pack_ring_kernel's warps do (the same bytes), so that the ring write needs no
// launch of its own; the block then has a warp per unit when the row has more units than value
// warps.
constexpr int kNrqMaxWarps = int(kSumChunk / 128);  // warps holding values
constexpr int kNrqMaxThreads = 1024;
__global__ void __launch_bounds__(kNrqMaxThreads) norm_rope_quant_kernel(float* x, const float* w, const int64_t* pos,
                                                                        const float* inv_freq, int dim, int rope_dim,
                                                                        float eps, bool bf16, int qprefix, int qblock,
                                                                        uint8_t* ring, int64_t ring_size,
                                                                        CacheRowFormat rf) {
  pdl_prologue();
  __shared__ double sq[kNrqMaxWarps][32][4];
  __shared__ float trig[kSumChunk];  // [half] cos, [half] sin
  __shared__ float r_inv;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), nwarps = int(blockDim.x / 32);
  const int k0 = 128 * warp + 4 * lane;  // dim % 4 == 0: the four values are all in the row or all out
  const bool live = k0 < dim;
  float* xr = x + int64_t(blockIdx.x) * dim;
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f), g = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
  if (live) {
    v = *reinterpret_cast<const float4*>(xr + k0);  // not __ldg: written by the step's previous kernel
    if (w) g = ld_weight(reinterpret_cast<const float4*>(w + k0));
  }
  const int half = rope_dim / 2, roff = dim - rope_dim;
  const float p = half > 0 ? float(pos[blockIdx.x]) : 0.0f;
  for (int f = int(threadIdx.x); f < half; f += int(blockDim.x))
    dev_rope_trig(p, ld_weight(inv_freq + f), false, trig[f], trig[half + f]);
  if (live) {
    sq[warp][lane][0] = __dmul_rn(double(v.x), double(v.x)), sq[warp][lane][1] = __dmul_rn(double(v.y), double(v.y));
    sq[warp][lane][2] = __dmul_rn(double(v.z), double(v.z)), sq[warp][lane][3] = __dmul_rn(double(v.w), double(v.w));
  }
  __syncthreads();
  if (warp == 0) {
    double s[4] = {0, 0, 0, 0};
    for (int i = 0; i < nwarps && i < kNrqMaxWarps; ++i)
      if (128 * i + 4 * lane < dim)
#pragma unroll
        for (int q = 0; q < 4; ++q) s[q] = __dadd_rn(s[q], sq[i][lane][q]);
    double t = __dadd_rn(__dadd_rn(s[0], s[1]), __dadd_rn(s[2], s[3]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t = __dadd_rn(t, __shfl_xor_sync(0xffffffffu, t, o));
    if (lane == 0) r_inv = 1.0f / sqrtf(__fadd_rn(float(t / double(dim)), eps));
  }
  __syncthreads();
  const float ri = r_inv;
  float e[4] = {v.x, v.y, v.z, v.w};
  const float gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float t = __fmul_rn(e[q], ri);
    if (w) t = __fmul_rn(t, gw[q]);
    e[q] = bf16 ? dev_round_bf16(t) : t;
  }
  if (live && k0 + 2 >= roff) {  // roff even: the pairs (k, k + 1) are (q, q + 1) for q = 0, 2
#pragma unroll
    for (int q = 0; q < 4; q += 2) {
      if (k0 + q < roff) continue;  // roff % 4 == 2: this thread's first pair is not rotated
      const int i = (k0 + q - roff) / 2;
      dev_rope_pair(e[q], e[q + 1], trig[i], trig[half + i], bf16);
    }
  }
  if (qblock > 0) {  // a block is the lanes [lane - lane % (qblock / 4), +qblock / 4) of this warp
    const bool in = k0 < qprefix;
    float amax = 0;
    if (in)
#pragma unroll
      for (int q = 0; q < 4; ++q) amax = fmaxf(amax, fabsf(e[q]));
    for (int o = qblock / 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (in) {
      const float sc = dev_pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
#pragma unroll
      for (int q = 0; q < 4; ++q) e[q] = dev_round_e4m3(fminf(fmaxf(e[q] / sc, -448.0f), 448.0f)) * sc;
    }
  }
  if (live) *reinterpret_cast<float4*>(xr + k0) = make_float4(e[0], e[1], e[2], e[3]);
  if (ring) {
    __syncthreads();  // the row as stored above, visible to every warp of the block
    uint8_t* slot = ring + (pos[blockIdx.x] % ring_size) * cache_row_stride(rf, rf.dim);
    const int64_t units = row_pack::warps_per_row(rf);
    for (int64_t u = warp; u < units; u += nwarps) row_pack::pack_row_unit(rf, xr, slot, u, nullptr);
  }
}

}  // namespace

bool norm_rope_quant_supports(const float* x, int64_t dim, int64_t rope_dim, int64_t qprefix, int64_t qblock) {
  const bool quant_ok = qblock == 0 || (qblock >= 4 && qblock <= 128 && (qblock & (qblock - 1)) == 0 &&
                                        qprefix >= 0 && qprefix <= dim && qprefix % qblock == 0);
  return x && (reinterpret_cast<uintptr_t>(x) & 15) == 0 && dim >= 4 && dim <= kSumChunk && dim % 4 == 0 &&
         rope_dim >= 0 && rope_dim <= dim && rope_dim % 2 == 0 && quant_ok;
}

cudaError_t launch_norm_rope_quant(float* x, const float* w, const int64_t* pos, const float* inv_freq, int64_t rows,
                                   int64_t dim, int64_t rope_dim, float eps, bool bf16, int64_t qprefix,
                                   int64_t qblock, cudaStream_t stream, const NormRopeQuantRing* ring) {
  if (rows < 0 || rows > INT32_MAX || !norm_rope_quant_supports(x, dim, rope_dim, qprefix, qblock) ||
      (w && (reinterpret_cast<uintptr_t>(w) & 15) != 0) || (rope_dim > 0 && (!pos || !inv_freq)))
    return cudaErrorInvalidValue;
  int64_t warps = (dim + 127) / 128;
  if (ring) {
    if (!ring->ring || !pos || ring->ring_size < rows || ring->format.dim != dim || !cache_row_packable(ring->format) ||
        row_pack::warps_per_row(ring->format) > kNrqMaxThreads / 32)
      return cudaErrorInvalidValue;
    warps = std::max<int64_t>(warps, row_pack::warps_per_row(ring->format));
  }
  if (rows == 0) return cudaSuccess;
  return launch_kernel(norm_rope_quant_kernel, unsigned(rows), unsigned(warps * 32), 0, stream, x, w, pos, inv_freq,
                       int(dim), int(rope_dim), eps, bf16, int(qprefix), int(qblock),
                       ring ? static_cast<uint8_t*>(ring->ring) : nullptr, ring ? ring->ring_size : int64_t(1),
                       ring ? ring->format : CacheRowFormat{});
}

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
