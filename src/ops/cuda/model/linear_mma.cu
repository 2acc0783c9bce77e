// The linear of BF16 inputs on the BF16 tensor cores (LinearArgs::x_bf16, kernel 5): y = x · Wᵀ
// where every x value is a BF16 value (reference numerics round the inputs of wo_a and the LM
// head to BF16) and W is stored as BF16 or as FP8 e4m3 codes with E8M0 block scales (each code
// times its scale is a BF16 value). So every product x·w is exact in FP32, as in the exactness
// kernels; what differs is the order of the FP32 sum: per output, 16-wide m16n8k16 MMA steps with
// FP32 accumulation, in ascending k, the k values of a step permuted the same way for W and x.
// That order depends on `in` only: never on the rows (tokens) of the launch, the outputs, the
// groups or the tiling, so decode rows, verify blocks, prefill chunks and tensor-parallel slices
// of the same output give the same bits (batch invariance; prefill == decode). Against the CPU's
// exact order the difference is a reordering of an FP32 sum (tests bound it by K·2^-23·Σ|x·w|).
//
// Work: a CTA owns 16 outputs (one group's; 32 or 64 where that still fills the SMs, for slices
// of 32 tokens and for decode steps of 4 to 8 rows) and 8·kNt tokens; its kWarps warps split
// `in` into kWarps equal ranges (always, so the split depends on `in` only) and their partial
// sums are added in warp order at the end. Each warp's x sub-chunk of kChunk k values for the CTA's tokens
// is converted to BF16 in shared memory (rows padded so that the eight token rows of a fragment
// load fall in different banks). Each thread streams 16 bytes of each of its two weight rows per
// step (BF16: 8 values, 2 MMAs; FP8: 16 codes, 4 MMAs) with kAhead steps of loads in flight across
// the sub-chunks. Token slices of 8·kNt are in grid y.
// A warp's load takes 64 bytes of each of 16 rows; the loads ask the L2 for the whole 256-byte
// span of each (load_weights), so that DRAM serves the rows in long runs instead of 64-byte pieces.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/runtime/smem_limit.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kChunk = 256;            // k values of x staged per warp and round
constexpr int kPad = 8;                // BF16 values of padding per staged token row
constexpr int kRowStride = kChunk + kPad;
constexpr int kAhead = 4;              // weight steps in flight per thread
constexpr int kStageLoads = 8;         // x loads in flight per thread while staging

// 16 weight bytes, read-only, not kept in L1, with a 256-byte L2 prefetch (see above).
__device__ __forceinline__ uint4 load_weights(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Four values of a 16-byte weight load as two BF16 pairs (values 4j..4j+3 of the load): BF16
// weights are already pairs; FP8 codes are expanded exactly (code value times the block scale).
template <bool kFp8>
__device__ __forceinline__ void weight_pairs(const uint4& raw, int j, float scale, uint32_t& lo, uint32_t& hi) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(&raw);
  if constexpr (!kFp8) {
    lo = w[2 * j], hi = w[2 * j + 1];
  } else {
    // Four e4m3 codes (lowest byte first) → f16 pairs by the hardware conversion (exact: e4m3 is a
    // subset of f16), → FP32, times the power-of-two scale (exact: dev_e4m3_value's products), →
    // BF16 (exact wherever the value is within BF16's range, as every model weight is).
    const uint32_t c = w[j];
    const __half2_raw h01 = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(c & 0xffffu), __NV_E4M3);
    const __half2_raw h23 = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(c >> 16), __NV_E4M3);
    const float2 f01 = __half22float2(__half2(h01)), f23 = __half22float2(__half2(h23));
    lo = dev_pack_bf16x2(__fmul_rn(f01.x, scale), __fmul_rn(f01.y, scale));
    hi = dev_pack_bf16x2(__fmul_rn(f23.x, scale), __fmul_rn(f23.y, scale));
  }
}

