// Device pack / unpack of compact cache rows (cache_rows.h). The host twin and the argument why
// the scale search always finds a quantised block's scale: ops/cpu/cache_row.cpp. Pointers are
// not checked for null: under CUDA graph capture a growing cache is allocated only after the
// capture (DevArray::reserve defers it), and that recording is discarded.
#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/runtime/launch.cuh"

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
__device__ __forceinline__ float decode(RowCodec c, uint32_t code) {
  return c == RowCodec::kFp8E8m0 ? dev_e4m3_value(code) : dev_e2m1_value(code);
}

// Every value of the block decodes back to its own bits with scale s.
__device__ bool block_fits(RowCodec c, const float* x, int n, float s) {
  if (!(s > 0.0f) || isinf(s)) return false;
  for (int i = 0; i < n; ++i)
    if (__float_as_uint(__fmul_rn(decode(c, encode(c, __fdiv_rn(x[i], s))), s)) != __float_as_uint(x[i])) return false;
  return true;
}

// Block b of row x → its codes and scale byte in `row` (the host's pack_block).
__device__ void pack_block(const CacheRowFormat& f, const float* x, uint8_t* row, int64_t b, int* bad) {
  const int n = f.block;
  const float* xb = x + b * n;
  float amax = 0;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    finite = finite && isfinite(xb[i]);
    amax = fmaxf(amax, fabsf(xb[i]));
  }
  float s = 0;
  uint32_t sbyte = 0;
  bool ok = false;
  if (f.codec == RowCodec::kFp4E4m3) {
    const float cands[7] = {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f};
    if (amax == 0.0f) {
      s = 0.001953125f, ok = true;  // 2^-9, the quantiser's floor
    } else {
      for (int k = 0; k < 7 && finite && !ok; ++k) {
        const float cs = __fdiv_rn(amax, cands[k]);
        if (!(cs <= 448.0f) || dev_round_e4m3(cs) != cs) continue;
        if (s == 0) s = cs;  // the first valid candidate: written even when nothing fits
        if (block_fits(f.codec, xb, n, cs)) s = cs, ok = true;
      }
      if (s == 0) s = dev_round_e4m3(fminf(fmaxf(__fdiv_rn(amax, 6.0f), 0.001953125f), 448.0f));
    }
    sbyte = dev_e4m3_code(s);
  } else {
    const float top = f.codec == RowCodec::kFp8E8m0 ? 448.0f : 6.0f;
    const float s0 = amax == 0.0f ? ldexpf(1.0f, -127) : pow2_at_least(__fdiv_rn(amax, top));
    s = s0;
    for (int k = 0; k < 2 && finite && !ok; ++k) {
      const float cs = ldexpf(s0, k);
      if (cs > ldexpf(1.0f, 127)) break;
      if (block_fits(f.codec, xb, n, cs)) s = cs, ok = true;
    }
    int e;
    frexpf(s, &e);
    sbyte = uint32_t(e - 1 + 127);
  }
  if (!ok && bad) atomicAdd(bad, 1);
  row[f.scale_offset() + b] = uint8_t(sbyte);
  if (f.fp4()) {
    for (int i = 0; i < n; i += 2) {
      const uint32_t lo = encode(f.codec, __fdiv_rn(xb[i], s)), hi = encode(f.codec, __fdiv_rn(xb[i + 1], s));
      row[(b * n + i) / 2] = uint8_t((lo & 15u) | ((hi & 15u) << 4));
    }
  } else {
    for (int i = 0; i < n; ++i) row[b * n + i] = uint8_t(encode(f.codec, __fdiv_rn(xb[i], s)));
  }
}

// Work units of a row: kF32 one per float; else one per block, plus one for the BF16 tail and
// the padding.
__host__ __device__ inline int64_t units(const CacheRowFormat& f) {
  return f.codec == RowCodec::kF32 ? f.dim : f.scales() + 1;
}

