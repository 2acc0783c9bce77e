// Device pack / unpack of compact cache rows (ops/cache_row_format.h): the GPU twins of
// ops::pack_cache_rows / unpack_cache_rows, and the window ring writes in a row format.
// Packing recovers each block's scale from its values exactly as the host does; a block whose
// values are not exactly representable (any block holding NaN or ±inf among them) is still
// written (rounded to the first candidate scale) and counted in *bad when `bad` is non-null, as
// is a tail value that is not BF16, so callers and tests can detect it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/cache_row_format.h"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {

// dst row r (f.row_bytes() apart; kF32: 4·dim) ← src [n, f.dim] FP32 row r.
cudaError_t launch_cache_pack_rows(const CacheRowFormat& f, const float* src, int64_t n, void* dst, int* bad,
                                   cudaStream_t s);
// The same with row r written at dst[r] (a device table of n row addresses: rows of several
// caches in one launch).
cudaError_t launch_cache_pack_rows_table(const CacheRowFormat& f, const float* src, int64_t n, uint8_t* const* dst,
                                         int* bad, cudaStream_t s);
// dst[r][0, width) ← src[r][0, width) for the n FP32 rows of two device address tables (rows of
// many sequences' states in one launch). Rows may not overlap a row another entry writes.
cudaError_t launch_copy_rows_table(const float* const* src, float* const* dst, int64_t n, int64_t width,
                                   cudaStream_t s);
// dst [n, f.dim] FP32 ← n packed rows.
cudaError_t launch_cache_unpack_rows(const CacheRowFormat& f, const void* src, int64_t n, float* dst, cudaStream_t s);
// Whether the packers above take rows of format f (ops::validate_row_format's rules; the warp
// layout of cache_pack.cuh divides by the block).
bool cache_row_packable(const CacheRowFormat& f);
// launch_ring_write in a row format: ring slot pos[t] % ring_size ← kv[t] for t in [t0, T).
cudaError_t launch_cache_pack_ring(const CacheRowFormat& f, void* ring, const float* kv, const int64_t* pos,
                                   int64_t t0, int64_t T, int64_t ring_size, int* bad, cudaStream_t s);
// launch_ring_write_seqs in a row format (every sequence's ring in format f).
cudaError_t launch_cache_pack_ring_seqs(const CacheRowFormat& f, const ModelAttnSeq* seqs, const int32_t* row_seq,
                                        const float* kv, const int64_t* pos, int64_t rows, int* bad, cudaStream_t s);

}  // namespace flashseek::ops::cuda::detail
