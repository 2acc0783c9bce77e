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
//
// Decode speed (M <= 8) is set by weight bytes in flight, not by arithmetic: a warp iteration is
// one dependent round trip (weights + x, quantise, MMA), so (a) a warp loads `kChunk` blocks per
// iteration (FP4 kept packed until the MMA so 4 blocks fit the 128-register cap), and (b) small
// grids are split along k over a thread-block cluster (sm_90): the CTAs of a cluster sum disjoint
// k ranges and CTA rank 0 adds the partials from distributed shared memory in rank order, so the
// result stays deterministic and needs no workspace. The split is used only while all CTAs
// still fit in one wave (pick_tuning below).
//
// Prefill (x pre-quantised by launch_gemv_quantize, more than 8 tokens per group):
// gemv_tiled_kernel forms the same sums in the same order as a GEMM of 64-row x 64-token tiles,
// so a prompt's rows are the same bits whether prefilled in any chunking or decoded one by one.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "ops/cuda/gemv/fp4_expand.cuh"
#include "ops/cuda/gemv/gemv_kernels.h"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/mbarrier.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/runtime/smem_limit.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 32;  // output rows per block

__device__ __forceinline__ float e8m0f(uint8_t e) { return __uint_as_float(uint32_t(e) << 23); }

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// Raw weight words and per-row scales of one matrix for rows row0 + mt*16 + {g, g+8}, blocks
// kb0...: FP8 keeps two words per (row, block) (A fragment regs h and h+2), FP4 one packed word
// (expanded right before the MMA, which halves the registers that hold loads in flight).
template <bool kFp4>
struct WRaw {
  static constexpr int kWords = kFp4 ? 1 : 2;
};

// Decode's streamed weight loads: read-only, not kept in L1, and each asks the L2 for the whole
// 256-byte span around it. A warp's load takes 8 (FP8) or 4 (FP4) bytes of each row from four
// threads, 16-32 bytes of each of 32 rows; with the hint DRAM serves each row in 256-byte runs
// that the next k blocks' loads then find in L2 (as the tensor-core linear's loads, linear_mma.cu).
__device__ __forceinline__ uint2 ld_stream(const uint2* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ unsigned int ld_stream(const unsigned int* p) {
  unsigned int v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// r'[i] = r[(i + s) & 3] by selects (no local memory).
__device__ __forceinline__ void rotl4(uint32_t (&r)[4], int s) {
  if (s & 1) {
    const uint32_t t = r[0];
    r[0] = r[1], r[1] = r[2], r[2] = r[3], r[3] = t;
  }
  if (s & 2) {
    uint32_t t = r[0];
    r[0] = r[2], r[2] = t;
    t = r[1], r[1] = r[3], r[3] = t;
  }
}

// FP4, 4-block chunks: the four threads q of a row's quad each load 16 bytes, block kb0 + q of the
// row (one load, whole 32-byte sectors, instead of four 4-byte loads that each use half a sector),
// then exchange words so that thread q holds word q of blocks kb0..kb0+3, out[j]: the registers
// the 4-byte loads give (the same fragments, the same bits). Every lane of the warp takes part.
__device__ __forceinline__ void load_fp4_quad4(const uint8_t* row_kb0, int q, uint32_t (&out)[4]) {
  const uint4 v = ld_stream(reinterpret_cast<const uint4*>(row_kb0 + q * 16));
  uint32_t r[4] = {v.x, v.y, v.z, v.w};
  rotl4(r, q);  // r[s]: word (q + s) & 3 of block q, the word thread (q + s) & 3 wants from it
  const int quad = int(threadIdx.x & 31) & ~3;
  uint32_t got[4];  // got[s]: word q of block (q - s) & 3
#pragma unroll
  for (int s = 0; s < 4; ++s) got[s] = __shfl_sync(0xffffffffu, r[s], quad | ((q - s) & 3));
  uint32_t o[4] = {got[0], got[3], got[2], got[1]};  // o[i] = got[(-i) & 3]
  rotl4(o, (4 - q) & 3);                              // o[j] = got[(q - j) & 3]: word q of block j
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = o[j];
}

// FP4 in the fragment order (ops/fp4_fragments.h: n % 32 == 0, k % 64 == 0): the registers of
// load_w's row-major loads, each block's 4 words in one 16-byte load (a warp reads 512 contiguous
// bytes) and each block pair's scale bytes in one 8-byte load.
// A fragment-order unit's 16 bytes of block j for this lane (ops/fp4_fragments.h): the packed FP4
// words of its rows g, g + 8 (tile 0) and g + 16, g + 24 (tile 1).
template <int kChunk>
__device__ __forceinline__ void fp4_unit_words(const uint4& v, int j, uint32_t (&A)[2][kChunk][2][1]) {
  A[0][j][0][0] = v.x, A[0][j][1][0] = v.y, A[1][j][0][0] = v.z, A[1][j][1][0] = v.w;
}
// A block pair's 8 scale bytes of this lane's rows (bytes 2i, 2i + 1: row i = 2mt + h, blocks 2p,
// 2p + 1) into the packed per-row scale words, pair pp at bits 16pp.
__device__ __forceinline__ void fp4_pair_scales(const uint2& s, int pp, uint32_t (&packed)[2][2]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) packed[i / 2][i % 2] |= (((i < 2 ? s.x : s.y) >> (16 * (i % 2))) & 0xffffu) << (16 * pp);
}

template <int kChunk, bool kKeep>
__device__ __forceinline__ void load_w_packed(const GemvArgs& a, const uint8_t* w, const uint8_t* ws, int row0,
                                              int kb0, int g, uint32_t (&A)[2][kChunk][2][1], uint32_t (&sc)[2][2]) {
  const int64_t unit0 = int64_t(row0 / 32) * (a.k / 64);  // the tile's first (tile, pair) unit
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    const int kb = kb0 + j;
    const auto* p = reinterpret_cast<const uint4*>(w + ((unit0 + kb / 2) * 32 + lane) * 32 + (kb % 2) * 16);
    fp4_unit_words<kChunk>(kKeep ? ld_weight(p) : ld_stream(p), j, A);
  }
  constexpr int kPairs = kChunk >= 2 ? kChunk / 2 : 1;  // kChunk >= 2: kb0 is even
  uint32_t packed[2][2] = {};
#pragma unroll
  for (int pp = 0; pp < kPairs; ++pp) {
    const uint2 s = ld_weight(reinterpret_cast<const uint2*>(ws + ((unit0 + kb0 / 2 + pp) * 8 + g) * 8));
    if constexpr (kChunk == 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // i = 2mt + h: bytes 2i (block 2p), 2i + 1 (block 2p + 1)
        const uint32_t two = ((i < 2 ? s.x : s.y) >> (16 * (i % 2))) & 0xffffu;
        packed[i / 2][i % 2] = (two >> (8 * (kb0 % 2))) & 0xffu;
      }
    } else {
      fp4_pair_scales(s, pp, packed);
    }
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[mt][h] = packed[mt][h];
}

