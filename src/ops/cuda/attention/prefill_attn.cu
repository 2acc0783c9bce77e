// Prefill sparse MQA attention with sinks on the tensor cores (see prefill_kernels.h): head dims
// 64 / 128 / 256 / 512 (a template), any head count in blocks of 16·kHG heads (grid y; a block's
// heads past H compute on zero queries and write nothing). A block serves one query row and
// 16·kHG heads with 2·kHG warps: warp w owns heads [16·(w % kHG), +16) and output dims
// [D/2·(w / kHG), +D/2). Key rows are gathered 32 at a time (a tile) into a kSt-stage cp.async
// ring (16-byte pieces, absent rows zero-filled).
// Per tile: S = Q·Kᵀ with mma.m16n8k16 BF16 (the two dim halves of a head group both compute it:
// cheaper than a shared-memory exchange), then the tile's own softmax statistics (max m_t over its
// keys, p = exp(s − m_t), l_t = Σ p) and its own O_t = P·V (P re-packed as the A operand, V
// fragments read by ldmatrix.trans, from a zero accumulator). The row's state (m, l, O) folds the
// tiles in order: m' = max(m, m_t), a = exp(m − m'), b = exp(m_t − m'), l = l·a + l_t·b,
// O = O·a + O_t·b (tile_fold; a tile without a valid key is not folded). Because each tile's
// partial depends on that tile alone, a launch can also run one tile per block (the split form:
// grid x = tile) and write the partials to a workspace, which attn_fold_kernel folds in the same
// order with the same arithmetic: the same bits as the in-block fold, so the form is chosen by
// speed alone (launch_prefill_attn: the split form for few rows, where one block per row would
// leave most SMs idle). The sink joins the denominator at the end; the output is normalised and
// rounded to BF16 when asked. Numerics as sparse_attention_pool_cuda: BF16 q, keys and
// probabilities, FP32 accumulation and softmax statistics; a query with no valid key gets 0.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/runtime/device_caps.h"
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

// Inputs written by the kernels just before (q, the key lists, the split partials) are read with
// plain loads, never ld.global.nc (__ldg): under programmatic dependent launch a kernel starts
// while its predecessors still run, and a non-coherent load, which the compiler may treat as
// invariant for the kernel's lifetime, is not guaranteed to stay behind griddepcontrol.wait
// (pdl.cuh); the unrolled __ldg form of the q load read stale rows in the model.

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
    int r = s < a.n_idx ? a.idx[t * a.n_idx + s] : -1;
    const bool ok = r >= 0 && r < a.n_rows;
    if (ch == 0) valid_s[j] = ok;
    cp16(base + uint32_t((j * kLd + ch * 8) * 2), a.kv + (ok ? int64_t(r) * kD + ch * 8 : 0), ok);
  }
  asm volatile("cp.async.commit_group;\n" ::);
}

// The fold of one tile into a row's state (m, l) (see the header): its coefficients a (for the
// state) and b (for the tile); false when the tile has no valid key (m_t = −inf: not folded).
// Shared by both forms so that they take the same bits (no contraction: explicit roundings).
__device__ __forceinline__ bool tile_fold(float& m, float& l, float mt, float lt, float& fa, float& fb) {
  if (mt == -INFINITY) return false;
  const float m_new = fmaxf(m, mt);
  fa = m == -INFINITY ? 0.0f : expf(m - m_new);
  fb = expf(mt - m_new);
  m = m_new;
  l = __fadd_rn(__fmul_rn(l, fa), __fmul_rn(lt, fb));
  return true;
}
__device__ __forceinline__ float fold_o(float o, float ot, float fa, float fb) {
  return __fadd_rn(__fmul_rn(o, fa), __fmul_rn(ot, fb));
}
// The normaliser of a folded row: 1 / (l + exp(sink − m)); 0 for a row without a valid key.
__device__ __forceinline__ float fold_inv(float m, float l, float sink) {
  return m == -INFINITY ? 0.0f : 1.0f / __fadd_rn(l, expf(sink - m));
}
// The model's BF16 output (ModelAttnArgs::bf16): round to nearest even, as dev_round_bf16.
__device__ __forceinline__ float fold_out(float x, bool bf16) { return bf16 ? __bfloat162float(__float2bfloat16_rn(x)) : x; }

