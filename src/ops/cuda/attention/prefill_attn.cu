// Prefill sparse MQA attention with sinks on the tensor cores (see prefill_kernels.h): head dims
// 64 / 128 / 256 / 512 (a template), any head count in blocks of 16·kHG heads (grid y; a block's
// heads past H compute on zero queries and write nothing). One block per (query row, 16·kHG
// heads), 2·kHG warps: warp w owns heads [16·(w % kHG), +16) and output dims [D/2·(w / kHG),
// +D/2) (kHG 4 for launches of many rows, 1 for few: launch_d). Key rows are gathered 32 at a time
// into a kSt-stage cp.async ring (16-byte pieces, absent rows zero-filled).
// Per tile: S = Q·Kᵀ with mma.m16n8k16 BF16 (the two dim halves of a head group both compute it:
// cheaper than a shared-memory exchange), online softmax on the fragments, O += P·V with P
// re-packed as the A operand and V fragments read by ldmatrix.trans. The sink joins the
// denominator at the end; the output is normalised in place (no split workspace, no combine
// pass), rounded to BF16 when asked. Numerics as sparse_attention_pool_cuda: BF16 q, keys and
// probabilities, FP32 accumulation and softmax statistics; a query with no valid key gets 0.
#include <cuda_bf16.h>

#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/runtime/smem_limit.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

// kHG head groups of 16 per block (4: 64 heads, 8 warps; 1: 16 heads, 2 warps, for launches of
// few rows, which then spread over 4x the SMs), kSt stages in the key ring. Neither changes a
// bit: every warp computes its 16 heads x half the dims the same way in any block shape.
constexpr int kKt = 32;
template <int kD>
constexpr int kLdOf = kD + 8;  // +8 BF16: rows 4 banks apart
template <int kD, int kHG, int kSt>
constexpr int kSmemOf = (16 * kHG + kSt * kKt) * kLdOf<kD> * 2;

__device__ __forceinline__ void cp16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;  // 0: zero-fill
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

// Gathers tile `tile` of query t into stage buffer k_s; flags absent rows in valid_s.
template <int kD, int kThreads>
__device__ __forceinline__ void load_tile(const PrefillAttnArgs& a, int64_t t, int tile, uint16_t* k_s,
                                          int* valid_s) {
  constexpr int kLd = kLdOf<kD>;
  static_assert(kKt * (kD / 8) % kThreads == 0, "whole 16-byte pieces per thread");
  const int k0 = tile * kKt;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(k_s));
  // 32 rows x 64 pieces of 16 B = 2048 pieces, 8 per thread.
