// Device twins of the compact cache rows (ops/cache_row_format.h, host: ops/cpu/cache_row.cpp):
// value d of a row decoded on load (code · scale, an exact FP32 product: the same bits as the
// host unpack), and a row as a loader of the model kernels' FP32 dot (model_device.cuh
// dev_dot_f32_ld). Only included from .cu.
#pragma once
#include <cstdint>

#include "ops/cache_row_format.h"
#include "ops/cuda/model/model_device.cuh"

namespace flashseek::ops::cuda::detail {

// Value d of a row of format f at `row` (kF32: a row of floats).
__device__ __forceinline__ float cache_row_value(const CacheRowFormat& f, const uint8_t* row, int64_t d) {
  if (f.codec == RowCodec::kF32) return reinterpret_cast<const float*>(row)[d];
  if (d >= f.coded) {
    const uint8_t* t = row + f.tail_offset() + 2 * (d - f.coded);
    return __uint_as_float((uint32_t(t[0]) | (uint32_t(t[1]) << 8)) << 16);
  }
  const uint32_t sb = row[f.scale_offset() + d / f.block];
  const float s = f.codec == RowCodec::kFp4E4m3 ? dev_e4m3_value(sb) : dev_e8m0_value(sb);
  const float c = f.fp4() ? dev_e2m1_value((uint32_t(row[d >> 1]) >> (4 * (d & 1))) & 15u) : dev_e4m3_value(row[d]);
  return __fmul_rn(c, s);
}

// Bytes between rows of format f holding `dim` values.
__host__ __device__ inline int64_t cache_row_stride(const CacheRowFormat& f, int64_t dim) {
  return f.codec == RowCodec::kF32 ? 4 * dim : f.row_bytes();
}

// Values d .. d+3 of a row (d % 4 == 0, d + 3 < f.dim) into v: the same four values as
// cache_row_value, with one scale decode and one 4-byte (FP8) or 2-byte (FP4) code load when the
// four share a scale block and lie in the coded part (rows are 4-byte aligned: row_bytes).
__device__ __forceinline__ void cache_row_value4(const CacheRowFormat& f, const uint8_t* row, int64_t d, float v[4]) {
  if (f.codec == RowCodec::kF32 || d + 3 >= f.coded || f.block % 4 != 0) {
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = cache_row_value(f, row, d + c);
    return;
  }
  const uint32_t sb = row[f.scale_offset() + d / f.block];
  const float s = f.codec == RowCodec::kFp4E4m3 ? dev_e4m3_value(sb) : dev_e8m0_value(sb);
  if (f.fp4()) {
    const uint32_t w = *reinterpret_cast<const uint16_t*>(row + (d >> 1));
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = __fmul_rn(dev_e2m1_value((w >> (4 * c)) & 15u), s);
  } else {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(row + d);
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = __fmul_rn(dev_e4m3_value((w >> (8 * c)) & 255u), s);
  }
}

// One row as a loader of dev_dot_f32_ld (model_device.cuh): value d, or values d .. d+3 (d % 4 == 0).
struct CacheRowRef {
  const uint8_t* row;
  CacheRowFormat f;
  __device__ __forceinline__ float operator()(int64_t d) const { return cache_row_value(f, row, d); }
  __device__ __forceinline__ void load4(int64_t d, float v[4]) const { cache_row_value4(f, row, d, v); }
};

}  // namespace flashseek::ops::cuda::detail