// The tile's statistics for the thread's rows g and g + 8 (r = 0, 1) from its S elements
// s[j][e] (key 8j + 2c + (e & 1), row g + 8·(e / 2); the m16n8 tiles' layout, which the
// warpgroup kernel's accumulator shares): scaled, absent keys −inf, the max m_t over the thread's
// keys in order and then the quad's by shuffles, p = exp(s − m_t) in place, l_t = Σ p in the same
// order. Both kernels call it, so that they take the same bits.
__device__ __forceinline__ void tile_stats(float (&s)[4][4], const int* valid, int c, float scale, float (&mt)[2],
                                           float (&lt)[2]) {
  mt[0] = mt[1] = -INFINITY, lt[0] = lt[1] = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = j * 8 + 2 * c + (e & 1);
      s[j][e] = valid[key] ? s[j][e] * scale : -INFINITY;
      mt[e >> 1] = fmaxf(mt[e >> 1], s[j][e]);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
    mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
  }
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e >> 1;
      s[j][e] = mt[r] == -INFINITY ? 0.0f : expf(s[j][e] - mt[r]);
      lt[r] += s[j][e];
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lt[r] += __shfl_xor_sync(0xffffffffu, lt[r], 1);
    lt[r] += __shfl_xor_sync(0xffffffffu, lt[r], 2);
  }
}
// The probabilities as BF16 A fragments of P·V, pf[kk] for keys 16·kk .. +15.
__device__ __forceinline__ void pack_p(const float (&s)[4][4], uint32_t (&pf)[2][4]) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    pf[kk][0] = dev_pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
    pf[kk][1] = dev_pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
    pf[kk][2] = dev_pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pf[kk][3] = dev_pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}
// The in-block forms' output: rows hr[0], hr[1] (heads past nh: none) of the thread's kN n-tiles
// of dims from d0, normalised (fold_inv with the sink) and rounded when asked.
template <int kD, int kN>
__device__ __forceinline__ void store_rows(const PrefillAttnArgs& a, int64_t t, int hb, int nh, const int (&hr)[2],
                                           int d0, int c, const float (&m_run)[2], const float (&l_run)[2],
                                           const float (&o)[kN][4]) {
  float* out = a.out + (t * a.heads + hb) * kD;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) inv[r] = hr[r] >= nh ? 0.0f : fold_inv(m_run[r], l_run[r], a.sink[hb + hr[r]]);
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    const int d = d0 + n * 8 + 2 * c;
    if (hr[0] < nh)
      *reinterpret_cast<float2*>(out + hr[0] * kD + d) =
          make_float2(fold_out(o[n][0] * inv[0], a.bf16_out), fold_out(o[n][1] * inv[0], a.bf16_out));
    if (hr[1] < nh)
      *reinterpret_cast<float2*>(out + hr[1] * kD + d) =
          make_float2(fold_out(o[n][2] * inv[1], a.bf16_out), fold_out(o[n][3] * inv[1], a.bf16_out));
  }
}

// Q rows of this block's kH heads (from head hb; past nh: zero) as BF16 pairs: each thread loads
// kR float4 at a time, then hands put(h, d, first pair, second pair) the values of head h, dims
// d .. d + 3.
template <int kD, int kH, int kThreads, int kR, class Put>
__device__ __forceinline__ void load_q(const PrefillAttnArgs& a, int64_t t, int hb, int nh, Put put) {
  static_assert(kH * kD / 4 % (kR * kThreads) == 0, "whole rounds of loads per thread");
  const float4* q4 = reinterpret_cast<const float4*>(a.q + (t * a.heads + hb) * kD);
  for (int i0 = 0; i0 < kH * kD / 4; i0 += kR * kThreads) {
    float4 v[kR];
#pragma unroll
    for (int u = 0; u < kR; ++u) {
      const int i = i0 + u * kThreads + int(threadIdx.x);
      v[u] = i * 4 / kD < nh ? q4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kR; ++u) {
      const int e = (i0 + u * kThreads + int(threadIdx.x)) * 4;
      put(e / kD, e % kD, dev_pack_bf16x2(v[u].x, v[u].y), dev_pack_bf16x2(v[u].z, v[u].w));
    }
  }
}

