// Large-M FP8 block-scaled GEMM on sm_90a tensor cores (wgmma e4m3 · e4m3 → f32).
//
// Y[m, n] = Σ_kb (Xq[m, kb] · Wq[n, kb]ᵀ) · sx[m, kb] · sw[n/wb, kb·32/wb], kb over 32-deep blocks.
//
// Tile: kWG·64 tokens × 128 outputs per block of kWG warpgroups (kWG = 2 or 3), each owning 64
// token rows × 128 outputs. K advances in stages of 128 (four 32-blocks); a stage is kWG·8 KB of
// X codes + 16 KB of W codes + the X scales (kWG·64 × 4 FP32) + the W scales (4 × 4 FP32),
// filled by cp.async (zero-filled past m / n) into a 5-slot ring, loads running 4 stages ahead.
//
// Scale promotion: each 32-block is one wgmma m64n128k32 into a scratch accumulator (scale-d = 0,
// so it holds exactly that block's dot products), then acc += scratch · (sx · sw) in FP32 on the
// CUDA cores: DeepGEMM's promotion at V4.1's 32-element scale granularity (with V4's 128-element
// scales the numbers are the same). With 2 warpgroups, two scratch accumulators take two 32-blocks
// per wgmma batch (commit, wait, promote both); with 3 (register limit) one. Reading a scratch
// accumulator while another wgmma is in flight makes ptxas serialise every wgmma (C7514), so
// tensor-core work overlaps promotion only across the warpgroups of a block.
//
// Shared-memory layouts of an operand tile [rows][128 k-bytes] (FP8 wgmma takes both operands
// k-major, which is how X [m, k] and W [n, k] are stored):
// * kSw128 (default kernels 3, 4): 128-byte swizzle, row r at r·128 with its 16-byte chunk c at
//   position c ^ (r % 8); descriptor swizzle mode 1, stride byte offset 1024 (8-row groups), the
//   k-slice selected by advancing the start address 32 bytes per 32-block.
// * kInterleave (kernels 1, 2): unswizzled "core matrices" of 8 rows × 16 bytes stored as 128
//   contiguous bytes, (row group rg, k chunk kc) at rg·1024 + kc·128; leading byte offset (next
//   core matrix along k) 128, stride byte offset (next 8-row group) 1024. 1.3-1.5x slower on an
//   H200 (bank conflicts); kPadded (kernel 5) puts the row groups 1040 bytes apart: no better.
//
// Kernels 6-9 (gemm_fp8_ws_kernel): warp-specialised. One producer warp (its warpgroup gives
// registers back with setmaxnreg) fills a 6-slot ring with the bulk tensor copy engine (TMA, the
// 128-byte swizzle done by the copy, rows past m / n zero-filled) plus the X scales of the stage
// (TMA too) and its 16 W scales (lanes 0-15, ordinary stores); "full" mbarriers complete on the
// bytes, "empty" ones on one arrival per consumer warp. Two consumer warpgroups (232 registers
// each) own 64 rows × 128 columns of a 128×128 tile: no block barrier, no load instructions in
// the math warps. 6 / 8: two scratch accumulators, the wgmma of block i+1 in flight while block i
// is promoted (three of a stage's four promotions overlap its own tensor-core work; ptxas keeps
// the wgmmas pipelined, no C7514, because nothing is in flight across loop iterations). 7 / 9:
// two blocks per batch, wait, promote both (overlap only across the two warpgroups). 6 / 7 are
// persistent (one block per SM walks the tiles, the producer runs ahead into the next tile
// during the epilogue), 8 / 9 launch a block per tile.
//
// Without sm_90a (e.g. a 100a build) the kernel body is empty and the host launcher refuses.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "ops/cuda/gemm/gemm_fp8_kernels.h"
#include "ops/fp4_fragments.h"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/runtime/mbarrier.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/runtime/smem_limit.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

// Tile: kWG warpgroups × 64 token rows, 128 outputs, k stages of 128 bytes in a 5-slot ring.
constexpr int kBN = 128, kBK = 128, kStages = 5;
static_assert(kBK == 128, "a k stage is four 32-blocks of one 128-byte (swizzle-width) row");
constexpr int kSwFloats = 16;  // W scales per stage: 4 row groups of 32 × 4 k-blocks
constexpr int kGroupM = 8;     // block rasterisation: 8 m-tiles per group
static_assert(kGroupM > 0, "");
// Operand tile layouts in shared memory (see the file comment).
enum Layout : int { kInterleave = 0, kSw128 = 1, kPadded = 2 };
template <int kWG, int kLayout = kInterleave>
struct Tile {
  static constexpr int kBM = 64 * kWG, kThreads = 128 * kWG;
  // Distance between 8-row groups: 1024 bytes, or 1040 when padded (spreads the groups over the
  // shared-memory banks).
  static constexpr int kGroupBytes = kLayout == kPadded ? 1040 : 1024;
  static constexpr int kABytes = kBM / 8 * kGroupBytes, kBBytes = kBN / 8 * kGroupBytes;
  static constexpr int kSxFloats = kBM * 4;
  // + 1 KB: the base is rounded up to 1024 bytes (the 128-byte swizzle repeats every 8 rows).
  static constexpr int kSmemBytes =
      kStages * (kABytes + kBBytes + (kSxFloats + kSwFloats) * 4) + 1024;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FS_GEMM_FP8_SM90 1
#endif

#ifdef FS_GEMM_FP8_SM90
// FP32 output holding the BF16 rounding of the value (GemmFp8Args::bf16_round_out).
__device__ __forceinline__ float bf16_round_dev(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float e8m0f(uint8_t e) { return __uint_as_float(uint32_t(e) << 23); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads/writes of accumulator registers across wgmma fences and
// waits (the asm statements do not name them).
__device__ __forceinline__ void fence_regs(float (&r)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// D = A · B (scale-d = 0): one m64n128k32 e4m3 wgmma, A and B from shared memory, both k-major.
__device__ __forceinline__ void wgmma_m64n128k32(float (&d)[64], uint64_t da, uint64_t db) {
#define FS_R8(i)                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n"
      "}\n"
      : FS_R8(0), FS_R8(8), FS_R8(16), FS_R8(24), FS_R8(32), FS_R8(40), FS_R8(48), FS_R8(56)
      : "l"(da), "l"(db), "r"(0));
#undef FS_R8
}

// Shared-memory matrix descriptor: start address, leading (k) and stride (m/n) byte offsets, each
// in 16-byte units, swizzle mode in bits 62-63 (0 none, 1 = 128-byte).
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                              uint32_t swz) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) |
         (uint64_t(swz) << 62);
}
#endif  // FS_GEMM_FP8_SM90

