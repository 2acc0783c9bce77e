// Device pack / unpack of compact cache rows (cache_rows.h). The host twin and the argument why
// the scale search always finds a quantised block's scale: ops/cpu/cache_row.cpp. Pointers are
// not checked for null: under CUDA graph capture a growing cache is allocated only after the
// capture (DevArray::reserve defers it), and that recording is discarded.
#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"

namespace flashseek::ops::cuda::detail {
namespace {

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
constexpr int kThreads = 256;  // 8 warps per CTA; a warp is the unit of work (below)

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
__device__ void pack_code_warp(const CacheRowFormat& f, const float* x, uint8_t* row, int64_t cw, int* bad) {
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
__device__ void pack_tail_warp(const CacheRowFormat& f, const float* x, uint8_t* row, int* bad) {
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
__device__ void pack_row_unit(const CacheRowFormat& f, const float* x, uint8_t* row, int64_t u, int* bad) {
  if (f.codec == RowCodec::kF32) {
    const int64_t d = u * 32 + int64_t(threadIdx.x & 31);
    if (d < f.dim) reinterpret_cast<float*>(row)[d] = x[d];
  } else if (u < code_warps(f)) {
    pack_code_warp(f, x, row, u, bad);
  } else {
    pack_tail_warp(f, x, row, bad);
  }
}

// The calling warp's index over the grid (the same on its 32 lanes: blockDim is a multiple of 32).
__device__ __forceinline__ int64_t warp_id() { return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; }

// Row r to dst_rows[r] when a table of row addresses is given, else to row r of dst.
__global__ void __launch_bounds__(kThreads) pack_rows_kernel(CacheRowFormat f, const float* src, int64_t n,
                                                            uint8_t* dst, uint8_t* const* dst_rows, int* bad) {
  pdl_prologue();
  const int64_t U = warps_per_row(f), w = warp_id();
  if (w >= n * U) return;  // whole warps
  const int64_t r = w / U;
  uint8_t* row = dst_rows ? dst_rows[r] : dst + r * cache_row_stride(f, f.dim);
  pack_row_unit(f, src + r * f.dim, row, w % U, bad);
}

// Row r of n: dst[r][0, width) ← src[r][0, width), a thread per value.
__global__ void copy_rows_table_kernel(const float* const* src, float* const* dst, int64_t n, int64_t width) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * width) return;
  const int64_t r = id / width, d = id % width;
  dst[r][d] = src[r][d];
}

__global__ void unpack_rows_kernel(CacheRowFormat f, const uint8_t* src, int64_t n, float* dst) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * f.dim) return;
  const int64_t r = id / f.dim, d = id % f.dim;
  dst[id] = cache_row_value(f, src + r * cache_row_stride(f, f.dim), d);
}

__global__ void __launch_bounds__(kThreads) pack_ring_kernel(CacheRowFormat f, uint8_t* ring, const float* kv,
                                                            const int64_t* pos, int64_t t0, int64_t T,
                                                            int64_t ring_size, int* bad) {
  pdl_prologue();
  const int64_t U = warps_per_row(f), w = warp_id();
  if (w >= (T - t0) * U) return;
  const int64_t t = t0 + w / U;
  pack_row_unit(f, kv + t * f.dim, ring + (pos[t] % ring_size) * cache_row_stride(f, f.dim), w % U, bad);
}

__global__ void __launch_bounds__(kThreads) pack_ring_seqs_kernel(CacheRowFormat f, const ModelAttnSeq* seqs,
                                                                 const int32_t* row_seq, const float* kv,
                                                                 const int64_t* pos, int64_t rows, int* bad) {
  pdl_prologue();
  const int64_t U = warps_per_row(f), w = warp_id();
  if (w >= rows * U) return;
  const int64_t r = w / U;
  const ModelAttnSeq sq = seqs[row_seq[r]];
  if (r - sq.row0 < sq.T - sq.ring_size) return;  // overwritten later in the same chunk (whole warp)
  uint8_t* ring = static_cast<uint8_t*>(sq.ring);
  pack_row_unit(f, kv + r * f.dim, ring + (pos[r] % sq.ring_size) * cache_row_stride(f, f.dim), w % U, bad);
}