// kKeep: weights cached normally (prefill passes re-read a block's weight rows for every token
// tile); else streamed (ld_stream: decode reads them once). kPacked: the fragment order
// (ops/fp4_fragments.h; FP8: each block's two 8-byte pieces of the thread's four rows in two
// 16-byte loads).
template <bool kFp4, int kChunk, bool kKeep = false, bool kPacked = false>
__device__ __forceinline__ void load_w(const GemvArgs& a, const uint8_t* w, const uint8_t* ws,
                                       int row0, int kb0, int g, int q,
                                       uint32_t (&A)[2][kChunk][2][WRaw<kFp4>::kWords],
                                       uint32_t (&sc)[2][2]) {
  static_assert(kChunk <= 4, "scale exponents are packed 4 per register");
  if constexpr (kPacked && kFp4) {
    load_w_packed<kChunk, kKeep>(a, w, ws, row0, kb0, g, A, sc);
    return;
  }
  const int nkb = a.k / 32;
  // FP4: a row's kChunk scale bytes in one load where they are aligned (nkb % kChunk == 0).
  const bool wide_sc = kChunk > 1 && nkb % kChunk == 0 && reinterpret_cast<uintptr_t>(ws) % kChunk == 0;
  uint32_t sc8 = 0;
  if constexpr (!kFp4) {  // one scale row per 32-row tile (w_block 32 or 128, row0 % 32 == 0)
    const int kbw = a.k / a.w_block;
    const uint8_t* srow = ws + int64_t(row0 / a.w_block) * kbw;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const uint8_t* sp = srow + ((kb0 + j) * 32) / a.w_block;
      sc8 |= uint32_t(*sp) << (8 * j);
    }
  }
  if constexpr (kPacked && !kFp4) {  // FP8 in the fragment order (n % 32 == 0: no tail rows)
    const int lane = int(threadIdx.x & 31);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      const auto* p = reinterpret_cast<const uint4*>(w + ((int64_t(row0 / 32) * nkb + kb0 + j) * 32 + lane) * 32);
      const uint4 v0 = kKeep ? ld_weight(p) : ld_stream(p), v1 = kKeep ? ld_weight(p + 1) : ld_stream(p + 1);
      A[0][j][0][0] = v0.x, A[0][j][0][1] = v0.y, A[0][j][1][0] = v0.z, A[0][j][1][1] = v0.w;  // rows g, g + 8
      A[1][j][0][0] = v1.x, A[1][j][0][1] = v1.y, A[1][j][1][0] = v1.z, A[1][j][1][1] = v1.w;  // g + 16, g + 24
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sc[mt][h] = sc8;
  } else {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = min(row0 + mt * 16 + h * 8 + g, a.n - 1);  // tail rows: loaded, never stored
        uint32_t packed = sc8;
        if constexpr (kFp4) {
          const uint8_t* sp = ws + int64_t(row) * nkb + kb0;
          if (wide_sc) {
            if constexpr (kChunk == 4) packed = ld_weight(reinterpret_cast<const unsigned int*>(sp));
            else if constexpr (kChunk == 2) packed = ld_weight(reinterpret_cast<const unsigned short*>(sp));
          } else {
#pragma unroll
            for (int j = 0; j < kChunk; ++j) packed |= uint32_t(ld_weight(sp + j)) << (8 * j);
          }
        }
        if constexpr (kFp4 && kChunk == 4 && !kKeep) {
          // Rows are k / 2 bytes (k a multiple of 32) and blocks 16: every load is 16-byte aligned.
          uint32_t q4[4];
          load_fp4_quad4(w + int64_t(row) * (a.k / 2) + kb0 * 16, q, q4);
#pragma unroll
          for (int j = 0; j < 4; ++j) A[mt][j][h][0] = q4[j];
        } else {
#pragma unroll
          for (int j = 0; j < kChunk; ++j) {
            const int kb = kb0 + j;
            if constexpr (kFp4) {
              const auto* p = reinterpret_cast<const unsigned int*>(w + int64_t(row) * (a.k / 2) + kb * 16 + q * 4);
              A[mt][j][h][0] = kKeep ? ld_weight(p) : ld_stream(p);
            } else {
              const auto* p = reinterpret_cast<const uint2*>(w + int64_t(row) * a.k + kb * 32 + q * 8);
              const uint2 u = kKeep ? ld_weight(p) : ld_stream(p);
              A[mt][j][h][0] = u.x;
              A[mt][j][h][1] = u.y;
            }
          }
        }
        sc[mt][h] = packed;
      }
    }
  }
}

// Loads and FP8-quantises this thread's 8 values of each block for one token row (nullptr =
// absent token: zero codes, zero scale). Matches ops::fp8_quant_dequant bit for bit; with bf16_in
// each value is first rounded to BF16 (dev_round_bf16, quant_sim kBf16's rounding), the result of
// rounding x in place before the launch, without touching x.
template <int kChunk>
__device__ __forceinline__ void quant_vals(float (&v)[kChunk][8], bool present, int act_block,
                                           uint32_t (&B)[kChunk][2], float (&xs)[kChunk]);

template <int kChunk>
__device__ __forceinline__ void quant_x(const float* xrow, int kb0, int q, int act_block, bool bf16_in,
                                        uint32_t (&B)[kChunk][2], float (&xs)[kChunk]) {
  float v[kChunk][8];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    float4 lo = make_float4(0, 0, 0, 0), hi = lo;
    if (xrow) {  // plain loads: x is step-written (runtime/pdl.cuh)
      const float4* p = reinterpret_cast<const float4*>(xrow + (kb0 + j) * 32 + q * 8);
      lo = p[0];
      hi = p[1];
    }
    v[j][0] = lo.x, v[j][1] = lo.y, v[j][2] = lo.z, v[j][3] = lo.w;
    v[j][4] = hi.x, v[j][5] = hi.y, v[j][6] = hi.z, v[j][7] = hi.w;
    if (bf16_in) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[j][i] = dev_round_bf16(v[j][i]);
    }
  }
  quant_vals<kChunk>(v, xrow != nullptr, act_block, B, xs);
}

template <int kChunk>
__device__ __forceinline__ void quant_vals(float (&v)[kChunk][8], bool present, int act_block,
                                           uint32_t (&B)[kChunk][2], float (&xs)[kChunk]) {
  float amax[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) amax[j] = dev_fp8_block_amax(v[j], 32);
  if (act_block == 128) {  // kChunk == 4 here: one scale over the 4 blocks
    float m = 0;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) m = fmaxf(m, amax[j]);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) amax[j] = m;
  }
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    const float s = dev_fp8_block_scale(amax[j]);
    const uint2 codes = dev_fp8_pack8(v[j], 1.0f / s);  // exact: s is a power of two
    B[j][0] = codes.x, B[j][1] = codes.y;
    xs[j] = present ? s : 0.0f;
  }
}

// The pre-quantised form of quant_x (GemvArgs::xq / xs, written by quantize_kernel with the same
// arithmetic): this thread's 8 codes of each block and the block's scale for token row `row`
// (< 0: absent token, zero codes and scale).
template <int kChunk>
__device__ __forceinline__ void load_xq(const GemvArgs& a, int64_t row, int kb0, int q,
                                        uint32_t (&B)[kChunk][2], float (&xs)[kChunk]) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    B[j][0] = B[j][1] = 0u;
    xs[j] = 0.0f;
    if (row >= 0) {  // plain loads: xq / xs are step-written (runtime/pdl.cuh)
      const uint2 u = *reinterpret_cast<const uint2*>(a.xq + row * a.k + (kb0 + j) * 32 + q * 8);
      B[j][0] = u.x, B[j][1] = u.y;
      xs[j] = a.xs[row * (a.k / 32) + kb0 + j];
    }
  }
}

// kOne: the tile holds one token (column 0), so the odd columns' accumulators (acc[.][1], [3],
// never stored) are left alone: four fewer instructions per MMA at batch 1.
template <bool kFp4, int kChunk, bool kOne = false>
__device__ __forceinline__ void mma_accumulate(const uint32_t (&A)[2][kChunk][2][WRaw<kFp4>::kWords],
                                               const uint32_t (&sc)[2][2],
                                               const uint32_t (&B)[kChunk][2],
                                               const float (&xs)[kChunk], int q,
                                               float (&acc)[2][4]) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    const float s0 = __shfl_sync(0xffffffffu, xs[j], (q * 2) * 4);
    const float s1 = kOne ? 0.0f : __shfl_sync(0xffffffffu, xs[j], (q * 2 + 1) * 4);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      uint32_t af[4];
      if constexpr (kFp4) {
        fp4x8_to_e4m3x8(A[mt][j][0][0], af[0], af[2]);
        fp4x8_to_e4m3x8(A[mt][j][1][0], af[1], af[3]);
      } else {
        af[0] = A[mt][j][0][0], af[2] = A[mt][j][0][1], af[1] = A[mt][j][1][0], af[3] = A[mt][j][1][1];
      }
      float d[4];
      mma_e4m3(d, af, B[j][0], B[j][1]);
      const float w0 = e8m0f(uint8_t(sc[mt][0] >> (8 * j))), w1 = e8m0f(uint8_t(sc[mt][1] >> (8 * j)));
      acc[mt][0] += d[0] * (w0 * s0);
      if (!kOne) acc[mt][1] += d[1] * (w0 * s1);
      acc[mt][2] += d[2] * (w1 * s0);
      if (!kOne) acc[mt][3] += d[3] * (w1 * s1);
    }
  }
}

// The place of accumulator acc[nt][mt][i] of lane (g = lane / 4, q = lane % 4) in a warp's tile of
// 32 rows x 8·kNt tokens (the m16n8 MMA's D fragment layout).
__device__ __forceinline__ int frag_row(int mt, int i, int g) { return mt * 16 + g + (i >= 2 ? 8 : 0); }
__device__ __forceinline__ int frag_tok(int nt, int i, int q) { return nt * 8 + q * 2 + (i & 1); }

// Writes a thread's accumulators into its warp's slice of `red` ([kRows][8·kNt] per warp).
template <int kNt>
__device__ __forceinline__ void stash(float* red, const float (&acc)[kNt][2][4], int g, int q) {
  constexpr int kToks = 8 * kNt;
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        red[frag_row(mt, i, g) * kToks + frag_tok(nt, i, q)] = acc[nt][mt][i];
      }
}