// The split form's (max, sum) pairs: after the tile outputs in PrefillAttnArgs::part.
__device__ __forceinline__ float2* part_ml(const PrefillAttnArgs& a, int n_tiles) {
  return reinterpret_cast<float2*>(a.part + a.m * n_tiles * a.heads * int64_t(a.dim));
}

// kSt == 1: the split form (one tile per block, grid (tiles, head blocks, rows), partials to
// a.part); else the in-block fold over every tile (grid (rows, head blocks)).
template <int kD, int kHG, int kSt>
__global__ void __launch_bounds__(kHG * 64, 1) prefill_attn_kernel(PrefillAttnArgs a) {
  pdl_prologue();
  constexpr bool kSplit = kSt == 1;
  constexpr int kH = 16 * kHG, kThreads = kHG * 64;  // heads and threads per block
  constexpr int kLd = kLdOf<kD>, kN = kD / 16;  // kN: n-tiles of 8 dims in a warp's half of kD
  constexpr int kNc = kN < 8 ? kN : 8;           // n-tiles of O_t per pass (registers)
  extern __shared__ __align__(16) uint16_t sm[];
  __shared__ int valid_s[kSt][kKt];
  uint16_t* q_s = sm;                 // [kH][kLd]
  uint16_t* k_s0 = q_s + kH * kLd;    // kSt x [32][kLd]
  const int64_t t = kSplit ? blockIdx.z : blockIdx.x;
  const int hb = int(blockIdx.y) * kH, nh = a.heads - hb < kH ? a.heads - hb : kH;  // this block's heads
  const int n_tiles = (a.n_idx + kKt - 1) / kKt;
  const int tile_begin = kSplit ? int(blockIdx.x) : 0, tile_end = kSplit ? tile_begin + 1 : n_tiles;
  // The first kSt - 1 tiles in flight (an empty group for each missing one, so that every
  // iteration below waits for the same group count).
#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) {
    if (i < n_tiles) load_tile<kD, kThreads>(a, t, i, k_s0 + i * kKt * kLd, valid_s[i]);
    else asm volatile("cp.async.commit_group;\n" ::);
  }
  // Q → BF16 shared (heads past nh: zero), kR loads in flight per thread (kD / 16 float4 each)
  load_q<kD, kH, kThreads, (kD / 16 < 8 ? kD / 16 : 8)>(a, t, hb, nh, [&](int h, int d, uint32_t lo, uint32_t hi) {
    uint32_t* dst = reinterpret_cast<uint32_t*>(q_s + h * kLd + d);
    dst[0] = lo, dst[1] = hi;
  });
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int h0 = (warp % kHG) * 16, d0 = (warp / kHG) * (kD / 2);
  const int hr[2] = {h0 + g, h0 + g + 8};
  float o[kSplit ? 1 : kN][4];
#pragma unroll
  for (int i = 0; i < (kSplit ? 1 : kN); ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0, 0};
  const uint32_t* q32 = reinterpret_cast<const uint32_t*>(q_s);
  for (int tile = tile_begin; tile < tile_end; ++tile) {
    const int st = tile % kSt, ahead = tile + kSt - 1;  // into the stage freed by tile - 1 (split: this tile)
    if (ahead < n_tiles) load_tile<kD, kThreads>(a, t, ahead, k_s0 + (ahead % kSt) * kKt * kLd, valid_s[ahead % kSt]);
    else asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kSt - 1));  // tile `tile`'s group is complete
    __syncthreads();  // tile `tile` (and Q, first time) visible to every warp
    // A tile without a valid key has m_t = −inf for every head and is not folded: skip its work.
    if (__any_sync(0xffffffffu, valid_s[st][lane] != 0)) {
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
      float mt[2], lt[2];
      tile_stats(s, valid_s[st], c, a.scale, mt, lt);
      float fa[2] = {0.0f, 0.0f}, fb[2] = {0.0f, 0.0f};
      bool fold[2] = {false, false};
      if constexpr (kSplit) {  // the tile's statistics, once per (row, head): dim half 0, lane c == 0
        if (d0 == 0 && c == 0)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            if (hr[r] < nh)
              part_ml(a, n_tiles)[(t * n_tiles + tile) * a.heads + hb + hr[r]] = make_float2(mt[r], lt[r]);
      } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) fold[r] = tile_fold(m_run[r], l_run[r], mt[r], lt[r], fa[r], fb[r]);
      }
      uint32_t pf[2][4];
      pack_p(s, pf);
      const uint32_t k_base = uint32_t(__cvta_generic_to_shared(k_s));
      float* po = kSplit ? a.part + ((t * n_tiles + tile) * a.heads + hb) * kD : nullptr;