#pragma unroll
  for (int u = 0; u < kKt * (kD / 8) / kThreads; ++u) {
    const int i = threadIdx.x + u * kThreads;
    const int j = i / (kD / 8), ch = i % (kD / 8);
    const int s = k0 + j;
    int r = s < a.n_idx ? __ldg(a.idx + t * a.n_idx + s) : -1;
    const bool ok = r >= 0 && r < a.n_rows;
    if (ch == 0) valid_s[j] = ok;
    cp16(base + uint32_t((j * kLd + ch * 8) * 2), a.kv + (ok ? int64_t(r) * kD + ch * 8 : 0), ok);
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

template <int kD, int kHG, int kSt>
__global__ void __launch_bounds__(kHG * 64, 1) prefill_attn_kernel(PrefillAttnArgs a) {
  pdl_prologue();
  constexpr int kH = 16 * kHG, kThreads = kHG * 64;  // heads and threads per block
  constexpr int kLd = kLdOf<kD>, kN = kD / 16;  // kN: n-tiles of 8 dims in a warp's half of kD
  extern __shared__ __align__(16) uint16_t sm[];
  __shared__ int valid_s[kSt][kKt];
  uint16_t* q_s = sm;                 // [kH][kLd]
  uint16_t* k_s0 = q_s + kH * kLd;    // kSt x [32][kLd]
  const int64_t t = blockIdx.x;
  const int hb = int(blockIdx.y) * kH, nh = a.heads - hb < kH ? a.heads - hb : kH;  // this block's heads
  const int n_tiles = (a.n_idx + kKt - 1) / kKt;
  // The first kSt - 1 tiles in flight (an empty group for each missing one, so that every
  // iteration below waits for the same group count).
#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) {
    if (i < n_tiles) load_tile<kD, kThreads>(a, t, i, k_s0 + i * kKt * kLd, valid_s[i]);
    else asm volatile("cp.async.commit_group;\n" ::);
  }
  {  // Q → BF16 shared (heads past nh: zero)
    const float4* q4 = reinterpret_cast<const float4*>(a.q + (t * a.heads + hb) * kD);
    for (int i = threadIdx.x; i < kH * kD / 4; i += kThreads) {
      const int e = i * 4, h = e / kD, d = e % kD;
      const float4 v = h < nh ? __ldg(q4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      uint32_t* dst = reinterpret_cast<uint32_t*>(q_s + h * kLd + d);
      dst[0] = dev_pack_bf16x2(v.x, v.y), dst[1] = dev_pack_bf16x2(v.z, v.w);
    }
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int h0 = (warp % kHG) * 16, d0 = (warp / kHG) * (kD / 2);
  float o[kN][4];
#pragma unroll
  for (int i = 0; i < kN; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0, 0};  // l: this thread's partial sum
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q_s);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int st = tile % kSt, ahead = tile + kSt - 1;  // into the stage freed by tile - 1
    if (ahead < n_tiles) load_tile<kD, kThreads>(a, t, ahead, k_s0 + (ahead % kSt) * kKt * kLd, valid_s[ahead % kSt]);
    else asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kSt - 1));  // tile `tile`'s group is complete
    __syncthreads();  // tile `tile` (and Q, first time) visible to every warp
    const uint16_t* k_s = k_s0 + st * kKt * kLd;
    const uint32_t* k32 = reinterpret_cast<const uint32_t*>(k_s);
    float s[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0;
#pragma unroll 4
    for (int kk = 0; kk < kD; kk += 16) {
      uint32_t af[4];
      af[0] = q32[((h0 + g) * kLd + kk + 2 * c) / 2];
      af[1] = q32[((h0 + g + 8) * kLd + kk + 2 * c) / 2];
      af[2] = q32[((h0 + g) * kLd + kk + 2 * c + 8) / 2];
      af[3] = q32[((h0 + g + 8) * kLd + kk + 2 * c + 8) / 2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t bf[2];
        bf[0] = k32[((j * 8 + g) * kLd + kk + 2 * c) / 2];
        bf[1] = k32[((j * 8 + g) * kLd + kk + 2 * c + 8) / 2];
        dev_mma_bf16_16816(s[j], af, bf);
      }
    }
    float mt[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * 8 + 2 * c + (e & 1);
        s[j][e] = valid_s[st][key] ? s[j][e] * a.scale : -INFINITY;
        mt[e >> 1] = fmaxf(mt[e >> 1], s[j][e]);
      }
    float f[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
      mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
      const float m_new = fmaxf(m_run[r], mt[r]);
      f[r] = m_new == -INFINITY ? 1.0f : expf(m_run[r] - m_new);
      m_run[r] = m_new;
      l_run[r] *= f[r];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        s[j][e] = m_run[r] == -INFINITY ? 0.0f : expf(s[j][e] - m_run[r]);
        l_run[r] += s[j][e];
      }
#pragma unroll
    for (int n = 0; n < kN; ++n) o[n][0] *= f[0], o[n][1] *= f[0], o[n][2] *= f[1], o[n][3] *= f[1];
    const uint32_t k_base = uint32_t(__cvta_generic_to_shared(k_s));
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {  // keys 16·kk .. +15
      uint32_t pf[4];
      pf[0] = dev_pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
      pf[1] = dev_pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
      pf[2] = dev_pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pf[3] = dev_pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      // ldmatrix.x2.trans: lanes 0-7 address keys 16kk+0..7, lanes 8-15 keys 16kk+8..15.
      const uint32_t row_addr = k_base + uint32_t(((16 * kk + (lane & 15)) * kLd + d0) * 2);
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        uint32_t bf[2];
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(bf[0]), "=r"(bf[1])
                     : "r"(row_addr + uint32_t(n * 16)));
        dev_mma_bf16_16816(o[n], pf, bf);
      }
    }
    __syncthreads();  // every warp is done with stage st before it is refilled
  }
  float* out = a.out + (t * a.heads + hb) * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const int hr[2] = {h0 + g, h0 + g + 8};
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    inv[r] = m_run[r] == -INFINITY || hr[r] >= nh ? 0.0f : 1.0f / (l_run[r] + expf(a.sink[hb + hr[r]] - m_run[r]));
  // The model's BF16 output (ModelAttnArgs::bf16): round to nearest even, as dev_round_bf16.
  auto fin = [&](float x) { return a.bf16_out ? __bfloat162float(__float2bfloat16_rn(x)) : x; };
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int d = d0 + n * 8 + 2 * c;
    if (hr[0] < nh)
      *reinterpret_cast<float2*>(out + hr[0] * kD + d) = make_float2(fin(o[n][0] * inv[0]), fin(o[n][1] * inv[0]));
    if (hr[1] < nh)
      *reinterpret_cast<float2*>(out + hr[1] * kD + d) = make_float2(fin(o[n][2] * inv[1]), fin(o[n][3] * inv[1]));
  }
}

