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
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>

#include "ops/cuda/gemv_kernels.h"
#include "ops/cuda/launch.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 32;  // output rows per block


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

// cp.async (sm_80+): global -> shared without registers. 16-byte weight copies either through
// L1 (.ca) or around it (.cg: streamed weights are read once); 4-byte scale words through L1.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool via_l1) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (via_l1)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Waits until at most `pending` (1..5, warp-uniform) groups are in flight.
__device__ __forceinline__ void cp_async_wait_n(int pending) {
  switch (pending) {
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    default: cp_async_wait<5>(); break;
  }
}

// Pipelined variant (kPipe): every warp owns a ring of `stages` shared-memory slots; a slot holds
// the weight words of one warp iteration (32 rows x kChunk blocks per matrix, copied in 16-byte
// pieces: two per FP8 row and block, one per FP4) and, for FP4, each row's aligned scale word
// (one 4-byte copy per lane). Activations stay out of the ring: they are read with __ldg as in
// the direct kernel (L1 hits across warps and CTAs), which keeps slots small and the ring deep.
// Lanes copy pieces that other lanes read, so cp.async.wait_group is followed by __syncwarp.
// Pieces are XOR-swizzled within a row so that rows sharing a 128-byte bank line hold their
// fragment reads (8 bytes FP8, 4 bytes FP4 per lane) in disjoint banks.
template <bool kFp4, int kChunk, bool kGated>
struct PipeLayout {
  static constexpr int kMats = kGated ? 2 : 1;
  static constexpr int kPerBlock = kFp4 ? 1 : 2;              // 16-byte pieces per row and block
  static constexpr int kPerRow = kChunk * kPerBlock;
  static constexpr int kRowBytes = kPerRow * 16;
  static constexpr int kWBytes = kRows * kRowBytes;
  static constexpr int kSBytes = kFp4 ? kRows * 4 : 0;
  static constexpr int kMatBytes = kWBytes + kSBytes;
  static constexpr int kSlotBytes = kMats * kMatBytes;
  static_assert((kRows * kPerRow) % 32 == 0, "whole pieces per lane");
  __device__ static __forceinline__ int piece(int r, int c) {
    return c ^ (((r * kRowBytes / 128) & (kChunk - 1)) * kPerBlock);
  }
};

// Queues the copies of one warp iteration (blocks kb0 .. kb0 + kChunk - 1) into `slot`.
template <bool kFp4, int kChunk, bool kGated>
__device__ __forceinline__ void issue_slot(const GemvArgs& a, const uint8_t* const (&wm)[2],
                                           const uint8_t* const (&wsm)[2], int row0, int kb0, int lane,
                                           bool via_l1, uint8_t* slot) {
  using L = PipeLayout<kFp4, kChunk, kGated>;
  const int64_t row_bytes = kFp4 ? a.k / 2 : a.k;
  const int nkb = a.k / 32;
#pragma unroll
  for (int mi = 0; mi < L::kMats; ++mi) {
    uint8_t* ms = slot + mi * L::kMatBytes;
    const uint8_t* src = wm[mi] + int64_t(kb0) * L::kPerBlock * 16;
#pragma unroll
    for (int i = 0; i < kRows * L::kPerRow / 32; ++i) {
      const int p = i * 32 + lane, r = p / L::kPerRow, c = p % L::kPerRow;
      const int row = min(row0 + r, a.n - 1);  // tail rows: copied, never stored
      cp_async16(ms + r * L::kRowBytes + L::piece(r, c) * 16, src + int64_t(row) * row_bytes + c * 16, via_l1);
    }
    if constexpr (kFp4)  // the aligned word holding blocks kb0 .. kb0 + kChunk - 1 (nkb % 4 == 0)
      cp_async4(ms + L::kWBytes + lane * 4, wsm[mi] + int64_t(min(row0 + lane, a.n - 1)) * nkb + (kb0 & ~3));
  }
}