// kWG consumer warpgroups (tile kWG·64 × 128); kBatch 32-blocks per wgmma batch (one scratch
// accumulator each): 2 × 2 (128×128 tile, 235 registers) or 3 × 1 (192×128, ≤ 168 registers).
// kLayout: kInterleave = unswizzled core-matrix order; kPadded = the same with 8-row groups
// 1040 bytes apart; kSw128 = 128-byte swizzled rows (row r of a tile at r·128, its 16-byte chunk
// c at position c ^ (r % 8); descriptor: 128B swizzle, stride byte offset 1024 between 8-row
// groups, the k-slice selected by advancing the start address 32 bytes).
template <int kWG, int kBatch, int kLayout>
__global__ void __launch_bounds__(Tile<kWG, kLayout>::kThreads, 1) gemm_fp8_kernel(GemmFp8Args a) {
#ifdef FS_GEMM_FP8_SM90
  using T = Tile<kWG, kLayout>;
  constexpr bool kSw128 = kLayout == Layout::kSw128;
  constexpr int kGB = T::kGroupBytes;
  constexpr int kBM = T::kBM, kThreads = T::kThreads;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem =
      smem_raw + ((1024 - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  uint8_t* sa = smem;                         // [slot][kBM rows][128] core-matrix order
  uint8_t* sb = smem + kStages * T::kABytes;  // [slot][128 rows][128]
  float* ssx = reinterpret_cast<float*>(sb + kStages * T::kBBytes);  // [slot][kBM][4]
  float* ssw = ssx + kStages * T::kSxFloats;                         // [slot][group*4 + kb]

  // Grouped rasterisation: consecutive blocks walk n inside a group of kGroupM m-tiles, so the
  // X rows of a group and the W tiles they meet stay in L2.
  const int tiles_m = (a.m + kBM - 1) / kBM, tiles_n = (a.n + kBN - 1) / kBN;
  const int pid = blockIdx.x;
  const int in_group = kGroupM * tiles_n;
  const int first_m = (pid / in_group) * kGroupM;
  const int gsz = min(tiles_m - first_m, kGroupM);
  const int tm = first_m + (pid % in_group) % gsz, tn = (pid % in_group) / gsz;
  const int m0 = tm * kBM, n0 = tn * kBN;

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2;
  const int nst = a.k / kBK, nkb = a.k / 32;
  const int wkb = a.k / a.w_block;

  const uint32_t sa_u = uint32_t(__cvta_generic_to_shared(sa));
  const uint32_t sb_u = uint32_t(__cvta_generic_to_shared(sb));
  const uint32_t ssx_u = uint32_t(__cvta_generic_to_shared(ssx));

  // One 16-byte chunk c of a [rows][128] operand tile: a warp covers 8 rows × 4 chunks, so each
  // group of 8 lanes fills one 128-byte core matrix (no bank conflicts) and each row reads 64
  // contiguous bytes.
  auto copy_chunk = [&](uint32_t dst_base, const uint8_t* src, int r0, int rows_valid, int c,
                        int k0) {
    const int wc = c >> 5, l = c & 31, rr = l & 7, j = l >> 3;
    const int rg = wc >> 1, kc = (wc & 1) * 4 + j, row = rg * 8 + rr;
    const bool ok = r0 + row < rows_valid;
    const uint8_t* p = src + int64_t(ok ? r0 + row : 0) * a.k + k0 + kc * 16;
    const uint32_t off =
        kSw128 ? uint32_t(row * 128 + ((kc ^ rr) << 4)) : uint32_t(rg * kGB + kc * 128 + rr * 16);
    cp_async16(dst_base + off, p, ok ? 16 : 0);
  };
  // Issues the cp.async copies of stage s into ring slot s % kStages (nothing past the end) and
  // commits a group either way, so that group counting stays uniform.
  auto load_stage = [&](int s) {
    if (s < nst) {
      const int slot = s % kStages, k0 = s * kBK;
#pragma unroll
      for (int c = tid; c < kBM * 8; c += kThreads)
        copy_chunk(sa_u + uint32_t(slot * T::kABytes), a.xq, m0, a.m, c, k0);
#pragma unroll
      for (int c = tid; c < kBN * 8; c += kThreads)
        copy_chunk(sb_u + uint32_t(slot * T::kBBytes), a.w, n0, a.n, c, k0);
      if (tid < kBM) {
        const int gm = m0 + tid;
        const float* src = a.xs + int64_t(gm < a.m ? gm : 0) * nkb + s * 4;
        cp_async16(ssx_u + uint32_t((slot * T::kSxFloats + tid * 4) * 4), src, gm < a.m ? 16 : 0);
      }
    }
    cp_async_commit();
  };
  // W scale of (32-row group grp, 32-block i) of stage s: one value per thread tid 128..143.
  const int swi = tid - 128;
  // Returns the raw E8M0 byte: converted only when stored, so that the load of the next stages'
  // scales does not stall the warp where it is issued.
  auto w_scale = [&](int s) -> uint32_t {
    const int grp = swi >> 2, i = swi & 3;
    const int n = min(n0 + grp * 32, a.n - 1);
    const int kk = s * kBK + i * 32;
    return ld_weight(a.ws + int64_t(n / a.w_block) * wkb + kk / a.w_block);
  };
  const bool sw_thread = swi >= 0 && swi < kSwFloats;

  // Prologue: stages 0 .. kStages-2 in flight (the ring's last slot is filled at stage 0).
#pragma unroll 1
  for (int s = 0; s < kStages - 1; ++s) {
    load_stage(s);
    if (sw_thread && s < nst) ssw[s * kSwFloats + swi] = e8m0f(uint8_t(w_scale(s)));
  }
  uint32_t sw_pending = 127;

  float acc[64], t[kBatch][64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    acc[i] = 0.0f;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) t[b][i] = 0.0f;
  }

  const uint32_t lbo = kSw128 ? 16u : (a.desc_swap ? uint32_t(kGB) : 128u);
  const uint32_t sbo = kSw128 ? 1024u : (a.desc_swap ? 128u : uint32_t(kGB));
  const uint32_t swz = kSw128 ? 1u : 0u;
  const uint32_t kstep = kSw128 ? 32u : 256u;  // start-address advance per 32-deep k-slice
  const int lr0 = wg * 64 + warp * 16 + g;     // this thread's tile rows lr0 and lr0 + 8

  // acc += P · (sx · sw) for 32-block kb (P = that block's scratch accumulator). Accumulator
  // element 4·nt + e sits at row lr0 + 8·(e/2), column 8·nt + 2·(lane%4) + e%2.
  auto promote = [&](const float(&p)[64], int kb) {
    const int slot = (kb >> 2) % kStages, i = kb & 3;
    const float sx0 = ssx[slot * T::kSxFloats + lr0 * 4 + i];
    const float sx1 = ssx[slot * T::kSxFloats + (lr0 + 8) * 4 + i];
#pragma unroll
    for (int grp = 0; grp < 4; ++grp) {
      const float sw = ssw[slot * kSwFloats + grp * 4 + i];
      const float s0 = sx0 * sw, s1 = sx1 * sw;
#pragma unroll
      for (int nt = grp * 4; nt < grp * 4 + 4; ++nt) {
        acc[nt * 4 + 0] = fmaf(p[nt * 4 + 0], s0, acc[nt * 4 + 0]);
        acc[nt * 4 + 1] = fmaf(p[nt * 4 + 1], s0, acc[nt * 4 + 1]);
        acc[nt * 4 + 2] = fmaf(p[nt * 4 + 2], s1, acc[nt * 4 + 2]);
        acc[nt * 4 + 3] = fmaf(p[nt * 4 + 3], s1, acc[nt * 4 + 3]);
      }
    }
  };

  // At the start of stage s: wait for stage s, then refill the slot stage s-1 used (free: every
  // thread has finished stage s-1 when it reaches the barrier) with stage s+kStages-1, and
  // publish the W scales of stage s+kStages-2, fetched into a register one stage ago (its slot
  // was last read at stage s-3).
  auto stage_start = [&](int s) {
    cp_async_wait<kStages - 2>();  // this thread's copies of stage s have landed
    fence_proxy_async();           // ... visible to the tensor cores' async proxy
    __syncthreads();               // ... for every thread; all work on stage s-1 is done
    if (sw_thread && s > 0 && s - 1 + kStages - 1 < nst)
      ssw[((s - 1 + kStages - 1) % kStages) * kSwFloats + swi] = e8m0f(uint8_t(sw_pending));
    load_stage(s + kStages - 1);  // into slot (s-1) % kStages
    if (sw_thread && s + kStages - 1 < nst) sw_pending = w_scale(s + kStages - 1);
  };
  auto issue = [&](int kb, float(&d)[64]) {
    const int slot = (kb >> 2) % kStages, i = kb & 3;
    const uint64_t da =
        smem_desc(sa_u + uint32_t(slot * T::kABytes + wg * 8 * kGB) + i * kstep, lbo, sbo, swz);
    const uint64_t db = smem_desc(sb_u + uint32_t(slot * T::kBBytes) + i * kstep, lbo, sbo, swz);
    wgmma_m64n128k32(d, da, db);
  };

#pragma unroll 1
  for (int kb = 0; kb < nkb; kb += kBatch) {
    if ((kb & 3) == 0) stage_start(kb >> 2);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) fence_regs(t[b]);
    wgmma_fence();
#pragma unroll
    for (int b = 0; b < kBatch; ++b) issue(kb + b, t[b]);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int b = 0; b < kBatch; ++b) fence_regs(t[b]);
    if (!a.skip_promote) {  // skip_promote: timing diagnostic only (wrong results)
#pragma unroll
      for (int b = 0; b < kBatch; ++b) promote(t[b], kb + b);
    }
  }
  cp_async_wait<0>();

  // Epilogue: thread holds rows lr0, lr0+8 and columns nt*8 + 2q, +1 for nt = 0..15.
  const int r0 = m0 + lr0, r1 = r0 + 8, q = lane & 3;
  const bool pair_ok = (a.n & 1) == 0;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    const int c = n0 + nt * 8 + 2 * q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = h ? r1 : r0;
      if (r >= a.m || c >= a.n) continue;
      float v0 = acc[nt * 4 + 2 * h], v1 = acc[nt * 4 + 2 * h + 1];
      if (a.bf16_round_out) v0 = bf16_round_dev(v0), v1 = bf16_round_dev(v1);  // FP32 out, BF16 values
      const int64_t o = int64_t(r) * a.n + c;
      if (a.bf16_out) {
        auto* y = reinterpret_cast<__nv_bfloat16*>(a.y);
        if (pair_ok) {
          *reinterpret_cast<__nv_bfloat162*>(y + o) = __floats2bfloat162_rn(v0, v1);
        } else {
          y[o] = __float2bfloat16_rn(v0);
          if (c + 1 < a.n) y[o + 1] = __float2bfloat16_rn(v1);
        }
      } else {
        auto* y = reinterpret_cast<float*>(a.y);
        if (pair_ok) {
          *reinterpret_cast<float2*>(y + o) = make_float2(v0, v1);
        } else {
          y[o] = v0;
          if (c + 1 < a.n) y[o + 1] = v1;
        }
      }
    }
  }
#endif  // FS_GEMM_FP8_SM90
}

// Eight inputs per thread, 4 threads per 32-block (amax by shuffles): s = 2^(ceil(log2(amax)) -
// 15) (amax floored at 2^-100; 1 for a zero block), codes f16_rn(x · 2^-e) (exact power-of-two
// scaling first). As ops::quantize_f16_blocks_ref.
__global__ void __launch_bounds__(256) quantize_f16_kernel(const float* x, int64_t total8, uint16_t* xq,
                                                           float* xs) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t total_r = (total8 + 31) / 32 * 32;  // whole warps run every iteration
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total_r; t += stride) {
    const bool live = t < total8;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    if (live) {
      const float4* p = reinterpret_cast<const float4*>(x) + 2 * t;  // plain loads: x step-written
      const float4 lo = p[0], hi = p[1];
      v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
      v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    }
    const float amax = dev_fp8_block_amax(v, 32);
    float s = 1.0f;
    if (amax > 0.0f) {
      uint32_t u = __float_as_uint(fmaxf(amax, 0x1p-100f));
      int e = int((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) ? 1 : 0);  // ceil(log2(amax))
      s = ldexpf(1.0f, e - 15);
    }
    const float inv = 1.0f / s;  // exact: a power of two
    if (live) {
      uint32_t h[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __half2 c = __floats2half2_rn(v[2 * i] * inv, v[2 * i + 1] * inv);
        h[i] = *reinterpret_cast<const uint32_t*>(&c);
      }
      *reinterpret_cast<uint4*>(xq + t * 8) = make_uint4(h[0], h[1], h[2], h[3]);
      if ((t & 3) == 0) xs[t >> 2] = s;
    }
  }
}

// Eight inputs per thread; 4 (act_block 32) or 16 (128) threads share a block's amax by shuffles.
// Matches ops::fp8_quant_dequant bit for bit: s = 2^ceil(log2(max(amax, 1e-4) / 448)).
// f16_codes: the codes' values as f16 (exact: every e4m3 value is an f16), 16 bytes per thread.
__global__ void __launch_bounds__(256) quantize_fp8_kernel(const void* x, bool bf16, int64_t total8,
                                                           int act_block, uint8_t* xq, float* xs,
                                                           bool f16_codes, bool round_bf16, bool bf16_values) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t total_r = (total8 + 31) / 32 * 32;  // whole warps run every iteration
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total_r; t += stride) {
    const bool live = t < total8;
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    if (live) {
      if (bf16) {  // plain loads: x is step-written (runtime/pdl.cuh)
        const uint4 u = reinterpret_cast<const uint4*>(x)[t];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[2 * i] = __uint_as_float(w[i] << 16);
          v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
      } else {
        const float4* p = reinterpret_cast<const float4*>(x) + 2 * t;
        const float4 lo = p[0], hi = p[1];
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
        v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
        if (round_bf16) {
#pragma unroll
          for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(__float2bfloat16_rn(v[i]));
        }
      }
    }
    const float s = dev_fp8_block_scale(dev_fp8_block_amax(v, act_block));
    const uint2 codes = dev_fp8_pack8(v, 1.0f / s);  // exact: s is a power of two
    if (live) {
      if (f16_codes || bf16_values) {
        // The codes' values as f16 pairs (exact); bf16_values: times s as BF16 (exact: at most 4
        // significant bits times a power of two).
        const uint32_t w[2] = {codes.x, codes.y};
        uint32_t h[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t((w[i >> 1] >> (16 * (i & 1))) & 0xffffu),
                                                    __NV_E4M3);
          h[i] = uint32_t(r.x) | (uint32_t(r.y) << 16);
          if (bf16_values) {
            const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r));
            const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
            h[i] = *reinterpret_cast<const uint32_t*>(&b);
          }
        }
        *reinterpret_cast<uint4*>(xq + t * 16) = make_uint4(h[0], h[1], h[2], h[3]);
      } else {
        *reinterpret_cast<uint2*>(xq + t * 8) = codes;
      }
      if ((t & 3) == 0) xs[t >> 2] = s;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels 6-9: warp-specialised, TMA-fed (see the file comment).
constexpr int kWsStages = 6, kWsBM = 128, kWsBN = 128, kWsThreads = 384;
constexpr int kWsABytes = kWsBM * 128, kWsBBytes = kWsBN * 128, kWsSxBytes = kWsBM * 16;
constexpr int kWsTxBytes = kWsABytes + kWsBBytes + kWsSxBytes;  // TMA bytes per stage
constexpr int kWsSmemBytes =
    kWsStages * (kWsABytes + kWsBBytes + kWsSxBytes + 16 * 4) + 2 * kWsStages * 8 + 1024;
// Grouped: + the per-group tile prefix and row starts (ints) after the barriers.
constexpr int kWsGroupedSmemBytes = kWsSmemBytes + 2 * (kGemmFp8MaxGroups + 1) * 4;
// Full barrier: the 16 lanes that publish a stage's W scales + the TMA issuer's expect_tx.
constexpr int kWsFullArrivals = 17, kWsEmptyArrivals = 8;  // empty: one per consumer warp
static_assert(kWsTxBytes < (1 << 20), "an mbarrier's transaction count is below 2^20");
static_assert(kWsFullArrivals == 16 + 1 && kWsEmptyArrivals == 2 * 4, "see the comment above");
// FP4 weights (grouped only): 4 stages (the extra buffers do not fit 6). A stage adds the raw
// e2m1 bytes of the W tile (TMA, 128 rows × 64 bytes, unswizzled, own "raw" barrier) and the W
// scales per (32-block, row) as FP32; the W slot itself is written by the converter warps.
constexpr int kWs4Stages = 4, kWs4RawBytes = kWsBN * 64, kWs4SwFloats = 4 * kWsBN;
constexpr int kWs4TxBytes = kWsABytes + kWsSxBytes;  // TMA bytes on the full barrier (X side)
constexpr int kWs4SmemBytes =
    kWs4Stages * (kWsABytes + kWsBBytes + kWsSxBytes + kWs4SwFloats * 4 + kWs4RawBytes) +
    3 * kWs4Stages * 8 + 1024 + 2 * (kGemmFp8MaxGroups + 1) * 4;
