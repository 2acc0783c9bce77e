// Small-M block-scaled linears on tensor cores (sm_89+ FP8 MMA, m16n8k32 e4m3 · e4m3 → f32).
//
// Why MMA for a GEMV: at M = 8..16 a CUDA-core GEMV needs M FMAs per weight byte, which at
// 4.4 TB/s exceeds the FP32 rate; one m16n8k32 MMA covers 16 rows × 8 tokens × 32 k.
// Each MMA spans exactly one 32-wide k block, so the per-block scales (weight e8m0 × activation
// pow2) are applied to its FP32 result: acc += mma(Wq, Xq) · s_w · s_x. The activation is
// quantised to e4m3 inside the kernel (quad-wide amax over the block), so no extra launch or
// workspace is needed; FP4 weights are expanded to e4m3 in registers (exact: e2m1 ⊂ e4m3).
//
// Layout: a block of 8 warps owns 32 output rows (two 16-row MMA tiles) and up to 16 tokens
// (two 8-token tiles); the warps split k (in chunks of `kChunk` blocks) and reduce through
// shared memory in a fixed order (deterministic). A thread (group g = lane/4, q = lane%4) feeds
// k offsets q*8 .. q*8+7 of each block: the same permutation of k for weights and activations,
// which lets it load 8 contiguous FP8 bytes (4 FP4 bytes) per row and block.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "ops/cuda/gemv_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 32;  // output rows per block
constexpr int kToks = 16;  // tokens per tile


__device__ __forceinline__ float e8m0f(uint8_t e) { return __uint_as_float(uint32_t(e) << 23); }

// Four e2m1 nibbles (low 16 bits, element 0 lowest) -> four e4m3 bytes.
__device__ __forceinline__ uint32_t fp4x4_to_e4m3x4(uint32_t v) {
  const uint32_t mag = __byte_perm(0x3C383000u, 0x4C484440u, v & 0x7777u);
  uint32_t s = (v | (v << 8)) & 0x00FF00FFu;
  s = (s | (s << 4)) & 0x0F0F0F0Fu;
  return mag | ((s & 0x08080808u) << 4);
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// A fragments and per-row scales of one matrix for rows row0 + mt*16 + {g, g+8}, blocks kb0...
template <bool kFp4, int kChunk>
__device__ __forceinline__ void load_w(const GemvArgs& a, const uint8_t* w, const uint8_t* ws,
                                       int row0, int kb0, int g, int q,
                                       uint32_t (&A)[2][kChunk][4], float (&sc)[2][2][kChunk]) {
  const int nkb = a.k / 32;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + mt * 16 + h * 8 + g, a.n - 1);  // tail rows: loaded, never stored
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const int kb = kb0 + j;
        if constexpr (kFp4) {
          const uint32_t u = __ldcs(reinterpret_cast<const unsigned int*>(
              w + int64_t(row) * (a.k / 2) + kb * 16 + q * 4));
          A[mt][j][h] = fp4x4_to_e4m3x4(u & 0xffffu);
          A[mt][j][h + 2] = fp4x4_to_e4m3x4(u >> 16);
          sc[mt][h][j] = e8m0f(ws[int64_t(row) * nkb + kb]);
        } else {
          const uint2 u = __ldcs(reinterpret_cast<const uint2*>(w + int64_t(row) * a.k + kb * 32 + q * 8));
          A[mt][j][h] = u.x;
          A[mt][j][h + 2] = u.y;
          const int kbw = a.k / a.w_block;
          sc[mt][h][j] = e8m0f(ws[int64_t(row / a.w_block) * kbw + (kb * 32) / a.w_block]);
        }
      }
    }
  }
}