// Grid: x = group · tiles + tile of 16·kMt outputs of the group, y = token slice. kMt > 1 (token
// slices of 32): the CTA's output tiles share each staged x sub-chunk and each B fragment, so x is
// staged once per 16·kMt outputs; every output's sum is the same sequence of MMA steps.
template <bool kFp8, int kNt, int kMt>
__global__ void __launch_bounds__(kThreads) linear_mma_kernel(LinearArgs a, int64_t tiles) {
  pdl_prologue();
  constexpr int kE = kFp8 ? 16 : 8;   // values per 16-byte load
  constexpr int kStep = 4 * kE;       // k values per step (four threads of a row)
  constexpr int kMmas = kE / 4;       // MMAs per step and token tile
  constexpr int kToks = 8 * kNt;
  constexpr int kWb = kFp8 ? 1 : 2;   // bytes per weight value
  // Steps in flight (registers: 2·kMt loads per step; one token tile leaves room for more of them).
  constexpr int kAh = kNt == 1 ? (kMt > 2 ? 2 : kAhead) : kMt > 2 ? 1 : kMt > 1 ? 2 : kAhead;
  extern __shared__ __align__(16) __nv_bfloat16 xs[];  // [kWarps][kToks][kRowStride]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int64_t group = blockIdx.x / tiles, out0 = (blockIdx.x % tiles) * 16 * kMt;
  const int64_t tok0 = int64_t(blockIdx.y) * kToks;
  const int n_tok = int(a.rows - tok0 < kToks ? a.rows - tok0 : kToks);
  const float* x = a.x + group * a.x_group;
  const int64_t span = a.in / kWarps, k_begin = warp * span;  // this warp's k range
  const int nsteps = int(span / kStep), chunk_steps = kChunk / kStep;
  // This thread's two weight rows of each tile (clamped inside the matrix; rows past `out` are
  // not stored).
  const int64_t last = a.out - 1;
  const uint8_t* wa[kMt];
  const uint8_t* wb[kMt];
  const uint8_t* sa[kMt];
  const uint8_t* sb[kMt];
  const int64_t sc_cols = kFp8 ? (a.in + a.wt.block_cols - 1) / a.wt.block_cols : 0;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt) {
    const int64_t o = out0 + mt * 16 + g;
    const int64_t oa = o < last ? o : last, ob = o + 8 < last ? o + 8 : last;
    const int64_t ra = a.wt.row0 + group * a.out + oa, rb = a.wt.row0 + group * a.out + ob;
    wa[mt] = static_cast<const uint8_t*>(a.wt.data) + ra * a.in * kWb + (k_begin + q * kE) * kWb;
    wb[mt] = static_cast<const uint8_t*>(a.wt.data) + rb * a.in * kWb + (k_begin + q * kE) * kWb;
    sa[mt] = kFp8 ? a.wt.scale + (ra / a.wt.block_rows) * sc_cols : nullptr;
    sb[mt] = kFp8 ? a.wt.scale + (rb / a.wt.block_rows) * sc_cols : nullptr;
  }
  __nv_bfloat16* xw = xs + warp * kToks * kRowStride;  // this warp's sub-chunk
  float acc[kMt][kNt][4];
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
  uint4 la[kMt][kAh], lb[kMt][kAh];
#pragma unroll
  for (int i = 0; i < kAh; ++i)
    if (i < nsteps)
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        la[mt][i] = load_weights(wa[mt] + int64_t(i) * kStep * kWb);
        lb[mt][i] = load_weights(wb[mt] + int64_t(i) * kStep * kWb);
      }
  for (int s0 = 0; s0 < nsteps; s0 += kAh) {
#pragma unroll
    for (int i = 0; i < kAh; ++i) {
      const int s = s0 + i;
      if (s >= nsteps) break;  // uniform over the CTA (every warp has nsteps steps)
      if (s % chunk_steps == 0) {  // stage every warp's next x sub-chunk (BF16 values: exact)
        __syncthreads();  // the previous sub-chunks' fragment loads are done
        // Only the launch's token rows: a fragment column of a missing token reads whatever the
        // shared memory holds, and only that token's outputs (never stored) see it.
        // kStageLoads loads in flight per thread before any is converted (one at a time, each
        // waited for, the staging of 32 tokens is latency-bound).
        const int64_t kc = int64_t(s) * kStep;
        const int total = kWarps * n_tok * (kChunk / 4);
        for (int e0 = threadIdx.x; e0 < total; e0 += kThreads * kStageLoads) {
          float4 v[kStageLoads];
#pragma unroll
          for (int u = 0; u < kStageLoads; ++u) {
            const int e = e0 + u * kThreads;
            const int c = (e % (kChunk / 4)) * 4;
            v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (e < total && kc + c < span) {
              const int w = e / (n_tok * (kChunk / 4)), t = (e % (n_tok * (kChunk / 4))) / (kChunk / 4);
              v[u] = *reinterpret_cast<const float4*>(x + (tok0 + t) * a.x_stride + w * span + kc + c);
            }
          }
#pragma unroll
          for (int u = 0; u < kStageLoads; ++u) {
            const int e = e0 + u * kThreads;
            if (e >= total) break;
            const int w = e / (n_tok * (kChunk / 4)), rem = e % (n_tok * (kChunk / 4));
            const int t = rem / (kChunk / 4), c = (rem % (kChunk / 4)) * 4;
            uint2 p;
            p.x = dev_pack_bf16x2(v[u].x, v[u].y), p.y = dev_pack_bf16x2(v[u].z, v[u].w);
            *reinterpret_cast<uint2*>(xs + (w * kToks + t) * kRowStride + c) = p;
          }
        }
        __syncthreads();
      }
      uint4 ca[kMt], cb[kMt];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        ca[mt] = la[mt][i], cb[mt] = lb[mt][i];
        if (s + kAh < nsteps) {  // refill this slot kAh steps ahead
          la[mt][i] = load_weights(wa[mt] + int64_t(s + kAh) * kStep * kWb);
          lb[mt][i] = load_weights(wb[mt] + int64_t(s + kAh) * kStep * kWb);
        }
      }
      const int64_t k = k_begin + int64_t(s) * kStep + q * kE;  // this thread's first k of the step
      float sca[kMt], scb[kMt];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        sca[mt] = 1.0f, scb[mt] = 1.0f;
        if constexpr (kFp8) {
          sca[mt] = dev_e8m0_value(sa[mt][k / a.wt.block_cols]);
          scb[mt] = dev_e8m0_value(sb[mt][k / a.wt.block_cols]);
        }
      }
      const int xc = (s % chunk_steps) * kStep + q * kE;
