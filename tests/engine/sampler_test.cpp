// Sampling: support and frequencies of temperature / top-k / top-p / min-p, edge cases, and
// the (seed, position) keying that makes seeded requests independent of scheduling.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "core/rng.h"
#include "engine/sampler.h"

namespace flashseek::engine {
namespace {

// Softmax of logits / t over the ids in `keep` (all ids when empty), in double.
std::map<int32_t, double> reference_probs(const std::vector<float>& logits, double t,
                                          const std::set<int32_t>& keep) {
  std::map<int32_t, double> p;
  double mx = -INFINITY, sum = 0;
  for (size_t v = 0; v < logits.size(); ++v)
    if (keep.empty() || keep.count(int32_t(v))) mx = std::max(mx, logits[v] / t);
  for (size_t v = 0; v < logits.size(); ++v)
    if (keep.empty() || keep.count(int32_t(v)))
      sum += (p[int32_t(v)] = std::exp(logits[v] / t - mx));
  for (auto& [id, q] : p) q /= sum;
  return p;
}

// Pearson chi-square of `n` draws (positions 0..n-1, one seed) against `expected`.
double chi_square(const std::vector<float>& logits, const SamplingParams& params,
                  const std::map<int32_t, double>& expected, int n, std::set<int32_t>* seen) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    auto tok = sample_token(logits, params, i);
    EXPECT_TRUE(tok.ok()) << tok.status().to_string();
    ++counts[*tok];
    seen->insert(*tok);
  }
  double chi = 0;
  for (auto& [id, p] : expected) {
    const double e = p * n;
    const double d = counts[id] - e;
    chi += d * d / e;
  }
  return chi;
}

const std::vector<float> kLogits = {1.0f, 2.5f, 0.2f, -1.0f, 2.0f, 0.9f, 1.7f};

TEST(Sampler, TemperatureFrequenciesMatchSoftmax) {
  SamplingParams p;
  p.temperature = 0.8;
  p.seed = 42;
  std::set<int32_t> seen;
  // 6 degrees of freedom: chi2 < 22.46 at p = 0.001.
  EXPECT_LT(chi_square(kLogits, p, reference_probs(kLogits, 0.8, {}), 30000, &seen), 22.46);
  EXPECT_EQ(seen.size(), kLogits.size());
}

TEST(Sampler, TopKRestrictsSupportAndRenormalises) {
  SamplingParams p;
  p.temperature = 1.3;
  p.top_k = 3;
  p.seed = 7;
  std::set<int32_t> top3 = {1, 4, 6};  // logits 2.5, 2.0, 1.7
  std::set<int32_t> seen;
  EXPECT_LT(chi_square(kLogits, p, reference_probs(kLogits, 1.3, top3), 20000, &seen), 13.82);
  EXPECT_EQ(seen, top3);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.7;
  p.seed = 9;
  auto full = reference_probs(kLogits, 1.0, {});
  // Descending: 1 (.38), 4 (.23), 6 (.17) -> cumulative .79 >= .7 only after three tokens.
  ASSERT_LT(full[1] + full[4], 0.7);
  ASSERT_GE(full[1] + full[4] + full[6], 0.7);
  std::set<int32_t> nucleus = {1, 4, 6};
  std::set<int32_t> seen;
  EXPECT_LT(chi_square(kLogits, p, reference_probs(kLogits, 1.0, nucleus), 20000, &seen), 13.82);
  EXPECT_EQ(seen, nucleus);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0;
  p.min_p = 0.5;  // keep prob >= 0.5 * p(max): logit >= 2.5 - ln 2 = 1.807
  p.seed = 3;
  std::set<int32_t> kept = {1, 4};
  std::set<int32_t> seen;
  EXPECT_LT(chi_square(kLogits, p, reference_probs(kLogits, 1.0, kept), 10000, &seen), 10.83);
  EXPECT_EQ(seen, kept);
}

TEST(Sampler, EdgeCases) {
  SamplingParams p;
  p.temperature = 1.0;
  // top_p = 1 and k > vocab: no filtering at all.
  p.top_p = 1.0;
  p.top_k = 1000;
  auto d = sampling_distribution(kLogits, p);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->ids.size(), kLogits.size());
  // k = 1 is greedy even at high temperature.
  p.top_k = 1;
  p.temperature = 50;
  for (int pos = 0; pos < 50; ++pos) EXPECT_EQ(*sample_token(kLogits, p, pos), 1);
  // All-equal logits: uniform; top-k keeps the lowest ids; top-p keeps ceil(p * V).
  std::vector<float> flat(7, 0.25f);
  p = {};
  d = sampling_distribution(flat, p);
  for (double q : d->probs) EXPECT_NEAR(q, 1.0 / 7, 1e-12);
  p.top_k = 3;
  d = sampling_distribution(flat, p);
  EXPECT_EQ(d->ids, (std::vector<int32_t>{0, 1, 2}));
  p.top_k = 0;
  p.top_p = 0.5;
  d = sampling_distribution(flat, p);
  EXPECT_EQ(d->ids, (std::vector<int32_t>{0, 1, 2, 3}));
  // Greedy ties go to the lowest id; -inf entries are never chosen.
  EXPECT_EQ(*argmax_token(flat), 0);
  std::vector<float> masked = {-INFINITY, 3.0f, 3.0f, -INFINITY};
  EXPECT_EQ(*argmax_token(masked), 1);
  p = {};
  for (int pos = 0; pos < 100; ++pos) {
    int32_t t = *sample_token(masked, p, pos);
    EXPECT_TRUE(t == 1 || t == 2);
  }
  // Single-token vocabulary.
  EXPECT_EQ(*sample_token(std::vector<float>{0.5f}, p, 0), 0);
}

