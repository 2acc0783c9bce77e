// The device side of compact cache row packing (cache_rows.h): one warp packs one unit of a row
// (a group of scale blocks, the BF16 tail and padding, or 32 FP32 values). Shared by the pack
// kernels (cache_pack.cu) and the kernels that write a finished row straight into its ring
// (model/norm_rope.cu). The host twin and the argument why the scale search always finds a
// quantised block's scale: ops/cpu/cache_row.cpp. Only included from .cu files.
#pragma once
#include "ops/cache_row_format.h"
#include "ops/cuda/cache/cache_row.cuh"

namespace flashseek::ops::cuda::detail::row_pack {

// core/numeric.h f32_to_e4m3 (RNE, saturating, sign kept).
__device__ __forceinline__ uint32_t dev_e4m3_code(float x) {
  if (isnan(x)) return 0x7fu;
  const float r = fabsf(dev_round_e4m3(x));
  uint32_t code;
  if (r < 0.015625f) {
    code = uint32_t(rintf(r * 512.0f));
  } else {
    const uint32_t u = __float_as_uint(r);
    code = (((u >> 23) - 127u + 7u) << 3) | ((u >> 20) & 7u);
  }
  return signbit(x) ? (code | 0x80u) : code;
}

__device__ __forceinline__ float pow2_at_least(float v) {
  int e;
  const float m = frexpf(v, &e);
  int k = m == 0.5f ? e - 1 : e;
  k = k < -127 ? -127 : k > 127 ? 127 : k;
  return ldexpf(1.0f, k);
}

__device__ __forceinline__ uint32_t encode(RowCodec c, float q) {
  return c == RowCodec::kFp8E8m0 ? dev_e4m3_code(q) : dev_e2m1_code(q);
}
// x / s as the host computes it: a NaN keeps its sign (x86 division passes the NaN operand through;
// a GPU division returns the positive canonical NaN, which would turn -NaN's FP4 code 8 into 0).
__device__ __forceinline__ float quot(float x, float s) { return isnan(x) ? x : __fdiv_rn(x, s); }
__device__ __forceinline__ float decode(RowCodec c, uint32_t code) {
  return c == RowCodec::kFp8E8m0 ? dev_e4m3_value(code) : dev_e2m1_value(code);
}

constexpr unsigned kFull = 0xffffffffu;

// Work layout (one warp per unit, rows flattened over the grid): kF32 rows copy 32 floats per
// warp. Compact rows: a scale block is packed by G lanes, G = the block when it divides the warp
// (32 / G blocks share a warp, one value per lane), else the whole warp striding over the block;
// one more warp per row writes the BF16 tail and the padding when the row has any.
__host__ __device__ inline int lanes_per_block(int block) { return block <= 32 && 32 % block == 0 ? block : 32; }
__host__ __device__ inline int64_t code_warps(const CacheRowFormat& f) {
  const int64_t per_warp = 32 / lanes_per_block(f.block);
  return (f.scales() + per_warp - 1) / per_warp;
}
__host__ __device__ inline bool has_tail_warp(const CacheRowFormat& f) {
  return f.tail_dims() > 0 || f.row_bytes() > f.scale_offset() + f.scales();
}
__host__ __device__ inline int64_t warps_per_row(const CacheRowFormat& f) {
  if (f.codec == RowCodec::kF32) return (int64_t(f.dim) + 31) / 32;
  return code_warps(f) + (has_tail_warp(f) ? 1 : 0);
}

// True on every lane when `p` holds on every lane of the calling lane's group (lanes `gmask`).
// Called by all 32 lanes.
__device__ __forceinline__ bool group_all(bool p, unsigned gmask) { return (__ballot_sync(kFull, !p) & gmask) == 0; }

// Blocks cw·(32/G) .. of row x → their codes and scale bytes in `row` (the host's pack_block; the
// scale search of the former one-thread-per-block kernel, step by step: the amax is a max, so the
// lanes' order does not change it, and "every value decodes back to its own bits" is an AND over
// the lanes). A block no candidate fits is written with the first valid candidate (or the
// fallback) and counted, as is a block holding NaN or ±inf. All 32 lanes call this.
__device__ inline void pack_code_warp(const CacheRowFormat& f, const float* x, uint8_t* row, int64_t cw, int* bad) {
  const int lane = int(threadIdx.x & 31);
  const int n = f.block, G = lanes_per_block(n), li = lane % G, K = (n + G - 1) / G;
  const int64_t b = cw * (32 / G) + lane / G;
  const bool on = b < f.scales();  // a group past the row's last block loads and stores nothing
  const unsigned gmask = G == 32 ? kFull : ((1u << G) - 1u) << (lane - li);
  const float* xb = x + (on ? b : 0) * int64_t(n);

  float amax = 0;
  bool finite = true;
  for (int k = 0; k < K; ++k) {
    const int i = li + k * G;
    if (on && i < n) {
      const float v = xb[i];
      finite = finite && isfinite(v);
      amax = fmaxf(amax, fabsf(v));  // NaN never enters: fmaxf returns the other operand
    }
  }
  for (int o = G / 2; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, o));
  finite = group_all(finite, gmask);

