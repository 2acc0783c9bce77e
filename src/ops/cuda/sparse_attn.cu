// Split-KV sparse MQA decode attention with sinks (CUDA cores). One block per (query, split):
// the block holds the query's heads in shared memory, walks its slice of the index list in tiles
// of 16 keys (each BF16 row read once for all heads: K = V is shared by every head), keeps an
// online softmax per head and writes unnormalised partials; a combine kernel merges the splits
// and adds the sink to the denominator (v4 §3.5.7).
#include <cuda_bf16.h>

#include <cmath>

#include "ops/cuda/small_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 16;
constexpr int kMaxHeads = 64;

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

// Loads the tile's rows (invalid keys: row -1, zeros) into k_s [kTile][dim].
__device__ void load_tile(const AttnArgs& a, int t, int k0, int k_end, int* key_row, float* k_s) {
  if (threadIdx.x < kTile) {
    const int s = k0 + threadIdx.x;
    int r = s < k_end ? a.idx[int64_t(t) * a.n_idx + s] : -1;
    key_row[threadIdx.x] = (r >= 0 && r < a.n_rows) ? r : -1;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kTile * a.dim; i += kThreads) {
    const int j = i / a.dim, d = i % a.dim, r = key_row[j];
    k_s[i] = r >= 0 ? bf16_bits_to_f32(a.kv[int64_t(r) * a.dim + d]) : 0.0f;
  }
  __syncthreads();
}

// Scaled logits p_s[h][j] (−inf for absent keys), one warp per (head, key) pair.
__device__ void tile_logits(const AttnArgs& a, const int* key_row, const float* q_s,
                            const float* k_s, float* p_s) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int pr = warp; pr < a.heads * kTile; pr += kThreads / 32) {
    const int h = pr / kTile, j = pr % kTile;
    float dot = 0;
    if (key_row[j] >= 0) {
      for (int d = lane; d < a.dim; d += 32) dot = fmaf(q_s[h * a.dim + d], k_s[j * a.dim + d], dot);
      for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    }
    if (lane == 0) p_s[h * kTile + j] = key_row[j] >= 0 ? dot * a.scale : -INFINITY;
  }
}

