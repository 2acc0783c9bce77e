#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>

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
    // The sum of squares takes the chunked order at every length (a short row is one chunk).
    const double ss_want = chunked_by_definition<double>(n, [&](int64_t i) { return double(a[i]) * double(a[i]); });
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

// Inputs for linear_abs_terms: normal values with, per row, one all-zero block (the amax floor),
// one block of tiny values (e4m3 subnormals and flushes to ±0), one outlier, and exact e4m3
// rounding ties of both signs (1.0625 lies between 1 and 1.125; 2^-10 between 0 and 2^-9 once the
// block scale is 1, which the 448 in that block makes it).
std::vector<float> hostile_activations(Rng& rng, int64_t rows, int64_t in) {
  auto x = randn(rng, rows * in);
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data() + r * in;
    if (in >= 128) {
      std::fill(xr, xr + 32, 0.0f);
      for (int64_t i = 32; i < 64; ++i) xr[i] *= 1e-6f;
      const float ties[] = {448.0f, 1.0625f, -1.0625f, 0x1p-10f, -0x1p-10f, -0x3p-10f, 0x3p-10f};
      std::copy(std::begin(ties), std::end(ties), xr + 64);
      xr[in - 1] = 3e3f;
    }
  }
  return x;
}

// Σ|x_i·w_i| against a direct double loop over the FP8-rounded input, odd shapes (rows, outputs;
// inputs odd where there is no activation block), both dot orders (<= 1024 and chunked): the FP32
// sum of n nonnegative rounded products is within γ_n = n·u / (1 − n·u) (u = 2^-24) of the exact one.
TEST(LinearAbsTerms, MatchesDoubleLoopOnOddSizes) {
  Rng rng(21);
  struct Case { int64_t rows, in, out, act_block; bool bf16_in; };
  for (const Case c : {Case{1, 1, 1, 0, false}, Case{5, 37, 19, 0, false}, Case{3, 2049, 5, 0, true},
                       Case{3, 96, 7, 32, false}, Case{7, 1056, 13, 32, false}, Case{2, 5120, 9, 128, true},
                       Case{1, 4096, 3, 128, false}}) {
    SCOPED_TRACE(::testing::Message() << c.rows << "x" << c.in << " -> " << c.out << " act_block " << c.act_block);
    const auto x = hostile_activations(rng, c.rows, c.in);
    const auto w = randn(rng, c.out * c.in, 0.1);
    std::vector<float> y(size_t(c.rows * c.out)), plain(y.size());
    LinearParams p{x.data(), w.data(), y.data(), c.rows, c.in, c.out};
    p.act_block = c.act_block;
    p.bf16_in = c.bf16_in;
    p.bf16_out = true;  // ignored: the magnitudes stay FP32
    linear_abs_terms(p);
    auto xq = x;
    if (c.bf16_in) round_bf16_inplace(xq.data(), int64_t(xq.size()));
    if (c.act_block > 0) fp8_quant_dequant(xq.data(), c.rows, c.in, c.act_block);
    LinearParams lp = p;
    lp.y = plain.data();
    lp.bf16_out = false;
    linear(lp);
    const double u = std::ldexp(1.0, -24), gamma = double(c.in) * u / (1 - double(c.in) * u);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t o = 0; o < c.out; ++o) {
        double want = 0;
        for (int64_t i = 0; i < c.in; ++i) want += std::fabs(double(xq[r * c.in + i]) * double(w[o * c.in + i]));
        const float got = y[size_t(r * c.out + o)];
        ASSERT_LE(std::fabs(double(got) - want), gamma * want) << "row " << r << " out " << o;
        // Σ|t| bounds |Σ t| (both computed in FP32: allow the two sums' rounding).
        ASSERT_GE(double(got) * (1 + gamma), std::fabs(double(plain[size_t(r * c.out + o)])) * (1 - gamma));
      }
    if (c.in > 1) EXPECT_NE(y, plain) << "no term cancelled: the inputs were meant to have both signs";
  }
}

// The identity the dot perturbation relies on (cpu_model.h, CpuLoadOptions): Σ|q(x)_i·w_i| is
// linear(|x|, |W|) with the same act_block, bit for bit — q(|x|) = |q(x)| for the code's rounding
// (amax-derived power-of-two scale, sign-symmetric e4m3 RNE, including the ties and the tiny and
// all-zero blocks of hostile_activations).
TEST(LinearAbsTerms, EqualsLinearOfAbsoluteValues) {
  Rng rng(22);
  const int64_t rows = 5, in = 1152, out = 11;
  const auto x = hostile_activations(rng, rows, in);
  const auto w = randn(rng, out * in, 0.1);
  std::vector<float> xa(x.size()), wa(w.size());
  for (size_t i = 0; i < x.size(); ++i) xa[i] = std::fabs(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wa[i] = std::fabs(w[i]);
  for (int64_t act_block : {0, 32, 128}) {
    for (bool bf16_in : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "act_block " << act_block << " bf16_in " << bf16_in);
      std::vector<float> y(size_t(rows * out)), want(y.size());
      LinearParams p{x.data(), w.data(), y.data(), rows, in, out};
      p.act_block = act_block;
      p.bf16_in = bf16_in;
      linear_abs_terms(p);
      LinearParams q{xa.data(), wa.data(), want.data(), rows, in, out};
      q.act_block = act_block;
      q.bf16_in = bf16_in;
      linear(q);
      ASSERT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0);
    }
  }
  // Element-wise: the rounding of |x| is the magnitude of the rounding of x.
  auto q1 = x, q2 = xa;
  fp8_quant_dequant(q1.data(), rows, in, 32);
  fp8_quant_dequant(q2.data(), rows, in, 32);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(std::fabs(q1[i]), q2[i]) << i;
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