unsigned grid_for(int64_t n) { return unsigned((n + 127) / 128); }

// A format the packers can run (ops::validate_row_format's rules; the work layout divides by the
// block).
bool packable(const CacheRowFormat& f) {
  if (f.dim <= 0) return false;
  if (!f.compact()) return true;
  if (f.block <= 0 || f.coded <= 0 || f.coded > f.dim || f.coded % f.block != 0) return false;
  return !f.fp4() || (f.coded == f.dim && f.block % 2 == 0);
}

// CTAs of kThreads for `rows` rows of warps_per_row(f) warps each; 0 when that does not fit a grid.
unsigned pack_grid(const CacheRowFormat& f, int64_t rows) {
  const int64_t ctas = (rows * warps_per_row(f) + kThreads / 32 - 1) / (kThreads / 32);
  return ctas > 0x7fffffff ? 0u : unsigned(ctas);
}

}  // namespace

cudaError_t launch_cache_pack_rows(const CacheRowFormat& f, const float* src, int64_t n, void* dst, int* bad,
                                   cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (!packable(f) || pack_grid(f, n) == 0) return cudaErrorInvalidValue;
  return launch_kernel(pack_rows_kernel, pack_grid(f, n), kThreads, 0, s, f, src, n, static_cast<uint8_t*>(dst),
                       static_cast<uint8_t* const*>(nullptr), bad);
}

cudaError_t launch_cache_pack_rows_table(const CacheRowFormat& f, const float* src, int64_t n, uint8_t* const* dst,
                                         int* bad, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (!packable(f) || !dst || pack_grid(f, n) == 0) return cudaErrorInvalidValue;
  return launch_kernel(pack_rows_kernel, pack_grid(f, n), kThreads, 0, s, f, src, n, static_cast<uint8_t*>(nullptr),
                       dst, bad);
}

cudaError_t launch_copy_rows_table(const float* const* src, float* const* dst, int64_t n, int64_t width,
                                   cudaStream_t s) {
  if (n <= 0 || width <= 0) return cudaSuccess;
  if (!src || !dst || (n * width + 255) / 256 > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_kernel(copy_rows_table_kernel, unsigned((n * width + 255) / 256), 256, 0, s, src, dst, n, width);
}

cudaError_t launch_cache_unpack_rows(const CacheRowFormat& f, const void* src, int64_t n, float* dst, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (f.dim <= 0 || !src || !dst) return cudaErrorInvalidValue;
  return launch_kernel(unpack_rows_kernel, grid_for(n * f.dim), 128, 0, s, f, static_cast<const uint8_t*>(src), n, dst);
}

cudaError_t launch_cache_pack_ring(const CacheRowFormat& f, void* ring, const float* kv, const int64_t* pos,
                                   int64_t t0, int64_t T, int64_t ring_size, int* bad, cudaStream_t s) {
  if (T <= t0) return cudaSuccess;
  if (!packable(f) || ring_size <= 0 || pack_grid(f, T - t0) == 0) return cudaErrorInvalidValue;
  return launch_kernel(pack_ring_kernel, pack_grid(f, T - t0), kThreads, 0, s, f, static_cast<uint8_t*>(ring), kv, pos,
                       t0, T, ring_size, bad);
}

cudaError_t launch_cache_pack_ring_seqs(const CacheRowFormat& f, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                        const float* kv, const int64_t* pos, int64_t rows, int* bad, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (!packable(f) || !seqs || !row_seq || pack_grid(f, rows) == 0) return cudaErrorInvalidValue;
  return launch_kernel(pack_ring_seqs_kernel, pack_grid(f, rows), kThreads, 0, s, f, seqs, row_seq, kv, pos, rows,
                       bad);
}

}  // namespace flashseek::ops::cuda::detail
