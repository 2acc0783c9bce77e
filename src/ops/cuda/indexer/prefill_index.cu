// Indexer scores on the tensor cores for prefill (see prefill_kernels.h): one block owns 16 query
// rows (their 16 x 32 head vectors as BF16 in shared memory, 136 KB) and a range of 2048 keys,
// streamed in tiles of 64 keys (FP32 → BF16, register-prefetched double buffer). 8 warps, warp w
// owns queries 2w, 2w+1 (four m16 tiles of heads) x the tile's 64 keys: S = Q·Kᵀ by
// mma.m16n8k16 (FP32 accumulate), then relu(S) · w[t, h] summed over the 32 heads in registers
// and by shuffles; keys a query cannot see (>= (start + t + 1) / ratio) get −inf.
#include <cuda_bf16.h>

#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/runtime/smem_limit.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kNh = 32, kDi = 128, kLd = kDi + 8;  // +8 BF16: rows 4 banks apart
constexpr int kQb = 16, kKt = 64, kRange = 2048, kThreads = 256;
constexpr int kSmem = (kQb * kNh + 2 * kKt) * kLd * 2;

__global__ void __launch_bounds__(kThreads, 1) index_scores_mma_kernel(IndexScoreMmaArgs a) {
  extern __shared__ __align__(16) uint16_t sm[];
  __shared__ float w_s[kQb * kNh];
  uint16_t* q_s = sm;                   // [16·32][kLd]
  uint16_t* k_s0 = q_s + kQb * kNh * kLd;  // 2 x [64][kLd]
  const int64_t t0 = int64_t(blockIdx.y) * kQb;
  const int64_t key_lo = int64_t(blockIdx.x) * kRange;
  const int64_t key_hi = min(a.stride, key_lo + kRange);
  // Visible keys of the block's last query (the most of any of its rows).
  const int64_t t_last = min(a.T, t0 + kQb) - 1;
  const int64_t vis_max = min(a.stride, (a.start + t_last + 1) / a.ratio);
  const int64_t comp_hi = min(key_hi, vis_max);
  const int n_tiles = comp_hi > key_lo ? int((comp_hi - key_lo + kKt - 1) / kKt) : 0;
  // Keys past every row's reach: −inf only.
  for (int64_t i = threadIdx.x; i < kQb * (key_hi - max(key_lo, comp_hi)); i += kThreads) {
    const int64_t w = key_hi - max(key_lo, comp_hi);
    const int64_t r = i / w, s = max(key_lo, comp_hi) + i % w;
    if (t0 + r < a.T) a.scores[(t0 + r) * a.stride + s] = -INFINITY;
  }
  if (n_tiles == 0) return;
  for (int i = threadIdx.x; i < kQb * kNh; i += kThreads)
    w_s[i] = t0 + i / kNh < a.T ? a.w[(t0 + i / kNh) * kNh + i % kNh] : 0.0f;
  for (int i = threadIdx.x; i < kQb * kNh * kDi / 4; i += kThreads) {  // Q → BF16
    const int row = i / (kDi / 4), d = (i % (kDi / 4)) * 4;
    float4 v = make_float4(0, 0, 0, 0);
    if (t0 + row / kNh < a.T) v = *reinterpret_cast<const float4*>(a.q + (t0 * kNh + row) * kDi + d);
    uint32_t* dst = reinterpret_cast<uint32_t*>(q_s + row * kLd + d);
    dst[0] = dev_pack_bf16x2(v.x, v.y), dst[1] = dev_pack_bf16x2(v.z, v.w);
  }
  constexpr int kPer = kKt * kDi / 4 / kThreads;  // float4 per thread per key tile (8)
  float4 pre[kPer];
  // q and keys are step-written: plain loads, not ld.global.nc (runtime/pdl.cuh).
  auto fetch = [&](int tile) {
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int i = threadIdx.x + u * kThreads, j = i / (kDi / 4), d = (i % (kDi / 4)) * 4;
      const int64_t s = key_lo + int64_t(tile) * kKt + j;
      pre[u] = s < a.stride ? *reinterpret_cast<const float4*>(a.keys + s * kDi + d) : make_float4(0, 0, 0, 0);
    }
  };
  auto stash = [&](int buf) {
    uint16_t* k_s = k_s0 + buf * kKt * kLd;
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int i = threadIdx.x + u * kThreads, j = i / (kDi / 4), d = (i % (kDi / 4)) * 4;
      uint32_t* dst = reinterpret_cast<uint32_t*>(k_s + j * kLd + d);
      dst[0] = dev_pack_bf16x2(pre[u].x, pre[u].y), dst[1] = dev_pack_bf16x2(pre[u].z, pre[u].w);
    }
  };
  fetch(0);
  stash(0);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q_s);
  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) fetch(tile + 1);
    const uint32_t* k32 = reinterpret_cast<const uint32_t*>(k_s0 + (tile & 1) * kKt * kLd);
    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0;