// Full barrier (FP4): the TMA issuer's expect_tx + one arrival per converter warp (warps 1-3).
constexpr int kWs4ConvWarps = 3, kWs4FullArrivals = 1 + kWs4ConvWarps;
static_assert(kWs4SmemBytes <= 227 * 1024, "FP4 ring over the sm_90 shared-memory limit");
// FP4 weights with f16 operands (GemmFp8Args::x_f16): a stage is 64 k (two 32-blocks, one 128-byte
// swizzle row of f16), so the operand tiles keep the FP8 byte layout (128 rows × 128 bytes); X f16
// by TMA, W expanded from 32 raw bytes per row into f16. The X scales: the same 128 × 4 box at
// the 4-aligned k-block 4·(s/2) (a box must start 16-byte aligned: at 2·s the tensor copy stops
// the kernel with an illegal instruction), odd stages using its second pair; past k/32 zero-filled.
constexpr int kWsHStages = 5, kWsHBK = 64, kWsHRawBytes = kWsBN * 32, kWsHSwFloats = 2 * kWsBN;
constexpr int kWsHSmemBytes =
    kWsHStages * (kWsABytes + kWsBBytes + kWsSxBytes + kWsHSwFloats * 4 + kWsHRawBytes) +
    3 * kWsHStages * 8 + 1024 + 2 * (kGemmFp8MaxGroups + 1) * 4;
static_assert(kWsHSmemBytes <= 227 * 1024, "FP4/f16 ring over the sm_90 shared-memory limit");
// FP8 weights with f16 operands (GemmFp8Args::x_f16 without w_fp4): the same 64-k stages, the raw
// e4m3 bytes of the W tile (128 rows × 64 bytes) expanded to f16 by the converter warps, one W
// scale per (row, 32-block) looked up from the w_block × w_block tile scales.
constexpr int kWsH8RawBytes = kWsBN * 64;
constexpr int kWsH8SmemBytes =
    kWsHStages * (kWsABytes + kWsBBytes + kWsSxBytes + kWsHSwFloats * 4 + kWsH8RawBytes) +
    3 * kWsHStages * 8 + 1024 + 2 * (kGemmFp8MaxGroups + 1) * 4;
static_assert(kWsH8SmemBytes <= 227 * 1024, "FP8/f16 ring over the sm_90 shared-memory limit");

struct WsParams {
  CUtensorMap ta;   // X codes [m, k] u8, box 128 × 128, 128-byte swizzle
  CUtensorMap tb;   // W codes [n, k] u8, box 128 × 128, 128-byte swizzle
  CUtensorMap tsx;  // X scales [m, k/32] f32, box 128 rows × 4
  GemmFp8Args a;
};

#ifdef FS_GEMM_FP8_SM90
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

// The raw W bytes of one 64-k stage of 128 rows, copied as the fragment order's four 1,024-byte
// units (ops/fp4_fragments.h: 32-row tile i, lane slot L = 4g + q owning 32 bytes: the 16 of block
// j at 32L + 16j, word 2mt + h of them being bytes 4q..4q+3 of row 16mt + 8h + g), put back in row
// order in place (row r's 32 bytes at 32r: word 4j + q), as the tensor copy of the row-major
// layout leaves them. A tile's unit and its rows occupy the same 1,024 bytes, so the 96 threads
// `ct` of the converter warps move two tiles a round (128 16-byte vectors, at most two a thread,
// under their 40-register cap), reading all before writing any (named barrier 1).
__device__ __forceinline__ void fragments_to_rows(uint8_t* raw, int ct) {
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    uint8_t* base2 = raw + half * 2048;
    const bool two = ct < 32;  // vectors ct and ct + 96 of the round's 128
    const uint4 a = *reinterpret_cast<const uint4*>(base2 + ct * 16);
    uint4 b = a;
    if (two) b = *reinterpret_cast<const uint4*>(base2 + (ct + 96) * 16);
    asm volatile("bar.sync 1, 96;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (i == 1 && !two) break;
      const int u = ct + 96 * i;
      const uint4 v = i ? b : a;
      const int tile = u >> 6, lane_slot = (u >> 1) & 31, j = u & 1, g = lane_slot >> 2, q = lane_slot & 3;
      uint32_t* w = reinterpret_cast<uint32_t*>(base2 + (tile * 32 + g) * 32 + (4 * j + q) * 4);  // mt = h = 0
      w[0] = v.x, w[8 * 8] = v.y, w[16 * 8] = v.z, w[24 * 8] = v.w;  // rows + 0, + 8, + 16, + 24 (8 words a row)
    }
    asm volatile("bar.sync 1, 96;\n" ::: "memory");
  }
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Four e2m1 codes (nibbles of h[15:0], first value in the low nibble) → four e4m3 bytes (first
// value in the low byte); exact: e2m1 {0, .5, 1, 1.5, 2, 3, 4, 6} are e4m3 0x00, 0x30, 0x38, 0x3C,
// 0x40, 0x44, 0x48, 0x4C. Magnitudes by one byte permute from an 8-entry table (selector bit 3,
// prmt's sign-replicate flag, masked off); sign bits moved from bit 3 / 7 of each source byte to
// bit 7 of the target bytes.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3(uint32_t h) {
  const uint32_t mag = __byte_perm(0x3C383000u, 0x4C484440u, h & 0x7777u);
  const uint32_t x = __byte_perm(h, 0u, 0x1100u);  // bytes h0 h0 h1 h1
  return mag | ((x << 4) & 0x00800080u) | (x & 0x80008000u);
}
// Eight e2m1 codes (nibbles of v, first value in the low nibble) → eight f16 values (exact: e2m1
// {0, .5, 1, 1.5, 2, 3, 4, 6} are f16 0x0000, 0x3800, 0x3C00, 0x3E00, 0x4000, 0x4200, 0x4400,
// 0x4600: only the high byte is non-zero). The high bytes as e2m1x4_to_e4m3 forms its codes
// (another table, the same sign moves), then spread into the high byte of each 16-bit half.
__device__ __forceinline__ uint32_t e2m1x4_to_f16_hi(uint32_t h) {
  const uint32_t mag = __byte_perm(0x3E3C3800u, 0x46444240u, h & 0x7777u);
  const uint32_t x = __byte_perm(h, 0u, 0x1100u);  // bytes h0 h0 h1 h1
  return mag | ((x << 4) & 0x00800080u) | (x & 0x80008000u);
}
__device__ __forceinline__ uint4 e2m1x8_to_f16(uint32_t v) {
  const uint32_t lo = e2m1x4_to_f16_hi(v & 0xffffu), hi = e2m1x4_to_f16_hi(v >> 16);
  uint4 o;
  o.x = __byte_perm(lo, 0u, 0x1404u), o.y = __byte_perm(lo, 0u, 0x3424u);  // values 0-1, 2-3
  o.z = __byte_perm(hi, 0u, 0x1404u), o.w = __byte_perm(hi, 0u, 0x3424u);  // values 4-5, 6-7
  return o;
}
// Eight e4m3 codes (first value in the low byte of v.x) → eight f16 values (exact: every e4m3
// value is an f16), two per cvt.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t h) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(h & 0xffffu), __NV_E4M3);
  return uint32_t(r.x) | (uint32_t(r.y) << 16);
}
__device__ __forceinline__ uint4 e4m3x8_to_f16(uint2 v) {
  return make_uint4(e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.x >> 16), e4m3x2_to_f16x2(v.y),
                    e4m3x2_to_f16x2(v.y >> 16));
}
// D (+)= A · B: one m64n128k16 wgmma of 16-bit operands (f16 or BF16; FP32 accumulation), A and
// B from shared memory, both k-major; scale-d = 0 overwrites D.
#define FS_R8(i)                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FS_WGMMA_M64N128K16(NAME, TYPE)                                                             \
  __device__ __forceinline__ void NAME(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {    \
    asm volatile(                                                                                  \
        "{\n"                                                                                      \
        ".reg .pred p;\n"                                                                          \
        "setp.ne.b32 p, %66, 0;\n"                                                                 \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                            \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                  \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "         \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "         \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "        \
        "%64, %65, p, 1, 1, 0, 0;\n"                                                               \
        "}\n"                                                                                      \
        : FS_R8(0), FS_R8(8), FS_R8(16), FS_R8(24), FS_R8(32), FS_R8(40), FS_R8(48), FS_R8(56)    \
        : "l"(da), "l"(db), "r"(scale_d));                                                         \
  }
FS_WGMMA_M64N128K16(wgmma_m64n128k16_f16, "f16")
FS_WGMMA_M64N128K16(wgmma_m64n128k16_bf16, "bf16")
#undef FS_WGMMA_M64N128K16
// D (+)= A · B, BF16, A from registers (four .b32 of the warpgroup's fragment: this thread's
// rows lane/4 and lane/4 + 8 of its warp's 16, columns 2·(lane%4) + {0, 1} and + 8, the even
// column in the low half), B from shared memory (k-major). The A registers are read-write
// operands so that they stay allocated until the caller's wait retires the wgmma.
__device__ __forceinline__ void wgmma_m64n128k16_bf16_rs(float (&d)[64], uint32_t (&ra)[4], uint64_t db) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
      "}\n"
      : FS_R8(0), FS_R8(8), FS_R8(16), FS_R8(24), FS_R8(32), FS_R8(40), FS_R8(48), FS_R8(56), "+r"(ra[0]),
        "+r"(ra[1]), "+r"(ra[2]), "+r"(ra[3])
      : "l"(db));
}
#undef FS_R8
// BF16 expansion with the weight's scale folded in (x_bf16). The codes' bits are first placed in
// BF16 fields, which gives each value times a fixed power of two (2^-120 for e4m3, 2^-126 for
// e2m1, subnormal codes included: the code's exponent field lands in the low bits of BF16's, its
// mantissa bits on top of BF16's), then one BF16 multiply by 2^bias · scale, exact (a power of
// two times a value of at most 4 significant bits), or two when 2^bias · scale passes 2^127.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
struct Bf16Scale {
  uint32_t m1, m2;  // multipliers (BF16 pairs); m2 only when two
  bool two;
};
// bias_exp: 120 (e4m3) or 126 (e2m1); sc: the E8M0 scale's value.
__device__ __forceinline__ Bf16Scale bf16_scale(float sc, float bias) {
  const float f = sc * bias;  // 2^bias · sc (a power of two, 0 or inf)
  Bf16Scale r;
  r.two = !(f <= 0x1p127f);
  const uint32_t h1 = __bfloat16_as_ushort(__float2bfloat16_rn(r.two ? bias : f));
  const uint32_t h2 = __bfloat16_as_ushort(__float2bfloat16_rn(sc));
  r.m1 = h1 | (h1 << 16), r.m2 = h2 | (h2 << 16);
  return r;
}
__device__ __forceinline__ uint32_t bf16_apply(uint32_t bits, const Bf16Scale& s) {
  const uint32_t v = bf16x2_mul(bits, s.m1);
  return s.two ? bf16x2_mul(v, s.m2) : v;
}
// Eight e4m3 codes (first value in the low byte of v.x) → eight BF16 values · scale.
__device__ __forceinline__ uint4 e4m3x8_to_bf16(uint2 v, const Bf16Scale& s) {
  auto pair = [&](uint32_t w, uint32_t sel) {  // two codes in the low bytes of the 16-bit halves
    const uint32_t x = __byte_perm(w, 0u, sel);
    return bf16_apply(((x << 8) & 0x80008000u) | ((x << 4) & 0x07f007f0u), s);
  };
  return make_uint4(pair(v.x, 0x4140u), pair(v.x, 0x4342u), pair(v.y, 0x4140u), pair(v.y, 0x4342u));
}
// Eight e2m1 codes (nibbles of v, first value in the low nibble) → eight BF16 values · scale.
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t v, const Bf16Scale& s) {
  auto pair = [&](uint32_t b) {  // byte b: two codes, into the low nibbles of the 16-bit halves
    const uint32_t x = (b & 0xfu) | ((b << 12) & 0xf0000u);
    return bf16_apply(((x & 0x00070007u) << 6) | ((x & 0x00080008u) << 12), s);
  };
  return make_uint4(pair(v), pair(v >> 8), pair(v >> 16), pair(v >> 24));
}
// The same conversion for the many chunks that share one scale (s.two false): the eight
// magnitudes' BF16 values · scale made once (each the bf16x2 product e2m1x8_to_bf16 forms for that
// code), their low and high bytes as two byte-permute tables; a chunk is then four table lookups
// (the codes' magnitude bits as selectors), four interleaves and the sign bits ORed in. A negative
// code's product is the positive one's with the sign bit set (a product's rounding does not depend
// on the signs; -0 included), so the bits are e2m1x8_to_bf16's.
struct E2m1Bf16Table {
  uint32_t lo0, lo1, hi0, hi1;  // bytes of magnitudes 0-3 / 4-7: low bytes, high bytes
};
__device__ __forceinline__ E2m1Bf16Table e2m1_bf16_table(const Bf16Scale& s) {
  const uint32_t t01 = bf16x2_mul(0x00400000u, s.m1), t23 = bf16x2_mul(0x00c00080u, s.m1);  // m << 6
  const uint32_t t45 = bf16x2_mul(0x01400100u, s.m1), t67 = bf16x2_mul(0x01c00180u, s.m1);
  return {__byte_perm(t01, t23, 0x6420u), __byte_perm(t45, t67, 0x6420u), __byte_perm(t01, t23, 0x7531u),
          __byte_perm(t45, t67, 0x7531u)};
}
__device__ __forceinline__ uint4 e2m1x8_to_bf16(uint32_t v, const E2m1Bf16Table& t) {
  const uint32_t idx = v & 0x77777777u;
  const uint32_t la = __byte_perm(t.lo0, t.lo1, idx), ha = __byte_perm(t.hi0, t.hi1, idx);
  const uint32_t lb = __byte_perm(t.lo0, t.lo1, idx >> 16), hb = __byte_perm(t.hi0, t.hi1, idx >> 16);
  // Word j: value 2j (nibble 2j) in the low half, 2j + 1 in the high half. The signs: bit 7 of
  // byte b of v << 4 is value 2b's, of v value 2b + 1's, so one byte-permute puts word j's two
  // sign bits at bits 15 and 31 (bytes 1 and 3 from byte j of each), ORed in under one mask.
  const uint32_t s_even = v << 4;
  const auto sign = [&](uint32_t sel) { return __byte_perm(s_even, v, sel) & 0x80008000u; };
  return make_uint4(__byte_perm(la, ha, 0x5140u) | sign(0x4000u), __byte_perm(la, ha, 0x7362u) | sign(0x5010u),
                    __byte_perm(lb, hb, 0x5140u) | sign(0x6020u), __byte_perm(lb, hb, 0x7362u) | sign(0x7030u));
}
#endif  // FS_GEMM_FP8_SM90

