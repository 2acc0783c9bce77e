// Host pack/unpack of compact cache rows (ops/cache_row.h).
//
// Packing recovers a scale per block from the values themselves and checks every value:
// * power-of-two scales (E8M0): the smallest power of two s with amax / s within the code range.
//   A value c0 · s0 of the quantiser (s0 >= s, both powers of two) is (c0 · s0/s) · s, and
//   c0 · 2^j within range is again a code (e4m3 and e2m1 grids are closed under doubling up to
//   their maximum), so this scale always fits a quantised block.
// * E4M3 scales: s0 = amax / c_max, c_max the code of the largest value; the candidates amax / c
//   for every e2m1 magnitude c include it.
// A block no candidate fits is not representable: an error, never a rounded row.
#include "ops/cache_row.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/numeric.h"

namespace flashseek::ops {
namespace {

bool same_bits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// Smallest power of two >= v (v > 0 and finite), kept within E8M0's [2^-127, 2^127].
float pow2_at_least(float v) {
  int e;
  const float m = std::frexp(v, &e);  // v = m · 2^e
  int k = m == 0.5f ? e - 1 : e;
  k = std::clamp(k, -127, 127);
  return std::ldexp(1.0f, k);
}

// Codes of one block for scale s (e4m3 bytes or e2m1 nibbles in `codes`); true when every value
// decodes back to itself.
bool try_block(RowCodec codec, const float* x, int64_t n, float s, uint8_t* codes) {
  if (!(s > 0.0f) || !std::isfinite(s)) return false;
  for (int64_t i = 0; i < n; ++i) {
    const float q = x[i] / s;
    float back;
    if (codec == RowCodec::kFp8E8m0) {
      codes[i] = f32_to_e4m3(q);
      back = e4m3_to_f32(codes[i]) * s;
    } else {
      codes[i] = f32_to_e2m1(q);
      back = e2m1_to_f32(codes[i]) * s;
    }
    if (!same_bits(back, x[i])) return false;
  }
  return true;
}

// Packs one block: codes (one per value) and its scale byte; false if no scale fits.
bool pack_block(RowCodec codec, const float* x, int64_t n, uint8_t* codes, uint8_t& scale) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
    amax = std::max(amax, std::fabs(x[i]));
  }
  if (codec == RowCodec::kFp4E4m3) {
    if (amax == 0.0f) {  // any positive scale: 2^-9, the quantiser's floor
      scale = f32_to_e4m3(std::ldexp(1.0f, -9));
      return try_block(codec, x, n, e4m3_to_f32(scale), codes);
    }
    for (const float c : {6.0f, 4.0f, 3.0f, 2.0f, 1.5f, 1.0f, 0.5f}) {
      const float s = amax / c;
      if (!(s <= kE4M3Max) || round_e4m3(s) != s) continue;
      scale = f32_to_e4m3(s);
      if (try_block(codec, x, n, s, codes)) return true;
    }
    return false;
  }
  const float top = codec == RowCodec::kFp8E8m0 ? kE4M3Max : 6.0f;
  float s = amax == 0.0f ? std::ldexp(1.0f, -127) : pow2_at_least(amax / top);
  for (int attempt = 0; attempt < 2; ++attempt, s *= 2.0f) {  // 2s: amax / top rounded down onto s
    if (s > std::ldexp(1.0f, 127)) break;
    scale = pow2_to_e8m0(s);
    if (try_block(codec, x, n, s, codes)) return true;
  }
  return false;
}

float scale_value(RowCodec codec, uint8_t s) { return codec == RowCodec::kFp4E4m3 ? e4m3_to_f32(s) : e8m0_to_f32(s); }

}  // namespace

Status validate_row_format(const CacheRowFormat& f) {
  if (f.dim <= 0) return invalid_argument("cache row format: {} values per row", f.dim);
  if (!f.compact()) return {};
  if (f.block <= 0 || f.coded <= 0 || f.coded > f.dim || f.coded % f.block != 0)
    return invalid_argument("cache row format: {} coded values of {} in blocks of {}", f.coded, f.dim, f.block);
  if (f.fp4() && (f.coded != f.dim || f.block % 2 != 0))
    return invalid_argument("cache row format: FP4 rows code every value in even blocks ({} of {}, block {})", f.coded,
                            f.dim, f.block);
  return {};
}

Status pack_cache_rows(const CacheRowFormat& f, const float* x, int64_t n, uint8_t* out) {
  FS_RETURN_IF_ERROR(validate_row_format(f));
  const int64_t rb = f.row_bytes();
  if (!f.compact()) {
    std::memcpy(out, x, size_t(n * rb));
    return {};
  }
  uint8_t codes[256];
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * f.dim;
    uint8_t* o = out + r * rb;
    std::memset(o, 0, size_t(rb));
    for (int64_t b = 0; b < f.scales(); ++b) {
      const float* xb = xr + b * f.block;
      uint8_t* cb = codes;
      std::vector<uint8_t> big;
      if (f.block > 256) big.resize(size_t(f.block)), cb = big.data();
      uint8_t scale = 0;
      if (!pack_block(f.codec, xb, f.block, cb, scale))
        return out_of_range("cache row {}: values {}…{} are not exactly representable in the compact format", r,
                            b * f.block, (b + 1) * f.block - 1);
      o[f.scale_offset() + b] = scale;
      for (int64_t i = 0; i < f.block; ++i) {
        const int64_t d = b * f.block + i;
        if (f.fp4()) o[d / 2] |= uint8_t((cb[i] & 0xf) << (4 * (d % 2)));
        else o[d] = cb[i];
      }
    }
    for (int64_t t = 0; t < f.tail_dims(); ++t) {
      const float v = xr[f.coded + t];
      const uint16_t h = f32_to_bf16(v);
      if (!same_bits(bf16_to_f32(h), v))
        return out_of_range("cache row {}: value {} is not a BF16 value", r, f.coded + t);
      std::memcpy(o + f.tail_offset() + 2 * t, &h, 2);
    }
  }
  return {};
}

void unpack_cache_rows(const CacheRowFormat& f, const uint8_t* in, int64_t n, float* out) {
  const int64_t rb = f.row_bytes();
  if (!f.compact()) {
    std::memcpy(out, in, size_t(n * rb));
    return;
  }
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* row = in + r * rb;
    float* o = out + r * f.dim;
    for (int64_t d = 0; d < f.coded; ++d) {
      const float s = scale_value(f.codec, row[f.scale_offset() + d / f.block]);
      const float c = f.fp4() ? e2m1_to_f32(uint8_t((row[d / 2] >> (4 * (d % 2))) & 0xf)) : e4m3_to_f32(row[d]);
      o[d] = c * s;
    }
    for (int64_t t = 0; t < f.tail_dims(); ++t) {
      uint16_t h;
      std::memcpy(&h, row + f.tail_offset() + 2 * t, 2);
      o[f.coded + t] = bf16_to_f32(h);
    }
  }
}

}  // namespace flashseek::ops