__global__ void __launch_bounds__(kThreads, 1) attn_split_kernel(AttnArgs a) {
  extern __shared__ float smem[];
  __shared__ int key_row[kTile];
  float* q_s = smem;                     // [heads][dim]
  float* k_s = q_s + a.heads * a.dim;    // [kTile][dim]
  float* p_s = k_s + kTile * a.dim;      // [heads][kTile]
  float* f_s = p_s + a.heads * kTile;    // [heads] rescale factors
  const int t = blockIdx.x, split = blockIdx.y;
  const int per = (a.n_idx + a.splits - 1) / a.splits;
  const int k_begin = split * per, k_end = min(a.n_idx, k_begin + per);
  for (int i = threadIdx.x; i < a.heads * a.dim; i += kThreads)
    q_s[i] = a.q[int64_t(t) * a.heads * a.dim + i];
  float m_run = -INFINITY, l_run = 0;  // meaningful in threads < heads
  const int d0 = threadIdx.x * 2;      // this thread's two output dims
  float acc[kMaxHeads][2];
#pragma unroll
  for (int h = 0; h < kMaxHeads; ++h) acc[h][0] = acc[h][1] = 0;
  for (int k0 = k_begin; k0 < k_end; k0 += kTile) {
    __syncthreads();  // previous tile fully consumed
    load_tile(a, t, k0, k_end, key_row, k_s);
    tile_logits(a, key_row, q_s, k_s, p_s);
    __syncthreads();
    if (threadIdx.x < a.heads) {
      float* p = p_s + threadIdx.x * kTile;
      float mt = -INFINITY;
      for (int j = 0; j < kTile; ++j) mt = fmaxf(mt, p[j]);
      const float m_new = fmaxf(m_run, mt);
      float f = 1.0f, sum = 0;
      if (m_new != -INFINITY) {
        f = expf(m_run - m_new);  // m_run = −inf gives 0
        for (int j = 0; j < kTile; ++j) sum += (p[j] = expf(p[j] - m_new));
      } else {
        for (int j = 0; j < kTile; ++j) p[j] = 0;
      }
      l_run = l_run * f + sum;
      m_run = m_new;
      f_s[threadIdx.x] = f;
    }
    __syncthreads();
    if (d0 < a.dim) {
#pragma unroll
      for (int h = 0; h < kMaxHeads; ++h)
        if (h < a.heads) acc[h][0] *= f_s[h], acc[h][1] *= f_s[h];
      for (int j = 0; j < kTile; ++j) {
        if (key_row[j] < 0) continue;
        const float kx = k_s[j * a.dim + d0], ky = k_s[j * a.dim + d0 + 1];
#pragma unroll
        for (int h = 0; h < kMaxHeads; ++h) {
          if (h < a.heads) {
            const float p = p_s[h * kTile + j];
            acc[h][0] = fmaf(p, kx, acc[h][0]);
            acc[h][1] = fmaf(p, ky, acc[h][1]);
          }
        }
      }
    }
  }
  const int64_t base = (int64_t(t) * a.splits + split) * a.heads;
  if (d0 < a.dim) {
#pragma unroll
    for (int h = 0; h < kMaxHeads; ++h) {
      if (h < a.heads) {
        float* o = a.ws + (base + h) * a.dim + d0;
        o[0] = acc[h][0];
        o[1] = acc[h][1];
      }
    }
  }
  if (threadIdx.x < a.heads) {
    float* ml = a.ws + int64_t(a.m) * a.splits * a.heads * a.dim + (base + threadIdx.x) * 2;
    ml[0] = m_run;
    ml[1] = l_run;
  }
}

// One block per (query, head): merges the splits, adds the sink to the denominator.
__global__ void attn_combine_kernel(AttnArgs a) {
  const int t = blockIdx.x, h = blockIdx.y;
  const float* ml = a.ws + int64_t(a.m) * a.splits * a.heads * a.dim;
  float mx = -INFINITY;
  for (int s = 0; s < a.splits; ++s) mx = fmaxf(mx, ml[((int64_t(t) * a.splits + s) * a.heads + h) * 2]);
  float* out = a.out + (int64_t(t) * a.heads + h) * a.dim;
  if (mx == -INFINITY) {  // no valid key: zero output, as the CPU reference
    for (int d = threadIdx.x; d < a.dim; d += blockDim.x) out[d] = 0;
    return;
  }
  float denom = expf(a.sink[h] - mx);
  for (int s = 0; s < a.splits; ++s) {
    const float* e = ml + ((int64_t(t) * a.splits + s) * a.heads + h) * 2;
    if (e[0] != -INFINITY) denom += e[1] * expf(e[0] - mx);
  }
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float o = 0;
    for (int s = 0; s < a.splits; ++s) {
      const int64_t b = (int64_t(t) * a.splits + s) * a.heads + h;
      const float ms = ml[b * 2];
      if (ms != -INFINITY) o += a.ws[b * a.dim + d] * expf(ms - mx);
    }
    out[d] = o / denom;
  }
}

}  // namespace

cudaError_t launch_sparse_attn(const AttnArgs& a, cudaStream_t stream) {
  const size_t smem = sizeof(float) * (size_t(a.heads) * a.dim + size_t(kTile) * a.dim +
                                       size_t(a.heads) * kTile + a.heads);
  cudaError_t e = cudaFuncSetAttribute(attn_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(smem));
  if (e != cudaSuccess) return e;
  attn_split_kernel<<<dim3(a.m, a.splits), kThreads, smem, stream>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  attn_combine_kernel<<<dim3(a.m, a.heads), 128, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