// Loads and FP8-quantises this thread's 8 values of each block for one token row (nullptr =
// absent token: zero codes, zero scale). Matches ops::fp8_quant_dequant bit for bit.
template <int kChunk>
__device__ __forceinline__ void quant_x(const float* xrow, int kb0, int q, int act_block,
                                        uint32_t (&B)[kChunk][2], float (&xs)[kChunk]) {
  float v[kChunk][8];
  float amax[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    float4 lo = make_float4(0, 0, 0, 0), hi = lo;
    if (xrow) {
      const float4* p = reinterpret_cast<const float4*>(xrow + (kb0 + j) * 32 + q * 8);
      lo = __ldg(p);
      hi = __ldg(p + 1);
    }
    v[j][0] = lo.x, v[j][1] = lo.y, v[j][2] = lo.z, v[j][3] = lo.w;
    v[j][4] = hi.x, v[j][5] = hi.y, v[j][6] = hi.z, v[j][7] = hi.w;
    float m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[j][i]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    amax[j] = m;
  }
  if (act_block == 128) {  // kChunk == 4 here: one scale over the 4 blocks
    float m = 0;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) m = fmaxf(m, amax[j]);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) amax[j] = m;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    // s = 2^ceil(log2(max(amax, 1e-4) / 448)): round the float up to a power of two.
    uint32_t u = __float_as_uint(fmaxf(amax[j], 1e-4f) / 448.0f);
    if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x00800000u;
    const float s = __uint_as_float(u);
    const float inv = 1.0f / s;  // exact: s is a power of two
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = make_float2(v[j][2 * i] * inv, v[j][2 * i + 1] * inv);
      packed[i] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
    }
    B[j][0] = packed[0] | (packed[1] << 16);
    B[j][1] = packed[2] | (packed[3] << 16);
    xs[j] = xrow ? s : 0.0f;
  }
}

template <int kChunk>
__device__ __forceinline__ void mma_accumulate(const uint32_t (&A)[2][kChunk][4],
                                               const float (&sc)[2][2][kChunk],
                                               const uint32_t (&B)[kChunk][2],
                                               const float (&xs)[kChunk], int q,
                                               float (&acc)[2][4]) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    const float s0 = __shfl_sync(0xffffffffu, xs[j], (q * 2) * 4);
    const float s1 = __shfl_sync(0xffffffffu, xs[j], (q * 2 + 1) * 4);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      float d[4];
      mma_e4m3(d, A[mt][j], B[j][0], B[j][1]);
      acc[mt][0] += d[0] * (sc[mt][0][j] * s0);
      acc[mt][1] += d[1] * (sc[mt][0][j] * s1);
      acc[mt][2] += d[2] * (sc[mt][1][j] * s0);
      acc[mt][3] += d[3] * (sc[mt][1][j] * s1);
    }
  }
}

// Writes a thread's accumulators into its warp's slice of `red` ([kRows][kToks] per warp).
__device__ __forceinline__ void stash(float* red, const float (&acc)[2][2][4], int g, int q) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = mt * 16 + g + (i >= 2 ? 8 : 0);
        const int t = nt * 8 + q * 2 + (i & 1);
        red[r * kToks + t] = acc[nt][mt][i];
      }
}