// Reads one matrix's words and scales of a landed slot (same registers as load_w).
template <bool kFp4, int kChunk, bool kGated>
__device__ __forceinline__ void read_w(const GemvArgs& a, const uint8_t* ws, const uint8_t* ms, int row0,
                                       int kb0, int g, int q, uint32_t (&A)[2][kChunk][2][kFp4 ? 1 : 2],
                                       uint32_t (&sc)[2][2]) {
  using L = PipeLayout<kFp4, kChunk, kGated>;
  uint32_t sc8 = 0;
  if constexpr (!kFp4) {
    const int kbw = a.k / a.w_block;
    const uint8_t* srow = ws + int64_t(row0 / a.w_block) * kbw;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) sc8 |= uint32_t(__ldg(srow + ((kb0 + j) * 32) / a.w_block)) << (8 * j);
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + h * 8 + g;
      const uint8_t* rs = ms + r * L::kRowBytes;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if constexpr (kFp4) {
          A[mt][j][h][0] = *reinterpret_cast<const uint32_t*>(rs + L::piece(r, j) * 16 + q * 4);
        } else {
          const uint2 u = *reinterpret_cast<const uint2*>(rs + L::piece(r, 2 * j + (q >> 1)) * 16 + (q & 1) * 8);
          A[mt][j][h][0] = u.x;
          A[mt][j][h][1] = u.y;
        }
      }
      if constexpr (kFp4) {
        const uint32_t wd = *reinterpret_cast<const uint32_t*>(ms + L::kWBytes + r * 4);
        sc[mt][h] = kChunk == 4 ? wd : (wd >> (8 * (kb0 & 3))) & (kChunk == 2 ? 0xffffu : 0xffu);
      } else {
        sc[mt][h] = sc8;
      }
    }
}

// Raw weight words and per-row scales of one matrix for rows row0 + mt*16 + {g, g+8}, blocks
// kb0...: FP8 keeps two words per (row, block) (A fragment regs h and h+2), FP4 one packed word
// (expanded right before the MMA, which halves the registers that hold loads in flight).
template <bool kFp4>
struct WRaw {
  static constexpr int kWords = kFp4 ? 1 : 2;
};

template <bool kFp4, int kChunk>
__device__ __forceinline__ void load_w(const GemvArgs& a, const uint8_t* w, const uint8_t* ws,
                                       int row0, int kb0, int g, int q,
                                       uint32_t (&A)[2][kChunk][2][WRaw<kFp4>::kWords],
                                       uint32_t (&sc)[2][2]) {
  static_assert(kChunk <= 4, "scale exponents are packed 4 per register");
  const int nkb = a.k / 32;
  uint32_t sc8 = 0;
  if constexpr (!kFp4) {  // one scale row per 32-row tile (w_block 32 or 128, row0 % 32 == 0)
    const int kbw = a.k / a.w_block;
    const uint8_t* srow = ws + int64_t(row0 / a.w_block) * kbw;
#pragma unroll
    for (int j = 0; j < kChunk; ++j) sc8 |= uint32_t(srow[((kb0 + j) * 32) / a.w_block]) << (8 * j);
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + mt * 16 + h * 8 + g, a.n - 1);  // tail rows: loaded, never stored
      uint32_t packed = sc8;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const int kb = kb0 + j;
        if constexpr (kFp4) {
          A[mt][j][h][0] = __ldcs(reinterpret_cast<const unsigned int*>(
              w + int64_t(row) * (a.k / 2) + kb * 16 + q * 4));
          packed |= uint32_t(ws[int64_t(row) * nkb + kb]) << (8 * j);
        } else {
          const uint2 u = __ldcs(reinterpret_cast<const uint2*>(w + int64_t(row) * a.k + kb * 32 + q * 8));
          A[mt][j][h][0] = u.x;
          A[mt][j][h][1] = u.y;
        }
      }
      sc[mt][h] = packed;
    }
  }
}

// Loads and FP8-quantises this thread's 8 values of each block for one token row (nullptr =
// absent token: zero codes, zero scale). Matches ops::fp8_quant_dequant bit for bit.
template <int kChunk>
__device__ __forceinline__ void quant_vals(float (&v)[kChunk][8], bool present, int act_block,
                                           uint32_t (&B)[kChunk][2], float (&xs)[kChunk]);

template <int kChunk>
__device__ __forceinline__ void quant_x(const float* xrow, int kb0, int q, int act_block,
                                        uint32_t (&B)[kChunk][2], float (&xs)[kChunk]) {
  float v[kChunk][8];
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
  }
  quant_vals<kChunk>(v, xrow != nullptr, act_block, B, xs);
}

template <int kChunk>
__device__ __forceinline__ void quant_vals(float (&v)[kChunk][8], bool present, int act_block,
                                           uint32_t (&B)[kChunk][2], float (&xs)[kChunk]) {
  float amax[kChunk];
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
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
    xs[j] = present ? s : 0.0f;
  }
}