// Output (out_row, row) of the launch: FP32, BF16 with bf16_out, or FP32 holding the BF16-rounded
// value with bf16_round_out. kStacked (a.y2 set; only the instantiations that launch() picks for
// stacked matrices, so that the others keep their registers): rows from a.ny on go to y2, each
// output with its own row stride.
template <bool kStacked = false>
__device__ __forceinline__ void store_out(const GemvArgs& a, int64_t out_row, int row, float v) {
  void* y = a.y;
  int64_t at = out_row * a.n + row;
  if constexpr (kStacked) {
    if (row >= a.ny) y = a.y2, at = out_row * (a.n - a.ny) + (row - a.ny);
    else at = out_row * a.ny + row;
  }
  if (a.bf16_out) reinterpret_cast<__nv_bfloat16*>(y)[at] = __float2bfloat16_rn(v);
  else if (a.bf16_round_out) reinterpret_cast<float*>(y)[at] = dev_round_bf16(v);  // quant_sim kBf16, fused
  else reinterpret_cast<float*>(y)[at] = v;
}

// The epilogue of one output's sums (v; gated: gate v, up u): SwiGLU with the pair's routing
// weight when gated, then store_out.
template <bool kGated, bool kStacked = false>
__device__ __forceinline__ void finish_out(const GemvArgs& a, int64_t out_row, int row, float v, float u) {
  if constexpr (kGated) {
    if (a.bf16_round_gu) v = dev_round_bf16(v), u = dev_round_bf16(u);  // two launches' bf16_round_out
    if (a.limit > 0) v = fminf(v, a.limit), u = fminf(fmaxf(u, -a.limit), a.limit);
    const float pw = a.pair_weight ? a.pair_weight[out_row] : 1.0f;
    // SwiGLU as the CPU twin (ops::swiglu) and the model's swiglu kernel compute it, with
    // dev_exp (model_device.cuh: correctly rounded like the host's libm; CUDA's expf is off
    // by up to 2 ulp, which can move the down projection's FP8 activation codes).
    v = __fmul_rn(__fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, dev_exp(-v))), u), pw);
  }
  store_out<kStacked>(a, out_row, row, v);
}

// Zero outputs for a group of another rank's expert: rows row0.. of its `count` pairs from start.
__device__ __forceinline__ void store_zeros(const GemvArgs& a, int row0, int64_t start, int64_t count) {
  for (int64_t o = threadIdx.x; o < int64_t(kRows) * count; o += kThreads) {
    const int row = row0 + int(o % kRows);
    const int64_t out_row = start + o / kRows;
    if (row >= a.n) continue;
    store_out(a, out_row, row, 0.0f);
  }
}

// The CTA's tokens and matrices: dense, all m tokens of w / wu; grouped, group blockIdx.y's pairs
// and its expert's matrices. false: the pairs are routed to another rank's expert (expert
// parallel), whose outputs rank 0 has stored as zeros (the whole cluster shares blockIdx.y, so
// every rank returns).
struct CtaGroup {
  int64_t start, count;
  const uint8_t *w, *ws, *wu, *wsu;
};
template <bool kGated>
__device__ __forceinline__ bool cta_group(const GemvArgs& a, int rank, int row0, CtaGroup& c) {
  c.start = 0, c.count = a.m, c.w = a.w, c.ws = a.ws, c.wu = a.wu, c.wsu = a.wsu;
  if (!a.group_start) return true;
  c.start = a.group_start[blockIdx.y];
  c.count = a.group_start[blockIdx.y + 1] - c.start;
  const int64_t e = a.group_expert[blockIdx.y];
  if (e < 0) {
    if (rank == 0) store_zeros(a, row0, c.start, c.count);
    return false;
  }
  c.w += e * a.e_stride, c.ws += e * a.e_sstride;
  if constexpr (kGated) c.wu += e * a.e_stride, c.wsu += e * a.e_sstride;
  return true;
}

// The input row of each of this thread's token slots in a pass (tokens tt.. of the unit's
// start..; -1: no token).
template <int kNt>
__device__ __forceinline__ void pass_rows(const GemvArgs& a, int64_t start, int64_t tt, int ntok, int g,
                                          int64_t (&xr)[kNt]) {
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    const int slot = nt * 8 + g;
    xr[nt] = -1;
    if (slot < ntok) {
      const int64_t p = start + tt + slot;
      xr[nt] = a.group_start ? (a.pair_row ? a.pair_row[p] : p) : tt + slot;
    }
  }
}

// One chunk's MMAs for every 8-token tile of the pass: the tile's x codes (pre-quantised or
// quantised here) times the chunk's weights (and up weights, gated) into the accumulators.
template <bool kFp4, int kChunk, bool kGated, int kNt, bool kOne>
__device__ __forceinline__ void chunk_mma(const GemvArgs& a, const int64_t (&xr)[kNt], int ntok, int kb0, int q,
                                          const uint32_t (&A)[2][kChunk][2][WRaw<kFp4>::kWords],
                                          const uint32_t (&sc)[2][2],
                                          const uint32_t (&AU)[2][kChunk][2][WRaw<kFp4>::kWords],
                                          const uint32_t (&scu)[2][2], float (&acc)[kNt][2][4],
                                          float (&accu)[kNt][2][4]) {
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    if (nt * 8 >= ntok) break;  // warp-uniform: no token in this or any later tile
    uint32_t B[kChunk][2];
    float xs[kChunk];
    if (a.xq) load_xq<kChunk>(a, xr[nt], kb0, q, B, xs);
    else quant_x<kChunk>(xr[nt] >= 0 ? a.x + xr[nt] * a.k : nullptr, kb0, q, a.act_block, a.bf16_in, B, xs);
    mma_accumulate<kFp4, kChunk, kOne>(A, sc, B, xs, q, acc[nt]);
    if constexpr (kGated) mma_accumulate<kFp4, kChunk, kOne>(AU, scu, B, xs, q, accu[nt]);
  }
}

