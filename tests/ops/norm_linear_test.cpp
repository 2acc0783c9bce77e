#include <cmath>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/quant.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::max_abs_diff;
using testing::randn;

TEST(RmsNorm, MatchesDoubleOnOddSizes) {
  Rng rng(1);
  for (int64_t dim : {1, 7, 33, 129, 1000}) {
    for (float eps : {1e-6f, 1e-20f}) {
      const int64_t rows = 3;
      auto x = randn(rng, rows * dim, 3.0), w = randn(rng, dim);
      std::vector<float> y(x.size());
      rms_norm({x.data(), w.data(), y.data(), rows, dim, eps, false});
      std::vector<double> ref(x.size());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
        const double inv = 1.0 / std::sqrt(ss / dim + eps);
        for (int64_t i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * w[i];
      }
      EXPECT_LT(max_abs_diff(y.data(), ref.data(), rows * dim), 1e-5) << dim << " " << eps;
    }
  }
}

TEST(RmsNorm, TinyEpsOnZeroRowIsFiniteAndZero) {
  // eps 1e-20 must be added in FP32 (it underflows in FP16): a zero row stays zero, no NaN.
  std::vector<float> x(16, 0.0f), y(16, 1.0f);
  rms_norm({x.data(), nullptr, y.data(), 1, 16, 1e-20f, false});
  for (float v : y) EXPECT_EQ(v, 0.0f);
  // A row of 1e-12 values: mean 1e-24 << eps, so the result is 1e-12 / sqrt(1e-20) = 1e-2.
  std::vector<float> z(8, 1e-12f), o(8);
  rms_norm({z.data(), nullptr, o.data(), 1, 8, 1e-20f, false});
  EXPECT_NEAR(o[0], 1e-12 / std::sqrt(1e-24 + 1e-20), 1e-6);
}

TEST(RmsNorm, Bf16OutputIsRounded) {
  Rng rng(2);
  auto x = randn(rng, 64);
  std::vector<float> y(64);
  rms_norm({x.data(), nullptr, y.data(), 1, 64, 1e-6f, true});
  for (float v : y) EXPECT_EQ(v, round_bf16(v));
}

TEST(Linear, MatchesDoubleAndIsBatchInvariant) {
  Rng rng(3);
  for (auto [rows, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 37, 19},
                               {17, 256, 131}, {3, 1000, 7}}) {
    auto x = randn(rng, rows * in), w = randn(rng, out * in, 0.1);
    std::vector<float> y(size_t(rows * out));
    linear({x.data(), w.data(), y.data(), rows, in, out});
    std::vector<double> ref(y.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += double(x[r * in + i]) * w[o * in + i];
        ref[r * out + o] = s;
      }
    EXPECT_LT(max_abs_diff(y.data(), ref.data(), rows * out), 1e-4);
    // Each row alone gives bit-identical results (batch invariance).
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> y1(static_cast<size_t>(out));
      linear({x.data() + r * in, w.data(), y1.data(), 1, in, out});
      for (int64_t o = 0; o < out; ++o) ASSERT_EQ(y1[o], y[r * out + o]);
    }
  }
}

TEST(Linear, ActQuantEqualsQuantisingTheInputFirst) {
  Rng rng(4);
  const int64_t rows = 3, in = 96, out = 5;
  auto x = randn(rng, rows * in), w = randn(rng, out * in);
  std::vector<float> y(size_t(rows * out)), y2(y.size());
  LinearParams p{x.data(), w.data(), y.data(), rows, in, out};
  p.act_block = 32;
  p.bf16_out = true;
  linear(p);
  auto xq = x;
  fp8_quant_dequant(xq.data(), rows, in, 32);
  linear({xq.data(), w.data(), y2.data(), rows, in, out});
  for (size_t i = 0; i < y.size(); ++i) EXPECT_EQ(y[i], round_bf16(y2[i]));
  EXPECT_NE(xq, x);  // the quantisation did change something
}

}  // namespace flashseek::ops

namespace flashseek::ops {

TEST(RmsNorm, Bf16HeadNormIsBf16AndCloseToFp32) {
  Rng rng(16);
  const int64_t rows = 5, dim = 96;
  auto x = testing::randn(rng, rows * dim, 3.0);
  for (auto& v : x) v = round_bf16(v);  // the reference's q is BF16
  auto y = x;
  rms_norm_bf16_heads(y.data(), rows, dim, 1e-6f);
  std::vector<float> z(x.size());
  rms_norm({x.data(), nullptr, z.data(), rows, dim, 1e-6f, false});
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(y[i], round_bf16(y[i]));
    EXPECT_NEAR(y[i], z[i], 0.02 * std::fabs(z[i]) + 1e-3);
  }
}

}  // namespace flashseek::ops
