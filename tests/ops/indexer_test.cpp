#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "ops/compressor.h"
#include "ops/indexer.h"
#include "test_util.h"

namespace flashseek::ops {
using testing::randn;
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Indexer, ScoresMatchDouble) {
  Rng rng(11);
  const int64_t H = 3, D = 32, n = 9;
  auto q = randn(rng, H * D), w = randn(rng, H), k = randn(rng, n * D);
  std::vector<float> s(n);
  index_scores({q.data(), w.data(), k.data(), n, H, D, false, s.data()});
  for (int64_t t = 0; t < n; ++t) {
    double ref = 0;
    for (int64_t h = 0; h < H; ++h) {
      double d = 0;
      for (int64_t i = 0; i < D; ++i) d += double(q[h * D + i]) * k[t * D + i];
      ref += std::max(d, 0.0) * w[h];
    }
    EXPECT_NEAR(s[t], ref, 1e-4);
  }
}

TEST(Indexer, TopkDropsAndBreaksTiesLowIndexFirst) {
  std::vector<float> s = {1, 5, 3, 5, -kInf, 2, 5, 0};
  EXPECT_EQ(topk_indices(s.data(), 8, 2), (std::vector<int32_t>{1, 3}));  // tie of three 5s
  EXPECT_EQ(topk_indices(s.data(), 8, 4), (std::vector<int32_t>{1, 2, 3, 6}));
  // k larger than the finite count: every finite index, ascending; −inf never selected.
  EXPECT_EQ(topk_indices(s.data(), 8, 100), (std::vector<int32_t>{0, 1, 2, 3, 5, 6, 7}));
  EXPECT_TRUE(topk_indices(s.data(), 0, 4).empty());
}

TEST(Indexer, TopkRandomMatchesSort) {
  Rng rng(12);
  for (int64_t n : {1, 7, 100, 513}) {
    auto s = randn(rng, n);
    for (int64_t k : {1, 4, 512}) {
      auto got = topk_indices(s.data(), n, k);
      std::vector<int32_t> all(n);
      for (int64_t i = 0; i < n; ++i) all[i] = int32_t(i);
      std::sort(all.begin(), all.end(), [&](int a, int b) { return s[a] > s[b]; });
      all.resize(std::min(n, k));
      std::sort(all.begin(), all.end());
      EXPECT_EQ(got, all);
    }
  }
}

TEST(Indexer, CandidateMaskPinsNewestBlock) {
  // 10 reachable positions (clen 10) of n = 12, blocks of 4: blocks {0..3}, {4..7}, {8..11}.
  // Block scores: 9, 7, low (position 9 is the newest visible one, in block 2 → pinned).
  std::vector<float> s = {9, 0, 0, 0, 7, 0, 0, 0, -5, -6, -kInf, -kInf};
  std::vector<uint8_t> m(12);
  candidate_mask(s.data(), 12, 10, 4, 2, m.data());
  // Keep 2 blocks: the pinned block 2 and the best other (block 0).
  EXPECT_EQ(m, (std::vector<uint8_t>{1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1}));
  // Without pinning pressure (3 blocks kept) everything reachable is kept.
  candidate_mask(s.data(), 12, 10, 4, 3, m.data());
  EXPECT_EQ(m, (std::vector<uint8_t>(12, 1)));
  // Unreachable blocks are dropped even when fewer than K are reachable.
  std::vector<float> u = {1, 2, -kInf, -kInf, -kInf, -kInf, -kInf, -kInf};
  candidate_mask(u.data(), 8, 2, 2, 4, m.data());
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.begin() + 8), (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0, 0}));
  // clen = 0 pins nothing and keeps nothing.
  candidate_mask(u.data(), 8, 0, 2, 4, m.data());
  std::vector<float> none(8, -kInf);
  candidate_mask(none.data(), 8, 0, 2, 4, m.data());
  EXPECT_EQ(std::vector<uint8_t>(m.begin(), m.begin() + 8), std::vector<uint8_t>(8, 0));
}

TEST(Compressor, SoftmaxPoolPerChannelWithEmptySlots) {
  std::vector<float> v0 = {1, 10}, v1 = {3, 20}, z0 = {0, 0}, z1 = {std::log(3.0f), -100};
  const float* v[3] = {v0.data(), nullptr, v1.data()};
  const float* z[3] = {z0.data(), nullptr, z1.data()};
  std::vector<float> out(2);
  softmax_pool({v, z, 3, 2, out.data()});
  EXPECT_NEAR(out[0], 0.25 * 1 + 0.75 * 3, 1e-6);  // weights 1:3
  EXPECT_NEAR(out[1], 10.0, 1e-6);                  // channel 1 dominated by slot 0
}

}  // namespace flashseek::ops