// The end of a pass (after every warp stashed its sums in red): the CTA's sum over its warps in
// a fixed order, the cluster ranks' sums in rank order (distributed shared memory), the epilogue
// and stores by rank 0; returns once red may be overwritten.
template <bool kGated, int kNt, bool kStacked>
__device__ __forceinline__ void reduce_store(const GemvArgs& a, float (&red)[kGated ? 2 : 1][kWarps][kRows * 8 * kNt],
                                             int rank, int split, int row0, int64_t start, int64_t tt, int ntok) {
  constexpr int kToks = 8 * kNt, kMats = kGated ? 2 : 1;
  __syncthreads();
  // This CTA's sum over its warps (fixed order), kept in red[*][0] (each thread owns its `o`s).
  for (int o = threadIdx.x; o < kRows * kToks; o += kThreads) {
#pragma unroll
    for (int mi = 0; mi < kMats; ++mi) {
      float v = 0;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) v += red[mi][wi][o];
      red[mi][0][o] = v;
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  if (split > 1) cg::this_cluster().sync();  // every rank's partial is in its shared memory
#endif
  if (rank == 0) {
    for (int o = threadIdx.x; o < kRows * kToks; o += kThreads) {
      const int r = o / kToks, t = o % kToks, row = row0 + r;
      if (row >= a.n || t >= ntok) continue;
      float v = red[0][0][o], u = kGated ? red[kMats - 1][0][o] : 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      for (int rk = 1; rk < split; ++rk) {  // rank order: deterministic
        const float* rem = cg::this_cluster().map_shared_rank(&red[0][0][0], rk);
        v += rem[o];
        if constexpr (kGated) u += rem[(kMats - 1) * kWarps * kRows * kToks + o];
      }
#endif
      const int64_t out_row = a.group_start ? start + tt + t : tt + t;
      finish_out<kGated, kStacked>(a, out_row, row, v, u);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (split > 1) {
    cg::this_cluster().sync();  // rank 0 has read the partials before they are overwritten
    return;
  }
#endif
  __syncthreads();
}

// Grid: x = row tile * split + k slice (a cluster of `split` CTAs per row tile), y = group.
// kNt: 8-token MMA tiles per pass (1 when every group holds <= 8 tokens: half the accumulators;
// 4 for wide launches over pre-quantised x, whose passes then re-read each weight tile half as
// often). With GemvArgs::xq the passes read the codes and scales instead of quantising x.
// (Pre-quantised x, prefill: also gemv_tiled_kernel below, the same sums.)
template <bool kFp4, int kChunk, bool kGated, int kNt, bool kStacked = false, bool kPacked = false>
__global__ void __launch_bounds__(kThreads, 2) gemv_kernel(GemvArgs a, int split) {
  pdl_prologue();
  constexpr int kToks = 8 * kNt;
  __shared__ float red[kGated ? 2 : 1][kWarps][kRows * kToks];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int tile = blockIdx.x / split, rank = blockIdx.x % split;  // rank == cluster block rank
  const int row0 = tile * kRows;
  CtaGroup grp;
  if (!cta_group<kGated>(a, rank, row0, grp)) return;
  const int64_t start = grp.start, count = grp.count;
  const uint8_t *w = grp.w, *ws = grp.ws, *wu = grp.wu, *wsu = grp.wsu;
  const int n_chunks = a.k / 32 / kChunk;
  const int c_begin = rank * n_chunks / split, c_end = (rank + 1) * n_chunks / split;
  constexpr int kMats = kGated ? 2 : 1;
  for (int64_t tt = 0; tt < count; tt += kToks) {
    const int ntok = count - tt < kToks ? int(count - tt) : kToks;
    int64_t xr[kNt];  // input row of each of this thread's token slots (-1: none)
    pass_rows<kNt>(a, start, tt, ntok, g, xr);
    float acc[kNt][2][4] = {}, accu[kNt][2][4] = {};
    using Words = uint32_t[2][kChunk][2][WRaw<kFp4>::kWords];
    // The warp's chunks; `one`: std::true_type when the pass holds a single token (kOne).
    auto chunks = [&](auto one) {
      constexpr bool kOne = decltype(one)::value;
      for (int c = c_begin + warp; c < c_end; c += kWarps) {
        const int kb0 = c * kChunk;
        Words A, AU;
        uint32_t sc[2][2], scu[2][2];
        load_w<kFp4, kChunk, false, kPacked>(a, w, ws, row0, kb0, g, q, A, sc);
        if constexpr (kGated) load_w<kFp4, kChunk, false, kPacked>(a, wu, wsu, row0, kb0, g, q, AU, scu);
        chunk_mma<kFp4, kChunk, kGated, kNt, kOne>(a, xr, ntok, kb0, q, A, sc, AU, scu, acc, accu);
      }
    };
    // (Not with 4-block chunks of gate and up: the second copy of the loop would spill.)
    if (kNt == 1 && !(kGated && kChunk == 4) && ntok == 1) chunks(std::true_type{});
    else chunks(std::false_type{});
    stash<kNt>(red[0][warp], acc, g, q);
    if constexpr (kGated) stash<kNt>(red[kMats - 1][warp], accu, g, q);
    reduce_store<kGated, kNt, kStacked>(a, red, rank, split, row0, start, tt, ntok);
  }
}

// ---- The FP4 fragment-order decode GEMV through a shared-memory ring ---------------------------
// gemv_kernel's sums for packed FP4 weights, 2-block chunks, 8-token passes over pre-quantised x
// (GemvArgs::ring > 0): the registers that gemv_kernel loads per chunk come from shared memory
// instead, where one thread streams them by bulk copies (cp.async.bulk, completing on a stage's
// mbarrier) `ring` stages ahead. In the fragment order a CTA's next kWarps chunks of a matrix are
// one contiguous run of kWarps 1,024-byte units (and kWarps 64-byte scale units), and a token's
// codes and scales for them are contiguous too, so a stage is 2·kMats + 2·tokens bulk copies of a few KB,
// and the bytes a CTA has in flight no longer depend on how many registers its warps can spare.
// Warp w takes chunk c_begin + w + kWarps·i from stage i, as gemv_kernel's loop does, and the same
// chunk_mma arithmetic, stash and reduce_store follow: the same bits.
constexpr int kRingChunk = 2;                                     // k blocks per chunk
constexpr int kRingUnit = 1024;                                   // weight bytes per chunk (a 32-row tile's block pair)
constexpr int kRingScaleUnit = 64;                                // weight scale bytes per chunk
constexpr int kRingXq = kWarps * kRingChunk * 32;                 // a token's code bytes per stage
constexpr int kRingXs = kWarps * kRingChunk * 4 + 16;             // its scale bytes (+ 16: the copy's alignment slack)
constexpr int kRingMaxStages = 8;

template <bool kGated>
struct RingLayout {
  static constexpr int kMats = kGated ? 2 : 1;
  static constexpr int kW = kWarps * kRingUnit, kS = kWarps * kRingScaleUnit;
  static constexpr int kStage = kMats * (kW + kS) + 8 * (kRingXq + kRingXs);  // bytes per stage (16-aligned)
  static constexpr int kRed = kMats * kWarps * kRows * 8 * 4;                   // reduce_store's red
  static size_t bytes(int stages) { return size_t(kRed) + size_t(stages) * (kStage + 8); }
};
static_assert(RingLayout<true>::kStage % 16 == 0 && RingLayout<false>::kStage % 16 == 0, "stage alignment");

template <bool kGated>
__global__ void __launch_bounds__(kThreads, 2) gemv_ring_kernel(GemvArgs a, int split) {
  pdl_prologue();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // bulk copies and mbarrier tx counts (ring_applies: sm_90+)
  using L = RingLayout<kGated>;
  constexpr int kMats = L::kMats;
  extern __shared__ __align__(128) uint8_t rsm[];
  auto& red = *reinterpret_cast<float(*)[kMats][kWarps][kRows * 8]>(rsm);
  uint8_t* ring = rsm + L::kRed;
  const int stages = a.ring;
  const uint32_t bar0 = uint32_t(__cvta_generic_to_shared(ring + size_t(stages) * L::kStage));
  const uint32_t ring_s = uint32_t(__cvta_generic_to_shared(ring));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int tile = blockIdx.x / split, rank = blockIdx.x % split;
  const int row0 = tile * kRows;
  CtaGroup grp;
  if (!cta_group<kGated>(a, rank, row0, grp)) return;
  const int64_t start = grp.start, count = grp.count;
  const uint8_t *w = grp.w, *ws = grp.ws, *wu = grp.wu, *wsu = grp.wsu;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) mbar_init(bar0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int n_chunks = a.k / 32 / kRingChunk;
  const int c_begin = rank * n_chunks / split, c_end = (rank + 1) * n_chunks / split;
  const int n_st = (c_end - c_begin + kWarps - 1) / kWarps;  // stages per pass
  const int64_t unit0 = int64_t(row0 / 32) * (a.k / 64);     // the tile's first (tile, pair) unit
  const uint8_t* mats_w[2] = {w, wu};
  const uint8_t* mats_s[2] = {ws, wsu};
  uint32_t use = 0;  // stages used by earlier passes: stage st of a pass is use + st (slot, parity)
  __shared__ int64_t trow[8];  // the pass's input rows (read by the issuing thread)
  for (int64_t tt = 0; tt < count; tt += 8) {
    const int ntok = count - tt < 8 ? int(count - tt) : 8;
    if (int(threadIdx.x) < ntok) {
      const int64_t p = start + tt + threadIdx.x;
      trow[threadIdx.x] = a.group_start ? (a.pair_row ? a.pair_row[p] : p) : tt + threadIdx.x;
    }
    __syncthreads();
    // Stage st of this pass into its slot (thread 0): every matrix's units and scale units of
    // chunks c0.., then each token's codes and (16-byte aligned superset of) scales.
    auto issue = [&](int st) {
      const int c0 = c_begin + st * kWarps, nch = c_end - c0 < kWarps ? c_end - c0 : kWarps;
      const uint32_t slot = (use + uint32_t(st)) % uint32_t(stages), bar = bar0 + 8 * slot;
      const uint32_t dst = ring_s + slot * L::kStage;
      const int64_t xs0 = int64_t(c0) * kRingChunk * 4, xs_lo = xs0 & ~int64_t(15);
      const uint32_t xs_bytes = uint32_t((xs0 + int64_t(nch) * kRingChunk * 4 + 15 - xs_lo) & ~int64_t(15));
      mbar_arrive_expect_tx(bar, uint32_t(kMats * nch * (kRingUnit + kRingScaleUnit)) +
                              uint32_t(ntok) * (uint32_t(nch) * kRingChunk * 32 + xs_bytes));
#pragma unroll
      for (int mi = 0; mi < kMats; ++mi) {
        bulk_load(dst + mi * (L::kW + L::kS), mats_w[mi] + (unit0 + c0) * kRingUnit, uint32_t(nch * kRingUnit), bar);
        bulk_load(dst + mi * (L::kW + L::kS) + L::kW, mats_s[mi] + (unit0 + c0) * kRingScaleUnit,
                  uint32_t(nch * kRingScaleUnit), bar);
      }
      for (int t = 0; t < ntok; ++t) {
        const int64_t row = trow[t];
        const uint32_t xd = dst + kMats * (L::kW + L::kS) + t * (kRingXq + kRingXs);
        bulk_load(xd, a.xq + row * a.k + int64_t(c0) * kRingChunk * 32, uint32_t(nch * kRingChunk * 32), bar);
        bulk_load(xd + kRingXq, reinterpret_cast<const uint8_t*>(a.xs + row * (a.k / 32)) + xs_lo, xs_bytes, bar);
      }
    };
    if (threadIdx.x == 0)
      for (int st = 0; st < stages && st < n_st; ++st) issue(st);
    float acc[1][2][4] = {}, accu[1][2][4] = {};
    auto run = [&](auto one) {
      constexpr bool kOne = decltype(one)::value;
      for (int st = 0; st < n_st; ++st) {
        const uint32_t u = use + uint32_t(st), slot = u % uint32_t(stages);
        mbar_wait(bar0 + 8 * slot, (u / uint32_t(stages)) & 1u);
        const int c = c_begin + st * kWarps + warp;
        if (c < c_end) {
          const uint8_t* sb = ring + size_t(slot) * L::kStage;
          uint32_t A[kMats][2][kRingChunk][2][1], sc[kMats][2][2];
#pragma unroll
          for (int mi = 0; mi < kMats; ++mi) {  // load_w_packed's registers, from the stage
            const uint8_t* unit = sb + mi * (L::kW + L::kS) + warp * kRingUnit + lane * 32;
#pragma unroll
            for (int j = 0; j < kRingChunk; ++j) fp4_unit_words<kRingChunk>(*reinterpret_cast<const uint4*>(unit + j * 16), j, A[mi]);
            sc[mi][0][0] = sc[mi][0][1] = sc[mi][1][0] = sc[mi][1][1] = 0u;
            fp4_pair_scales(*reinterpret_cast<const uint2*>(sb + mi * (L::kW + L::kS) + L::kW + warp * kRingScaleUnit + g * 8),
                            0, sc[mi]);
          }
          uint32_t B[kRingChunk][2] = {};
          float xsv[kRingChunk] = {};
          if (g < ntok) {  // load_xq's values, from the stage (this thread's token slot g)
            const uint8_t* xd = sb + kMats * (L::kW + L::kS) + g * (kRingXq + kRingXs);
            const int64_t xs_skip = (int64_t(c_begin + st * kWarps) * kRingChunk * 4) & 15;
#pragma unroll
            for (int j = 0; j < kRingChunk; ++j) {
              const uint2 v = *reinterpret_cast<const uint2*>(xd + (warp * kRingChunk + j) * 32 + q * 8);
              B[j][0] = v.x, B[j][1] = v.y;
              xsv[j] = *reinterpret_cast<const float*>(xd + kRingXq + xs_skip + (warp * kRingChunk + j) * 4);
            }
          }
          mma_accumulate<true, kRingChunk, kOne>(A[0], sc[0], B, xsv, q, acc[0]);
          if constexpr (kGated) mma_accumulate<true, kRingChunk, kOne>(A[kMats - 1], sc[kMats - 1], B, xsv, q, accu[0]);
        }
        __syncthreads();  // every warp is done with the slot: refill it
        if (threadIdx.x == 0 && st + stages < n_st) issue(st + stages);
      }
    };
    if (ntok == 1) run(std::true_type{});
    else run(std::false_type{});
    use += uint32_t(n_st);
    stash<1>(red[0][warp], acc, g, q);
    if constexpr (kGated) stash<1>(red[kMats - 1][warp], accu, g, q);
    reduce_store<kGated, 1, false>(a, red, rank, split, row0, start, tt, ntok);
  }
#endif
}

// ---- Tiled passes for prefill (pre-quantised x) --------------------------------------------------
// The same sums as gemv_kernel, bit for bit, laid out as a GEMM: a warp owns 32 output rows x 8·kNt
// tokens and adds every k block of the matrix itself, in gemv_kernel's order. For each output,
// gemv_kernel forms: per cluster rank rk (chunks [rk·C/split, (rk+1)·C/split)), per warp w, the
// warp's sum over its chunks c = c_begin + w, c_begin + w + 8, ... (each chunk's blocks in order,
// one m16n8k32 MMA per 32-block times its scales, the same fragment permutation); the CTA's sum
// 0 + warp 0 + ... + warp 7; then rank 0's sum + rank 1's + ... The tiled kernel walks the k
// blocks in exactly that sequence (a table built once per CTA, each entry flagged where a warp's
// or a rank's sum ends) with three accumulator sets (the warp's, the rank's, the total) and
// gemv_kernel's MMA / promotion code (mma_accumulate), so every output is the GEMV's bits for any
// token count. Adding a group's sum to a running sum that starts at +0 is the GEMV's first
// assignment exactly: no partial is ever -0 (each starts at +0 and only adds). The tuning (split,
// chunk) comes from pick_tuning as for the GEMV: a function of the matrix only.
// CTA: kTRowWarps x kTTokWarps warps (64 rows x 32·kNt tokens); grid x = 64-row tiles, y = group,
// z = token slices (each CTA loops over token tiles z, z + gridDim.z, ...). Per k block a stage
// holds the CTA's weight rows, token codes and token scales (cp.async, zero-filled for absent
// tokens); kTStages stages in flight, one barrier per block. Each thread's cp.async sources and
// destinations are set up once per token tile, so issuing a stage is a few adds. The warp's and
// the rank's sums live in registers; the total over the ranks, folded in at most `split` times per
// tile, lives in the thread's own column of shared memory (registers for 8 MMAs per k block per
// warp: 32 tokens x 32 rows, or 16 tokens of gate and up). The weight scale bytes of the CTA's
// rows (every k block: FP4 one per row, FP8 one per 32-row tile) are read once per CTA into
// shared memory (tiled_scale_bytes), so no load in the k loop waits on a global read. All of the
// kernel's shared memory is dynamic (TiledSmem, then the scale table).
constexpr int kTRowWarps = 2, kTTokWarps = 4, kTStages = 8, kTMaxBlocks = 1024, kTMaxFp4Blocks = 256;
constexpr int kTRows = kTRowWarps * kRows;  // 64
static_assert(kTRowWarps * kTTokWarps == kWarps, "the tiled CTA is kWarps warps");
constexpr uint32_t kTWarpEnd = 1u << 30, kTRankEnd = 1u << 31;

__device__ __forceinline__ void tcp16(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void tcp4(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
}

template <int kNt>
__device__ __forceinline__ void acc_fold(float (&dst)[kNt][2][4], float (&src)[kNt][2][4]) {
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) dst[nt][mt][i] += src[nt][mt][i], src[nt][mt][i] = 0.0f;
}

template <bool kFp4, bool kGated, int kNt>
struct TiledSmem {
  static constexpr int kMats = kGated ? 2 : 1, kToks = 8 * kNt * kTTokWarps, kAcc = kMats * kNt * 8;
  static constexpr int kRowBytes = kFp4 ? 16 : 32;  // one 32-block of a weight row
  uint8_t w[kTStages][kMats][kTRows][kRowBytes];
  uint8_t x[kTStages][kToks][32];
  float xs[kTStages][kToks];
  float tot[kAcc][kThreads];  // the total over cluster ranks, a column per thread
  uint32_t seq[kTMaxBlocks];
  int64_t xr[kToks];
};

template <bool kFp4, bool kGated, int kNt>
__global__ void __launch_bounds__(kThreads, 2) gemv_tiled_kernel(GemvArgs a, int split, int chunk) {
  pdl_prologue();
  using Sm = TiledSmem<kFp4, kGated, kNt>;
  constexpr int kMats = Sm::kMats, kToks = Sm::kToks, kRowBytes = Sm::kRowBytes, kWarpToks = 8 * kNt;
  constexpr int kWChunks = kMats * kTRows * kRowBytes / 16, kXChunks = kToks * 2;
  constexpr int kChunksPer = (kWChunks + kXChunks + kThreads - 1) / kThreads;  // cp.async chunks per thread
  extern __shared__ __align__(16) uint8_t tiled_dyn[];
  Sm& sm = *reinterpret_cast<Sm*>(tiled_dyn);
  uint8_t* wsc = tiled_dyn + sizeof(Sm);  // [kMats][FP4: kTRows rows | FP8: 2 row tiles][nkb] scale bytes
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int wr = warp % kTRowWarps, wt = warp / kTRowWarps;
  const int cta_row0 = int(blockIdx.x) * kTRows, row0 = cta_row0 + wr * kRows;
  const int nkb = a.k / 32;
  int64_t start = 0, count = a.m;
  const uint8_t *wm0 = a.w, *wm1 = a.wu, *wsm0 = a.ws, *wsm1 = a.wsu;
  bool absent = false;  // pairs routed to another rank's expert: their outputs are 0
  if (a.group_start) {
    start = a.group_start[blockIdx.y];
    count = a.group_start[blockIdx.y + 1] - start;
    const int64_t e = a.group_expert[blockIdx.y];
    if (e < 0) absent = true;
    else
      wm0 += e * a.e_stride, wsm0 += e * a.e_sstride;
      if constexpr (kGated) wm1 += e * a.e_stride, wsm1 += e * a.e_sstride;
  }
  if (int64_t(blockIdx.z) * kToks >= count) return;  // no token tile: before any barrier, CTA-uniform
  // The block sequence of gemv_kernel's sums (see above), built once by one thread.
  if (threadIdx.x == 0) {
    const int n_chunks = nkb / chunk;
    int i = 0;
    for (int rk = 0; rk < split; ++rk) {
      const int cb = rk * n_chunks / split, ce = (rk + 1) * n_chunks / split;
      int last = -1;
      for (int wi = 0; wi < kWarps; ++wi) {
        for (int c = cb + wi; c < ce; c += kWarps)
          for (int j = 0; j < chunk; ++j) sm.seq[i++] = uint32_t(c * chunk + j);
        if (i > 0 && cb + wi < ce) sm.seq[i - 1] |= kTWarpEnd, last = i - 1;
      }
      if (last >= 0) sm.seq[last] |= kTRankEnd;
    }
  }
  const int kbw = a.k / (a.w_block > 0 ? a.w_block : 32);
  constexpr int kScRows = kFp4 ? kTRows : kTRowWarps;  // FP8: one scale row per 32-row tile
  if (!absent)
    for (int idx = threadIdx.x; idx < kMats * kScRows * nkb; idx += kThreads) {
      const int mi = idx / (kScRows * nkb), r = idx / nkb % kScRows, kb = idx % nkb;
      const uint8_t* base = mi == 0 ? wsm0 : wsm1;
      if constexpr (kFp4) {
        wsc[idx] = ld_weight(base + int64_t(min(cta_row0 + r, a.n - 1)) * nkb + kb);
      } else {  // as load_w: the scale row of the tile's first row (w_block 32 or 128)
        const int row = min(cta_row0 + r * kRows, a.n - 1);
        wsc[idx] = ld_weight(base + int64_t(row / a.w_block) * kbw + (kb * 32) / a.w_block);
      }
    }
  const uint32_t sm_base = static_cast<uint32_t>(__cvta_generic_to_shared(tiled_dyn));
  for (int64_t tt = int64_t(blockIdx.z) * kToks; tt < count; tt += int64_t(gridDim.z) * kToks) {
    const int ntok = count - tt < kToks ? int(count - tt) : kToks;
    __syncthreads();  // the table is built; the previous tile's stages are all read
    for (int s = threadIdx.x; s < kToks; s += kThreads) {
      int64_t r = -1;
      if (s < ntok) {
        const int64_t p = start + tt + s;
        r = a.group_start ? (a.pair_row ? a.pair_row[p] : p) : tt + s;
      }
      sm.xr[s] = r;
    }
    __syncthreads();
    // This thread's cp.async chunks of a stage: source at k block 0 and shared destination in
    // stage 0; info = bytes per k block | stage stride << 6 | zero-fill-free bit 31 (a chunk past
    // the stage: no bits). Stages are `stride` bytes apart in each array.
    const uint8_t* csrc[kChunksPer];
    uint32_t cdst[kChunksPer], cinfo[kChunksPer];
#pragma unroll
    for (int u = 0; u < kChunksPer; ++u) {
      const int c = int(threadIdx.x) + u * kThreads;
      csrc[u] = a.w, cdst[u] = sm_base, cinfo[u] = 0;
      if (c < kWChunks) {
        const int per_mat = kTRows * kRowBytes / 16, mi = c / per_mat, rc = c % per_mat;
        const int r = rc / (kRowBytes / 16), part = rc % (kRowBytes / 16);
        const int row = min(cta_row0 + r, a.n - 1);  // tail rows: loaded, never stored
        csrc[u] = (mi == 0 ? wm0 : wm1) + int64_t(row) * (kFp4 ? a.k / 2 : a.k) + part * 16;
        cdst[u] = sm_base + uint32_t(reinterpret_cast<uintptr_t>(&sm.w[0][mi][r][part * 16]) -
                                     reinterpret_cast<uintptr_t>(&sm));
        cinfo[u] = uint32_t(kRowBytes) | uint32_t(sizeof(sm.w[0])) << 6 | 1u << 31;
      } else if (c < kWChunks + kXChunks) {
        const int xc = c - kWChunks, t = xc / 2, part = xc % 2;
        const int64_t r = sm.xr[t];
        csrc[u] = r >= 0 ? a.xq + r * a.k + part * 16 : a.xq;
        cdst[u] = sm_base + uint32_t(reinterpret_cast<uintptr_t>(&sm.x[0][t][part * 16]) - reinterpret_cast<uintptr_t>(&sm));
        cinfo[u] = uint32_t(sizeof(sm.x[0])) << 6 | (r >= 0 ? 32u | 1u << 31 : 0u);
      }
    }
    const int64_t sxr = threadIdx.x < kToks ? sm.xr[threadIdx.x] : -1;
    const float* ssrc = sxr >= 0 ? a.xs + sxr * nkb : a.xs;
    const uint32_t sdst = sm_base + uint32_t(reinterpret_cast<uintptr_t>(&sm.xs[0][threadIdx.x < kToks ? threadIdx.x : 0]) -
                                             reinterpret_cast<uintptr_t>(&sm));
    // Issues the loads of sequence position i into its stage.
    auto issue = [&](int i) {
      const uint32_t st = uint32_t(i % kTStages);
      const int kb = int(sm.seq[i] & (kTWarpEnd - 1));
#pragma unroll
      for (int u = 0; u < kChunksPer; ++u)
        if (cinfo[u] != 0)
          tcp16(cdst[u] + st * ((cinfo[u] >> 6) & 0xffffu), csrc[u] + kb * int(cinfo[u] & 63u), (cinfo[u] >> 31) != 0);
      if (threadIdx.x < kToks) tcp4(sdst + st * uint32_t(sizeof(sm.xs[0])), ssrc + (sxr >= 0 ? kb : 0), sxr >= 0);
    };
    float acc[kMats][kNt][2][4] = {}, cta[kMats][kNt][2][4] = {};
#pragma unroll
    for (int e = 0; e < Sm::kAcc; ++e) sm.tot[e][threadIdx.x] = 0.0f;  // the thread's own column
    if (!absent) {
      for (int i = 0; i < kTStages - 1; ++i) {
        if (i < nkb) issue(i);
        asm volatile("cp.async.commit_group;\n" ::);
      }
      for (int i = 0; i < nkb; ++i) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(kTStages - 2));
        __syncthreads();  // stage i landed for every thread; stage i - 1 is read by every warp
        if (i + kTStages - 1 < nkb) issue(i + kTStages - 1);
        asm volatile("cp.async.commit_group;\n" ::);
        const int st = i % kTStages;
        const uint32_t e = sm.seq[i];
        const int kb = int(e & (kTWarpEnd - 1));
        using Words = uint32_t[2][1][2][WRaw<kFp4>::kWords];
#pragma unroll
        for (int mi = 0; mi < kMats; ++mi) {
          Words A;
          uint32_t sc[2][2];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int r = wr * kRows + mt * 16 + h * 8 + g;
              if constexpr (kFp4) {
                A[mt][0][h][0] = *reinterpret_cast<const uint32_t*>(&sm.w[st][mi][r][q * 4]);
              } else {
                const uint2 u = *reinterpret_cast<const uint2*>(&sm.w[st][mi][r][q * 8]);
                A[mt][0][h][0] = u.x, A[mt][0][h][1] = u.y;
              }
              sc[mt][h] = kFp4 ? wsc[(mi * kTRows + r) * nkb + kb] : wsc[(mi * kTRowWarps + wr) * nkb + kb];
            }
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) {
            const int t = wt * kWarpToks + nt * 8 + g;
            const uint2 u = *reinterpret_cast<const uint2*>(&sm.x[st][t][q * 8]);
            uint32_t B[1][2] = {{u.x, u.y}};
            float xs[1] = {sm.xs[st][t]};
            mma_accumulate<kFp4, 1>(A, sc, B, xs, q, acc[mi][nt]);
          }
        }
        if (e & kTWarpEnd)  // gemv_kernel's v = 0; v += red[warp] in warp order
#pragma unroll
          for (int mi = 0; mi < kMats; ++mi) acc_fold<kNt>(cta[mi], acc[mi]);
        if (e & kTRankEnd) {  // v = rank 0's sum; v += rank rk's
#pragma unroll
          for (int mi = 0; mi < kMats; ++mi)
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
              for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                  float& tv = sm.tot[((mi * kNt + nt) * 2 + mt) * 4 + j][threadIdx.x];
                  tv += cta[mi][nt][mt][j], cta[mi][nt][mt][j] = 0.0f;
                }
        }
      }
      asm volatile("cp.async.wait_group 0;\n" ::);
    }
    if (row0 < a.n) {
      const int wtok0 = wt * kWarpToks;
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int row = row0 + frag_row(mt, i, g), t = wtok0 + frag_tok(nt, i, q);
            if (row >= a.n || t >= ntok) continue;
            const int64_t out_row = a.group_start ? start + tt + t : tt + t;
            if (absent) {
              store_out(a, out_row, row, 0.0f);
            } else {
              const float v = sm.tot[(nt * 2 + mt) * 4 + i][threadIdx.x];
              const float u = sm.tot[(((kMats - 1) * kNt + nt) * 2 + mt) * 4 + i][threadIdx.x];
              finish_out<kGated>(a, out_row, row, v, u);
            }
          }
    }
  }
}

