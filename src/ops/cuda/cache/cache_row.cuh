// Device twins of the compact cache rows (ops/cache_row_format.h, host: ops/cpu/cache_row.cpp):
// value d of a row decoded on load (code · scale, an exact FP32 product: the same bits as the
// host unpack), and the FP32 dot of the model kernels over such a row. Only included from .cu.
#pragma once
#include <cstdint>

#include "ops/cache_row_format.h"
#include "ops/cuda/model/model_device.cuh"

namespace flashseek::ops::cuda::detail {

// core/numeric.h e4m3_to_f32 (codes 0x7f / 0xff, NaN, are never packed).
__device__ __forceinline__ float dev_e4m3_value(uint32_t b) {
  const uint32_t e = (b >> 3) & 15u, m = b & 7u;
  const float v = e == 0 ? __fmul_rn(float(m), 0.001953125f) : __uint_as_float(((e + 120u) << 23) | (m << 20));
  return (b & 0x80u) ? -v : v;
}
// core/numeric.h e8m0_to_f32: 2^(e−127) (e = 0: the FP32 subnormal 2^-127).
__device__ __forceinline__ float dev_e8m0_value(uint32_t e) {
  return e == 0 ? __uint_as_float(0x00400000u) : e == 255 ? __uint_as_float(0x7fc00000u) : __uint_as_float(e << 23);
}
// core/numeric.h e2m1_to_f32 (bit 3: sign).
__device__ __forceinline__ float dev_e2m1_value(uint32_t n) {
  const uint32_t m = n & 7u;
  const float v = m < 4 ? 0.5f * float(m) : m == 4 ? 2.0f : m == 5 ? 3.0f : m == 6 ? 4.0f : 6.0f;
  return (n & 8u) ? -v : v;
}

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

// One row as an element loader (load4: values d .. d+3, d % 4 == 0).
struct CacheRowRef {
  const uint8_t* row;
  CacheRowFormat f;
  __device__ __forceinline__ float operator()(int64_t d) const { return cache_row_value(f, row, d); }
  __device__ __forceinline__ void load4(int64_t d, float v[4]) const { cache_row_value4(f, row, d, v); }
};

// dev_dot_chunk_serial / dev_dot_f32 (model_device.cuh) with b read through a loader: the same
// products and additions in the same order, so the same bits as over the decoded FP32 row.
template <typename Load>
__device__ __forceinline__ float dev_dot_chunk_serial_ld(const float* a, const Load& b, int64_t o, int64_t len) {
  float v[32];
  for (int l = 0; l < 32; ++l) {
    float p[4] = {0, 0, 0, 0};
    for (int64_t i = 4 * l; i < len; i += 128) {
      if (i + 3 < len && (o + i) % 4 == 0) {  // four values of one load, same products and sums
        float w[4];
        b.load4(o + i, w);
#pragma unroll
        for (int c = 0; c < 4; ++c) p[c] = mul_add(a[o + i + c], w[c], p[c]);
      } else {
        for (int c = 0; c < 4 && i + c < len; ++c) p[c] = mul_add(a[o + i + c], b(o + i + c), p[c]);
      }
    }
    v[l] = __fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3]));
  }
  for (int off = 16; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) v[l] = __fadd_rn(v[l], v[l + off]);
  return v[0];
}

template <typename Load>
__device__ __forceinline__ float dev_dot_f32_ld(const float* a, const Load& b, int64_t n) {
  if (n > kSumChunk) {
    float val[48];
    int64_t size[48];
    int top = 0;
    for (int64_t o = 0; o < n; o += kSumChunk) {
      float v = dev_dot_chunk_serial_ld(a, b, o, n - o < kSumChunk ? n - o : kSumChunk);
      int64_t sz = 1;
      while (top > 0 && size[top - 1] == sz) v = __fadd_rn(val[--top], v), sz *= 2;
      val[top] = v, size[top++] = sz;
    }
    float acc = val[--top];
    while (top > 0) acc = __fadd_rn(val[--top], acc);
    return acc;
  }
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    float w[8];
    b.load4(i, w);
    b.load4(i + 4, w + 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = mul_add(a[i + j], w[j], s[j]);
  }
  for (int j = 0; i < n; ++i, ++j) s[j] = mul_add(a[i], b(i), s[j]);
  return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[4]), __fadd_rn(s[2], s[6])),
                   __fadd_rn(__fadd_rn(s[1], s[5]), __fadd_rn(s[3], s[7])));
}

}  // namespace flashseek::ops::cuda::detail