#pragma unroll
      for (int n0 = 0; n0 < kN; n0 += kNc) {  // O_t in passes of kNc n-tiles, then folded or stored
        float ot[kNc][4];
#pragma unroll
        for (int n = 0; n < kNc; ++n) ot[n][0] = ot[n][1] = ot[n][2] = ot[n][3] = 0;
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          // ldmatrix.x2.trans: lanes 0-7 address keys 16kk+0..7, lanes 8-15 keys 16kk+8..15.
          const uint32_t row_addr = k_base + uint32_t(((16 * kk + (lane & 15)) * kLd + d0) * 2);
#pragma unroll
          for (int n = 0; n < kNc; ++n) {
            uint32_t bf[2];
            asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                         : "=r"(bf[0]), "=r"(bf[1])
                         : "r"(row_addr + uint32_t((n0 + n) * 16)));
            dev_mma_bf16_16816(ot[n], pf[kk], bf);
          }
        }
#pragma unroll
        for (int n = 0; n < kNc; ++n) {
          if constexpr (kSplit) {
            const int d = d0 + (n0 + n) * 8 + 2 * c;
            if (hr[0] < nh) *reinterpret_cast<float2*>(po + hr[0] * kD + d) = make_float2(ot[n][0], ot[n][1]);
            if (hr[1] < nh) *reinterpret_cast<float2*>(po + hr[1] * kD + d) = make_float2(ot[n][2], ot[n][3]);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r = e >> 1;
              if (fold[r]) o[n0 + n][e] = fold_o(o[n0 + n][e], ot[n][e], fa[r], fb[r]);
            }
          }
        }
      }
    } else if constexpr (kSplit) {  // no valid key: the tile's m_t = −inf (not folded)
      if (d0 == 0 && c == 0)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if (hr[r] < nh)
            part_ml(a, n_tiles)[(t * n_tiles + tile) * a.heads + hb + hr[r]] = make_float2(-INFINITY, 0.0f);
    }
    __syncthreads();  // every warp is done with stage st before it is refilled
  }
  if constexpr (!kSplit) {
    store_rows<kD, kN>(a, t, hb, nh, hr, d0, c, m_run, l_run, o);
  }
}