#pragma unroll
      for (int j = 0; j < kMmas; ++j) {
        // B (16 k x 8 tokens) of each token tile, shared by the output tiles.
        uint32_t bf[kNt][2];
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          const uint2 b = *reinterpret_cast<const uint2*>(xw + (nt * 8 + g) * kRowStride + xc + 4 * j);
          bf[nt][0] = b.x, bf[nt][1] = b.y;
        }
#pragma unroll
        for (int mt = 0; mt < kMt; ++mt) {
          // A (16 outputs x 16 k): logical columns 2q, 2q+1, 2q+8, 2q+9 of this thread are the
          // values 4j..4j+3 of its load; B takes the same k from x.
          uint32_t af[4];  // rows g (0, 2) and g + 8 (1, 3)
          weight_pairs<kFp8>(ca[mt], j, sca[mt], af[0], af[2]);
          weight_pairs<kFp8>(cb[mt], j, scb[mt], af[1], af[3]);
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) dev_mma_bf16_16816(acc[mt][nt], af, bf[nt]);
        }
      }
    }
  }
  // The warps' partial sums, added in warp order (the staging area is free after the barrier).
  constexpr int kVals = kMt * kNt * 4;
  __syncthreads();
  float* red = reinterpret_cast<float*>(xs);  // [kWarps][32][kMt·kNt·4]
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[(warp * 32 + lane) * kVals + (mt * kNt + nt) * 4 + i] = acc[mt][nt][i];
  __syncthreads();
  if (warp != 0) return;
  float* y = a.y + group * a.y_group;
#pragma unroll
  for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int idx = (mt * kNt + nt) * 4 + i;
        float v = red[lane * kVals + idx];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) v = __fadd_rn(v, red[(w * 32 + lane) * kVals + idx]);
        // D fragment: (output g, tokens 2q, 2q+1) and (output g + 8, the same tokens).
        const int64_t o = out0 + mt * 16 + g + (i >= 2 ? 8 : 0), r = tok0 + nt * 8 + 2 * q + (i & 1);
        if (o >= a.out || r >= a.rows) continue;
        y[r * a.y_stride + o] = a.bf16_out ? dev_round_bf16(v) : v;
      }
}

template <bool kFp8, int kNt, int kMt>
cudaError_t launch_mma(const LinearArgs& a, cudaStream_t s) {
  const int64_t tiles = (a.out + 16 * kMt - 1) / (16 * kMt);
  const int64_t slices = (a.rows + 8 * kNt - 1) / (8 * kNt);
  if (tiles * a.groups > INT32_MAX || slices > 65535) return cudaErrorInvalidValue;
  const size_t smem = std::max(size_t(kWarps) * 8 * kNt * kRowStride * sizeof(__nv_bfloat16),
                               size_t(kWarps) * 32 * kMt * kNt * 4 * sizeof(float));
  auto* kernel = linear_mma_kernel<kFp8, kNt, kMt>;
  static std::atomic<uint64_t> smem_done{0};
  if (const cudaError_t e = ensure_smem_limit(reinterpret_cast<const void*>(kernel), int(smem), smem_done);
      e != cudaSuccess)
    return e;
  return launch_kernel(kernel, dim3(unsigned(tiles * a.groups), unsigned(slices)), kThreads, smem, s, a, tiles);
}

