// Device pack / unpack of compact cache rows (cache_rows.h). The host twin and the argument why
// the scale search always finds a quantised block's scale: ops/cpu/cache_row.cpp. Pointers are
// not checked for null: under CUDA graph capture a growing cache is allocated only after the
// capture (DevArray::reserve defers it), and that recording is discarded.
#include "ops/cuda/cache/cache_pack.cuh"
#include "ops/cuda/cache/cache_row.cuh"
#include "ops/cuda/cache/cache_rows.h"
#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"

namespace flashseek::ops::cuda::detail {
namespace {
using namespace row_pack;  // NOLINT: the warp packers (cache_pack.cuh)

constexpr int kThreads = 256;  // 8 warps per CTA; a warp is the unit of work (cache_pack.cuh)

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

bool cache_row_packable(const CacheRowFormat& f) { return packable(f); }

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
