// Compact rows of the sequence caches (spec/perf-budget.md §2): window ring rows, compressed KV
// rows and index key rows stored in the formats the reference quantises them to, so that a row
// unpacks to exactly the FP32 values the model computed (nothing is lost).
//
// A row of `dim` values: its first `coded` values are codes with one scale per `block` values,
// the remaining dim − coded values (V4's RoPE tail) BF16. Byte layout of one row:
//   [codes] [BF16 tail] [scales] [zero padding to a multiple of 4 bytes]
// codes: one e4m3 byte per value (kFp8E8m0) or two e2m1 nibbles per byte (kFp4*, value 2i in the
// low nibble, 2i+1 in the high one); scales: one byte per block, E8M0 (2^(e−127)) or E4M3.
// A value is code · scale, an exact FP32 product. kF32 rows are plain FP32 (exact numerics, where
// the caches hold unquantised values).
//
// This header: the layout only (included by CUDA code); host pack/unpack: ops/cache_row.h
// (ops/cpu/cache_row.cpp); device twins: ops/cuda/attention/cache_row.cuh.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FS_CACHE_HD __host__ __device__
#else
#define FS_CACHE_HD
#endif

namespace flashseek::ops {

enum class RowCodec : uint8_t {
  kF32,       // FP32 values (no compaction)
  kFp8E8m0,   // e4m3 codes, E8M0 power-of-two scale per block, optional BF16 tail
  kFp4E8m0,   // e2m1 codes, E8M0 scale per block
  kFp4E4m3,   // e2m1 codes, E4M3 scale per block
};

struct CacheRowFormat {
  RowCodec codec = RowCodec::kF32;
  int32_t dim = 0;    // values per row
  int32_t coded = 0;  // values [0, coded) are codes, [coded, dim) the BF16 tail; kF32 has none
  int32_t block = 1;  // values per scale

  FS_CACHE_HD bool compact() const { return codec != RowCodec::kF32; }
  FS_CACHE_HD bool fp4() const { return codec == RowCodec::kFp4E8m0 || codec == RowCodec::kFp4E4m3; }
  FS_CACHE_HD int64_t code_bytes() const { return fp4() ? coded / 2 : coded; }
  FS_CACHE_HD int64_t tail_offset() const { return code_bytes(); }
  FS_CACHE_HD int64_t tail_dims() const { return compact() ? dim - coded : 0; }
  FS_CACHE_HD int64_t scale_offset() const { return tail_offset() + 2 * int64_t(tail_dims()); }
  FS_CACHE_HD int64_t scales() const { return compact() ? coded / block : 0; }
  // Device / host bytes of one row.
  FS_CACHE_HD int64_t row_bytes() const {
    if (!compact()) return 4 * int64_t(dim);
    return (scale_offset() + scales() + 3) / 4 * 4;
  }
};

// FP32 rows of `dim` values.
inline CacheRowFormat f32_row_format(int64_t dim) { return {RowCodec::kF32, int32_t(dim), 0, 1}; }

}  // namespace flashseek::ops
