#include <cmath>
#include <cstring>
#include <functional>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "ops/cpu/sum_order.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/quant.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::max_abs_diff;
using testing::randn;

TEST(RmsNorm, MatchesDoubleOnOddSizes) {
  Rng rng(1);
  for (int64_t dim : {1, 7, 33, 129, 1000, 1025, 5120}) {
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
                               {17, 256, 131}, {3, 1000, 7}, {3, 2049, 5}, {2, 5120, 9}}) {
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

// The chunked order of ops/cpu/sum_order.h written out independently: 128 partials per chunk
// (element j of a chunk into j % 128), the lanes combined as a warp's xor butterfly (lane 0's
// value), the chunk sums by a recursive power-of-two split.
template <typename Acc, typename Term>
Acc chunked_by_definition(int64_t n, Term term) {
  const int64_t m = (n + 1023) / 1024;
  std::vector<Acc> c(static_cast<size_t>(m));
  for (int64_t k = 0; k < m; ++k) {
    Acc p[128] = {};
    for (int64_t i = k * 1024; i < std::min(n, (k + 1) * 1024); ++i) p[(i - k * 1024) % 128] += term(i);
    Acc v[32];
    for (int l = 0; l < 32; ++l) v[l] = (p[4 * l] + p[4 * l + 1]) + (p[4 * l + 2] + p[4 * l + 3]);
    for (int off = 16; off >= 1; off /= 2) {
      Acc w[32];
      for (int l = 0; l < 32; ++l) w[l] = v[l] + v[l ^ off];
      std::copy(w, w + 32, v);
    }
    c[static_cast<size_t>(k)] = v[0];
  }
  std::function<Acc(int64_t, int64_t)> tree = [&](int64_t lo, int64_t size) -> Acc {
    if (size == 1) return c[static_cast<size_t>(lo)];
    if (lo + size / 2 >= m) return tree(lo, size / 2);
    return tree(lo, size / 2) + tree(lo + size / 2, size / 2);
  };
  int64_t size = 1;
  while (size < m) size *= 2;
  return tree(0, size);
}

TEST(DotF32, ShortAndChunkedOrdersMatchTheirDefinitions) {
  Rng rng(11);
  for (int64_t n : {1, 7, 8, 9, 1023, 1024, 1025, 1031, 2048, 2049, 3 * 1024 + 17, 5120, 20480, 65 * 1024 + 3}) {
    SCOPED_TRACE(n);
    const auto a = randn(rng, n), b = randn(rng, n);
    const float got = dot_f32(a.data(), b.data(), n);
    float want;
    if (n <= 1024) {
      float s[8] = {};
      for (int64_t i = 0; i < n; ++i) s[i % 8] += a[i] * b[i];
      want = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    } else {
      want = chunked_by_definition<float>(n, [&](int64_t i) { return a[i] * b[i]; });
    }
    EXPECT_EQ(std::memcmp(&got, &want, 4), 0) << got << " vs " << want;
    double d = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) d += double(a[i]) * b[i], mag += std::fabs(double(a[i]) * b[i]);
    EXPECT_LE(std::fabs(got - d), 1e-6 * mag + 1e-30);
    const double ss = detail::sumsq_f64(a.data(), n);
    double ss_want = 0;
    if (n <= 1024) {
      for (int64_t i = 0; i < n; ++i) ss_want += double(a[i]) * double(a[i]);
    } else {
      ss_want = chunked_by_definition<double>(n, [&](int64_t i) { return double(a[i]) * double(a[i]); });
    }
    EXPECT_EQ(std::memcmp(&ss, &ss_want, 8), 0) << ss << " vs " << ss_want;
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
