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

#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/model/small_kernels.h"
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
  {  // Q → BF16 shared (heads past nh: zero), kR loads in flight per thread
    constexpr int kR = kD / 16 < 8 ? kD / 16 : 8;  // kD / 16: float4 loads per thread
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
        const int e = (i0 + u * kThreads + int(threadIdx.x)) * 4, h = e / kD, d = e % kD;
        uint32_t* dst = reinterpret_cast<uint32_t*>(q_s + h * kLd + d);
        dst[0] = dev_pack_bf16x2(v[u].x, v[u].y), dst[1] = dev_pack_bf16x2(v[u].z, v[u].w);
      }
    }
  }
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
      // The tile's statistics per row (r: rows g and g + 8): max, then p = exp(s − m_t) and
      // l_t = Σ p (the thread's keys in order, then the quad's by shuffles).
      float mt[2] = {-INFINITY, -INFINITY}, lt[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = j * 8 + 2 * c + (e & 1);
          s[j][e] = valid_s[st][key] ? s[j][e] * a.scale : -INFINITY;
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
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {  // keys 16·kk .. +15
        pf[kk][0] = dev_pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        pf[kk][1] = dev_pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        pf[kk][2] = dev_pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pf[kk][3] = dev_pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
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
}

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
  if (kSt != 1)
    return a.unrope_pos ? launch_rope(a.out, a.unrope_pos, a.unrope_inv_freq, a.m, a.heads, kD, a.unrope_dim, true,
                                      a.bf16_out, s)
                        : cudaSuccess;
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
  return a.m <= kFewRows ? launch_shape<kD, 1, 4>(a, s) : launch_shape<kD, 4, 2>(a, s);
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