// Stored weights → BF16 values · scale (GemmExpandArgs), eight values per thread and step with the
// GEMM's own expansion (e4m3x8_to_bf16 / e2m1x8_to_bf16), so the x_bf16 GEMM over the result
// gives the bits of the x_bf16 GEMM that expands each tile itself.
__global__ void __launch_bounds__(256) expand_bf16_kernel(const GemmExpandArgs a) {
#ifdef FS_GEMM_FP8_SM90
  const int64_t per_matrix = a.n * a.k / 8, total = a.count * per_matrix;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t k8 = a.k / 8, kbw = a.k / a.w_block, nsb = (a.n + a.w_block - 1) / a.w_block;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += stride) {
    const int64_t e = t / per_matrix;
    if (a.row_start && a.row_start[e + 1] <= a.row_start[e]) {  // plain: group starts step-written
      // Matrix e is skipped: move to this thread's last unit inside it; the loop step leaves it.
      const int64_t last = (e + 1) * per_matrix - 1;
      t += (last - t) / stride * stride;
      continue;
    }
    const int64_t row = t / k8, i = (t % k8) * 8;  // row of [count · n], first k of the eight
    uint4 out;
    if (a.fp4) {
      // The eight values are code word (i % 32) / 8 of block i / 32 (row-major: bytes i/2 .. i/2 + 3).
      const int64_t wat = a.fragments ? fp4_fragment_word(row, i / 32, int(i % 32) / 8, a.k) : row * (a.k / 2) + i / 2;
      const int64_t sat = a.fragments ? fp4_fragment_scale(row, i / 32, a.k) : row * (a.k / 32) + i / 32;
      const uint32_t v = ld_weight(reinterpret_cast<const uint32_t*>(a.w + wat));
      out = e2m1x8_to_bf16(v, bf16_scale(e8m0f(ld_weight(a.ws + sat)), 0x1p126f));
    } else {
      const int64_t r = row - e * a.n;
      const uint2 v = ld_weight(reinterpret_cast<const uint2*>(a.w + row * a.k + i));
      out = e4m3x8_to_bf16(v, bf16_scale(e8m0f(ld_weight(a.ws + (e * nsb + r / a.w_block) * kbw + i / a.w_block)), 0x1p120f));
    }
    *reinterpret_cast<uint4*>(a.y + row * a.k + i) = out;
  }
#endif
}

// One unit (row r, 32-block b) of an FP4 stage (64 k) expanded into the BF16 W slot: the four
// 16-byte chunks of the row's 32-block share its scale, so they are made together, the 16 raw
// bytes (e2m1, row stride 32 bytes) read once and the scale's table made once
// (e2m1_bf16_table; a scale past 2^1 takes the two-multiply path per chunk). sw: the stage's W
// scales [32-block][kWsBN rows]; dst: the slot, rows of 128 bytes with the TMA's 128-byte swizzle.
#ifdef FS_GEMM_FP8_SM90
__device__ __forceinline__ void fp4_bf16_unit(const uint8_t* raw, uint8_t* dst, const float* sw, int r, int b) {
  const Bf16Scale sc = bf16_scale(sw[b * kWsBN + r], 0x1p126f);
  const uint32_t* v = reinterpret_cast<const uint32_t*>(raw + r * 32 + b * 16);
  uint8_t* row = dst + r * 128;
  const int sw4 = (4 * b) ^ (r & 7);  // chunk 4b + i lands at 16-byte column sw4 ^ i
  if (sc.two) {  // rare (scales past 2^1): kept rolled, for the converter warps' 40 registers
#pragma unroll 1
    for (int i = 0; i < 4; ++i) *reinterpret_cast<uint4*>(row + ((sw4 ^ i) << 4)) = e2m1x8_to_bf16(v[i], sc);
  } else {
    const E2m1Bf16Table t = e2m1_bf16_table(sc);
#pragma unroll
    for (int i = 0; i < 4; ++i) *reinterpret_cast<uint4*>(row + ((sw4 ^ i) << 4)) = e2m1x8_to_bf16(v[i], t);
  }
}
#endif  // FS_GEMM_FP8_SM90

// kPipe2: two scratch accumulators per consumer warpgroup, the wgmma of 32-block kb+1 in flight
// while kb is promoted; else two 32-blocks per batch, waited for, then promoted (the schedule of
// kernel 3 on the TMA/producer pipeline). kPersist: one block per SM walks the tiles (the
// producer runs ahead into the next tile while the consumers write the last one out); else one
// block per tile. kGrouped (with kPersist): the tiles of all groups (GemmFp8Args::groups).
// kFp4 (grouped only): W arrives as e2m1 bytes; warps 1-3 of the producer warpgroup expand each
// stage into the swizzled e4m3 W slot once its TMA lands (and publish the per-row W scales), then
// arrive on the stage's full barrier; the consumers promote with a scale per output column.
// kF16 (GemmFp8Args::x_f16): X arrives as f16 (the e4m3 values), the converters expand W (e2m1
// with kFp4, else e4m3 with its tile scales looked up per row) into f16, and each 32-block is two
// m64n128k16 f16 wgmmas (FP32 accumulation) instead of one e4m3 wgmma, whose 32-product sum keeps
// only ~14 bits below the largest product; stages of 64 k. kConv = kFp4 || kF16: the converter
// pipeline (raw W bytes by TMA, expanded by warps 1-3 of the producer warpgroup).
// kBv (with kF16; GemmFp8Args::x_bf16): X arrives as BF16 values (no X scales), the converters
// expand W into BF16 with its scale folded in, and each 32-block is two m64n128k16 BF16 wgmmas
// into a scratch accumulator, added to acc in FP32 (no scale work), so that the tensor core's
// truncating sum spans 32 products, as in the f16 mode, rather than all of k.
// kWb (with kBv; GemmFp8Args::w_bf16): W is a BF16 matrix (grouped: group g's from row g · n of the
// stack), brought by the TMA straight into the swizzled W slot like X (no converter work: warps
// 1-3 leave).
// kDirect (with kBv; GemmFp8Args::bf16_direct): the stage's four BF16 wgmmas accumulate into acc
// itself; the stage stays in flight while the next one is waited for and issued, and its slot
// goes back to the producer once the wgmma group after it has been committed (wait<1>), so the
// tensor core never waits on the threads' FP32 block additions.
template <bool kPipe2, bool kPersist, bool kGrouped = false, bool kFp4 = false, bool kF16 = false, bool kBv = false,
          bool kWb = false, bool kDirect = false, bool kSw = false>
