// The acceptance rule of speculative decoding (v41 §5.6) on scripted draft and target
// distributions: greedy prefixes of every length and the bonus token, and for sampling that the
// emitted tokens follow the target distribution (chi-square) whatever the draft.
#include "engine/spec_accept.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>

namespace flashseek::engine {
namespace {

constexpr int64_t kV = 7;

// A logits row [kV] whose argmax is `top` (other ids get distinct lower values).
std::vector<float> peaked(int32_t top) {
  std::vector<float> row(kV);
  for (int64_t v = 0; v < kV; ++v) row[size_t(v)] = -0.25f * float(v);
  row[size_t(top)] = 3.0f;
  return row;
}

std::vector<float> concat(const std::vector<std::vector<float>>& rows) {
  std::vector<float> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

TEST(SpecAccept, GreedyAcceptsTheMatchingPrefixThenTheTargetToken) {
  const std::vector<int32_t> target_top = {4, 1, 6, 2, 5};  // argmax of rows 0 … 4
  SamplingParams greedy{.temperature = 0};
  const std::vector<float> target = concat({peaked(4), peaked(1), peaked(6), peaked(2), peaked(5)});
  for (int64_t n = 0; n <= 4; ++n) {
    // Drafts agree with the target for the first n, then differ.
    std::vector<int32_t> drafts(target_top.begin(), target_top.begin() + 4);
    if (n < 4) drafts[size_t(n)] = (drafts[size_t(n)] + 3) % kV;
    auto v = accept_block(drafts, {}, target, kV, greedy, 10);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->accepted, n);
    EXPECT_EQ(v->bonus, target_top[size_t(n)])
        << "the bonus is the target's token after the prefix";
  }
}

TEST(SpecAccept, GreedyLaterMatchesDoNotCountAfterAMismatch) {
  const std::vector<float> target = concat({peaked(1), peaked(2), peaked(3)});
  auto v =
      accept_block(std::vector<int32_t>{0, 2}, {}, target, kV, SamplingParams{.temperature = 0}, 0);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->accepted, 0);
  EXPECT_EQ(v->bonus, 1);
}

TEST(SpecAccept, BadShapesAndTokensAreErrors) {
  const std::vector<float> target = concat({peaked(1), peaked(2)});
  SamplingParams greedy{.temperature = 0};
  EXPECT_FALSE(
      accept_block(std::vector<int32_t>{1, 2}, {}, target, kV, greedy, 0).ok());  // 3 rows needed
  EXPECT_FALSE(
      accept_block(std::vector<int32_t>{kV}, {}, target, kV, greedy, 0).ok());  // outside vocab
  SamplingParams hot{.temperature = 1.0, .seed = 1};
  EXPECT_FALSE(accept_block(std::vector<int32_t>{1}, {}, target, kV, hot, 0).ok());  // q missing
}

// Draws y from the draft row, then runs a one-draft block; returns the first emitted token.
struct Trial {
  int32_t first = 0;
  bool accepted = false;
};
Trial one_step(const std::vector<float>& draft_row, const std::vector<float>& target_rows,
               const SamplingParams& params, int64_t pos) {
  auto pick = pick_draft(draft_row, params, pos);
  EXPECT_TRUE(pick.ok());
  std::vector<SamplingDistribution> q{pick->q};
  auto v = accept_block(std::vector<int32_t>{pick->token}, q, target_rows, kV, params, pos);
  EXPECT_TRUE(v.ok());
  return {v->accepted == 1 ? pick->token : v->bonus, v->accepted == 1};
}

double chi_square(const std::vector<int64_t>& counts, const SamplingDistribution& p, int64_t n) {
  std::vector<double> expect(size_t(kV), 0.0);
  for (size_t i = 0; i < p.ids.size(); ++i) expect[size_t(p.ids[i])] = p.probs[i] * double(n);
  double chi = 0;
  for (int64_t v = 0; v < kV; ++v) {
    if (expect[size_t(v)] == 0) {
      EXPECT_EQ(counts[size_t(v)], 0) << "token " << v << " is outside the target's support";
      continue;
    }
    const double d = double(counts[size_t(v)]) - expect[size_t(v)];
    chi += d * d / expect[size_t(v)];
  }
  return chi;
}

struct Case {
  const char* name;
  SamplingParams params;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class SpecSampling : public ::testing::TestWithParam<Case> {};

TEST_P(SpecSampling, EmittedTokensFollowTheTargetDistribution) {
  const std::vector<float> p_row = {1.0f, 0.2f, -1.0f, 2.0f, 0.5f, -3.0f, 0.9f};
  const std::vector<float> q_row = {-0.5f, 2.5f, 0.7f, 0.1f, -2.0f, 1.0f, 0.0f};  // a poor draft
  const std::vector<float> target = concat({p_row, peaked(0)});
  const int64_t n = 40000;
  std::vector<int64_t> counts(size_t(kV), 0);
  int64_t accepted = 0;
  for (int64_t s = 0; s < n; ++s) {
    SamplingParams params = GetParam().params;
    params.seed = uint64_t(s) * 7919 + 13;
    const Trial t = one_step(q_row, target, params, 100 + s % 5);
    ++counts[size_t(t.first)];
    accepted += t.accepted;
  }
  auto p = sampling_distribution(p_row, GetParam().params);
  auto q = sampling_distribution(q_row, GetParam().params);
  ASSERT_TRUE(p.ok() && q.ok());
  // df ≤ 6; 22.46 is the 0.999 quantile for df = 6 (the RNG is deterministic, so no flakiness).
  EXPECT_LT(chi_square(counts, *p, n), 22.46);
  // Acceptance rate = Σ_v min(p(v), q(v)) (Leviathan et al., Thm 3.5), within 5 sigma.
  std::vector<double> dp(size_t(kV), 0.0);
  for (size_t i = 0; i < p->ids.size(); ++i) dp[size_t(p->ids[i])] = p->probs[i];
  double overlap = 0;
  for (size_t i = 0; i < q->ids.size(); ++i)
    overlap += std::min(q->probs[i], dp[size_t(q->ids[i])]);
  const double rate = double(accepted) / double(n),
               sigma = std::sqrt(overlap * (1 - overlap) / double(n));
  EXPECT_NEAR(rate, overlap, 5 * sigma + 1e-12);
  EXPECT_LT(overlap, 0.9) << "the scripted draft should differ from the target";
}

TEST_P(SpecSampling, ADraftEqualToTheTargetIsAlwaysAccepted) {
  const std::vector<float> row = {0.3f, 1.1f, -0.4f, 2.0f, 0.0f, 0.7f, -1.5f};
  // Four drafts drawn from the target's own rows: every one must pass.
  const std::vector<float> target = concat({row, row, row, row, peaked(2)});
  for (int64_t s = 0; s < 2000; ++s) {
    SamplingParams params = GetParam().params;
    params.seed = uint64_t(s);
    std::vector<int32_t> drafts;
    std::vector<SamplingDistribution> q;
    for (int64_t i = 0; i < 4; ++i) {
      auto pick = pick_draft(row, params, 50 + i);
      ASSERT_TRUE(pick.ok());
      drafts.push_back(pick->token);
      q.push_back(pick->q);
    }
    auto v = accept_block(drafts, q, target, kV, params, 50);
    ASSERT_TRUE(v.ok());
    ASSERT_EQ(v->accepted, 4) << "seed " << s;
  }
}

TEST_P(SpecSampling, ATokenTheTargetExcludesIsNeverEmitted) {
  // The target gives token 3 probability 0 (after its transform); the draft loves it.
  std::vector<float> p_row = {0.5f, 0.4f, 0.3f, -1e30f, 0.2f, 0.1f, 0.0f};
  std::vector<float> q_row = {-5.0f, -5.0f, -5.0f, 8.0f, -5.0f, -5.0f, -5.0f};
  const std::vector<float> target = concat({p_row, peaked(1)});
  int64_t rejected = 0;
  for (int64_t s = 0; s < 3000; ++s) {
    SamplingParams params = GetParam().params;
    params.seed = uint64_t(s) + 1;
    const Trial t = one_step(q_row, target, params, 7);
    ASSERT_NE(t.first, 3);  // neither accepted nor drawn from the residual
    rejected += !t.accepted;
  }
  EXPECT_GT(rejected, 2900) << "the draft proposes token 3 almost always; it must be rejected";
}

INSTANTIATE_TEST_SUITE_P(Transforms, SpecSampling,
                         ::testing::Values(Case{"plain", {.temperature = 1.0}},
                                           Case{"hot_topk", {.temperature = 1.7, .top_k = 5}},
                                           Case{"cool_topp", {.temperature = 0.6, .top_p = 0.85}},
                                           Case{"minp", {.temperature = 1.0, .min_p = 0.05}}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SpecResidual, IsTheNormalisedPositivePartOfTheDifference) {
  SamplingDistribution p{{0, 1, 2}, {0.5, 0.3, 0.2}}, q{{2, 1, 4}, {0.6, 0.1, 0.3}};
  const SamplingDistribution r = residual_distribution(p, q, kV);
  // p − q: id0 +0.5, id1 +0.2, id2 −0.4, id4 −0.3 → {0: 5/7, 1: 2/7}.
  ASSERT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(r.probs[0], 5.0 / 7, 1e-12);
  EXPECT_NEAR(r.probs[1], 2.0 / 7, 1e-12);
  const SamplingDistribution same = residual_distribution(p, p, kV);
  EXPECT_EQ(same.ids, p.ids);  // no mass left: falls back to p
}

TEST(SpecStreams, AreDistinctFromTheSamplerAndEachOther) {
  for (uint64_t seed : {0ull, 1ull, 12345ull}) {
    EXPECT_NE(spec_draft_seed(seed), seed);
    EXPECT_NE(spec_draft_seed(seed), spec_accept_seed(seed));
    EXPECT_NE(spec_accept_seed(seed), spec_residual_seed(seed));
  }
}

}  // namespace
}  // namespace flashseek::engine
