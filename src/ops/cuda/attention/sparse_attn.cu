// Split-KV sparse MQA decode attention with sinks: a BF16 tensor-core path (attn_mma_kernel, the
// V4/V4.1 shapes) and a CUDA-core fallback for other head counts / dims. Both use BF16 q and BF16
// probabilities for P·V (the reference's numerics), FP32 softmax statistics.
// Fallback: one block per (query, split):
// the block holds the query's heads in shared memory, walks its slice of the index list in tiles
// of 16 keys (each BF16 row read once for all heads: K = V is shared by every head), keeps an
// online softmax per head and writes unnormalised partials; a combine kernel merges the splits
// and adds the sink to the denominator (v4 §3.5.7).
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>

#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/runtime/smem_limit.cuh"

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
    q_s[i] = __bfloat162float(__float2bfloat16_rn(a.q[int64_t(t) * a.heads * a.dim + i]));
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
            const float p = __bfloat162float(__float2bfloat16_rn(p_s[h * kTile + j]));
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

constexpr int kCombineThreads = 256;
constexpr int kMaxSplits = 1024;

// Block-wide max (op 0) or sum (op 1) of one value per thread; every thread gets the result.
__device__ float block_reduce(float v, int op, float* red) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = op == 0 ? fmaxf(v, w) : v + w;
  }
  __syncthreads();  // red reused between calls
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = op == 0 ? -INFINITY : 0.0f;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) r = op == 0 ? fmaxf(r, red[i]) : r + red[i];
  return r;
}

// One block per (query, head): merges the splits, adds the sink to the denominator. The split
// weights exp(m_s − max) are computed once into shared memory; the output pass then has
// independent loads per split (unrolled), instead of a latency-bound chain.
__global__ void __launch_bounds__(kCombineThreads) attn_combine_kernel(AttnArgs a) {
  __shared__ float w_s[kMaxSplits];
  __shared__ float red[32];
  const int t = blockIdx.x, h = blockIdx.y;
  const float* ml = a.ws + int64_t(a.m) * a.splits * a.heads * a.dim;
  auto row = [&](int s) { return (int64_t(t) * a.splits + s) * a.heads + h; };
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < a.splits; s += blockDim.x) mx = fmaxf(mx, ml[row(s) * 2]);
  mx = block_reduce(mx, 0, red);
  float* out = a.out + (int64_t(t) * a.heads + h) * a.dim;
  if (mx == -INFINITY) {  // no valid key: zero output, as the CPU reference
    for (int d = threadIdx.x; d < a.dim; d += blockDim.x) out[d] = 0;
    return;
  }
  float part = 0;
  for (int s = threadIdx.x; s < a.splits; s += blockDim.x) {
    const float ms = ml[row(s) * 2];
    const float w = ms == -INFINITY ? 0.0f : expf(ms - mx);
    w_s[s] = w;
    part += w == 0.0f ? 0.0f : ml[row(s) * 2 + 1] * w;
  }
  const float denom = block_reduce(part, 1, red) + expf(a.sink[h] - mx);  // syncs w_s too
  const float* base = a.ws + row(0) * a.dim;
  const int64_t stride = int64_t(a.heads) * a.dim;  // between splits of one (query, head)
  for (int d = threadIdx.x; d < a.dim; d += blockDim.x) {
    float o = 0;
#pragma unroll 8
    for (int s = 0; s < a.splits; ++s) o = fmaf(base[s * stride + d], w_s[s], o);
    out[d] = o / denom;
  }
}


// ---- Tensor-core path (heads % 16 == 0, heads <= 64, dim % 64 == 0, dim <= 512) -------------
// One block per (query, split), 16 warps: warp w owns heads [16·(w % HG), +16) (HG = heads / 16)
// and output dims [dq·dim/4, +dim/4) with dq = w / HG (warps beyond 4·HG idle). Per tile of 16
// keys: S = Q·Kᵀ with mma.m16n8k16 BF16 (fp32 accumulate; every dim quarter recomputes the same
// S, cheaper than a shared-memory exchange), online softmax on the accumulator fragments, then
// O += P·V with P re-packed from the S fragments as the A operand (FlashAttention-2 layout).
constexpr int kMmaWarps = 16;
constexpr int kPad = 8;  // bf16 row padding: rows land 4 banks apart (conflict-free fragments)

