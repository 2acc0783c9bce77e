#include <cmath>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "ops/attention.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::randn;

TEST(SparseAttention, MatchesDoubleWithSinkAndPadding) {
  Rng rng(10);
  for (int64_t n_keys : {1, 5, 13, 70}) {
    const int64_t H = 3, D = 24;
    auto q = randn(rng, H * D), kv = randn(rng, n_keys * D), sink = randn(rng, H);
    std::vector<const float*> keys;
    for (int64_t s = 0; s < n_keys; ++s) {
      keys.push_back(kv.data() + s * D);
      if (s % 3 == 1) keys.push_back(nullptr);  // −1 padding entries contribute nothing
    }
    std::vector<float> out(H * D);
    const float scale = 1.0f / std::sqrt(float(D));
    sparse_attention({q.data(), keys.data(), int64_t(keys.size()), H, D, sink.data(), scale, false,
                      out.data()});
    for (int64_t h = 0; h < H; ++h) {
      std::vector<double> l(n_keys);
      double mx = -1e300;
      for (int64_t s = 0; s < n_keys; ++s) {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += double(q[h * D + i]) * kv[s * D + i];
        l[s] = d * scale;
        mx = std::max(mx, l[s]);
      }
      double den = std::exp(sink[h] - mx);
      for (auto v : l) den += std::exp(v - mx);
      for (int64_t i = 0; i < D; ++i) {
        double o = 0;
        for (int64_t s = 0; s < n_keys; ++s) o += std::exp(l[s] - mx) / den * kv[s * D + i];
        EXPECT_NEAR(out[h * D + i], o, 1e-5);
      }
    }
  }
}

TEST(SparseAttention, HugeSinkSilencesAndNoKeysGiveZero) {
  std::vector<float> q(4, 1.0f), k(4, 1.0f), out(4, 9.0f);
  const float* keys[1] = {k.data()};
  float sink = 1000.0f;
  sparse_attention({q.data(), keys, 1, 1, 4, &sink, 0.5f, false, out.data()});
  for (float v : out) EXPECT_NEAR(v, 0.0f, 1e-30);
  sink = -1000.0f;  // sink negligible → softmax over one key = the key itself
  sparse_attention({q.data(), keys, 1, 1, 4, &sink, 0.5f, false, out.data()});
  for (float v : out) EXPECT_FLOAT_EQ(v, 1.0f);
  const float* none[1] = {nullptr};
  sparse_attention({q.data(), none, 1, 1, 4, &sink, 0.5f, false, out.data()});
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

}  // namespace flashseek::ops
