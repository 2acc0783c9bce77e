#include <cmath>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "ops/quant.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::randn;

TEST(Quant, Pow2CeilIsExact) {
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(1.0000001f), 2.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(0.5f), 0.5f);
  EXPECT_EQ(pow2_ceil(std::ldexp(1.0f, -130)), std::ldexp(1.0f, -130));
  EXPECT_EQ(pow2_ceil(3e-40f), std::ldexp(1.0f, -131));
}

TEST(Quant, Fp8BlocksMatchTheFormula) {
  Rng rng(5);
  for (int64_t block : {32, 64, 128}) {
    auto x = randn(rng, 2 * block * 3, 5.0);
    x[7] = 0;
    auto y = x;
    fp8_quant_dequant(y.data(), 2, block * 3, block);
    for (size_t b = 0; b < x.size(); b += size_t(block)) {
      double amax = 0;
      for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(double(x[b + i])));
      // s = 2^ceil(log2(max(amax,1e-4)/448)) computed in double
      const double s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-4) / 448.0)));
      for (int64_t i = 0; i < block; ++i) {
        const double q = double(x[b + i]) / s;
        EXPECT_LE(std::fabs(q), 448.0 + 1e-9);
        EXPECT_EQ(y[b + i], float(double(round_e4m3(float(q))) * s));
        EXPECT_LE(std::fabs(y[b + i] - x[b + i]), std::fabs(x[b + i]) / 16 + s * std::ldexp(1.0, -9));
      }
    }
  }
}

TEST(Quant, Fp4E8m0ValuesLieOnTheGrid) {
  Rng rng(6);
  auto x = randn(rng, 4 * 32);
  auto y = x;
  fp4_quant_dequant_e8m0(y.data(), 4, 32, 32);
  for (int b = 0; b < 4; ++b) {
    double amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(double(x[b * 32 + i])));
    const double s = std::exp2(std::ceil(std::log2(amax / 6.0)));
    for (int i = 0; i < 32; ++i) {
      const double v = y[b * 32 + i] / s;  // must be an e2m1 value
      EXPECT_EQ(float(v), round_e2m1(float(v)));
      EXPECT_LE(std::fabs(v), 6.0);
      // nearest grid point: no other e2m1 value is closer to x/s
      const double q = x[b * 32 + i] / s;
      for (uint8_t c = 0; c < 16; ++c) EXPECT_LE(std::fabs(v - q), std::fabs(e2m1_to_f32(c) - q) + 1e-12);
    }
  }
}

TEST(Quant, Fp4E4m3ScaleIsAnE4m3Value) {
  // amax 3.3 → s = e4m3(0.55) = 0.5625; 3.3/0.5625 = 5.87 → 6 → 3.375.
  std::vector<float> x(16, 0.0f);
  x[0] = 3.3f;
  x[1] = -0.3f;  // /0.5625 = -0.533 → -0.5 → -0.28125
  fp4_quant_dequant_e4m3(x.data(), 1, 16, 16);
  EXPECT_EQ(x[0], 3.375f);
  EXPECT_EQ(x[1], -0.28125f);
  EXPECT_EQ(x[2], 0.0f);
}

TEST(Quant, HadamardIsOrthonormalAndSylvesterOrdered) {
  std::vector<float> e(8, 0.0f);
  e[1] = 1;
  hadamard_inplace(e.data(), 1, 8);
  // Column 1 of H_8 (Sylvester) = [1,-1,1,-1,1,-1,1,-1] / sqrt(8).
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(e[i], (i % 2 ? -1.0f : 1.0f) / std::sqrt(8.0f));
  Rng rng(7);
  auto x = randn(rng, 128);
  auto y = x;
  hadamard_inplace(y.data(), 1, 128);
  hadamard_inplace(y.data(), 1, 128);  // H is its own inverse
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

}  // namespace flashseek::ops