#pragma unroll 2
    for (int kk = 0; kk < kDi; kk += 16) {
      uint32_t af[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r0 = (4 * warp + i) * 16 + g;
        af[i][0] = q32[(r0 * kLd + kk + 2 * c) / 2];
        af[i][1] = q32[((r0 + 8) * kLd + kk + 2 * c) / 2];
        af[i][2] = q32[(r0 * kLd + kk + 2 * c + 8) / 2];
        af[i][3] = q32[((r0 + 8) * kLd + kk + 2 * c + 8) / 2];
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t bf[2];
        bf[0] = k32[((j * 8 + g) * kLd + kk + 2 * c) / 2];
        bf[1] = k32[((j * 8 + g) * kLd + kk + 2 * c + 8) / 2];
#pragma unroll
        for (int i = 0; i < 4; ++i) dev_mma_bf16_16816(acc[i][j], af[i], bf);
      }
    }
    // relu · weight, summed over the 32 heads of each of the warp's two queries.
#pragma unroll
    for (int qi = 0; qi < 2; ++qi) {
      const int ql = 2 * warp + qi;  // query within the block
      const float* wq = w_s + ql * kNh;
      const float w0 = wq[g], w1 = wq[g + 8], w2 = wq[16 + g], w3 = wq[16 + g + 8];
      float v[8][2];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float* lo = acc[2 * qi][j];       // heads g (e), g + 8 (e + 2)
          const float* hi = acc[2 * qi + 1][j];   // heads 16 + g, 16 + g + 8
          v[j][e] = fmaxf(lo[e], 0.0f) * w0 + fmaxf(lo[e + 2], 0.0f) * w1 + fmaxf(hi[e], 0.0f) * w2 +
                    fmaxf(hi[e + 2], 0.0f) * w3;
          v[j][e] += __shfl_xor_sync(0xffffffffu, v[j][e], 4);
          v[j][e] += __shfl_xor_sync(0xffffffffu, v[j][e], 8);
          v[j][e] += __shfl_xor_sync(0xffffffffu, v[j][e], 16);
        }
      const int64_t t = t0 + ql;
      if (g == 0 && t < a.T) {
        const int64_t vis = min(a.stride, (a.start + t + 1) / a.ratio);
        float* row = a.scores + t * a.stride;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t s = key_lo + int64_t(tile) * kKt + j * 8 + 2 * c + e;
            if (s < key_hi) row[s] = s < vis ? v[j][e] : -INFINITY;
          }
      }
    }
    if (tile + 1 < n_tiles) stash((tile + 1) & 1);
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_index_scores_mma(const IndexScoreMmaArgs& a, cudaStream_t s) {
  if (a.T < 0 || a.stride < 0 || a.ratio < 1 || a.start < 0) return cudaErrorInvalidValue;
  if (a.T == 0 || a.stride == 0) return cudaSuccess;
  if ((a.T + kQb - 1) / kQb > 65535) return cudaErrorInvalidValue;
  static std::atomic<uint64_t> attr{0};  // per device (smem_limit.cuh)
  if (const cudaError_t e = ensure_smem_limit(reinterpret_cast<const void*>(index_scores_mma_kernel), kSmem, attr);
      e != cudaSuccess)
    return e;
  const dim3 grid(unsigned((a.stride + kRange - 1) / kRange), unsigned((a.T + kQb - 1) / kQb));
  index_scores_mma_kernel<<<grid, kThreads, kSmem, s>>>(a);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