__global__ void __launch_bounds__(kWsThreads, 1)
    gemm_fp8_ws_kernel(const __grid_constant__ WsParams P) {
  static_assert(!kBv || kF16, "BF16 operands use the f16 pipeline's stages");
  static_assert(!kDirect || kBv, "direct accumulation: BF16 operands (scales folded in) only");
  static_assert(!kWb || (kBv && !kFp4), "BF16 weights: BF16-value GEMM only");
  static_assert(!kGrouped || kPersist, "the grouped tile loop is persistent");
  static_assert(!kFp4 || kGrouped, "FP4 weights: grouped GEMM only");
  static_assert(!kF16 || kPipe2, "f16 operands: the overlapped schedule only");
  constexpr bool kConv = kFp4 || kF16;                                            // converter pipeline
  // kCc (FP4 weights, BF16 values, direct accumulation): the 256 consumer threads expand each
  // stage themselves, one (row, 32-block) unit each, while the previous stage's wgmmas run;
  // warps 1-3 of the producer warpgroup only publish the stage's W scales, so the expansion is
  // spread over all 256 consumer threads instead of three warps; the same values land in the slot.
  constexpr bool kCc = kFp4 && kBv && kDirect;
  // kSw (with kCc; GemmFp8Args::w_in_registers): the operands swapped, Yᵀ = W · Xᵀ: each consumer
  // warpgroup expands its 64 W rows of the stage straight into wgmma A-fragment registers and
  // the X tile (the tile's 128 rows) is the shared-memory B operand, so no expanded W is stored,
  // fenced or shared behind a barrier, and each stage's shared-memory traffic drops by the W
  // slot's writes and second read (shared-memory bandwidth, which the operand reads and the TMA's
  // writes otherwise use up).
  static_assert(!kSw || kCc, "swapped operands: FP4 weights, BF16 values, direct accumulation, grouped");
  // Rows of X per grouped tile: kSw takes up to 256 (two 128-row TMA boxes, the second in the
  // otherwise unused W slot, two wgmma accumulators sharing the W registers), so that a group of
  // up to 256 rows expands each W tile once; the second half is skipped (no load, no wgmma) when
  // the group ends within the first.
  constexpr int kBMt = kSw ? 2 * kWsBM : kWsBM;
  constexpr int S = kF16 ? kWsHStages : kFp4 ? kWs4Stages : kWsStages;           // ring slots
  constexpr int kSwSlot = kF16 ? kWsHSwFloats : kFp4 ? kWs4SwFloats : 16;        // W scales per slot
  constexpr int kRawSlot = kF16 ? (kFp4 ? kWsHRawBytes : kWsH8RawBytes) : kFp4 ? kWs4RawBytes : 0;  // raw W bytes per slot
  constexpr int kStageK = kF16 ? kWsHBK : kBK;                                    // k per stage
#ifdef FS_GEMM_FP8_SM90
  const GemmFp8Args& a = P.a;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem =
      smem_raw + ((1024 - (uint32_t(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  uint8_t* sa = smem;                              // [slot][128 rows][128] swizzled
  uint8_t* sb = sa + S * kWsABytes;        // [slot][128 rows][128] swizzled
  float* ssx = reinterpret_cast<float*>(sb + S * kWsBBytes);  // [slot][128][4]
  // W scales: FP8 [slot][kb 4][grp 4]; FP4 [slot][kb 4][128 rows].
  float* ssw = ssx + S * kWsBM * 4;
  uint8_t* sraw = reinterpret_cast<uint8_t*>(ssw + S * kSwSlot);  // FP4: [slot][128 rows][64]
  // full[S], empty[S], FP4: raw[S]
  uint64_t* bars = reinterpret_cast<uint64_t*>(sraw + S * kRawSlot);
  const uint32_t sa_u = uint32_t(__cvta_generic_to_shared(sa));
  const uint32_t sb_u = uint32_t(__cvta_generic_to_shared(sb));
  const uint32_t ssx_u = uint32_t(__cvta_generic_to_shared(ssx));
  const uint32_t sraw_u = uint32_t(__cvta_generic_to_shared(sraw));
  const uint32_t bar_u = uint32_t(__cvta_generic_to_shared(bars));
  auto full_bar = [&](int slot) { return bar_u + uint32_t(slot * 8); };
  auto empty_bar = [&](int slot) { return bar_u + uint32_t((S + slot) * 8); };
  auto raw_bar = [&](int slot) { return bar_u + uint32_t((2 * S + slot) * 8); };
  int* tile_pref = reinterpret_cast<int*>(bars + (kConv ? 3 : 2) * S);  // grouped: [groups + 1]
  int* row_pref = tile_pref + kGemmFp8MaxGroups + 1;             // grouped: [groups + 1]
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int nst = a.k / kStageK;
  const int tiles_m = (a.m + kWsBM - 1) / kWsBM, tiles_n = (a.n + kWsBN - 1) / kWsBN;
  if constexpr (kGrouped) {
    // Warp 1: row starts and the prefix of the groups' tile counts (ceil(rows/128) · tiles_n)
    // into shared memory, a 32-wide inclusive scan per 32 groups.
    if (tid >> 5 == 1) {
      int carry = 0;
      if (lane == 0) tile_pref[0] = 0;
      for (int base = 0; base <= a.groups; base += 32) {
        const int g = base + lane;
        int cnt = 0;
        if (g <= a.groups) {
          const int rs = min(max(a.row_start[g], 0), a.m);
          row_pref[g] = rs;
          if (g < a.groups) {
            const int re = min(max(a.row_start[g + 1], rs), a.m);
            cnt = (re - rs + kBMt - 1) / kBMt * tiles_n;
          }
        }
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, cnt, o);
          if (lane >= o) cnt += v;
        }
        if (g < a.groups) tile_pref[g + 1] = carry + cnt;
        carry += __shfl_sync(0xffffffffu, cnt, 31);
      }
    }
  }

  // Grouped rasterisation (as in gemm_fp8_kernel): tile index → (m0, n0). Grouped GEMM: tile →
  // group g (binary search in the prefix), then m-tile fastest within the group (the m-tiles of
  // one weight n-tile run together); rows below m_end are the group's.
  const int tile_step = kPersist ? int(gridDim.x) : tiles_m * tiles_n;
  auto tile_origin = [&](int pid, int& m0, int& n0, int& g, int& m_end) {
    if constexpr (kGrouped) {
      int lo = 0, hi = a.groups;  // tile_pref[lo] <= pid < tile_pref[hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (tile_pref[mid] <= pid) lo = mid;
        else hi = mid;
      }
      g = lo;
      const int rs = row_pref[g];
      m_end = max(min(row_pref[g + 1], a.m), rs);
      const int tm = (m_end - rs + kBMt - 1) / kBMt, local = pid - tile_pref[g];
      m0 = rs + (local % tm) * kBMt;
      n0 = (local / tm) * kWsBN;
    } else {
      const int in_group = kGroupM * tiles_n;
      const int first_m = (pid / in_group) * kGroupM;
      const int gsz = min(tiles_m - first_m, kGroupM);
      m0 = (first_m + (pid % in_group) % gsz) * kWsBM;
      n0 = ((pid % in_group) / gsz) * kWsBN;
      g = 0, m_end = a.m;
    }
  };

  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(full_bar(s), kWb ? 1 : kConv ? kWs4FullArrivals : kWsFullArrivals);
      mbar_init(empty_bar(s), kWsEmptyArrivals);
      if constexpr (kConv) mbar_init(raw_bar(s), 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    fence_proxy_async();
  }
  __syncthreads();
  const int tiles = kGrouped ? tile_pref[a.groups] : tiles_m * tiles_n;

  if (wg == 0) {
    // Producer warpgroup: warp 0 feeds the ring, the other three leave.
    setmaxnreg_dec<40>();
    if constexpr (kConv) {
      if (warp == 0) {
        if (lane != 0) return;
        // Lane 0 of warp 0: X codes + X scales onto the full barrier, the raw W bytes onto the
        // raw barrier (the converters' signal).
        int it = 0;
#pragma unroll 1
        for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
          int m0, n0, g, m_end;
          tile_origin(tile, m0, n0, g, m_end);
#pragma unroll 1
          for (int s = 0; s < nst; ++s, ++it) {
            const int slot = it % S, round = it / S;
            if (round > 0) mbar_wait(empty_bar(slot), uint32_t((round - 1) & 1));
            const bool x2 = kSw && m0 + kWsBM < m_end;  // kSw: the tile's second 128 rows
            mbar_arrive_expect_tx(full_bar(slot), uint32_t(kWb  ? kWsABytes + kWsBBytes
                                                           : x2 ? 2 * kWsABytes
                                                           : kBv ? kWsABytes
                                                                 : kWs4TxBytes));
            // X: 128 bytes of each row per stage (128 e4m3, or 64 f16 / BF16 values).
            tma_load_2d(sa_u + uint32_t(slot * kWsABytes), &P.ta, full_bar(slot), s * 128, m0);
            if (x2) tma_load_2d(sb_u + uint32_t(slot * kWsBBytes), &P.ta, full_bar(slot), s * 128, m0 + kWsBM);
            if constexpr (kWb) {  // W: 64 BF16 values of each row, swizzled, onto the full barrier
              tma_load_2d(sb_u + uint32_t(slot * kWsBBytes), &P.tb, full_bar(slot), s * 128, g * a.n + n0);
              continue;
            }
            if constexpr (!kBv)
              tma_load_2d(ssx_u + uint32_t(slot * kWsSxBytes), &P.tsx, full_bar(slot), kF16 ? (s >> 1) * 4 : s * 4, m0);
            mbar_arrive_expect_tx(raw_bar(slot), uint32_t(kRawSlot));
            if (kF16 && kFp4 && a.w_fragments) {
              // The fragment order (n % 128 == 0): units (32-row tile t0 + i, block pair s).
              const int64_t t0 = (int64_t(g) * a.n + n0) / 32, pairs = a.k / 64;
#pragma unroll
              for (int i = 0; i < 4; ++i)
                bulk_load(sraw_u + uint32_t(slot * kRawSlot + i * 1024), a.w + ((t0 + i) * pairs + s) * 1024, 1024u,
                          raw_bar(slot));
            } else {
              tma_load_2d(sraw_u + uint32_t(slot * kRawSlot), &P.tb, raw_bar(slot),
                          kFp4 ? s * (kStageK / 2) : s * kStageK, g * a.n + n0);
            }
          }
        }
        return;
      }
      // Warps 1-3 (96 threads): per stage, the W scales of the tile's 128 rows (thread ct: rows
      // ct and ct + 96; one 4-byte load = the stage's four 32-blocks), then the 1024 16-byte
      // chunks of the e4m3 tile: chunk j = (row j/8, k chunk j%8) from raw bytes row·64 + 8·(j%8),
      // stored at row·128 + ((j%8) ^ (row%8))·16 (the TMA's 128-byte swizzle).
      // FP8 weights (kF16 without kFp4): raw bytes row·64 + 8·(j%8), each byte an e4m3 code
      // expanded to f16; a row's scale of 32-block kb is its w_block tile's.
      if constexpr (kWb) return;
      const int ct = tid - 32;
      const int kb_row = a.k / 32;
      const int wkb = a.k / a.w_block, nsb = (a.n + a.w_block - 1) / a.w_block;
      int it = 0;
#pragma unroll 1
      for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
        int m0, n0, g, m_end;
        tile_origin(tile, m0, n0, g, m_end);
        const int r0 = min(n0 + ct, a.n - 1), r1 = min(n0 + ct + 96, a.n - 1);
        // FP4 in the fragment order (64-k stages): stage s's two scale bytes of a row at the row's
        // pair-0 place + 64·s (ops/fp4_fragments.h), row-major at the row + 2·s.
        const bool frag = kF16 && kFp4 && a.w_fragments;
        const uint8_t* sc0 = !kFp4 ? a.ws + (int64_t(g) * nsb + r0 / a.w_block) * wkb
                             : frag ? a.ws + fp4_fragment_scale(int64_t(g) * a.n + r0, 0, a.k)
                                    : a.ws + (int64_t(g) * a.n + r0) * kb_row;
        const uint8_t* sc1 = !kFp4 ? a.ws + (int64_t(g) * nsb + r1 / a.w_block) * wkb
                             : frag ? a.ws + fp4_fragment_scale(int64_t(g) * a.n + r1, 0, a.k)
                                    : a.ws + (int64_t(g) * a.n + r1) * kb_row;
        const int sstep = frag ? 64 : 2;
#pragma unroll 1
        for (int s = 0; s < nst; ++s, ++it) {
          const int slot = it % S, round = it / S;
          // Issued before the wait: the latency hides behind it.
          uint32_t w0, w1;
          if constexpr (kF16 && !kFp4) {  // the scales of the stage's 32-blocks 2s and 2s + 1
            const int b0 = (2 * s) * 32 / a.w_block, b1 = (2 * s + 1) * 32 / a.w_block;
            w0 = uint32_t(ld_weight(sc0 + b0)) | (uint32_t(ld_weight(sc0 + b1)) << 8);
            w1 = ct < 32 ? uint32_t(ld_weight(sc1 + b0)) | (uint32_t(ld_weight(sc1 + b1)) << 8) : 0u;
          } else if constexpr (kF16) {  // the stage's two 32-blocks: one 2-byte load per row
            w0 = ld_weight(reinterpret_cast<const uint16_t*>(sc0 + s * sstep));
            w1 = ct < 32 ? ld_weight(reinterpret_cast<const uint16_t*>(sc1 + s * sstep)) : 0u;
          } else {
            w0 = ld_weight(reinterpret_cast<const uint32_t*>(sc0 + s * 4));
            w1 = ct < 32 ? ld_weight(reinterpret_cast<const uint32_t*>(sc1 + s * 4)) : 0u;
          }
          float* sw = ssw + slot * kSwSlot;
          if constexpr (kBv && !kCc) {
            // The stage's scales first (rows ct, ct + 96; 32-blocks 0 and 1), read back per chunk
            // below by any of the 96 converter threads (named barrier 1). A slot's scales are
            // rewritten S stages later, after S more of these barriers, so no reader is left.
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              sw[i * kWsBN + ct] = e8m0f(uint8_t(w0 >> (8 * i)));
              if (ct < 32) sw[i * kWsBN + ct + 96] = e8m0f(uint8_t(w1 >> (8 * i)));
            }
            asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kWs4ConvWarps) : "memory");
          }
          mbar_wait(raw_bar(slot), uint32_t(round & 1));
          if (frag) fragments_to_rows(sraw + slot * kRawSlot, ct);
          const uint8_t* raw = sraw + slot * kRawSlot;
          uint8_t* dst = sb + slot * kWsBBytes;
          // Chunk j = (row j/8, 16-byte output chunk j%8 = values 8·(j%8) ... +7 of the stage,
          // in 32-block (j%8)/4), stored at row·128 + ((j%8) ^ (row%8))·16 (the TMA's 128-byte
          // swizzle), from raw bytes row·64 + 8·(j%8) (e4m3; the e4m3 ring's e2m1: 16 codes) or
          // row·32 + 4·(j%8) (e2m1); the 96 threads take chunks ct, ct + 96, ...
          auto for_chunks = [&](auto&& expand) {  // expand(row, chunk) → the 16 output bytes
#pragma unroll 1
            for (int j = ct; j < kWsBN * 8; j += 32 * kWs4ConvWarps) {
              const int r = j >> 3, c = j & 7;
              *reinterpret_cast<uint4*>(dst + r * 128 + ((c ^ (r & 7)) << 4)) = expand(r, c);
            }
          };
          if (a.skip_promote & 2) {
            // Timing diagnostic only (wrong results): no expansion.
          } else if constexpr (kCc) {
            // The consumers expand the stage (below); these warps only publish its scales.
          } else if constexpr (kBv && kFp4) {
#pragma unroll 1
            for (int u = ct; u < kWsBN * 2; u += 32 * kWs4ConvWarps)
              fp4_bf16_unit(raw, dst, sw, u & (kWsBN - 1), u / kWsBN);
          } else if constexpr (kBv) {
            for_chunks([&](int r, int c) {
              return e4m3x8_to_bf16(*reinterpret_cast<const uint2*>(raw + r * 64 + c * 8),
                                    bf16_scale(sw[(c >> 2) * kWsBN + r], 0x1p120f));
            });
          } else if constexpr (kF16 && !kFp4) {  // e4m3 → f16, hardware conversion, exact
            for_chunks([&](int r, int c) { return e4m3x8_to_f16(*reinterpret_cast<const uint2*>(raw + r * 64 + c * 8)); });
          } else if constexpr (kF16) {
            for_chunks([&](int r, int c) { return e2m1x8_to_f16(*reinterpret_cast<const uint32_t*>(raw + r * 32 + c * 4)); });
          } else {  // e2m1 → e4m3 (the e4m3 ring, 128-k stages)
            for_chunks([&](int r, int c) {
              const uint2 v = *reinterpret_cast<const uint2*>(raw + r * 64 + c * 8);
              return make_uint4(e2m1x4_to_e4m3(v.x), e2m1x4_to_e4m3(v.x >> 16), e2m1x4_to_e4m3(v.y),
                                e2m1x4_to_e4m3(v.y >> 16));
            });
          }
          if constexpr (!kBv || kCc) {  // kCc: after the raw wait, so the consumers are done with the slot
#pragma unroll
            for (int i = 0; i < kStageK / 32; ++i) {
              sw[i * kWsBN + ct] = e8m0f(uint8_t(w0 >> (8 * i)));
              if (ct < 32) sw[i * kWsBN + ct + 96] = e8m0f(uint8_t(w1 >> (8 * i)));
            }
          }
          fence_proxy_async();  // the generic-proxy stores, visible to the wgmma (async proxy)
          __syncwarp();
          if (lane == 0) mbar_arrive(full_bar(slot));
        }
      }
      return;
    }
    if (warp != 0) return;
    // Lane l < 16 publishes the W scale of (k-block l/4, 32-row group l%4) of each stage.
    const int wkb = a.k / a.w_block, nsb = (a.n + a.w_block - 1) / a.w_block;
    int it = 0;  // stages issued so far (all tiles): ring slot it % S, round it / S