template <int kD, int kHG, int kSt>
cudaError_t launch_shape(const PrefillAttnArgs& a, cudaStream_t s) {
  static std::atomic<uint64_t> attr{0};  // per device (smem_limit.cuh)
  const void* fn = reinterpret_cast<const void*>(prefill_attn_kernel<kD, kHG, kSt>);
  if (const cudaError_t e = ensure_smem_limit(fn, kSmemOf<kD, kHG, kSt>, attr); e != cudaSuccess) return e;
  const dim3 grid(unsigned(a.m), unsigned((a.heads + 16 * kHG - 1) / (16 * kHG)));
  return launch_kernel(prefill_attn_kernel<kD, kHG, kSt>, grid, dim3(kHG * 64), size_t(kSmemOf<kD, kHG, kSt>), s, a);
}

// Launches of up to kFewRows rows (decode steps, verify blocks) take blocks of 16 heads and a
// 4-stage ring: more SMs per row and more key tiles in flight for a latency-bound launch; others
// 64-head blocks. The same bits either way.
constexpr int64_t kFewRows = 32;
template <int kD>
cudaError_t launch_d(const PrefillAttnArgs& a, cudaStream_t s) {
  return a.m <= kFewRows ? launch_shape<kD, 1, 4>(a, s) : launch_shape<kD, 4, 2>(a, s);
}

}  // namespace

bool prefill_attn_supports(int64_t heads, int64_t dim) {
  return heads > 0 && heads <= 65535 * int64_t(16) && (dim == 64 || dim == 128 || dim == 256 || dim == 512);
}

cudaError_t launch_prefill_attn(const PrefillAttnArgs& a, cudaStream_t s) {
  if (!prefill_attn_supports(a.heads, a.dim) || a.m < 0 || a.m > INT32_MAX || a.n_idx < 0 || a.n_rows < 0)
    return cudaErrorInvalidValue;
  if (a.m == 0) return cudaSuccess;
  switch (a.dim) {
    case 64: return launch_d<64>(a, s);
    case 128: return launch_d<128>(a, s);
    case 256: return launch_d<256>(a, s);
    default: return launch_d<512>(a, s);
  }
}

}  // namespace flashseek::ops::cuda::detail