// The in-block forms' inverse RoPE (PrefillAttnArgs::unrope_pos): rope_kernel's rotation launched
// after the attention, over its output (the split form's fold applies it itself).
cudaError_t unrope_after(const PrefillAttnArgs& a, int dim, cudaStream_t s) {
  return a.unrope_pos ? launch_rope(a.out, a.unrope_pos, a.unrope_inv_freq, a.m, a.heads, dim, a.unrope_dim, true,
                                    a.bf16_out, s)
                      : cudaSuccess;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FS_ATTN_WGMMA 1
#endif

// The in-block form on the warpgroup tensor cores (sm_90a; head dims 128 / 256 / 512, blocks of
// 64 heads): the same warps, tiles, order and arithmetic as prefill_attn_kernel<kD, 4, kSt>, so
// the same bits (wgmma's whole-k BF16 steps sum as the m16n8k16 steps do; CudaPrefillAttention.*
// compares the launches bitwise). Warpgroup w (warps 4w .. 4w + 3, the other kernel's dim half w)
// computes the tile's S = Q·Kᵀ as one m64n32k16 chain over the head dim (Q's 64 heads as M, the
// tile's 32 keys as N), which leaves on each thread the elements the four m16n8 tiles leave there
// (rows g, g + 8 of its warp's 16; columns 8j + 2c + {0, 1}); P, packed as there, is the register
// A operand of O_t = P·V, V being the same key rows read as an MN-major B operand, in passes of 64
// dims from a zero accumulator. Q and the key tiles sit in shared memory in 128-byte swizzled
// 64-dim chunks (row r's 16-byte piece p at position p ^ (r % 8)), which serves S (k-major) and
// O_t (dims-major) alike.
namespace wg {
constexpr int kSt = 3;  // key-ring stages
template <int kD>
constexpr int kSmem = (64 + kSt * kKt) * kD * 2 + 1024;  // + 1024: the base rounded up for the swizzle

#ifdef FS_ATTN_WGMMA
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {  // 128-byte swizzle
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
}
#define FS_R8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
// D += A · B, A and B k-major in shared memory.
__device__ __forceinline__ void mma_s(float (&d)[16], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1, 1, 1, 0, 0;\n"
      : FS_R8(0), FS_R8(8)
      : "l"(da), "l"(db));
}
// D += A · B, A from registers (the m16n8k16 A fragment of each warp's 16 rows), B MN-major in
// shared memory (transposed). The A registers are read-write so that they stay allocated until
// the wait retires the wgmma.
__device__ __forceinline__ void mma_o(float (&d)[32], uint32_t (&ra)[4], uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
      : FS_R8(0), FS_R8(8), FS_R8(16), FS_R8(24), "+r"(ra[0]), "+r"(ra[1]), "+r"(ra[2]), "+r"(ra[3])
      : "l"(db));
}
#undef FS_R8
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Keeps the compiler from reading accumulators before the wait (the asm statements above do not
// name them as outputs of the wait).
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// Byte offset of row r's 16-byte piece p (8 values) in a block of 64-dim chunks of `rows` rows.
__device__ __forceinline__ uint32_t sw_off(int r, int p, int rows) {
  return uint32_t((p >> 3) * rows * 128 + r * 128 + (((p & 7) ^ (r & 7)) << 4));
}

// load_tile for the swizzled stage at `base` (256 threads), the tile's key rows already checked
// in rows_s (-1: absent; see kernel()).
template <int kD>
__device__ __forceinline__ void load_tile(const PrefillAttnArgs& a, const int* rows_s, uint32_t base, int* valid_s) {
  constexpr int kP = kD / 8;  // 16-byte pieces per row
  static_assert(kKt * kP % 256 == 0, "whole pieces per thread");
#pragma unroll 2
  for (int u = 0; u < kKt * kP / 256; ++u) {
    const int i = int(threadIdx.x) + u * 256;
    const int j = i / kP, p = i % kP;
    const int r = rows_s[j];
    if (p == 0) valid_s[j] = r >= 0;
    cp16(base + sw_off(j, p, kKt), a.kv + (r >= 0 ? int64_t(r) * kD + p * 8 : 0), r >= 0);
  }
  asm volatile("cp.async.commit_group;\n" ::);
}
// Key row of slot s of query t: -1 when s is past the list or the row is absent.
__device__ __forceinline__ int key_row(const PrefillAttnArgs& a, int64_t t, int s) {
  const int r = s < a.n_idx ? a.idx[t * a.n_idx + s] : -1;
  return r >= 0 && r < a.n_rows ? r : -1;
}
#endif  // FS_ATTN_WGMMA

template <int kD>
__global__ void __launch_bounds__(256, 1) kernel(PrefillAttnArgs a) {
  pdl_prologue();
#ifdef FS_ATTN_WGMMA
  constexpr int kH = 64, kThreads = 256;
  constexpr int kN = kD / 16;        // n-tiles of 8 dims in a warpgroup's half of kD
  constexpr int kPass = kD / 128;    // passes of 64 dims over that half
  constexpr int kQBytes = kH * kD * 2, kKBytes = kKt * kD * 2;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t raw_u = uint32_t(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024 - (raw_u & 1023)) & 1023);
  const uint32_t q_u = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t k_u0 = q_u + uint32_t(kQBytes);
  // rows_s: the key rows of the next kSt tiles, read from the list one iteration before their
  // gather, so that no thread waits on the list's load before it issues its copies.
  __shared__ int valid_s[kSt][kKt], rows_s[kSt][kKt];
  const int64_t t = blockIdx.x;
  const int hb = int(blockIdx.y) * kH, nh = a.heads - hb < kH ? a.heads - hb : kH;
  const int n_tiles = (a.n_idx + kKt - 1) / kKt;
  if (threadIdx.x < kSt * kKt) rows_s[threadIdx.x / kKt][threadIdx.x % kKt] = key_row(a, t, int(threadIdx.x));
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kSt - 1; ++i) {
    if (i < n_tiles) load_tile<kD>(a, rows_s[i], k_u0 + uint32_t(i * kKBytes), valid_s[i]);
    else asm volatile("cp.async.commit_group;\n" ::);
  }
  // Q → BF16 shared, swizzled (heads past nh: zero), all loads of a thread in flight at once
  // (kD 512: 32 float4)
  load_q<kD, kH, kThreads, (kH * kD / 4 / kThreads < 32 ? kH * kD / 4 / kThreads : 32)>(
      a, t, hb, nh, [&](int h, int d, uint32_t lo, uint32_t hi) {
        *reinterpret_cast<uint2*>(smem + sw_off(h, d >> 3, kH) + (d & 7) * 2) = make_uint2(lo, hi);
      });
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const int wgi = warp >> 2, h0 = (warp & 3) * 16, d0 = wgi * (kD / 2);
  const bool warp_last = warp == kThreads / 32 - 1;
  const int hr[2] = {h0 + g, h0 + g + 8};
  float o[kN][4];