// Tuning. The kernels are latency-bound (16 warps per SM at the 128-register cap), so:
// * the k split over a cluster pays only while all CTAs fit in one wave (2 per SM): a CTA has a
//   fixed cost (ramp, reduction, epilogue), and more, shorter CTAs lose once they spill into a
//   second wave. Split = min(8, 2·SMs / tiles), at least 1.
// * k blocks per warp iteration: 4 for FP8 when each warp still gets >= 2 iterations (wo_a,
//   wo_b), else 2 (4 blocks spill with FP4; wide batches then take 8-token passes). V4's
//   act_block 128 needs exactly 4. A gated launch takes the tuning of its one-matrix launches (it
//   may spill where 4 blocks of two matrices are picked) so that its gate and up sums are theirs,
//   bit for bit.
// * weights are loaded straight into registers (no shared-memory staging ring).
int g_split_override = 0, g_chunk_override = 0;
// set_gemv_fp4_chunk: k blocks per warp iteration of the FP4 matrices (0: automatic, 2).
int g_fp4_chunk = 0;

struct Tuning {
  int chunk = 1, split = 1;
};

struct DeviceInfo {
  int sms = 0, major = 0;
};

DeviceInfo device_info() {
  static DeviceInfo cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return {};
  DeviceInfo& d = cache[dev];
  if (d.sms == 0) {
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
  }
  return d;
}