template <bool kFp4, int kChunk>
__device__ __forceinline__ void mma_accumulate(const uint32_t (&A)[2][kChunk][2][WRaw<kFp4>::kWords],
                                               const uint32_t (&sc)[2][2],
                                               const uint32_t (&B)[kChunk][2],
                                               const float (&xs)[kChunk], int q,
                                               float (&acc)[2][4]) {
#pragma unroll
  for (int j = 0; j < kChunk; ++j) {
    const float s0 = __shfl_sync(0xffffffffu, xs[j], (q * 2) * 4);
    const float s1 = __shfl_sync(0xffffffffu, xs[j], (q * 2 + 1) * 4);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      uint32_t af[4];
      if constexpr (kFp4) {
        af[0] = fp4x4_to_e4m3x4(A[mt][j][0][0] & 0xffffu), af[2] = fp4x4_to_e4m3x4(A[mt][j][0][0] >> 16);
        af[1] = fp4x4_to_e4m3x4(A[mt][j][1][0] & 0xffffu), af[3] = fp4x4_to_e4m3x4(A[mt][j][1][0] >> 16);
      } else {
        af[0] = A[mt][j][0][0], af[2] = A[mt][j][0][1], af[1] = A[mt][j][1][0], af[3] = A[mt][j][1][1];
      }
      float d[4];
      mma_e4m3(d, af, B[j][0], B[j][1]);
      const float w0 = e8m0f(uint8_t(sc[mt][0] >> (8 * j))), w1 = e8m0f(uint8_t(sc[mt][1] >> (8 * j)));
      acc[mt][0] += d[0] * (w0 * s0);
      acc[mt][1] += d[1] * (w0 * s1);
      acc[mt][2] += d[2] * (w1 * s0);
      acc[mt][3] += d[3] * (w1 * s1);
    }
  }
}

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
        const int r = mt * 16 + g + (i >= 2 ? 8 : 0);
        const int t = nt * 8 + q * 2 + (i & 1);
        red[r * kToks + t] = acc[nt][mt][i];
      }
}