#pragma unroll
  for (int i = 0; i < kN; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0, 0};
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int st = tile % kSt, ahead = tile + kSt - 1;
    if (ahead < n_tiles) load_tile<kD>(a, rows_s[ahead % kSt], k_u0 + uint32_t((ahead % kSt) * kKBytes), valid_s[ahead % kSt]);
    else asm volatile("cp.async.commit_group;\n" ::);
    // The last warp reads tile ahead + 1's key rows now and stores them at the iteration's end
    // (into slot st, whose rows were gathered kSt - 1 iterations ago).
    const int next_row = warp_last ? key_row(a, t, (ahead + 1) * kKt + lane) : -1;
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kSt - 1));
    // The tile's (and, first time, Q's) generic-proxy writes, visible to the tensor cores' reads.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    if (__any_sync(0xffffffffu, valid_s[st][lane] != 0)) {  // the same answer in every warp
      const uint32_t k_u = k_u0 + uint32_t(st * kKBytes);
      float sa[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) sa[i] = 0.0f;
      fence();
      // The descriptors' address fields advance by (byte offset) / 16. The empty asm makes dq
      // opaque per tile, so that the compiler does not hoist Q's kD / 16 descriptors out of the
      // tile loop into registers.
      uint64_t dq = desc(q_u, 16, 1024);
      const uint64_t dk = desc(k_u, 16, 1024);
      asm volatile("" : "+l"(dq));