#pragma unroll 1
    for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
      int m0, n0, g, m_end;
      tile_origin(tile, m0, n0, g, m_end);
      const int wn = g * nsb + min(n0 + (lane & 3) * 32, a.n - 1) / a.w_block;
#pragma unroll 1
      for (int s = 0; s < nst; ++s, ++it) {
        const int slot = it % S, round = it / S;
        // Issued before the wait: its latency hides behind it.
        const uint32_t swv =
            lane < 16 ? ld_weight(a.ws + int64_t(wn) * wkb + (s * kBK + (lane >> 2) * 32) / a.w_block)
                      : 0u;
        if (round > 0) mbar_wait(empty_bar(slot), uint32_t((round - 1) & 1));
        if (lane < 16) {
          ssw[slot * 16 + lane] = e8m0f(uint8_t(swv));
          mbar_arrive(full_bar(slot));
        }
        if (lane == 0) {
          mbar_arrive_expect_tx(full_bar(slot), uint32_t(kWsTxBytes));
          tma_load_2d(sa_u + uint32_t(slot * kWsABytes), &P.ta, full_bar(slot), s * kBK, m0);
          tma_load_2d(sb_u + uint32_t(slot * kWsBBytes), &P.tb, full_bar(slot), s * kBK, g * a.n + n0);
          tma_load_2d(ssx_u + uint32_t(slot * kWsSxBytes), &P.tsx, full_bar(slot), s * 4, m0);
        }
        __syncwarp();
      }
    }
    return;
  }

  setmaxnreg_inc<232>();
  // A consumer warp is done with a ring slot (the stage's wgmmas retired).
  auto release = [&](int slot) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty_bar(slot));
  };
  if constexpr (kSw) {
    // Consumer warpgroup cw: W rows n0 + cw·64 .. +63 of the tile (the wgmma's M) against the
    // tile's 128 X rows (its N). This thread's W rows wr0 and wr0 + 8; per stage (64 k) its A
    // fragments of the four k16 steps come from bytes q, q + 4, ..., q + 28 of each row's 32 raw
    // bytes (byte j: k 2j, 2j + 1; word w = bytes 4w..4w+3: k 8w..8w+7), one BF16 pair per byte,
    // made in two register sets so that a stage is expanded while the previous one's wgmmas run.
    const int cw = wg - 1, q = lane & 3;
    const int wr0 = cw * 64 + warp * 16 + (lane >> 2);
    const uint32_t selq = uint32_t(q) | (uint32_t(q + 4) << 4);  // byte q of x, byte q of y
    // The stage's A fragments: f[h][0..3] = (wr0, k 16h + 2q..), (wr0 + 8, same), (wr0, + 8), (wr0 + 8, + 8).
    auto expand = [&](int slot, uint32_t(&f)[4][4]) {
      const uint8_t* raw = sraw + slot * kRawSlot;
      const float* sw = ssw + slot * kSwSlot;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wr0 + 8 * r;
        const uint4 w03 = *reinterpret_cast<const uint4*>(raw + row * 32);
        const uint4 w47 = *reinterpret_cast<const uint4*>(raw + row * 32 + 16);
#pragma unroll
        for (int b = 0; b < 2; ++b) {  // 32-block b: words 4b..4b+3, k16 steps 2b and 2b + 1
          const uint4 w = b ? w47 : w03;
          const uint32_t v = __byte_perm(__byte_perm(w.x, w.y, selq), __byte_perm(w.z, w.w, selq), 0x5410u);
          const Bf16Scale sc = bf16_scale(sw[b * kWsBN + row], 0x1p126f);
          const uint4 o = sc.two ? e2m1x8_to_bf16(v, sc) : e2m1x8_to_bf16(v, e2m1_bf16_table(sc));
          f[2 * b][r] = o.x, f[2 * b][2 + r] = o.y, f[2 * b + 1][r] = o.z, f[2 * b + 1][2 + r] = o.w;
        }
      }
    };
    auto fence_frag = [](uint32_t(&f)[4][4]) {
#pragma unroll
      for (int h = 0; h < 4; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(f[h][i])::"memory");
    };
    float acc[64], acc2[64];  // the tile's X rows m0 .. +127 and m0 + 128 .. +255
    uint32_t fa[4][4], fb[4][4];
    int it = 0;
#pragma unroll 1
    for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
      int m0, n0, g, m_end;
      tile_origin(tile, m0, n0, g, m_end);
      const bool x2 = m0 + kWsBM < m_end;  // the second half holds rows of the group (uniform per tile)
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = 0.0f, acc2[i] = 0.0f;
      int in_flight = -1;
      // One stage into f: wait for its bytes, expand, issue its four k16 wgmmas, then retire the
      // previous stage's (wait<1>) and hand that slot back; `other` is the previous stage's set.
      auto stage = [&](uint32_t(&f)[4][4], uint32_t(&other)[4][4]) {
        const int slot = it % S;
        mbar_wait(full_bar(slot), uint32_t((it / S) & 1));
        mbar_wait(raw_bar(slot), uint32_t((it / S) & 1));
        if (!(a.skip_promote & 2)) expand(slot, f);  // timing diagnostic only (wrong results): no expansion
        fence_regs(acc);
        fence_regs(acc2);
        fence_frag(f);
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          wgmma_m64n128k16_bf16_rs(acc, f[h], smem_desc(sa_u + uint32_t(slot * kWsABytes + h * 32), 16u, 1024u, 1u));
          if (x2)
            wgmma_m64n128k16_bf16_rs(acc2, f[h], smem_desc(sb_u + uint32_t(slot * kWsBBytes + h * 32), 16u, 1024u, 1u));
        }
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(acc);
        fence_regs(acc2);
        fence_frag(other);
        if (in_flight >= 0) release(in_flight);
        in_flight = slot;
        ++it;
      };
#pragma unroll 1
      for (int s = 0; s < nst; s += 2) {
        stage(fa, fb);
        if (s + 1 < nst) stage(fb, fa);
      }
      wgmma_wait<0>();
      fence_regs(acc);
      fence_regs(acc2);
      fence_frag(fa);
      fence_frag(fb);
      if (in_flight >= 0) release(in_flight);
      // Epilogue: acc[nt·4 + 2h + j] = Yᵀ[W row wr0 + 8h][X row m0 + nt·8 + 2q + j]; acc2 the
      // same 128 rows further.
      const int64_t ldy = a.ldy > 0 ? a.ldy : a.n;
      auto store = [&](const float(&d)[64], int rbase) {
#pragma unroll
        for (int nt = 0; nt < 16; ++nt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int r = rbase + nt * 8 + 2 * q + j, c = n0 + wr0 + 8 * h;
              if (r >= m_end || c >= a.n) continue;
              float v = d[nt * 4 + 2 * h + j];
              if (a.bf16_round_out) v = bf16_round_dev(v);
              const int64_t o = int64_t(r) * ldy + c;
              if (a.bf16_out) reinterpret_cast<__nv_bfloat16*>(a.y)[o] = __float2bfloat16_rn(v);
              else reinterpret_cast<float*>(a.y)[o] = v;
            }
      };
      store(acc, m0);
      if (x2) store(acc2, m0 + kWsBM);
    }
    return;
  }
  // Consumer warpgroups 1 and 2: rows (wg-1)·64 .. +63 of the tile, all 128 columns.
  const int cw = wg - 1;
  const int g = lane >> 2;
  const int lr0 = cw * 64 + warp * 16 + g;  // this thread's tile rows lr0 and lr0 + 8
  float acc[64], t0[64], t1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) t0[i] = 0.0f, t1[i] = 0.0f;

  auto issue = [&](int slot, int i, float(&d)[64]) {
    const uint64_t da =
        smem_desc(sa_u + uint32_t(slot * kWsABytes + cw * 8192 + i * 32), 16u, 1024u, 1u);
    const uint64_t db = smem_desc(sb_u + uint32_t(slot * kWsBBytes + i * 32), 16u, 1024u, 1u);
    wgmma_m64n128k32(d, da, db);
  };
  // kF16: 32-block i of the stage = 16-bit k-steps 2i and 2i+1 (32 bytes each along the 128-byte
  // swizzled row; f16, or BF16 with kBv), the second accumulating onto the first.
  auto issue_f16 = [&](int slot, int i, float(&d)[64]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t ko = uint32_t((2 * i + h) * 32);
      const uint64_t da = smem_desc(sa_u + uint32_t(slot * kWsABytes + cw * 8192) + ko, 16u, 1024u, 1u);
      const uint64_t db = smem_desc(sb_u + uint32_t(slot * kWsBBytes) + ko, 16u, 1024u, 1u);
      if constexpr (kBv) wgmma_m64n128k16_bf16(d, da, db, h);
      else wgmma_m64n128k16_f16(d, da, db, h);
    }
  };
  // acc += P · (sx · sw) for 32-block i of the stage in `slot`; sx0 / sx1: this thread's rows.
  auto promote = [&](const float(&p)[64], int slot, int i, float sx0, float sx1) {
    if (a.skip_promote & 1) return;  // timing diagnostic only (wrong results)
    if constexpr (kConv) {
      // One W scale per column: this thread's columns 8·nt + 2·(lane%4) + {0, 1}. The scale
      // product sx·sw is formed as in the FP8 branch, so equal scales give equal bits.
      const float2* sw2 = reinterpret_cast<const float2*>(ssw + slot * kSwSlot + i * kWsBN) + (lane & 3);
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
        const float2 w = sw2[nt * 4];
        acc[nt * 4 + 0] = fmaf(p[nt * 4 + 0], sx0 * w.x, acc[nt * 4 + 0]);
        acc[nt * 4 + 1] = fmaf(p[nt * 4 + 1], sx0 * w.y, acc[nt * 4 + 1]);
        acc[nt * 4 + 2] = fmaf(p[nt * 4 + 2], sx1 * w.x, acc[nt * 4 + 2]);
        acc[nt * 4 + 3] = fmaf(p[nt * 4 + 3], sx1 * w.y, acc[nt * 4 + 3]);
      }
      return;
    }
    const float4 sw = *reinterpret_cast<const float4*>(ssw + slot * 16 + i * 4);
    const float swg[4] = {sw.x, sw.y, sw.z, sw.w};