// Grid: x = row tile * split + k slice (a cluster of `split` CTAs per row tile), y = group.
// kNt: 8-token MMA tiles per pass (1 when every group holds <= 8 tokens: half the accumulators).
// kPipe: weights and FP4 scales come through the per-warp cp.async ring of `stages` slots in
// dynamic shared memory (issue_slot; 16-byte copies through L1 when `via_l1`), which afterwards
// holds `red`; activations, arithmetic and its order are those of the direct-load variant
// (same bits).
template <bool kFp4, int kChunk, bool kGated, int kNt, bool kPipe>
__global__ void __launch_bounds__(kThreads, 2) gemv_kernel(GemvArgs a, int split, int stages, int via_l1) {
  constexpr int kToks = 8 * kNt;
  using Red = float[kGated ? 2 : 1][kWarps][kRows * kToks];
  extern __shared__ __align__(16) uint8_t dyn_smem[];
  Red* red_p;
  if constexpr (kPipe) {
    red_p = reinterpret_cast<Red*>(dyn_smem);
  } else {
    __shared__ Red red_static;
    red_p = &red_static;
  }
  Red& red = *red_p;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int tile = blockIdx.x / split, rank = blockIdx.x % split;  // rank == cluster block rank
  const int row0 = tile * kRows;
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
  const int c_begin = rank * n_chunks / split, c_end = (rank + 1) * n_chunks / split;
  constexpr int kMats = kGated ? 2 : 1;
  for (int64_t tt = 0; tt < count; tt += kToks) {
    const int ntok = count - tt < kToks ? int(count - tt) : kToks;
    const float* xrow[kNt];
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const int slot = nt * 8 + g;
      xrow[nt] = nullptr;
      if (slot < ntok) {
        const int64_t p = start + tt + slot;
        const int64_t row = a.group_start ? (a.pair_row ? a.pair_row[p] : p) : tt + slot;
        xrow[nt] = a.x + row * a.k;
      }
    }
    float acc[kNt][2][4] = {}, accu[kNt][2][4] = {};
    using Words = uint32_t[2][kChunk][2][WRaw<kFp4>::kWords];
    auto compute = [&](int kb0, const Words& A, const uint32_t (&sc)[2][2], const Words& AU,
                       const uint32_t (&scu)[2][2]) {
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        if (nt == 1 && ntok <= 8) break;  // warp-uniform
        uint32_t B[kChunk][2];
        float xs[kChunk];
        quant_x<kChunk>(xrow[nt], kb0, q, a.act_block, B, xs);
        mma_accumulate<kFp4, kChunk>(A, sc, B, xs, q, acc[nt]);
        if constexpr (kGated) mma_accumulate<kFp4, kChunk>(AU, scu, B, xs, q, accu[nt]);
      }
    };
    if constexpr (kPipe) {
      using L = PipeLayout<kFp4, kChunk, kGated>;
      uint8_t* ring = dyn_smem + warp * stages * L::kSlotBytes;
      const uint8_t* const wm[2] = {w, wu};
      const uint8_t* const wsm[2] = {ws, wsu};
      int c_next = c_begin + warp;
      for (int s = 0; s + 1 < stages; ++s, c_next += kWarps) {  // prologue: stages - 1 slots
        if (c_next < c_end)
          issue_slot<kFp4, kChunk, kGated>(a, wm, wsm, row0, c_next * kChunk, lane, via_l1 != 0,
                                           ring + s * L::kSlotBytes);
        cp_async_commit();
      }
      int slot = 0;
      for (int c = c_begin + warp; c < c_end; c += kWarps, c_next += kWarps) {
        const int fill = slot == 0 ? stages - 1 : slot - 1;  // the slot read last iteration
        __syncwarp();  // every lane is done reading it
        if (c_next < c_end)
          issue_slot<kFp4, kChunk, kGated>(a, wm, wsm, row0, c_next * kChunk, lane, via_l1 != 0,
                                           ring + fill * L::kSlotBytes);
        cp_async_commit();
        cp_async_wait_n(stages - 1);  // this lane's copies of this iteration's slot have landed
        __syncwarp();                 // ... and every other lane's
        const uint8_t* ms = ring + slot * L::kSlotBytes;
        const int kb0 = c * kChunk;
        Words A, AU;
        uint32_t sc[2][2], scu[2][2];
        read_w<kFp4, kChunk, kGated>(a, ws, ms, row0, kb0, g, q, A, sc);
        if constexpr (kGated) read_w<kFp4, kChunk, kGated>(a, wsu, ms + L::kMatBytes, row0, kb0, g, q, AU, scu);
        compute(kb0, A, sc, AU, scu);
        slot = slot + 1 == stages ? 0 : slot + 1;
      }
      cp_async_wait<0>();
      __syncthreads();  // every warp is done with its ring: `red` reuses the memory
    } else {
      for (int c = c_begin + warp; c < c_end; c += kWarps) {
        const int kb0 = c * kChunk;
        Words A, AU;
        uint32_t sc[2][2], scu[2][2];
        load_w<kFp4, kChunk>(a, w, ws, row0, kb0, g, q, A, sc);
        if constexpr (kGated) load_w<kFp4, kChunk>(a, wu, wsu, row0, kb0, g, q, AU, scu);
        compute(kb0, A, sc, AU, scu);
      }
    }
    stash<kNt>(red[0][warp], acc, g, q);
    if constexpr (kGated) stash<kNt>(red[kMats - 1][warp], accu, g, q);
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
        if constexpr (kGated) {
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
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (split > 1) {
      cg::this_cluster().sync();  // rank 0 has read the partials before they are overwritten
      continue;
    }
#endif
    __syncthreads();
  }
}

// Tuning, from the split / chunk sweep of `flashseek bench --gemv-sweep` on an H200 (RESULTS.md,
// 2026-11-29 H4b). Under ncu the kernels read exactly the counted bytes from DRAM; they are
// latency-bound (16 warps per SM at the 128-register cap, long-scoreboard stalls), so:
// * k split over a cluster pays only while all CTAs fit in one wave (2 per SM): a CTA has a
//   fixed cost of a few µs (ramp, reduction, epilogue), and more, shorter CTAs lose as soon as
//   they spill into a second wave. Split = min(8, 2·SMs / tiles), at least 1.
// * k blocks per warp iteration: 4 for one FP8 matrix and one token tile when each warp still
//   gets >= 2 iterations (wo_a, wo_b), else 2 (4 blocks spill with two matrices, two token
//   tiles or FP4). V4's act_block 128 needs exactly 4. A variant that prefetched the next
//   chunk into a second register set measured 5-15 % slower and was dropped.
// * Pipelined loads (kPipe, opt-in: FLASHSEEK_GEMV_PIPE=1 (.cg weight copies) or 2 (.ca), or
//   set_gemv_pipeline(2 / 3)): see the kernel; `stages` slots per warp, as many (2..6) as keep
//   two CTAs per SM in shared memory. Same bits as direct loads. H4f's first ring (activations
//   in the ring too, 4-8-byte copies) measured SLOWER on an H200 at every GEMV (RESULTS.md, H4f);
//   this weights-only ring (H4g) is closer but still slower at almost every GEMV on an H200
//   (M = 6 layer kernels 692 -> 704..822 us; only FP4 routed gate+up with 3 .cg stages gains
//   ~1-2 %; RESULTS.md, H4g), so it stays opt-in. Shapes the ring
//   cannot serve (misaligned pointers, FP4 with k/32 not a multiple of 4, chunk 1, pre-sm_80,
//   ring beyond the shared-memory opt-in) always take direct loads.
int g_split_override = 0, g_chunk_override = 0, g_pipe_override = 0, g_stages_override = 0;