#pragma unroll
      for (int kk = 0; kk < kD; kk += 16) {
        const uint32_t kb = uint32_t((kk & 63) * 2);  // the k16 slice inside the 128-byte rows
        mma_s(sa, dq + (((kk >> 6) * kH * 128 + kb) >> 4), dk + (((kk >> 6) * kKt * 128 + kb) >> 4));
      }
      commit_wait();
      fence_regs(sa);
      float s[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = sa[4 * j + e];
      float mt[2], lt[2];
      tile_stats(s, valid_s[st], c, a.scale, mt, lt);
      float fa[2] = {0.0f, 0.0f}, fb[2] = {0.0f, 0.0f};
      bool fold[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) fold[r] = tile_fold(m_run[r], l_run[r], mt[r], lt[r], fa[r], fb[r]);
      uint32_t pf[2][4];
      pack_p(s, pf);
#pragma unroll
      for (int ps = 0; ps < kPass; ++ps) {  // O_t in passes of 64 dims: d0 + 64·ps .. +63 (chunk d0 / 64 + ps)
        float ot[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) ot[i] = 0.0f;
        fence();
        const uint32_t v_u = k_u + uint32_t((d0 / 64 + ps) * kKt * 128);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) mma_o(ot, pf[kk], desc(v_u + uint32_t(kk * 16 * 128), uint32_t(kKt * 128), 1024));
        commit_wait();
        fence_regs(ot);
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            if (fold[r]) o[ps * 8 + n][e] = fold_o(o[ps * 8 + n][e], ot[4 * n + e], fa[r], fb[r]);
          }
      }
    }
    if (warp_last) rows_s[st][lane] = next_row;
    __syncthreads();  // every warp is done with stage st before it is refilled
  }
  store_rows<kD, kN>(a, t, hb, nh, hr, d0, c, m_run, l_run, o);
#endif  // FS_ATTN_WGMMA
}

template <int kD>
cudaError_t launch(const PrefillAttnArgs& a, cudaStream_t s) {
  static std::atomic<uint64_t> attr{0};
  const void* fn = reinterpret_cast<const void*>(kernel<kD>);
  if (const cudaError_t e = ensure_smem_limit(fn, kSmem<kD>, attr); e != cudaSuccess) return e;
  const dim3 grid(unsigned(a.m), unsigned((a.heads + 63) / 64));
  if (cudaError_t e = launch_kernel(kernel<kD>, grid, dim3(256), size_t(kSmem<kD>), s, a); e != cudaSuccess) return e;
  return unrope_after(a, kD, s);
}
}  // namespace wg

// The split form's second pass: one block per (head, row), 4 dims per thread; folds the tiles'
// partials in tile order with tile_fold / fold_o, then normalises as the in-block form. Loads
// run 8 tiles ahead of the fold (a tile without a valid key: its outputs are never written and
// its loaded values unused).
template <int kD>
__global__ void __launch_bounds__(128) attn_fold_kernel(PrefillAttnArgs a) {
  pdl_prologue();
  constexpr int kAhead = 8;
  const int h = int(blockIdx.x);
  const int64_t t = blockIdx.y;
  const int d = int(threadIdx.x) * 4;
  const bool has_d = d < kD;
  const int n_tiles = (a.n_idx + kKt - 1) / kKt;
  float m = -INFINITY, l = 0.0f;
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float2* ml = part_ml(a, n_tiles) + t * n_tiles * a.heads + h;
  const float* po = a.part + (t * n_tiles * a.heads + h) * kD + (has_d ? d : 0);
  for (int t0 = 0; t0 < n_tiles; t0 += kAhead) {
    float2 st[kAhead];
    float4 ot[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      const int tile = t0 + j;
      st[j] = tile < n_tiles ? ml[int64_t(tile) * a.heads] : make_float2(-INFINITY, 0.0f);
      ot[j] = tile < n_tiles && has_d ? *reinterpret_cast<const float4*>(po + int64_t(tile) * a.heads * kD)
                                      : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int j = 0; j < kAhead; ++j) {
      float fa, fb;
      if (!tile_fold(m, l, st[j].x, st[j].y, fa, fb)) continue;
      o.x = fold_o(o.x, ot[j].x, fa, fb), o.y = fold_o(o.y, ot[j].y, fa, fb);
      o.z = fold_o(o.z, ot[j].z, fa, fb), o.w = fold_o(o.w, ot[j].w, fa, fb);
    }
  }
  if (!has_d) return;
  const float inv = fold_inv(m, l, a.sink[h]);
  float e[4] = {fold_out(o.x * inv, a.bf16_out), fold_out(o.y * inv, a.bf16_out), fold_out(o.z * inv, a.bf16_out),
                fold_out(o.w * inv, a.bf16_out)};
  const int roff = kD - a.unrope_dim;  // even: the pairs (d, d + 1), (d + 2, d + 3)
  if (a.unrope_pos && d + 2 >= roff) {  // rope_kernel's inverse rotation of the stored values
    const float p = float(a.unrope_pos[t]);
#pragma unroll
    for (int q = 0; q < 4; q += 2) {
      if (d + q < roff) continue;  // roff % 4 == 2: this thread's first pair is not rotated
      float cs, sn;
      dev_rope_trig(p, ld_weight(a.unrope_inv_freq + (d + q - roff) / 2), true, cs, sn);
      dev_rope_pair(e[q], e[q + 1], cs, sn, a.bf16_out);
    }
  }
  *reinterpret_cast<float4*>(a.out + (t * a.heads + h) * kD + d) = make_float4(e[0], e[1], e[2], e[3]);
}