__global__ void __launch_bounds__(kMmaWarps * 32, 1) attn_mma_kernel(AttnArgs a) {
  extern __shared__ uint16_t sm16[];
  __shared__ int key_row[kTile];
  const int ld = a.dim + kPad;
  uint16_t* q_s = sm16;                // [heads][ld]
  uint16_t* k_s = q_s + a.heads * ld;  // [kTile][ld]
  const int t = blockIdx.x, split = blockIdx.y;
  const int per = (a.n_idx + a.splits - 1) / a.splits;
  const int k_begin = split * per, k_end = min(a.n_idx, k_begin + per);
  const int nthreads = kMmaWarps * 32;
  {  // Q → BF16 shared: all of this thread's float4 loads first (one round trip, not 64)
    const float4* q4 = reinterpret_cast<const float4*>(a.q + int64_t(t) * a.heads * a.dim);
    const int n4 = a.heads * a.dim / 4;  // <= 16 per thread (64 heads x 512 / 4 / 512 threads)
    float4 buf[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int i = threadIdx.x + u * nthreads;
      if (i < n4) buf[u] = q4[i];
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int i = threadIdx.x + u * nthreads;
      if (i >= n4) break;
      const int e = i * 4, h = e / a.dim, d = e % a.dim;
      uint32_t* dst = reinterpret_cast<uint32_t*>(q_s + h * ld + d);
      dst[0] = dev_pack_bf16x2(buf[u].x, buf[u].y);
      dst[1] = dev_pack_bf16x2(buf[u].z, buf[u].w);
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int hg_n = a.heads / 16, hg = warp % hg_n, dq = warp / hg_n;
  const bool active = dq < 4;
  const int dim_w = a.dim / 4, n_nt = dim_w / 8, h0 = hg * 16, d_base = dq * dim_w;
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0, 0};
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q_s);
  const uint32_t* k32 = reinterpret_cast<const uint32_t*>(k_s);
  for (int k0 = k_begin; k0 < k_end; k0 += kTile) {
    __syncthreads();  // previous tile consumed (and q_s written, first time)
    if (threadIdx.x < kTile) {
      const int s = k0 + threadIdx.x;
      const int r = s < k_end ? a.idx[int64_t(t) * a.n_idx + s] : -1;
      key_row[threadIdx.x] = (r >= 0 && r < a.n_rows) ? r : -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kTile * (a.dim / 8); i += nthreads) {  // 16-byte row chunks
      const int j = i / (a.dim / 8), ch = i % (a.dim / 8), r = key_row[j];
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r >= 0) v = *reinterpret_cast<const uint4*>(a.kv + int64_t(r) * a.dim + ch * 8);
      uint32_t* dst = reinterpret_cast<uint32_t*>(k_s + j * ld + ch * 8);
      dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    }
    __syncthreads();
    if (!active) continue;
    float s[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    for (int kk = 0; kk < a.dim; kk += 16) {
      uint32_t af[4];
      af[0] = q32[((h0 + g) * ld + kk + 2 * c) / 2];
      af[1] = q32[((h0 + g + 8) * ld + kk + 2 * c) / 2];
      af[2] = q32[((h0 + g) * ld + kk + 2 * c + 8) / 2];
      af[3] = q32[((h0 + g + 8) * ld + kk + 2 * c + 8) / 2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        uint32_t bf[2];
        bf[0] = k32[((nt * 8 + g) * ld + kk + 2 * c) / 2];
        bf[1] = k32[((nt * 8 + g) * ld + kk + 2 * c + 8) / 2];
        dev_mma_bf16_16816(s[nt], af, bf);
      }
    }
    // Scaled logits; absent keys −inf. Row r = 0 (head h0+g) uses s[.][0..1], r = 1 (g+8) s[.][2..3].
    float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = nt * 8 + 2 * c + (e & 1);
        s[nt][e] = key_row[j] >= 0 ? s[nt][e] * a.scale : -INFINITY;
        mt[e >> 1] = fmaxf(mt[e >> 1], s[nt][e]);
      }
    float f[2], sum[2] = {0, 0};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
      mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
      const float m_new = fmaxf(m_run[r], mt[r]);
      f[r] = m_new == -INFINITY ? 1.0f : expf(m_run[r] - m_new);
      m_run[r] = m_new;
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        s[nt][e] = m_run[r] == -INFINITY ? 0.0f : expf(s[nt][e] - m_run[r]);
        sum[r] += s[nt][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l_run[r] = l_run[r] * f[r] + sum[r];
    }
    uint32_t pf[4];  // P as the A operand: BF16 probabilities (the denominator keeps FP32)
    pf[0] = dev_pack_bf16x2(s[0][0], s[0][1]);
    pf[1] = dev_pack_bf16x2(s[0][2], s[0][3]);
    pf[2] = dev_pack_bf16x2(s[1][0], s[1][1]);
    pf[3] = dev_pack_bf16x2(s[1][2], s[1][3]);
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      if (nt >= n_nt) break;
      o[nt][0] *= f[0], o[nt][1] *= f[0], o[nt][2] *= f[1], o[nt][3] *= f[1];
      const int n = d_base + nt * 8 + g;
      uint32_t bf[2];
      bf[0] = uint32_t(k_s[(2 * c) * ld + n]) | (uint32_t(k_s[(2 * c + 1) * ld + n]) << 16);
      bf[1] = uint32_t(k_s[(2 * c + 8) * ld + n]) | (uint32_t(k_s[(2 * c + 9) * ld + n]) << 16);
      dev_mma_bf16_16816(o[nt], pf, bf);
    }
  }
  if (!active) return;
  const int64_t base = (int64_t(t) * a.splits + split) * a.heads;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    if (nt >= n_nt) break;
    const int d = d_base + nt * 8 + 2 * c;
    float* o0 = a.ws + (base + h0 + g) * a.dim + d;
    float* o1 = a.ws + (base + h0 + g + 8) * a.dim + d;
    o0[0] = o[nt][0], o0[1] = o[nt][1], o1[0] = o[nt][2], o1[1] = o[nt][3];
  }
  if (dq == 0 && c == 0) {
    float* ml = a.ws + int64_t(a.m) * a.splits * a.heads * a.dim;
    ml[(base + h0 + g) * 2] = m_run[0], ml[(base + h0 + g) * 2 + 1] = l_run[0];
    ml[(base + h0 + g + 8) * 2] = m_run[1], ml[(base + h0 + g + 8) * 2 + 1] = l_run[1];
  }
}

}  // namespace