// Depends on the matrix shape (n, k, format; not on gated) and, for grouped launches, on split_groups
// (a fixed group count chosen by the caller) only, never on the token count: a row's summation
// order (which k blocks each warp and cluster rank adds, in which order) is then the same whatever
// else shares the launch (batch invariance).
Tuning pick_tuning(const GemvArgs& a, bool fp4, int64_t tiles, const DeviceInfo& d) {
  Tuning t;
  const int nkb = a.k / 32;
  if (d.major >= 9 && d.sms > 0) {
    t.split = int(std::min<int64_t>(8, std::max<int64_t>(1, 2 * int64_t(d.sms) / std::max<int64_t>(tiles, 1))));
  }
  if (g_split_override > 0) t.split = g_split_override;
  if (d.major < 9) t.split = 1;
  int want = 2;
  if (a.act_block == 128) want = 4;
  else if (g_chunk_override > 0) want = g_chunk_override;
  else if (fp4 && g_fp4_chunk > 0) want = g_fp4_chunk;
  else if (!fp4 && nkb / (4 * t.split) >= 2 * kWarps) want = 4;
  while (want > 1 && nkb % want != 0) want /= 2;
  t.chunk = want;
  t.split = std::max(1, std::min({t.split, nkb / t.chunk, 8}));
  return t;
}