template <int kD, int kHG, int kSt>
cudaError_t launch_shape(const PrefillAttnArgs& a, cudaStream_t s) {
  static std::atomic<uint64_t> attr{0};  // per device (smem_limit.cuh)
  const void* fn = reinterpret_cast<const void*>(prefill_attn_kernel<kD, kHG, kSt>);
  if (const cudaError_t e = ensure_smem_limit(fn, kSmemOf<kD, kHG, kSt>, attr); e != cudaSuccess) return e;
  const unsigned head_blocks = unsigned((a.heads + 16 * kHG - 1) / (16 * kHG));
  const dim3 grid = kSt == 1 ? dim3(unsigned((a.n_idx + kKt - 1) / kKt), head_blocks, unsigned(a.m))
                             : dim3(unsigned(a.m), head_blocks);
  if (cudaError_t e =
          launch_kernel(prefill_attn_kernel<kD, kHG, kSt>, grid, dim3(kHG * 64), size_t(kSmemOf<kD, kHG, kSt>), s, a);
      e != cudaSuccess)
    return e;
  if (kSt != 1) return unrope_after(a, kD, s);
  return launch_kernel(attn_fold_kernel<kD>, dim3(unsigned(a.heads), unsigned(a.m)), dim3(std::max(32, kD / 4)), 0, s,
                       a);
}

// Launches of up to kFewRows rows (decode steps, verify blocks) take the split form in blocks of
// 16 heads when its partials fit a.part, else blocks of 16 heads with a 4-stage ring; others
// 64-head blocks. The same bits in every shape.
constexpr int64_t kFewRows = 32;
template <int kD>
cudaError_t launch_d(const PrefillAttnArgs& a, cudaStream_t s) {
  if (a.m <= kPrefillAttnSplitMaxRows && a.n_idx > 0 && a.part && a.part_bytes >= prefill_attn_split_bytes(a.m, a.n_idx, a.heads, a.dim))
    return launch_shape<kD, 1, 1>(a, s);
  if (a.m <= kFewRows) return launch_shape<kD, 1, 4>(a, s);
  if constexpr (kD >= 128)
    if (!a.mma_sync && current_device_is_sm90a()) return wg::launch<kD>(a, s);
  return launch_shape<kD, 4, 2>(a, s);
}

}  // namespace

bool prefill_attn_supports(int64_t heads, int64_t dim) {
  return heads > 0 && heads <= 65535 * int64_t(16) && (dim == 64 || dim == 128 || dim == 256 || dim == 512);
}

size_t prefill_attn_split_bytes(int64_t m, int64_t n_idx, int64_t heads, int64_t dim) {
  if (m <= 0 || n_idx <= 0 || heads <= 0 || dim <= 0) return 0;
  return size_t(m) * size_t((n_idx + kKt - 1) / kKt) * size_t(heads) * size_t(dim + 2) * sizeof(float);
}

cudaError_t launch_prefill_attn(const PrefillAttnArgs& a, cudaStream_t s) {
  if (!prefill_attn_supports(a.heads, a.dim) || a.m < 0 || a.m > INT32_MAX || a.n_idx < 0 || a.n_rows < 0)
    return cudaErrorInvalidValue;
  if (a.unrope_pos && (!a.unrope_inv_freq || a.unrope_dim <= 0 || a.unrope_dim > a.dim || a.unrope_dim % 2 != 0))
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
