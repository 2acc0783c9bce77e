#include <cmath>

#include <gtest/gtest.h>

#include "ops/mhc.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::randn;

namespace {
double sig(double v) { return 1 / (1 + std::exp(-v)); }
}

TEST(Mhc, MixesMatchDoubleReference) {
  Rng rng(9);
  const int64_t hc = 4, dim = 37, rows = 2, nm = (2 + hc) * hc;
  auto x = randn(rng, rows * hc * dim, 4.0), fn = randn(rng, nm * hc * dim, 0.05);
  auto base = randn(rng, nm), scale = randn(rng, 3);
  std::vector<float> pre(rows * hc), post(rows * hc), comb(rows * hc * hc);
  HcMixParams p{x.data(), fn.data(), base.data(), scale.data(), rows, hc, dim, 1e-20f, 1e-6f, 20,
                pre.data(), post.data(), comb.data()};
  hc_mixes(p);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x.data() + r * hc * dim;
    double ss = 0;
    for (int64_t i = 0; i < hc * dim; ++i) ss += double(xr[i]) * xr[i];
    const double rs = 1 / std::sqrt(ss / (hc * dim) + 1e-20);
    std::vector<double> mu(nm);
    for (int64_t m = 0; m < nm; ++m) {
      double s = 0;
      for (int64_t i = 0; i < hc * dim; ++i) s += double(fn[m * hc * dim + i]) * xr[i];
      mu[m] = s * rs;
    }
    for (int64_t i = 0; i < hc; ++i) {
      EXPECT_NEAR(pre[r * hc + i], sig(mu[i] * scale[0] + base[i]) + 1e-6, 1e-5);
      EXPECT_NEAR(post[r * hc + i], 2 * sig(mu[hc + i] * scale[1] + base[hc + i]), 1e-5);
    }
    // Sinkhorn in double: row softmax + eps, col, then 19 × (row, col).
    double P[4][4];
    for (int j = 0; j < 4; ++j) {
      double mx = -1e300, s = 0;
      for (int k = 0; k < 4; ++k) mx = std::max(mx, mu[8 + 4 * j + k] * scale[2] + base[8 + 4 * j + k]);
      for (int k = 0; k < 4; ++k) s += (P[j][k] = std::exp(mu[8 + 4 * j + k] * scale[2] + base[8 + 4 * j + k] - mx));
      for (int k = 0; k < 4; ++k) P[j][k] = P[j][k] / s + 1e-6;
    }
    auto col = [&] {
      for (int k = 0; k < 4; ++k) {
        double s = 0;
        for (int j = 0; j < 4; ++j) s += P[j][k];
        for (int j = 0; j < 4; ++j) P[j][k] /= s + 1e-6;
      }
    };
    col();
    for (int it = 1; it < 20; ++it) {
      for (int j = 0; j < 4; ++j) {
        double s = 0;
        for (int k = 0; k < 4; ++k) s += P[j][k];
        for (int k = 0; k < 4; ++k) P[j][k] /= s + 1e-6;
      }
      col();
    }
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_NEAR(comb[r * 16 + j * 4 + k], P[j][k], 1e-5);
    // The last step is a column normalisation: columns sum to ~1.
    for (int k = 0; k < 4; ++k) {
      double s = 0;
      for (int j = 0; j < 4; ++j) s += comb[r * 16 + j * 4 + k];
      EXPECT_NEAR(s, 1.0, 1e-5);
    }
  }
}

TEST(Mhc, PostUsesTransposedComb) {
  // Hand case: comb = e_{0,1} (P[0][1] = 1): stream 1 receives stream 0; P·X would move stream 1.
  const int64_t hc = 2, dim = 1;
  std::vector<float> x = {3, 5}, f = {10}, post = {0.5f, 2.0f}, comb = {0, 1, 0, 0}, out(2);
  hc_post(f.data(), x.data(), post.data(), comb.data(), out.data(), 1, hc, dim, false);
  EXPECT_EQ(out[0], 0.5f * 10);          // Σ_j P[j][0] x_j = 0
  EXPECT_EQ(out[1], 2.0f * 10 + 3.0f);   // Σ_j P[j][1] x_j = x_0
  std::vector<float> pre = {0.25f, 2.0f}, u(1);
  hc_collapse(x.data(), pre.data(), u.data(), 1, hc, dim, false);
  EXPECT_EQ(u[0], 0.25f * 3 + 2.0f * 5);
}

}  // namespace flashseek::ops

namespace flashseek::ops {

TEST(Mhc, HeadPreMatchesDouble) {
  Rng rng(15);
  const int64_t hc = 4, dim = 21, rows = 3;
  auto x = testing::randn(rng, rows * hc * dim, 2.0), fn = testing::randn(rng, hc * hc * dim, 0.1);
  auto base = testing::randn(rng, hc), scale = testing::randn(rng, 1);
  std::vector<float> pre(rows * hc);
  hc_head_pre(x.data(), fn.data(), base.data(), scale.data(), pre.data(), rows, hc, dim, 1e-6f, 1e-6f);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < hc * dim; ++i) ss += double(x[r * hc * dim + i]) * x[r * hc * dim + i];
    const double rs = 1 / std::sqrt(ss / (hc * dim) + 1e-6);
    for (int64_t i = 0; i < hc; ++i) {
      double mu = 0;
      for (int64_t j = 0; j < hc * dim; ++j) mu += double(fn[i * hc * dim + j]) * x[r * hc * dim + j];
      EXPECT_NEAR(pre[r * hc + i], 1 / (1 + std::exp(-(mu * rs * scale[0] + base[i]))) + 1e-6, 1e-5);
    }
  }
}

}  // namespace flashseek::ops