template <bool kFp4, int kChunk, bool kGated, int kNt, bool kStacked = false, bool kPacked = false>
cudaError_t launch_k(const GemvArgs& a, int n_groups, int split, cudaStream_t stream) {
  const int tiles = (a.n + kRows - 1) / kRows;
  const dim3 grid(tiles * split, n_groups);
  auto* kernel = gemv_kernel<kFp4, kChunk, kGated, kNt, kStacked, kPacked>;
  if (split == 1) return launch_kernel(kernel, grid, kThreads, 0, stream, a, 1);
  return launch_kernel_cluster(kernel, grid, kThreads, 0, stream, unsigned(split), a, split);
}

template <bool kFp4, bool kGated, int kNt, bool kPacked = false>
cudaError_t launch_nt(const GemvArgs& a, int n_groups, const Tuning& t, cudaStream_t stream) {
  if (t.chunk == 4) return launch_k<kFp4, 4, kGated, kNt, false, kPacked>(a, n_groups, t.split, stream);
  if (t.chunk == 2) return launch_k<kFp4, 2, kGated, kNt, false, kPacked>(a, n_groups, t.split, stream);
  return launch_k<kFp4, 1, kGated, kNt, false, kPacked>(a, n_groups, t.split, stream);
}

// Dynamic shared memory of gemv_tiled_kernel: the scale bytes of its rows for every k block.
size_t tiled_scale_bytes(int k, bool fp4, bool gated) {
  return size_t(gated ? 2 : 1) * (fp4 ? kTRows : kTRowWarps) * size_t(k / 32);
}

// The tiled kernel over every token of the launch: 64-row x (32·kNt)-token CTA tiles; token
// slices in grid z (dense: one per tile, up to 65535; grouped: about twice the average group's
// tiles, each CTA looping over the rest).
template <bool kFp4, bool kGated, int kNt>
cudaError_t launch_tiled_k(const GemvArgs& a, int n_groups, const Tuning& t, cudaStream_t stream) {
  constexpr int64_t kCtaToks = 8 * kNt * kTTokWarps;
  const int64_t row_tiles = (a.n + kTRows - 1) / kTRows;
  const int64_t per_group = a.group_start ? (a.m + n_groups - 1) / n_groups : a.m;
  int64_t slices = (per_group + kCtaToks - 1) / kCtaToks;
  if (a.group_start) slices = 2 * slices;
  slices = std::max<int64_t>(1, std::min<int64_t>(slices, 65535));
  const dim3 grid{unsigned(row_tiles), unsigned(n_groups), unsigned(slices)};
  auto* kernel = gemv_tiled_kernel<kFp4, kGated, kNt>;
  const size_t dyn = sizeof(TiledSmem<kFp4, kGated, kNt>) + tiled_scale_bytes(a.k, kFp4, kGated);
  // The limit is raised once per device to the largest this instantiation can ask for (the most
  // k blocks it takes), never to one launch's size: threads driving ranks on one device (host-
  // staged tensor parallelism) would otherwise lower it under each other's launches.
  static std::atomic<uint64_t> smem_done{0};
  const size_t dyn_max =
      sizeof(TiledSmem<kFp4, kGated, kNt>) + tiled_scale_bytes(32 * (kFp4 ? kTMaxFp4Blocks : kTMaxBlocks), kFp4, kGated);
  if (const cudaError_t e = ensure_smem_limit(reinterpret_cast<const void*>(kernel), int(dyn_max), smem_done);
      e != cudaSuccess)
    return e;
  return launch_kernel(kernel, grid, kThreads, dyn, stream, a, t.split, t.chunk);
}

// Four 8-token MMA tiles per warp for one matrix, two for gate + up (8 MMAs per k block either
// way); the token width never changes a row's sums.
template <bool kFp4, bool kGated>
cudaError_t launch_tiled(const GemvArgs& a, int n_groups, const Tuning& t, cudaStream_t stream) {
  return launch_tiled_k<kFp4, kGated, kGated ? 2 : 4>(a, n_groups, t, stream);
}

// The one-pass kernels (gemv_kernel) for launch(); kPacked: FP4 in the fragment order.
// Pre-quantised x without the tiled kernel: 32-token passes where the groups average more than
// 16 tokens, for one matrix (32 tokens of gate and up would need 64 KB of shared memory) in
// chunks of at most 2 blocks (4-block chunks would spill).
template <bool kFp4, bool kGated, bool kPacked>
cudaError_t launch_passes(const GemvArgs& a, int n_groups, const Tuning& t, bool small, cudaStream_t stream) {
  const int64_t per_group = a.group_start ? (a.m + n_groups - 1) / n_groups : a.m;
  if constexpr (!kGated)
    if (a.xq && per_group > 16 && t.chunk <= 2)
      return t.chunk == 2 ? launch_k<kFp4, 2, kGated, 4, false, kPacked>(a, n_groups, t.split, stream)
                          : launch_k<kFp4, 1, kGated, 4, false, kPacked>(a, n_groups, t.split, stream);
  const bool wide = !small && (a.xq || !(t.chunk == 4 && a.act_block != 128));
  return wide ? launch_nt<kFp4, kGated, 2, kPacked>(a, n_groups, t, stream)
              : launch_nt<kFp4, kGated, 1, kPacked>(a, n_groups, t, stream);
}