#pragma unroll
    for (int grp = 0; grp < 4; ++grp) {
      const float s0 = sx0 * swg[grp], s1 = sx1 * swg[grp];
#pragma unroll
      for (int nt = grp * 4; nt < grp * 4 + 4; ++nt) {
        acc[nt * 4 + 0] = fmaf(p[nt * 4 + 0], s0, acc[nt * 4 + 0]);
        acc[nt * 4 + 1] = fmaf(p[nt * 4 + 1], s0, acc[nt * 4 + 1]);
        acc[nt * 4 + 2] = fmaf(p[nt * 4 + 2], s1, acc[nt * 4 + 2]);
        acc[nt * 4 + 3] = fmaf(p[nt * 4 + 3], s1, acc[nt * 4 + 3]);
      }
    }
  };
  auto load_sx = [&](int slot, float4& x0, float4& x1) {
    const float4* p = reinterpret_cast<const float4*>(ssx + slot * kWsBM * 4);
    x0 = p[lr0];
    x1 = p[lr0 + 8];
  };

  int it = 0;  // stages consumed so far (all tiles), in the producer's order
#pragma unroll 1
  for (int tile = blockIdx.x; tile < tiles; tile += tile_step) {
    int m0, n0, g, m_end;
    tile_origin(tile, m0, n0, g, m_end);
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    // Grouped: a warpgroup whose 64 rows all lie past the group's end (the tail m-tile of a
    // group, e.g. 129-192 rows) keeps in step with the ring (waits, releases) but issues no
    // tensor-core work, leaving the tensor cores to the other warpgroup; it stores nothing.
    const bool idle = kGrouped && m0 + cw * 64 >= m_end;
    [[maybe_unused]] int in_flight = -1;  // kDirect: the slot whose wgmmas may still be running
#pragma unroll 1
    for (int s = 0; s < nst; ++s, ++it) {
      const int slot = it % S;
      mbar_wait(full_bar(slot), uint32_t((it / S) & 1));
      if constexpr (kCc && !kSw) {
        // Every consumer thread (an idle warpgroup's too: the W slot is the whole tile's) expands
        // its unit, then all 256 meet (named barrier 2) before either warpgroup's wgmma reads it.
        mbar_wait(raw_bar(slot), uint32_t((it / S) & 1));
        const int u = tid - 128;
        if (!(a.skip_promote & 2))  // timing diagnostic only (wrong results): no expansion
          fp4_bf16_unit(sraw + slot * kRawSlot, sb + slot * kWsBBytes, ssw + slot * kSwSlot, u & (kWsBN - 1), u / kWsBN);
        fence_proxy_async();  // the generic-proxy stores, visible to the wgmma (async proxy)
        asm volatile("bar.sync 2, 256;\n" ::: "memory");
      }
      if (idle) {
        release(slot);
        continue;
      }
      if constexpr (kDirect) {
        fence_regs(acc);
        wgmma_fence();
#pragma unroll
        for (int h = 0; h < kStageK / 16; ++h) {  // 16-deep steps: 32 bytes each along the swizzled rows
          const uint32_t ko = uint32_t(h * 32);
          const uint64_t da = smem_desc(sa_u + uint32_t(slot * kWsABytes + cw * 8192) + ko, 16u, 1024u, 1u);
          const uint64_t db = smem_desc(sb_u + uint32_t(slot * kWsBBytes) + ko, 16u, 1024u, 1u);
          wgmma_m64n128k16_bf16(acc, da, db, 1);
        }
        wgmma_commit();
        wgmma_wait<1>();  // the previous stage's group has retired: its slot can be refilled
        fence_regs(acc);
        if (in_flight >= 0) release(in_flight);
        in_flight = slot;
        continue;
      }
      float4 x0{}, x1{};
      if constexpr (!kBv) load_sx(slot, x0, x1);
      if constexpr (kF16) {
        // Two 32-blocks per stage: both issued, the first promoted while the second runs. kBv:
        // the scales are folded into the operands, so a block's sum is added as it is.
        fence_regs(t0);
        fence_regs(t1);
        wgmma_fence();
        issue_f16(slot, 0, t0);
        wgmma_commit();
        issue_f16(slot, 1, t1);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(t0);
        [[maybe_unused]] const bool odd = (s & 1) != 0;  // the box starts at the 4-aligned column (s/2)·4
        if constexpr (kBv) {
#pragma unroll
          for (int i = 0; i < 64; ++i) acc[i] += t0[i];
        } else {
          promote(t0, slot, 0, odd ? x0.z : x0.x, odd ? x1.z : x1.x);
        }
        wgmma_wait<0>();
        fence_regs(t1);
        if constexpr (kBv) {
#pragma unroll
          for (int i = 0; i < 64; ++i) acc[i] += t1[i];
        } else {
          promote(t1, slot, 1, odd ? x0.w : x0.y, odd ? x1.w : x1.y);
        }
      } else if constexpr (kPipe2) {
        // Blocks 0 and 1 issued; then each wait<1> retires the older block, which is promoted
        // while the next one runs; the stage's last block is promoted after wait<0> (keeping
        // the in-flight set inside one iteration lets ptxas pipeline the wgmmas: no C7514).
        fence_regs(t0);
        fence_regs(t1);
        wgmma_fence();
        issue(slot, 0, t0);
        wgmma_commit();
        issue(slot, 1, t1);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(t0);
        promote(t0, slot, 0, x0.x, x1.x);
        fence_regs(t0);
        wgmma_fence();
        issue(slot, 2, t0);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(t1);
        promote(t1, slot, 1, x0.y, x1.y);
        fence_regs(t1);
        wgmma_fence();
        issue(slot, 3, t1);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(t0);
        promote(t0, slot, 2, x0.z, x1.z);
        wgmma_wait<0>();
        fence_regs(t1);
        promote(t1, slot, 3, x0.w, x1.w);
      } else {
        fence_regs(t0);
        fence_regs(t1);
        wgmma_fence();
        issue(slot, 0, t0);
        issue(slot, 1, t1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(t0);
        fence_regs(t1);
        promote(t0, slot, 0, x0.x, x1.x);
        promote(t1, slot, 1, x0.y, x1.y);
        fence_regs(t0);
        fence_regs(t1);
        wgmma_fence();
        issue(slot, 2, t0);
        issue(slot, 3, t1);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(t0);
        fence_regs(t1);
        promote(t0, slot, 2, x0.z, x1.z);
        promote(t1, slot, 3, x0.w, x1.w);
      }
      release(slot);
    }
    if constexpr (kDirect) {
      wgmma_wait<0>();
      fence_regs(acc);
      if (in_flight >= 0) release(in_flight);
    }

    // Epilogue: thread holds rows lr0, lr0+8 and columns nt*8 + 2q, +1 for nt = 0..15.
    const int r0 = m0 + lr0, r1 = r0 + 8, q = lane & 3;
    const int64_t ldy = a.ldy > 0 ? a.ldy : a.n;
    const bool pair_ok = (a.n & 1) == 0 && (ldy & 1) == 0;
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      const int c = n0 + nt * 8 + 2 * q;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = h ? r1 : r0;
        if (r >= m_end || c >= a.n) continue;
        float v0 = acc[nt * 4 + 2 * h], v1 = acc[nt * 4 + 2 * h + 1];
        if (a.bf16_round_out) v0 = bf16_round_dev(v0), v1 = bf16_round_dev(v1);  // FP32 out, BF16 values
        const int64_t o = int64_t(r) * ldy + c;
        if (a.bf16_out) {
          auto* y = reinterpret_cast<__nv_bfloat16*>(a.y);
          if (pair_ok) {
            *reinterpret_cast<__nv_bfloat162*>(y + o) = __floats2bfloat162_rn(v0, v1);
          } else {
            y[o] = __float2bfloat16_rn(v0);
            if (c + 1 < a.n) y[o + 1] = __float2bfloat16_rn(v1);
          }
        } else {
          auto* y = reinterpret_cast<float*>(a.y);
          if (pair_ok) {
            *reinterpret_cast<float2*>(y + o) = make_float2(v0, v1);
          } else {
            y[o] = v0;
            if (c + 1 < a.n) y[o + 1] = v1;
          }
        }
      }
    }
  }
#endif  // FS_GEMM_FP8_SM90
}

}  // namespace

int gemm_fp8_smem_bytes(int variant) {
  switch (variant) {
    case 2:
      return Tile<3>::kSmemBytes;
    case 4:
      return Tile<3, kSw128>::kSmemBytes;
    case 5:
      return Tile<2, kPadded>::kSmemBytes;
    case 6:
    case 7:
    case 8:
    case 9:
      return kWsSmemBytes;
    default:
      return Tile<2>::kSmemBytes;
  }
}

namespace {
template <int kWG, int kBatch, int kLayout>
cudaError_t launch_variant(const GemmFp8Args& a, cudaStream_t stream) {
  using T = Tile<kWG, kLayout>;
  static std::atomic<uint64_t> attr_set{0};  // per device (smem_limit.cuh)
  if (const cudaError_t e = ensure_smem_limit(reinterpret_cast<const void*>(gemm_fp8_kernel<kWG, kBatch, kLayout>),
                                              T::kSmemBytes, attr_set);
      e != cudaSuccess)
    return e;
  const int tiles = ((a.m + T::kBM - 1) / T::kBM) * ((a.n + kBN - 1) / kBN);
  gemm_fp8_kernel<kWG, kBatch, kLayout><<<tiles, T::kThreads, T::kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

// cuTensorMapEncodeTiled through the runtime (no link against libcuda).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled_fn() {
  static EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// 2-D tensor map over a row-major [rows, cols] matrix (cols contiguous), box [box_rows, box_cols].
// row_bytes: the distance between rows (0: cols · elem_bytes; a multiple of 16).
bool make_map(CUtensorMap* map, const void* base, CUtensorMapDataType dt, int elem_bytes,
              uint64_t rows, uint64_t cols, uint32_t box_rows, uint32_t box_cols, bool swizzle,
              uint64_t row_bytes = 0) {
  EncodeTiledFn fn = encode_tiled_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes ? row_bytes : cols * uint64_t(elem_bytes)};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t estr[2] = {1, 1};
  return fn(map, dt, 2, const_cast<void*>(base), dims, strides, box, estr,
            CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0)
      v = 132;
    return v;
  }();
  return n;
}