// The most of 4, 2, 1 output tiles per CTA that still gives a CTA per SM over `slices` token
// slices (fewer x stagings per output, as long as the SMs stay busy), or the forced count `forced`
// (1, 2, 4; 0: automatic). A choice by shape only: the bits are the same either way.
int tiles_per_cta(const LinearArgs& a, int forced, int64_t slices) {
  if (forced == 1 || forced == 2 || forced == 4) return forced;
  const int64_t sms = device_sm_count();
  for (const int mt : {4, 2})
    if ((a.out + 16 * mt - 1) / (16 * mt) * a.groups * slices >= sms) return mt;
  return 1;
}

// Token slices of 32 (more than 8 rows): LinearArgs::mma_tiles, else tiles_per_cta's rule.
int mma_tiles_per_cta(const LinearArgs& a) { return tiles_per_cta(a, a.mma_tiles, (a.rows + 31) / 32); }

// Decode (at most 8 rows, one token slice): every CTA stages all of x (FP32 in, BF16 in shared
// memory) for its 16·kMt outputs, so at 16 outputs a 6-token step reads more x than weight bytes
// from L2 (wo_a: 98 KB of x per 64 KB of FP8 rows); more tiles per CTA divide that traffic but
// leave fewer CTAs and fewer loads in flight. LinearArgs::mma_decode_tiles; else (automatic)
// tiles_per_cta's rule from kMmaDecodeTilesMinRows rows, and 1 below (at one row the single tile
// is the faster one).
constexpr int64_t kMmaDecodeTilesMinRows = 4;
int mma_decode_tiles_per_cta(const LinearArgs& a) {
  const bool forced = a.mma_decode_tiles == 1 || a.mma_decode_tiles == 2 || a.mma_decode_tiles == 4;
  if (!forced && a.rows < kMmaDecodeTilesMinRows) return 1;
  return tiles_per_cta(a, a.mma_decode_tiles, 1);
}

}  // namespace

bool linear_mma_applies(const LinearArgs& a) {
  if (a.w || a.sel || a.x_row_div != 1 || !a.wt.data) return false;  // typed weights, plain rows
  if (a.wt.dtype != WeightDtype::kBf16 && a.wt.dtype != WeightDtype::kFp8) return false;
  const bool fp8 = a.wt.dtype == WeightDtype::kFp8;
  // Each warp's quarter of `in` whole steps (64 FP8 / 32 BF16 values).
  if (a.in <= 0 || a.in % (kWarps * (fp8 ? 64 : 32)) != 0 || a.out <= 0 || a.rows <= 0) return false;
  if (reinterpret_cast<uintptr_t>(a.wt.data) % 16 != 0 || reinterpret_cast<uintptr_t>(a.x) % 16 != 0) return false;
  if (a.x_stride % 4 != 0 || (a.groups > 1 && a.x_group % 4 != 0)) return false;
  // FP8: a thread's 16 codes of a row share one scale (scale blocks of >= 16 columns, aligned).
  if (fp8 && (!a.wt.scale || a.wt.block_rows <= 0 || a.wt.block_cols < 16 || a.wt.block_cols % 16 != 0)) return false;
  return true;
}

cudaError_t launch_linear_mma(const LinearArgs& a0, cudaStream_t s) {
  LinearArgs a = a0;
  if (a.x_stride == 0) a.x_stride = a.in;
  if (a.y_stride == 0) a.y_stride = a.out;
  const auto tiles_ok = [](int t) { return t == 0 || t == 1 || t == 2 || t == 4; };
  if (!linear_mma_applies(a) || !tiles_ok(a.mma_tiles) || !tiles_ok(a.mma_decode_tiles)) return cudaErrorInvalidValue;
  const bool fp8 = a.wt.dtype == WeightDtype::kFp8;
  if (a.rows <= 8) {
    switch (mma_decode_tiles_per_cta(a)) {
      case 4: return fp8 ? launch_mma<true, 1, 4>(a, s) : launch_mma<false, 1, 4>(a, s);
      case 2: return fp8 ? launch_mma<true, 1, 2>(a, s) : launch_mma<false, 1, 2>(a, s);
      default: return fp8 ? launch_mma<true, 1, 1>(a, s) : launch_mma<false, 1, 1>(a, s);
    }
  }
  switch (mma_tiles_per_cta(a)) {
    case 4: return fp8 ? launch_mma<true, 4, 4>(a, s) : launch_mma<false, 4, 4>(a, s);
    case 2: return fp8 ? launch_mma<true, 4, 2>(a, s) : launch_mma<false, 4, 2>(a, s);
    default: return fp8 ? launch_mma<true, 4, 1>(a, s) : launch_mma<false, 4, 1>(a, s);
  }
}

}  // namespace flashseek::ops::cuda::detail