// 0 = direct loads, 1 = pipeline with .cg weight copies, 2 = pipeline with .ca weight copies.
int pipe_mode() {
  if (g_pipe_override != 0) return g_pipe_override - 1;
  static const int env = [] {
    const char* e = std::getenv("FLASHSEEK_GEMV_PIPE");
    return e && (e[0] == '1' || e[0] == '2') && e[1] == 0 ? e[0] - '0' : 0;
  }();
  return env;
}

// FLASHSEEK_GEMV_STAGES=2..6 forces the ring depth (benchmarking; shapes whose ring would not fit
// the device's shared memory still fall back).
int stages_override() {
  if (g_stages_override != 0) return g_stages_override;
  static const int v = [] {
    const char* e = std::getenv("FLASHSEEK_GEMV_STAGES");
    const int s = e ? std::atoi(e) : 0;
    return s >= 2 && s <= 6 ? s : 0;
  }();
  return v;
}

struct Tuning {
  int chunk = 1, split = 1;
  int pipe = 0;  // pipe_mode()
};

struct DeviceInfo {
  int sms = 0, major = 0, smem_optin = 0;
};

DeviceInfo device_info() {
  static DeviceInfo cache[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return {};
  DeviceInfo& d = cache[dev];
  if (d.sms == 0) {
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  }
  return d;
}

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }

bool pipe_ok(const GemvArgs& a, bool fp4, bool gated, const DeviceInfo& d) {
  if (d.major < 8 || pipe_mode() == 0) return false;
  const uintptr_t wal = 16;  // 16-byte weight copies (row strides k or k/2 are multiples of 16)
  if (!aligned(a.w, wal) || a.e_stride % int64_t(wal) != 0) return false;
  if (gated && !aligned(a.wu, wal)) return false;
  if (fp4 && ((a.k / 32) % 4 != 0 || !aligned(a.ws, 4) || a.e_sstride % 4 != 0 || (gated && !aligned(a.wsu, 4))))
    return false;
  return true;
}

// Depends on the matrix shape (n, k, format, gated) and, for grouped launches, on split_groups
// (a fixed group count chosen by the caller) only, never on the token count: a row's summation
// order (which k blocks each warp and cluster rank adds, in which order) is then the same whatever
// else shares the launch (batch invariance).
Tuning pick_tuning(const GemvArgs& a, bool fp4, bool gated, int64_t tiles, const DeviceInfo& d) {
  Tuning t;
  t.pipe = pipe_ok(a, fp4, gated, d) ? pipe_mode() : 0;
  const int nkb = a.k / 32;
  if (d.major >= 9 && d.sms > 0) {
    t.split = int(std::min<int64_t>(8, std::max<int64_t>(1, 2 * int64_t(d.sms) / std::max<int64_t>(tiles, 1))));
  }
  if (g_split_override > 0) t.split = g_split_override;
  if (d.major < 9) t.split = 1;
  int want = 2;
  if (a.act_block == 128) want = 4;
  else if (g_chunk_override > 0) want = g_chunk_override;
  else if (!fp4 && !gated && nkb / (4 * t.split) >= 2 * kWarps) want = 4;
  while (want > 1 && nkb % want != 0) want /= 2;
  t.chunk = want;
  if (t.chunk == 1) t.pipe = 0;
  t.split = std::max(1, std::min({t.split, nkb / t.chunk, 8}));
  return t;
}

