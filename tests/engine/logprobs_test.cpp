// Reported logprobs: normalisation, ordering, shift invariance, masking and errors.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "engine/logprobs.h"

namespace flashseek::engine {
namespace {

TEST(Logprobs, FullTopKIsANormalisedDistribution) {
  Rng rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    const size_t V = 1 + rng.below(300);
    std::vector<float> logits(V);
    for (auto& x : logits) x = float(rng.normal() * 5 + 30);  // large offset: needs max-shift
    const int32_t chosen = int32_t(rng.below(V));
    auto lp = position_logprobs(logits, chosen, int64_t(V) + 10);  // K > V is clamped
    ASSERT_TRUE(lp.ok()) << lp.status().to_string();
    ASSERT_EQ(lp->top.size(), V);
    double sum = 0;
    for (size_t i = 0; i < V; ++i) {
      sum += std::exp(double(lp->top[i].logprob));
      EXPECT_LE(lp->top[i].logprob, 0.0f);
      if (i > 0) {
        EXPECT_GE(lp->top[i - 1].logprob, lp->top[i].logprob);
        if (lp->top[i - 1].logprob == lp->top[i].logprob) {
          EXPECT_LT(lp->top[i - 1].id, lp->top[i].id);
        }
      }
      if (lp->top[i].id == chosen) {
        EXPECT_EQ(lp->top[i].logprob, lp->chosen.logprob);
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    // Each value is logit - logsumexp, computed independently here in double.
    double mx = -INFINITY, s = 0;
    for (float x : logits) mx = std::max(mx, double(x));
    for (float x : logits) s += std::exp(double(x) - mx);
    EXPECT_NEAR(lp->chosen.logprob, double(logits[size_t(chosen)]) - mx - std::log(s), 1e-5);
  }
}

TEST(Logprobs, ShiftInvariantAndTopKIsPrefix) {
  std::vector<float> a = {0.5f, -1.0f, 2.0f, 2.0f, 0.0f};
  std::vector<float> b = a;
  for (auto& x : b) x += 100.0f;
  auto la = *position_logprobs(a, 4, 5);
  auto lb = *position_logprobs(b, 4, 5);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(la.top[i].id, lb.top[i].id);
    EXPECT_NEAR(la.top[i].logprob, lb.top[i].logprob, 1e-5);
  }
  EXPECT_EQ(la.top[0].id, 2);  // tie 2.0 / 2.0 -> lower id first
  EXPECT_EQ(la.top[1].id, 3);
  auto l2 = *position_logprobs(a, 4, 2);
  ASSERT_EQ(l2.top.size(), 2u);
  EXPECT_EQ(l2.top[0].id, la.top[0].id);
  EXPECT_EQ(l2.top[1].id, la.top[1].id);
  auto l0 = *position_logprobs(a, 1, 0);
  EXPECT_TRUE(l0.top.empty());
  EXPECT_NEAR(l0.chosen.logprob, la.top[4].logprob, 1e-6);  // id 1 has the lowest logit
}

TEST(Logprobs, MaskedEntriesAndErrors) {
  std::vector<float> m = {-INFINITY, 0.0f, 0.0f, -INFINITY};
  auto lp = *position_logprobs(m, 0, 4);
  EXPECT_TRUE(std::isinf(lp.chosen.logprob) && lp.chosen.logprob < 0);
  EXPECT_NEAR(lp.top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_NEAR(lp.top[1].logprob, std::log(0.5), 1e-6);
  auto bad = position_logprobs(m, 4, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("token id 4"), std::string::npos);
  EXPECT_FALSE(position_logprobs(m, -1, 1).ok());
  std::vector<float> none = {-INFINITY, NAN};
  EXPECT_FALSE(position_logprobs(none, 0, 1).ok());
}

}  // namespace
}  // namespace flashseek::engine