  // This lane's values decode back to their own bits with scale s (block_fits over the lanes).
  auto lane_fits = [&](float s) {
    if (!(s > 0.0f) || isinf(s)) return false;
    bool fits = true;
    for (int k = 0; k < K; ++k) {
      const int i = li + k * G;
      if (on && i < n)
        fits = fits && __float_as_uint(__fmul_rn(decode(f.codec, encode(f.codec, quot(xb[i], s))), s)) ==
                           __float_as_uint(xb[i]);
    }
    return fits;
  };

  // amax, finite, s and ok are the same on every lane of a group; every loop runs the same
  // iterations on all 32 lanes (the ballots), leaving only when no group still searches.
  float s = 0;
  uint32_t sbyte = 0;
  bool ok = false;
  if (f.codec == RowCodec::kFp4E4m3) {
    const float cands[7] = {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f};
    // An all-zero block: 2^-9, the quantiser's floor. A block of zeros and NaN is no such block
    // (counted, like every block with a non-finite value); the fallback below gives it the same 2^-9.
    if (amax == 0.0f && finite) s = 0.001953125f, ok = true;
    for (int k = 0; k < 7; ++k) {
      const bool search = finite && !ok;
      if (__ballot_sync(kFull, search) == 0) break;
      const float cs = __fdiv_rn(amax, cands[k]);
      const bool valid = search && cs <= 448.0f && dev_round_e4m3(cs) == cs;
      if (valid && s == 0) s = cs;  // the first valid candidate: written even when nothing fits
      if (group_all(valid && lane_fits(cs), gmask)) s = cs, ok = true;
    }
    if (s == 0) s = dev_round_e4m3(fminf(fmaxf(__fdiv_rn(amax, 6.0f), 0.001953125f), 448.0f));
    sbyte = dev_e4m3_code(s);
  } else {
    const float top = f.codec == RowCodec::kFp8E8m0 ? 448.0f : 6.0f;
    const float s0 = amax == 0.0f ? ldexpf(1.0f, -127) : pow2_at_least(__fdiv_rn(amax, top));
    s = s0;
    bool stop = false;
    for (int k = 0; k < 2; ++k) {
      const float cs = ldexpf(s0, k);
      if (finite && !ok && cs > ldexpf(1.0f, 127)) stop = true;
      const bool search = finite && !ok && !stop;
      if (__ballot_sync(kFull, search) == 0) break;
      if (group_all(search && lane_fits(cs), gmask)) s = cs, ok = true;
    }
    int e;
    frexpf(s, &e);
    sbyte = uint32_t(e - 1 + 127);
  }
  const unsigned failed = __ballot_sync(kFull, on && li == 0 && !ok);  // one bit per block
  if (bad && lane == 0 && failed) atomicAdd(bad, __popc(failed));
  if (on && li == 0) row[f.scale_offset() + b] = uint8_t(sbyte);
  const bool fp4 = f.fp4();
  for (int k = 0; k < K; ++k) {
    const int i = li + k * G;
    const bool has = on && i < n;
    const uint32_t c = has ? encode(f.codec, quot(xb[i], s)) : 0u;
    if (fp4) {
      // Value i even (low nibble) and i + 1 (high): lanes li and li + 1 of the group (blocks are
      // even, so i + 1 < n; G = 32 pairs lanes of the same k).
      const uint32_t hi = __shfl_down_sync(kFull, c, 1);
      if (has && i % 2 == 0) row[(b * n + i) / 2] = uint8_t((c & 15u) | ((hi & 15u) << 4));
    } else if (has) {
      row[b * n + i] = uint8_t(c);
    }
  }
}

// The BF16 tail (a value that is not one is counted) and the row's padding, by one warp.
__device__ inline void pack_tail_warp(const CacheRowFormat& f, const float* x, uint8_t* row, int* bad) {
  const int lane = int(threadIdx.x & 31);
  int nonbf16 = 0;
  for (int64_t t = lane; t < f.tail_dims(); t += 32) {
    const uint32_t bits = __float_as_uint(x[f.coded + t]);
    nonbf16 += (bits & 0xffffu) != 0;
    uint8_t* p = row + f.tail_offset() + 2 * t;
    p[0] = uint8_t(bits >> 16), p[1] = uint8_t(bits >> 24);
  }
  for (int64_t o = f.scale_offset() + f.scales() + lane; o < f.row_bytes(); o += 32) row[o] = 0;
  for (int o = 16; o >= 1; o /= 2) nonbf16 += __shfl_xor_sync(kFull, nonbf16, o);
  if (bad && lane == 0 && nonbf16) atomicAdd(bad, nonbf16);
}

// Unit u (< warps_per_row(f)) of one row, by a whole warp. x and row are not __restrict__ here
// or above: nvcc then reads the step-written x (and the kernels' seqs) with ld.global.nc.
__device__ inline void pack_row_unit(const CacheRowFormat& f, const float* x, uint8_t* row, int64_t u, int* bad) {
  if (f.codec == RowCodec::kF32) {
    const int64_t d = u * 32 + int64_t(threadIdx.x & 31);
    if (d < f.dim) reinterpret_cast<float*>(row)[d] = x[d];
  } else if (u < code_warps(f)) {
    pack_code_warp(f, x, row, u, bad);
  } else {
    pack_tail_warp(f, x, row, bad);
  }
}

}  // namespace flashseek::ops::cuda::detail::row_pack
