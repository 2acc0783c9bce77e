#include <bit>
#include <cmath>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "core/status.h"

namespace flashseek {

TEST(Numeric, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(round_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1.0078125 (odd) and 1.015625 (even): goes up.
  EXPECT_EQ(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
}

TEST(Numeric, F16RoundTrip) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f16_to_f32(uint16_t(b));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), b) << b;
  }
}

// The integer conversion (for compilers without _Float16) against the compiler's own: every
// binary16 value, the midpoints between neighbours and one float ulp either side of them (ties
// to even, overflow to infinity, the subnormal range), and a sweep over all float bit patterns.
TEST(Numeric, F16SoftConversionEqualsTheCompilers) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = f16_to_f32(uint16_t(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16_soft(f)))) << b;
      continue;
    }
    EXPECT_EQ(f32_to_f16_soft(f), b) << b;
    if ((b & 0x7fffu) >= 0x7c00u) continue;
    const float next = f16_to_f32(uint16_t(b + 1));
    const float mid = (b & 0x7fffu) == 0x7bffu ? std::copysign(65520.0f, f) : f + (next - f) / 2;
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, mid * 2)})
      EXPECT_EQ(f32_to_f16_soft(x), f32_to_f16(x)) << b << " " << x;
  }
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 251) {
    const float x = std::bit_cast<float>(uint32_t(u));
    if (std::isnan(x)) continue;
    ASSERT_EQ(f32_to_f16_soft(x), f32_to_f16(x)) << std::hex << u;
  }
}

TEST(Numeric, E4M3EveryCodeRoundTrips) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float f = e4m3_to_f32(uint8_t(b));
    if (std::isnan(f)) continue;
    EXPECT_EQ(round_e4m3(f), f) << b;
    EXPECT_EQ(f32_to_e4m3(f), b) << b;
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(round_e4m3(1000.0f), 448.0f);
  EXPECT_EQ(round_e4m3(-1000.0f), -448.0f);
  // Midpoint between 1.0 (even code) and 1.125 (odd): ties to even.
  EXPECT_EQ(round_e4m3(1.0625f), 1.0f);
  EXPECT_EQ(round_e4m3(1.1875f), 1.25f);
  // Subnormal midpoint 1.5 * 2^-9 rounds to 2 * 2^-9 (even).
  EXPECT_EQ(round_e4m3(1.5f * std::ldexp(1.0f, -9)), 2 * std::ldexp(1.0f, -9));
}

TEST(Numeric, E8M0AndE2M1) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
  EXPECT_EQ(pow2_to_e8m0(0.25f), 125);
  const float vals[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t c = 0; c < 16; ++c) {
    const float v = (c & 8) ? -vals[c & 7] : vals[c & 7];
    EXPECT_EQ(e2m1_to_f32(c), v);
    EXPECT_EQ(f32_to_e2m1(v), c);
  }
  EXPECT_EQ(round_e2m1(0.25f), 0.0f);   // tie -> even code 0
  EXPECT_EQ(round_e2m1(0.75f), 1.0f);   // tie -> code 2
  EXPECT_EQ(round_e2m1(2.5f), 2.0f);    // tie -> code 4
  EXPECT_EQ(round_e2m1(5.0f), 4.0f);    // tie -> code 6
  EXPECT_EQ(round_e2m1(100.0f), 6.0f);
  EXPECT_EQ(round_e2m1(-1.2f), -1.0f);
}

TEST(Status, ResultCarriesValueOrError) {
  Result<int> good = 3;
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(*good, 3);
  Result<int> bad = invalid_argument("field {} is wrong", "x");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "field x is wrong");
}

}  // namespace flashseek
