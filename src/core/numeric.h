// Scalar number formats of the checkpoint and of the reference's quantisation simulations:
// BF16, F16, FP8 E4M3 (fn: no inf, max 448), E8M0 (power-of-two scale), FP4 E2M1.
// Every conversion rounds to nearest, ties to even, exactly as torch's casts do.
// Hand-written because no Debian package provides e4m3/e8m0/e2m1 (only C++23 <stdfloat> bf16).
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace flashseek {

// ---- BF16 ----------------------------------------------------------------------------------
inline float bf16_to_f32(uint16_t bits) { return std::bit_cast<float>(uint32_t(bits) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// Rounds a float to the nearest BF16 value (the reference's `.bfloat16()` rounding points).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// ---- F16 -----------------------------------------------------------------------------------
inline float f16_to_f32(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  const uint32_t exp = (bits >> 10) & 0x1fu;
  const uint32_t man = bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}
// Round to nearest, ties to even, in integer arithmetic: the conversion where the compiler has
// no _Float16 (clang before 15 on x86-64, used for the fuzzing build). NaN stays NaN (quiet, the
// top payload bits kept), overflow gives infinity, tiny values round into the subnormals.
inline uint16_t f32_to_f16_soft(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 (and inf): infinity
  if (a >= 0x38800000u) {                                  // normal binary16 (>= 2^-14)
    uint32_t m = a - 0x38000000u;                          // exponent rebiased from 127 to 15
    m += 0xfffu + ((m >> 13) & 1u);
    return uint16_t(sign | (m >> 13));
  }
  if (a < 0x33000000u) return uint16_t(sign);  // below 2^-25 (2^-25 itself ties to 0)
  // Subnormal: the value in units of 2^-24 is mant >> (126 - e), rounded to even (a carry into
  // 0x400 is the smallest normal, correctly encoded).
  const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t q = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return uint16_t(sign | q);
}
inline uint16_t f32_to_f16(float f) {
#ifdef __FLT16_MAX__  // the compiler has IEEE binary16 (_Float16): its cast rounds to nearest even
  _Float16 h = static_cast<_Float16>(f);
  return std::bit_cast<uint16_t>(h);
#else
  return f32_to_f16_soft(f);
#endif
}

// ---- FP8 E4M3 (fn) -------------------------------------------------------------------------
// 1 sign, 4 exponent (bias 7), 3 mantissa; 0x7F/0xFF are NaN; no infinities; max ±448.
inline constexpr float kE4M3Max = 448.0f;
inline float e4m3_to_f32(uint8_t bits) {
  const bool neg = bits & 0x80u;
  const int exp = (bits >> 3) & 0xf;
  const int man = bits & 0x7;
  float v;
  if (exp == 15 && man == 7) return std::nanf("");
  if (exp == 0) v = std::ldexp(float(man), -9);            // subnormal: man/8 * 2^-6
  else v = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
  return neg ? -v : v;
}
// Rounds to the nearest e4m3 value (RNE), saturating at ±448 (callers clamp first, as the
// reference does). NaN stays NaN. Returns the rounded value as a float.
inline float round_e4m3(float x) {
  if (std::isnan(x)) return x;
  const float a = std::fabs(x);
  float r;
  if (a >= kE4M3Max) {
    r = kE4M3Max;
  } else if (a < 0.015625f) {               // below 2^-6: subnormal grid, step 2^-9
    r = std::nearbyint(a * 512.0f) / 512.0f;  // default rounding mode is RNE
  } else {                                  // normal: keep 3 mantissa bits, RNE on the float bits
    uint32_t u = std::bit_cast<uint32_t>(a);
    u += 0x7ffffu + ((u >> 20) & 1u);
    u &= ~0xfffffu;
    r = std::bit_cast<float>(u);
    if (r > kE4M3Max) r = kE4M3Max;
  }
  return std::signbit(x) ? -r : r;
}
// Encodes a float to e4m3 bits (RNE, saturating). Negative zero keeps its sign bit.
inline uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const float r = std::fabs(round_e4m3(x));
  uint8_t code;
  if (r < 0.015625f) {
    code = uint8_t(std::lround(r * 512.0f));  // exact: r is on the subnormal grid
  } else {
    int e;
    float m = std::frexp(r, &e);  // r = m * 2^e, m in [0.5, 1)
    const int exp = e - 1 + 7;
    const int man = int(std::lround((m * 2.0f - 1.0f) * 8.0f));
    code = uint8_t((exp << 3) | man);
  }
  return std::signbit(x) ? uint8_t(code | 0x80u) : code;
}

// ---- E8M0 (UE8M0 scale) --------------------------------------------------------------------
// One byte e: value 2^(e-127); 0xFF is NaN.
inline float e8m0_to_f32(uint8_t e) {
  if (e == 0xffu) return std::nanf("");
  return std::ldexp(1.0f, int(e) - 127);
}
// Encodes a power of two 2^k (k in [-127, 127]) as e8m0; the input must be an exact power of two.
inline uint8_t pow2_to_e8m0(float p) {
  int e;
  std::frexp(p, &e);  // p = 0.5 * 2^e
  return uint8_t(e - 1 + 127);
}

// ---- FP4 E2M1 ------------------------------------------------------------------------------
// Nibble code 0..7 -> 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign (8 = -0).
inline float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kVals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kVals[nibble & 7u];
  return (nibble & 8u) ? -v : v;
}
// Encodes to the nearest e2m1 code, ties to the even code (saturating at ±6).
inline uint8_t f32_to_e2m1(float x) {
  static constexpr float kVals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = std::fabs(x);
  uint8_t best = 7;
  if (!(a >= 6.0f)) {
    for (uint8_t c = 0; c < 7; ++c) {
      const float lo = kVals[c], hi = kVals[c + 1];
      if (a <= hi) {
        const float dlo = a - lo, dhi = hi - a;
        if (dlo < dhi) best = c;
        else if (dhi < dlo) best = uint8_t(c + 1);
        else best = (c % 2 == 0) ? c : uint8_t(c + 1);
        break;
      }
    }
  }
  if (std::isnan(x)) best = 0;
  return std::signbit(x) ? uint8_t(best | 8u) : best;
}
inline float round_e2m1(float x) { return e2m1_to_f32(f32_to_e2m1(x)); }

}  // namespace flashseek