template <bool kFp4, int kChunk, bool kGated, int kNt, bool kPipe>
cudaError_t launch_k(const GemvArgs& a, int n_groups, int split, int pipe, cudaStream_t stream) {
  const int tiles = (a.n + kRows - 1) / kRows;
  const dim3 grid(tiles * split, n_groups);
  auto* kernel = gemv_kernel<kFp4, kChunk, kGated, kNt, kPipe>;
  int stages = 0;
  size_t smem = 0;
  if constexpr (kPipe) {
    // As many slots (2..6) as keep two CTAs per SM within ~110 KB each; `red` reuses the ring.
    constexpr int kSlotCta = kWarps * PipeLayout<kFp4, kChunk, kGated>::kSlotBytes;
    stages = std::max(2, std::min(6, (110 * 1024) / kSlotCta));
    if (stages_override() > 0) stages = stages_override();
    constexpr size_t kRed = sizeof(float) * (kGated ? 2 : 1) * kWarps * kRows * 8 * kNt;
    smem = std::max(size_t(stages) * kSlotCta, kRed);
    if (smem > size_t(device_info().smem_optin))  // e.g. gated FP8, 4-block chunks, 16 tokens
      return launch_k<kFp4, kChunk, kGated, kNt, false>(a, n_groups, split, 0, stream);
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  if (split == 1) {
    return launch_kernel(kernel, grid, kThreads, smem, stream, a, 1, stages, int(pipe == 2));
  }
  return launch_kernel_cluster(kernel, grid, kThreads, smem, stream, unsigned(split), a, split, stages, int(pipe == 2));
}

template <bool kFp4, bool kGated, int kNt>
cudaError_t launch_nt(const GemvArgs& a, int n_groups, const Tuning& t, cudaStream_t stream) {
  if (t.pipe && t.chunk == 4) return launch_k<kFp4, 4, kGated, kNt, true>(a, n_groups, t.split, t.pipe, stream);
  if (t.pipe && t.chunk == 2) return launch_k<kFp4, 2, kGated, kNt, true>(a, n_groups, t.split, t.pipe, stream);
  if (t.chunk == 4) return launch_k<kFp4, 4, kGated, kNt, false>(a, n_groups, t.split, 0, stream);
  if (t.chunk == 2) return launch_k<kFp4, 2, kGated, kNt, false>(a, n_groups, t.split, 0, stream);
  return launch_k<kFp4, 1, kGated, kNt, false>(a, n_groups, t.split, 0, stream);
}

// One 8-token tile per pass when groups average <= 8 tokens (decode); larger groups then take
// several passes (correct, re-reading the weight tile), so wide batches use 16-token passes,
// except with 4-block chunks of one FP8 matrix (16-token passes would spill; V4's act_block 128
// has no other choice). The pass width never changes a row's summation order.
template <bool kFp4, bool kGated>
cudaError_t launch(const GemvArgs& a, int n_groups, cudaStream_t stream) {
  const int64_t groups = a.group_start && a.split_groups > 0 ? a.split_groups : n_groups;
  const int64_t tiles = int64_t((a.n + kRows - 1) / kRows) * groups;
  const Tuning t = pick_tuning(a, kFp4, kGated, tiles, device_info());
  const bool small = a.group_start ? a.m <= 8 * int64_t(n_groups) : a.m <= 8;
  const bool wide = !small && !(t.chunk == 4 && a.act_block != 128);
  return wide ? launch_nt<kFp4, kGated, 2>(a, n_groups, t, stream) : launch_nt<kFp4, kGated, 1>(a, n_groups, t, stream);
}

}  // namespace

void set_gemv_pipeline(int mode, int stages) {
  g_pipe_override = mode >= 1 && mode <= 3 ? mode : 0;
  g_stages_override = stages >= 2 && stages <= 6 ? stages : 0;
}

void set_gemv_tuning(int split, int chunk) {
  g_split_override = split;
  g_chunk_override = chunk == 1 || chunk == 2 || chunk == 4 ? chunk : 0;
}

cudaError_t launch_gemv(const GemvArgs& a, int n_groups, bool fp4, cudaStream_t stream) {
  const bool gated = a.wu != nullptr;
  if (fp4) return gated ? launch<true, true>(a, n_groups, stream) : launch<true, false>(a, n_groups, stream);
  return gated ? launch<false, true>(a, n_groups, stream) : launch<false, false>(a, n_groups, stream);
}

}  // namespace flashseek::ops::cuda::detail