template <bool kPipe2, bool kPersist, bool kGrouped = false, bool kFp4 = false, bool kF16 = false, bool kBv = false,
          bool kWb = false, bool kDirect = false, bool kSw = false>
cudaError_t launch_ws(const GemmFp8Args& a, cudaStream_t stream) {
  WsParams P;
  P.a = a;
  // Grouped: one W map over the stacked [groups · n, k] codes (group g from row g · n). FP4: the
  // [groups · n, k/2] e2m1 bytes, box 128 rows × one k stage (64 bytes; kF16: 32), unswizzled.
  // X: [m, k] bytes (kF16: [m, 2k] bytes of f16 or, kBv, BF16 values), box 128 rows × 128
  // bytes, swizzled. kBv reads no X scales (no map).
  // FP8 with kF16: the [groups · n, k] e4m3 bytes, box 128 rows × 64 bytes, unswizzled (raw).
  constexpr int kStageK = kF16 ? kWsHBK : kBK;
  const uint64_t w_rows = uint64_t(a.n) * uint64_t(kGrouped ? a.groups : 1);
  // kWb: the [n, k] BF16 matrix as [n, 2k] bytes, box 128 rows × 128 bytes, swizzled (as X).
  const bool w_map = kWb ? make_map(&P.tb, a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, w_rows, uint64_t(a.k) * 2, kWsBN,
                                    128, true)
                     : kFp4  ? make_map(&P.tb, a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, w_rows,
                                      uint64_t(a.k / 2), kWsBN, kStageK / 2, false)
                     : kF16 ? make_map(&P.tb, a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, w_rows,
                                       uint64_t(a.k), kWsBN, kStageK, false)
                            : make_map(&P.tb, a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, w_rows,
                                       uint64_t(a.k), kWsBN, 128, true);
  const uint64_t ldx = uint64_t(a.ldx > 0 ? a.ldx : a.k);
  if (!make_map(&P.ta, a.xq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, uint64_t(a.m), uint64_t(a.k) * (kF16 ? 2 : 1),
                kWsBM, 128, true, ldx * (kF16 ? 2 : 1)) ||
      !w_map ||
      (!kBv && !make_map(&P.tsx, a.xs, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, uint64_t(a.m),
                         uint64_t(a.k / 32), kWsBM, 4, false, ldx / 32 * 4)))
    return cudaErrorInvalidValue;
  constexpr int smem = kF16 ? (kFp4 ? kWsHSmemBytes : kWsH8SmemBytes)
                       : kFp4 ? kWs4SmemBytes : kGrouped ? kWsGroupedSmemBytes : kWsSmemBytes;
  static std::atomic<uint64_t> attr_set{0};  // per device (smem_limit.cuh)
  if (const cudaError_t e = ensure_smem_limit(
          reinterpret_cast<const void*>(gemm_fp8_ws_kernel<kPipe2, kPersist, kGrouped, kFp4, kF16, kBv, kWb, kDirect, kSw>),
          smem, attr_set);
      e != cudaSuccess)
    return e;
  // Grouped: the tile count lives on the device (from row_start); a block per SM, at most one
  // per 128 rows · n-tile.
  const int64_t tiles = kGrouped ? (int64_t(a.m) / kWsBM + a.groups) * ((a.n + kWsBN - 1) / kWsBN)
                                 : int64_t((a.m + kWsBM - 1) / kWsBM) * ((a.n + kWsBN - 1) / kWsBN);
  const int grid = kPersist ? int(tiles < sm_count() ? tiles : sm_count()) : int(tiles);
  gemm_fp8_ws_kernel<kPipe2, kPersist, kGrouped, kFp4, kF16, kBv, kWb, kDirect, kSw><<<grid, kWsThreads, smem, stream>>>(P);
  return cudaGetLastError();
}
}  // namespace

cudaError_t launch_gemm_fp8(const GemmFp8Args& a, cudaStream_t stream) {
  if (a.groups != 0) {
    if (a.variant != 6 || a.groups < 0 || a.groups > kGemmFp8MaxGroups || !a.row_start)
      return cudaErrorInvalidValue;
    if (a.bf16_direct && !a.x_bf16) return cudaErrorInvalidValue;
    if (a.w_bf16 && a.bf16_direct) return launch_ws<true, true, true, false, true, true, true, true>(a, stream);
    if (a.w_bf16) return a.x_bf16 ? launch_ws<true, true, true, false, true, true, true>(a, stream) : cudaErrorInvalidValue;
    if (a.w_fp4 && a.bf16_direct && a.w_in_registers)
      return launch_ws<true, true, true, true, true, true, false, true, true>(a, stream);
    if (a.w_fp4 && a.bf16_direct) return launch_ws<true, true, true, true, true, true, false, true>(a, stream);
    if (a.w_fp4 && a.x_bf16) return launch_ws<true, true, true, true, true, true>(a, stream);
    if (a.bf16_direct) return launch_ws<true, true, true, false, true, true, false, true>(a, stream);
    if (a.x_bf16) return launch_ws<true, true, true, false, true, true>(a, stream);
    if (a.w_fp4 && a.x_f16) return launch_ws<true, true, true, true, true>(a, stream);
    if (a.w_fp4) return launch_ws<true, true, true, true>(a, stream);
    if (a.x_f16) return launch_ws<true, true, true, false, true>(a, stream);
    return launch_ws<true, true, true>(a, stream);
  }
  if (a.w_fp4) return cudaErrorInvalidValue;  // FP4 weights: grouped only
  if (a.bf16_direct && !a.x_bf16) return cudaErrorInvalidValue;
  if (a.w_bf16 && a.bf16_direct) return launch_ws<true, true, false, false, true, true, true, true>(a, stream);
  if (a.w_bf16) return a.x_bf16 ? launch_ws<true, true, false, false, true, true, true>(a, stream) : cudaErrorInvalidValue;
  if (a.bf16_direct) return launch_ws<true, true, false, false, true, true, false, true>(a, stream);
  if (a.x_bf16) return launch_ws<true, true, false, false, true, true>(a, stream);
  if (a.x_f16) return launch_ws<true, true, false, false, true>(a, stream);  // kernel 6's schedule
  switch (a.variant) {
    case 1:
      return launch_variant<2, 2, kInterleave>(a, stream);
    case 2:
      return launch_variant<3, 1, kInterleave>(a, stream);
    case 3:
      return launch_variant<2, 2, kSw128>(a, stream);
    case 4:
      return launch_variant<3, 1, kSw128>(a, stream);
    case 5:
      return launch_variant<2, 2, kPadded>(a, stream);
    case 6:
      return launch_ws<true, true>(a, stream);
    case 7:
      return launch_ws<false, true>(a, stream);
    case 8:
      return launch_ws<true, false>(a, stream);
    case 9:
      return launch_ws<false, false>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launch_quantize_f16(const float* x, int64_t m, int64_t k, uint16_t* xq, float* xs,
                                cudaStream_t stream) {
  const int64_t total8 = m * k / 8;
  const int64_t want = (total8 + 255) / 256;
  const int blocks = int(want < 132 * 16 ? want : 132 * 16);
  if (blocks > 0) quantize_f16_kernel<<<blocks, 256, 0, stream>>>(x, total8, xq, xs);
  return cudaGetLastError();
}

cudaError_t launch_quantize_fp8(const void* x, bool bf16, int64_t m, int64_t k, int act_block,
                                uint8_t* xq, float* xs, cudaStream_t stream, bool f16_codes,
                                bool round_bf16, bool bf16_values) {
  const int64_t total8 = m * k / 8;
  const int64_t want = (total8 + 255) / 256;
  const int blocks = int(want < 132 * 16 ? want : 132 * 16);
  quantize_fp8_kernel<<<blocks, 256, 0, stream>>>(x, bf16, total8, act_block, xq, xs, f16_codes, round_bf16,
                                                  bf16_values);
  return cudaGetLastError();
}

__global__ void __launch_bounds__(256) pack_bf16_kernel(const float* x, int64_t total4, uint2* y) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total4; t += stride) {
    const float4 v = reinterpret_cast<const float4*>(x)[t];  // plain: x step-written
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    y[t] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

cudaError_t launch_pack_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  const int64_t total4 = n / 4;
  const int64_t want = (total4 + 255) / 256;
  const int blocks = int(want < 132 * 16 ? want : 132 * 16);
  if (blocks > 0) pack_bf16_kernel<<<blocks, 256, 0, stream>>>(x, total4, reinterpret_cast<uint2*>(y));
  return cudaGetLastError();
}

// y = x · Wᵀ over BF16 values by mma.sync m16n8k16 (FP32 accumulation), one warp per 16 x 8 output
// tile, the k16 steps in ascending order from a zero accumulator, fragments loaded from global
// memory: the step sequence of the attention kernels' S = Q·Kᵀ (dev_mma_bf16_16816), as a plain
// GEMM, to set against the wgmma GEMM's bf16_direct steps (bench --kernels mma-order). Fragment
// layout (row.col): lane (g = lane / 4, c = lane % 4) holds x rows g, g + 8 at k pairs 2c, 2c + 8
// and W row (output column) g at k pairs 2c, 2c + 8; the accumulator is rows g, g + 8 x columns
// 2c, 2c + 1.
__global__ void __launch_bounds__(128) mma_steps_kernel(const uint32_t* x, const uint32_t* w, float* y, int m, int n,
                                                         int k) {
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x & 31), g = lane >> 2, c = lane & 3;
  const int64_t tiles_n = n / 8, tm = warp / tiles_n, tn = warp % tiles_n;
  if (tm >= m / 16) return;  // whole warps
  const int64_t r0 = tm * 16 + g, r1 = r0 + 8, col = tn * 8 + g, k2 = k / 2;  // k2: BF16 pairs per row
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int kk = 0; kk < k / 2; kk += 8) {  // 16 k values = 8 pairs per step
    const uint32_t a[4] = {x[r0 * k2 + kk + c], x[r1 * k2 + kk + c], x[r0 * k2 + kk + c + 4], x[r1 * k2 + kk + c + 4]};
    const uint32_t b[2] = {w[col * k2 + kk + c], w[col * k2 + kk + c + 4]};
    dev_mma_bf16_16816(acc, a, b);
  }
  y[r0 * n + tn * 8 + 2 * c] = acc[0], y[r0 * n + tn * 8 + 2 * c + 1] = acc[1];
  y[r1 * n + tn * 8 + 2 * c] = acc[2], y[r1 * n + tn * 8 + 2 * c + 1] = acc[3];
}

cudaError_t launch_mma_steps(const uint16_t* x, const uint16_t* w, float* y, int m, int n, int k, cudaStream_t stream) {
  const int64_t warps = int64_t(m / 16) * (n / 8);
  const int64_t blocks = (warps * 32 + 127) / 128;
  if (blocks > 0)
    mma_steps_kernel<<<unsigned(blocks), 128, 0, stream>>>(reinterpret_cast<const uint32_t*>(x),
                                                           reinterpret_cast<const uint32_t*>(w), y, m, n, k);
  return cudaGetLastError();
}

cudaError_t launch_expand_bf16(const GemmExpandArgs& a, cudaStream_t stream) {
  const int64_t total8 = a.count * a.n * a.k / 8;
  const int64_t want = (total8 + 255) / 256;
  const int blocks = int(want < 132 * 16 ? want : 132 * 16);
  if (blocks > 0) expand_bf16_kernel<<<blocks, 256, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace flashseek::ops::cuda::detail