TEST(Sampler, ErrorsNameTheField) {
  SamplingParams p;
  p.top_p = 0;
  auto r = sample_token(kLogits, p, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("top_p"), std::string::npos);
  p = {};
  p.min_p = 1.5;
  EXPECT_NE(sample_token(kLogits, p, 0).status().message().find("min_p"), std::string::npos);
  p = {};
  p.temperature = NAN;
  EXPECT_NE(sample_token(kLogits, p, 0).status().message().find("temperature"),
            std::string::npos);
  p = {};
  std::vector<float> none = {-INFINITY, NAN};
  EXPECT_FALSE(sample_token(none, p, 0).ok());
  p.temperature = 0;
  EXPECT_FALSE(sample_token(none, p, 0).ok());
  EXPECT_FALSE(sample_token(std::vector<float>{}, p, 0).ok());
}

TEST(Sampler, SeedAndPositionKeyTheDraw) {
  std::vector<float> flat(50, 0.0f);
  SamplingParams a;
  a.seed = 1;
  SamplingParams b = a;
  b.seed = 2;
  int same_seed_equal = 0, diff_seed_equal = 0;
  for (int pos = 0; pos < 200; ++pos) {
    same_seed_equal += *sample_token(flat, a, pos) == *sample_token(flat, a, pos);
    diff_seed_equal += *sample_token(flat, a, pos) == *sample_token(flat, b, pos);
  }
  EXPECT_EQ(same_seed_equal, 200);
  EXPECT_LT(diff_seed_equal, 20);  // 1/50 chance each: about 4 expected
  // Order of calls does not matter (no hidden stream state).
  std::vector<int32_t> forward_order, backward_order(200);
  for (int pos = 0; pos < 200; ++pos) forward_order.push_back(*sample_token(flat, a, pos));
  for (int pos = 199; pos >= 0; --pos) backward_order[size_t(pos)] = *sample_token(flat, a, pos);
  EXPECT_EQ(forward_order, backward_order);
}

// Randomized: for every filter combination the support is "closed upwards" (a token with a higher
// logit than a kept token is kept), probabilities sum to 1 and follow the scaled softmax ratios.
TEST(Sampler, RandomizedSupportInvariants) {
  Rng rng(123);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t V = 1 + rng.below(257);
    std::vector<float> logits(V);
    for (auto& x : logits) x = float(rng.normal() * 3);
    if (V > 4) logits[rng.below(V)] = logits[rng.below(V)];  // a tie now and then
    SamplingParams p;
    p.temperature = 0.1 + rng.uniform() * 2;
    p.top_k = int64_t(rng.below(V + 3));
    p.top_p = rng.uniform() < 0.3 ? 1.0 : 0.05 + 0.95 * rng.uniform();
    p.min_p = rng.uniform() < 0.5 ? 0.0 : rng.uniform() * 0.5;
    auto d = sampling_distribution(logits, p);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    ASSERT_FALSE(d->ids.empty());
    if (p.top_k > 0) {
      EXPECT_LE(d->ids.size(), size_t(p.top_k));
    }
    double sum = 0;
    std::set<int32_t> kept(d->ids.begin(), d->ids.end());
    EXPECT_EQ(kept.size(), d->ids.size()) << "duplicate ids";
    float min_kept = INFINITY;
    for (size_t i = 0; i < d->ids.size(); ++i) {
      sum += d->probs[i];
      min_kept = std::min(min_kept, logits[size_t(d->ids[i])]);
      const double ratio = d->probs[i] / d->probs[0];
      const double want = std::exp(
          (double(logits[size_t(d->ids[i])]) - double(logits[size_t(d->ids[0])])) /
          p.temperature);
      EXPECT_NEAR(ratio, want, 1e-9 * want + 1e-300);
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
    for (size_t v = 0; v < V; ++v) {
      if (logits[v] > min_kept) {
        EXPECT_TRUE(kept.count(int32_t(v))) << "trial " << trial;
      }
    }
    // The draw lands inside the support.
    auto tok = sample_token(logits, p, int64_t(trial));
    ASSERT_TRUE(tok.ok());
    EXPECT_TRUE(p.greedy() || kept.count(*tok));
  }
}

}  // namespace
}  // namespace flashseek::engine