std::atomic<uint64_t> g_mma_attr{0}, g_split_attr{0};

bool sparse_attn_uses_mma(int heads, int dim) {
  return heads % 16 == 0 && heads <= 64 && dim % 64 == 0 && dim <= 512;
}

cudaError_t launch_sparse_attn(const AttnArgs& a, cudaStream_t stream) {
  if (a.splits < 1 || a.splits > kMaxSplits) return cudaErrorInvalidValue;
  cudaError_t e;
  if (sparse_attn_uses_mma(a.heads, a.dim)) {
    const size_t smem16 = sizeof(uint16_t) * size_t(a.heads + kTile) * size_t(a.dim + kPad);
    // The largest shape this path takes (64 heads x 512) sets the limit once.
    e = ensure_smem_limit(reinterpret_cast<const void*>(attn_mma_kernel),
                          int(sizeof(uint16_t) * (kMaxHeads + kTile) * (512 + kPad)), g_mma_attr);
    if (e != cudaSuccess) return e;
    attn_mma_kernel<<<dim3(a.m, a.splits), kMmaWarps * 32, smem16, stream>>>(a);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    attn_combine_kernel<<<dim3(a.m, a.heads), kCombineThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
  const size_t smem = sizeof(float) * (size_t(a.heads) * a.dim + size_t(kTile) * a.dim +
                                       size_t(a.heads) * kTile + a.heads);
  e = ensure_smem_limit(reinterpret_cast<const void*>(attn_split_kernel),
                        int(sizeof(float) * (kMaxHeads * 512 + kTile * 512 + kMaxHeads * kTile + kMaxHeads)),
                        g_split_attr);
  if (e != cudaSuccess) return e;
  attn_split_kernel<<<dim3(a.m, a.splits), kThreads, smem, stream>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  attn_combine_kernel<<<dim3(a.m, a.heads), kCombineThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