__device__ void pack_unit(const CacheRowFormat& f, const float* x, uint8_t* row, int64_t u, int* bad) {
  if (f.codec == RowCodec::kF32) {
    reinterpret_cast<float*>(row)[u] = x[u];
  } else if (u < f.scales()) {
    pack_block(f, x, row, u, bad);
  } else {  // tail values (BF16; a value that is not one is counted) and the row's padding
    for (int64_t t = 0; t < f.tail_dims(); ++t) {
      const float v = x[f.coded + t];
      const uint32_t bits = __float_as_uint(v);
      if ((bits & 0xffffu) != 0 && bad) atomicAdd(bad, 1);
      uint8_t* p = row + f.tail_offset() + 2 * t;
      p[0] = uint8_t(bits >> 16), p[1] = uint8_t(bits >> 24);
    }
    for (int64_t o = f.scale_offset() + f.scales(); o < f.row_bytes(); ++o) row[o] = 0;
  }
}

__global__ void pack_rows_kernel(CacheRowFormat f, const float* src, int64_t n, uint8_t* dst, int* bad) {
  const int64_t U = units(f), id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * U) return;
  const int64_t r = id / U;
  pack_unit(f, src + r * f.dim, dst + r * cache_row_stride(f, f.dim), id % U, bad);
}

__global__ void unpack_rows_kernel(CacheRowFormat f, const uint8_t* src, int64_t n, float* dst) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * f.dim) return;
  const int64_t r = id / f.dim, d = id % f.dim;
  dst[id] = cache_row_value(f, src + r * cache_row_stride(f, f.dim), d);
}

__global__ void pack_ring_kernel(CacheRowFormat f, uint8_t* ring, const float* kv, const int64_t* pos, int64_t t0,
                                 int64_t T, int64_t ring_size, int* bad) {
  const int64_t U = units(f), id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= (T - t0) * U) return;
  const int64_t t = t0 + id / U;
  pack_unit(f, kv + t * f.dim, ring + (pos[t] % ring_size) * cache_row_stride(f, f.dim), id % U, bad);
}

__global__ void pack_ring_seqs_kernel(CacheRowFormat f, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                      const float* kv, const int64_t* pos, int64_t rows, int* bad) {
  const int64_t U = units(f), id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * U) return;
  const int64_t r = id / U;
  const ModelAttnSeq sq = seqs[row_seq[r]];
  if (r - sq.row0 < sq.T - sq.ring_size) return;  // overwritten later in the same chunk
  uint8_t* ring = static_cast<uint8_t*>(sq.ring);
  pack_unit(f, kv + r * f.dim, ring + (pos[r] % sq.ring_size) * cache_row_stride(f, f.dim), id % U, bad);
}

unsigned grid_for(int64_t n) { return unsigned((n + 127) / 128); }

}  // namespace

cudaError_t launch_cache_pack_rows(const CacheRowFormat& f, const float* src, int64_t n, void* dst, int* bad,
                                   cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (f.dim <= 0) return cudaErrorInvalidValue;
  return launch_kernel(pack_rows_kernel, grid_for(n * units(f)), 128, 0, s, f, src, n, static_cast<uint8_t*>(dst), bad);
}

cudaError_t launch_cache_unpack_rows(const CacheRowFormat& f, const void* src, int64_t n, float* dst, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (f.dim <= 0 || !src || !dst) return cudaErrorInvalidValue;
  return launch_kernel(unpack_rows_kernel, grid_for(n * f.dim), 128, 0, s, f, static_cast<const uint8_t*>(src), n, dst);
}

cudaError_t launch_cache_pack_ring(const CacheRowFormat& f, void* ring, const float* kv, const int64_t* pos,
                                   int64_t t0, int64_t T, int64_t ring_size, int* bad, cudaStream_t s) {
  if (T <= t0) return cudaSuccess;
  if (f.dim <= 0 || ring_size <= 0) return cudaErrorInvalidValue;
  return launch_kernel(pack_ring_kernel, grid_for((T - t0) * units(f)), 128, 0, s, f, static_cast<uint8_t*>(ring), kv,
                       pos, t0, T, ring_size, bad);
}

cudaError_t launch_cache_pack_ring_seqs(const CacheRowFormat& f, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                        const float* kv, const int64_t* pos, int64_t rows, int* bad, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (f.dim <= 0 || !seqs || !row_seq) return cudaErrorInvalidValue;
  return launch_kernel(pack_ring_seqs_kernel, grid_for(rows * units(f)), 128, 0, s, f, seqs, row_seq, kv, pos, rows, bad);
}

}  // namespace flashseek::ops::cuda::detail
