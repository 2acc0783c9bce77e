#include <bit>
#include <cmath>

#include <gtest/gtest.h>

#include "ops/rope.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::randn;

TEST(Rope, ReleasedTablesAreTheBakedBits) {
  auto w = rope_inv_freq({64, 10000, false});
  EXPECT_EQ(std::bit_cast<uint32_t>(w[1]), 0x3f3ff911u);
  EXPECT_EQ(std::bit_cast<uint32_t>(w[31]), 0x390bd472u);
  auto y = rope_inv_freq({64, 160000, true, 16, 65536, 32, 1});
  EXPECT_EQ(std::bit_cast<uint32_t>(y[16]), 0x3b147ae1u);
  EXPECT_EQ(std::bit_cast<uint32_t>(y[31]), 0x35187c4du);
}

TEST(Rope, FormulaMatchesDoubleAndYarnRamp) {
  // The generic FP32 formula must agree with the baked bits within a few ulp. beta_slow
  // 1.0000001 gives the same lo/hi (15, 25) but bypasses the baked table.
  RopeSpec s{64, 160000, true, 16, 65536, 32, 1};
  auto baked = rope_inv_freq(s);
  s.beta_slow = 1.0000001;
  auto formula = rope_inv_freq(s);
  for (int i = 0; i < 32; ++i) {
    const double rel = std::fabs(double(formula[i]) - baked[i]) / baked[i];
    EXPECT_LT(rel, 5e-7) << i;  // a few ulp at most
  }
  // lo = 15, hi = 25: pairs < 16 unscaled, pairs ≥ 25 divided by 16.
  for (int i = 0; i < 32; ++i) {
    const double base = std::pow(160000.0, -2.0 * i / 64);
    const double g = std::clamp((i - 15.0) / 10.0, 0.0, 1.0);
    EXPECT_NEAR(formula[i] / (base * (1 - g) + base / 16 * g), 1.0, 1e-6) << i;
  }
}

TEST(Rope, TinyYarnTable) {
  // v41 §8 tiny: rope 16 dims, θ 160000, factor 4, original 32 → d(32) < 0 so lo = 0,
  // d(1) = 16·ln(32/2π)/(2 ln 160000) = 1.086 → hi = 2.
  auto w = rope_inv_freq({16, 160000, true, 4, 32, 32, 1});
  for (int i = 0; i < 8; ++i) {
    const double base = std::pow(160000.0, -2.0 * i / 16);
    const double g = std::clamp(i / 2.0, 0.0, 1.0);
    EXPECT_NEAR(w[i] / (base * (1 - g) + base / 4 * g), 1.0, 1e-6) << i;
  }
}

TEST(Rope, InterleavedTrailingSliceAndInverse) {
  Rng rng(8);
  const int64_t vec = 12, rope = 4, rows = 3, nv = 2;
  auto w = rope_inv_freq({rope, 10000, false});
  auto x = randn(rng, rows * nv * vec);
  auto y = x;
  std::vector<int64_t> pos = {0, 5, 123456};
  apply_rope({y.data(), pos.data(), w.data(), rows, nv, vec, rope});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t v = 0; v < nv; ++v) {
      const float* a = x.data() + (r * nv + v) * vec;
      const float* b = y.data() + (r * nv + v) * vec;
      for (int64_t d = 0; d < vec - rope; ++d) EXPECT_EQ(a[d], b[d]);  // nope dims untouched
      for (int64_t i = 0; i < rope / 2; ++i) {
        const double ang = double(float(pos[r]) * w[i]);
        const double c = std::cos(ang), s = std::sin(ang);
        const double x0 = a[vec - rope + 2 * i], x1 = a[vec - rope + 2 * i + 1];
        EXPECT_NEAR(b[vec - rope + 2 * i], x0 * c - x1 * s, 1e-5);
        EXPECT_NEAR(b[vec - rope + 2 * i + 1], x0 * s + x1 * c, 1e-5);
      }
    }
  apply_rope({y.data(), pos.data(), w.data(), rows, nv, vec, rope, true});
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
}

}  // namespace flashseek::ops