// The ring kernel's conditions beyond the fragment order's: 2-block chunks, pre-quantised x, and
// every bulk copy's ends 16-byte aligned (codes and scales of matrices, experts and token rows).
bool ring_applies(const GemvArgs& a, const Tuning& t) {
  const auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return device_info().major >= 9 && t.chunk == kRingChunk && a.ring <= kRingMaxStages && a.xq && a.xs &&
         a.k % 128 == 0 && al(a.xq) && al(a.xs) && al(a.w) && al(a.ws) && al(a.wu) && al(a.wsu) &&
         (!a.group_start || (a.e_stride % 16 == 0 && a.e_sstride % 16 == 0));
}

std::atomic<int64_t> g_ring_launches{0};

template <bool kGated>
cudaError_t launch_ring(const GemvArgs& a, int n_groups, const Tuning& t, cudaStream_t stream) {
  g_ring_launches.fetch_add(1, std::memory_order_relaxed);
  const int tiles = (a.n + kRows - 1) / kRows;
  const dim3 grid(tiles * t.split, n_groups);
  auto* kernel = gemv_ring_kernel<kGated>;
  static std::atomic<uint64_t> smem_done{0};  // raised once to the most stages' size
  if (const cudaError_t e = ensure_smem_limit(reinterpret_cast<const void*>(kernel),
                                              int(RingLayout<kGated>::bytes(kRingMaxStages)), smem_done);
      e != cudaSuccess)
    return e;
  const size_t smem = RingLayout<kGated>::bytes(a.ring);
  if (t.split == 1) return launch_kernel(kernel, grid, kThreads, smem, stream, a, 1);
  return launch_kernel_cluster(kernel, grid, kThreads, smem, stream, unsigned(t.split), a, t.split);
}

// One 8-token tile per pass when groups average <= 8 tokens (decode); larger groups then take
// several passes (correct, re-reading the weight tile), so wide batches use 16-token passes
// (32 over pre-quantised x, below), except with 4-block chunks of one FP8 matrix quantised inside
// (16-token passes would spill; V4's act_block 128 has no other choice). The pass width never
// changes a row's summation order.
template <bool kFp4, bool kGated>
cudaError_t launch(const GemvArgs& a, int n_groups, cudaStream_t stream) {
  const int64_t groups = a.group_start && a.split_groups > 0 ? a.split_groups : n_groups;
  const int64_t tune_n = a.tune_n > 0 ? a.tune_n : a.n;  // a stacked launch's shape (GemvArgs::tune_n)
  const int64_t tiles = int64_t((tune_n + kRows - 1) / kRows) * groups;
  const Tuning t = pick_tuning(a, kFp4, tiles, device_info());
  // FP4 4-block chunks load 16 bytes a thread (load_fp4_quad4): the matrices must start 16-byte
  // aligned (device allocations and whole-row offsets always do).
  if (kFp4 && t.chunk == 4 &&
      ((reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.wu)) % 16 != 0 ||
       (a.group_start && a.e_stride % 16 != 0)))
    return cudaErrorInvalidValue;
  // Stacked matrices (GemvArgs::y2; block_linear_cuda admits only one dense FP8 matrix over at
  // most kStackedLinearMaxRows tokens quantised inside): the one-pass kernels with the split store.
  if (a.y2) {
    if (a.w_packed) return cudaErrorInvalidValue;  // the stacked kernels read row-major rows
    if constexpr (!kFp4 && !kGated) {
      if (t.chunk == 4) return launch_k<kFp4, 4, kGated, 1, true>(a, n_groups, t.split, stream);
      if (t.chunk == 2) return launch_k<kFp4, 2, kGated, 1, true>(a, n_groups, t.split, stream);
      return launch_k<kFp4, 1, kGated, 1, true>(a, n_groups, t.split, stream);
    }
    return cudaErrorInvalidValue;
  }
  const bool small = a.group_start ? a.m <= 8 * int64_t(n_groups) : a.m <= 8;
  // The fragment order: the one-pass kernels only (the tiled kernel reads row-major tiles).
  if (a.w_packed) {
    if (a.n % kRows != 0 || (kFp4 && a.k % 64 != 0)) return cudaErrorInvalidValue;
    if ((reinterpret_cast<uintptr_t>(a.w) | reinterpret_cast<uintptr_t>(a.wu)) % 16 != 0 ||
        (kFp4 && (reinterpret_cast<uintptr_t>(a.ws) | reinterpret_cast<uintptr_t>(a.wsu)) % 8 != 0) ||
        (a.group_start && (a.e_stride % 16 != 0 || (kFp4 && a.e_sstride % 8 != 0))))
      return cudaErrorInvalidValue;
    if (kFp4 && a.ring > 0 && small && ring_applies(a, t)) return launch_ring<kGated>(a, n_groups, t, stream);
    return launch_passes<kFp4, kGated, true>(a, n_groups, t, small, stream);
  }
  // Pre-quantised activations (prefill-sized launches): the tiled kernel, the same sums.
  // (16-byte cp.async: codes and weights 16-byte aligned; at most kTMaxBlocks k blocks, FP4
  // kTMaxFp4Blocks: its scale table holds a byte per row and block.)
  const bool tiled_ok = a.k / 32 <= (kFp4 ? kTMaxFp4Blocks : kTMaxBlocks) && reinterpret_cast<uintptr_t>(a.xq) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(a.w) % 16 == 0 && (!a.wu || reinterpret_cast<uintptr_t>(a.wu) % 16 == 0) &&
                        (!a.group_start || a.e_stride % 16 == 0);
  if (a.xq && !small && tiled_ok && a.tiled) return launch_tiled<kFp4, kGated>(a, n_groups, t, stream);
  return launch_passes<kFp4, kGated, false>(a, n_groups, t, small, stream);
}

// One thread per 8 consecutive values of the flattened [m, k] (k % 32 == 0, so a quad of lanes
// is one 32-block of one row; act_block 128: 16 lanes); quant_x's arithmetic (bf16_in included).
__global__ void __launch_bounds__(256) quantize_kernel(const float* x, int64_t total8, int act_block, bool bf16_in,
                                                       uint8_t* xq, float* xs) {
  pdl_prologue();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t total_r = (total8 + 31) / 32 * 32;  // whole warps run every iteration (shuffles)
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total_r; t += stride) {
    const bool live = t < total8;
    float4 lo = make_float4(0, 0, 0, 0), hi = lo;
    if (live) {
      const float4* p = reinterpret_cast<const float4*>(x) + 2 * t;  // plain loads: x step-written
      lo = p[0], hi = p[1];
    }
    float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    if (bf16_in) {
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = dev_round_bf16(v[i]);
    }
    const float s = dev_fp8_block_scale(dev_fp8_block_amax(v, act_block));
    const uint2 codes = dev_fp8_pack8(v, 1.0f / s);  // exact: s is a power of two
    if (live) {
      reinterpret_cast<uint2*>(xq)[t] = codes;
      if ((t & 3) == 0) xs[t / 4] = s;
    }
  }
}

}  // namespace

void set_gemv_tuning(int split, int chunk) {
  g_split_override = split;
  g_chunk_override = chunk == 1 || chunk == 2 || chunk == 4 ? chunk : 0;
}

cudaError_t launch_gemv_quantize(const float* x, int64_t m, int64_t k, int act_block, bool bf16_in, uint8_t* xq,
                                 float* xs, cudaStream_t stream) {
  const int64_t total8 = m * k / 8;
  if (total8 <= 0) return cudaSuccess;
  const DeviceInfo d = device_info();
  const int64_t want = (total8 + 255) / 256, cap = int64_t(std::max(d.sms, 1)) * 16;
  return launch_kernel(quantize_kernel, dim3(unsigned(std::min(want, cap))), 256, 0, stream, x, total8, act_block,
                       bf16_in, xq, xs);
}

void set_gemv_fp4_chunk(int chunk) { g_fp4_chunk = chunk == 2 || chunk == 4 ? chunk : 0; }

int64_t gemv_ring_launches() { return g_ring_launches.load(std::memory_order_relaxed); }

cudaError_t launch_gemv(const GemvArgs& args, int n_groups, bool fp4, cudaStream_t stream) {
  GemvArgs a = args;
  a.n_groups = n_groups;
  const bool gated = a.wu != nullptr;
  if (fp4) return gated ? launch<true, true>(a, n_groups, stream) : launch<true, false>(a, n_groups, stream);
  return gated ? launch<false, true>(a, n_groups, stream) : launch<false, false>(a, n_groups, stream);
}

}  // namespace flashseek::ops::cuda::detail