template <bool kFp4, int kChunk, bool kGated>
__global__ void __launch_bounds__(kThreads, 2) gemv_kernel(GemvArgs a) {
  __shared__ float red[kGated ? 2 : 1][kWarps][kRows * kToks];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int row0 = blockIdx.x * kRows;
  int64_t start = 0, count = a.m;
  const uint8_t *w = a.w, *ws = a.ws, *wu = a.wu, *wsu = a.wsu;
  if (a.group_start) {
    start = a.group_start[blockIdx.y];
    count = a.group_start[blockIdx.y + 1] - start;
    const int64_t e = a.group_expert[blockIdx.y];
    w += e * a.e_stride, ws += e * a.e_sstride;
    if constexpr (kGated) wu += e * a.e_stride, wsu += e * a.e_sstride;
  }
  const int n_chunks = a.k / 32 / kChunk;
  for (int64_t tt = 0; tt < count; tt += kToks) {
    const int ntok = count - tt < kToks ? int(count - tt) : kToks;
    const float* xrow[2];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int slot = nt * 8 + g;
      xrow[nt] = nullptr;
      if (slot < ntok) {
        const int64_t p = start + tt + slot;
        const int64_t row = a.group_start ? (a.pair_row ? a.pair_row[p] : p) : tt + slot;
        xrow[nt] = a.x + row * a.k;
      }
    }
    float acc[2][2][4] = {}, accu[2][2][4] = {};
    for (int c = warp; c < n_chunks; c += kWarps) {
      const int kb0 = c * kChunk;
      uint32_t A[2][kChunk][4], AU[2][kChunk][4];
      float sc[2][2][kChunk], scu[2][2][kChunk];
      load_w<kFp4, kChunk>(a, w, ws, row0, kb0, g, q, A, sc);
      if constexpr (kGated) load_w<kFp4, kChunk>(a, wu, wsu, row0, kb0, g, q, AU, scu);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        if (nt == 1 && ntok <= 8) break;  // warp-uniform
        uint32_t B[kChunk][2];
        float xs[kChunk];
        quant_x<kChunk>(xrow[nt], kb0, q, a.act_block, B, xs);
        mma_accumulate<kChunk>(A, sc, B, xs, q, acc[nt]);
        if constexpr (kGated) mma_accumulate<kChunk>(AU, scu, B, xs, q, accu[nt]);
      }
    }
    stash(red[0][warp], acc, g, q);
    if constexpr (kGated) stash(red[kGated ? 1 : 0][warp], accu, g, q);
    __syncthreads();
    for (int o = threadIdx.x; o < kRows * kToks; o += kThreads) {
      const int r = o / kToks, t = o % kToks, row = row0 + r;
      if (row >= a.n || t >= ntok) continue;
      float v = 0, u = 0;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) v += red[0][wi][o];
      const int64_t out_row = a.group_start ? start + tt + t : tt + t;
      if constexpr (kGated) {
#pragma unroll
        for (int wi = 0; wi < kWarps; ++wi) u += red[kGated ? 1 : 0][wi][o];
        if (a.limit > 0) v = fminf(v, a.limit), u = fminf(fmaxf(u, -a.limit), a.limit);
        const float pw = a.pair_weight ? a.pair_weight[out_row] : 1.0f;
        v = (v / (1.0f + expf(-v))) * u * pw;
      }
      if (a.bf16_out) {
        reinterpret_cast<__nv_bfloat16*>(a.y)[out_row * a.n + row] = __float2bfloat16_rn(v);
      } else {
        reinterpret_cast<float*>(a.y)[out_row * a.n + row] = v;
      }
    }
    __syncthreads();
  }
}

template <bool kFp4, bool kGated>
cudaError_t launch(const GemvArgs& a, int n_groups, cudaStream_t stream) {
  const dim3 grid((a.n + kRows - 1) / kRows, n_groups);
  // act_block 128 needs the 4-block chunks (k % 128 == 0, checked by the caller).
  // Two blocks per SM (register cap 128) keep more weight bytes in flight than one fat block:
  // 2-block chunks fit the cap without spills; act_block 128 (V4) needs 4-block chunks.
  if (a.act_block == 128) gemv_kernel<kFp4, 4, kGated><<<grid, kThreads, 0, stream>>>(a);
  else if (a.k % 64 == 0) gemv_kernel<kFp4, 2, kGated><<<grid, kThreads, 0, stream>>>(a);
  else gemv_kernel<kFp4, 1, kGated><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gemv(const GemvArgs& a, int n_groups, bool fp4, cudaStream_t stream) {
  const bool gated = a.wu != nullptr;
  if (fp4) return gated ? launch<true, true>(a, n_groups, stream) : launch<true, false>(a, n_groups, stream);
  return gated ? launch<false, true>(a, n_groups, stream) : launch<false, false>(a, n_groups, stream);
}

}  // namespace flashseek::ops::cuda::detail
