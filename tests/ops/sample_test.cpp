// The sampling twin (ops/cpu/sample.cpp) against a frozen copy of the engine's sampler as it was
// before the rule moved into ops (engine/sampler.cpp at 301dd79), on random rows with ties, -inf
// and NaN entries and every filter; plus sample_rows_ref's row handling and its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "ops/sample.h"

namespace flashseek::ops {
namespace {

// ---- frozen copy of the pre-refactor engine sampler (do not edit: it is the behaviour oracle) ----
namespace legacy {

struct Dist {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};

int64_t argmax(const std::vector<float>& logits) {
  int64_t best = -1;
  for (size_t v = 0; v < logits.size(); ++v) {
    if (!std::isfinite(logits[v])) continue;
    if (best < 0 || logits[v] > logits[size_t(best)]) best = int64_t(v);
  }
  return best;
}

std::vector<double> scaled_softmax(const std::vector<float>& logits, const std::vector<int32_t>& ids,
                                   double inv_t) {
  double mx = -INFINITY;
  for (int32_t id : ids) mx = std::max(mx, double(logits[size_t(id)]) * inv_t);
  std::vector<double> probs(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp(double(logits[size_t(ids[i])]) * inv_t - mx);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  return probs;
}

void apply_top_p(Dist& d, const std::vector<float>& logits, double top_p) {
  struct Cand {
    float logit;
    int32_t id;
    double prob;
  };
  std::vector<Cand> c(d.ids.size());
  for (size_t i = 0; i < c.size(); ++i) c[i] = {logits[size_t(d.ids[i])], d.ids[i], d.probs[i]};
  auto higher = [](const Cand& a, const Cand& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  size_t k = std::min<size_t>(c.size(), 256);
  size_t n = 0;
  while (true) {
    if (k < c.size()) std::nth_element(c.begin(), c.begin() + ptrdiff_t(k), c.end(), higher);
    std::sort(c.begin(), c.begin() + ptrdiff_t(k), higher);
    double cum = 0;
    n = 0;
    while (n < k && cum < top_p) cum += c[n++].prob;
    if (cum >= top_p || k == c.size()) break;
    k = std::min(c.size(), k * 8);
  }
  d.ids.resize(n);
  d.probs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.ids[i] = c[i].id;
    d.probs[i] = c[i].prob;
  }
}

// Returns false where the old code returned an error (no finite logit).
bool distribution(const std::vector<float>& logits, const SampleSpec& p, Dist& d) {
  if (p.greedy()) {
    const int64_t best = argmax(logits);
    if (best < 0) return false;
    d.ids = {int32_t(best)};
    d.probs = {1.0};
    return true;
  }
  for (size_t v = 0; v < logits.size(); ++v)
    if (std::isfinite(logits[v])) d.ids.push_back(int32_t(v));
  if (d.ids.empty()) return false;
  auto higher = [&](int32_t a, int32_t b) {
    const float la = logits[size_t(a)], lb = logits[size_t(b)];
    return la != lb ? la > lb : a < b;
  };
  if (p.top_k > 0 && size_t(p.top_k) < d.ids.size()) {
    std::nth_element(d.ids.begin(), d.ids.begin() + ptrdiff_t(p.top_k), d.ids.end(), higher);
    d.ids.resize(size_t(p.top_k));
    std::sort(d.ids.begin(), d.ids.end(), higher);
  }
  d.probs = scaled_softmax(logits, d.ids, 1.0 / p.temperature);
  if (p.top_p < 1.0) apply_top_p(d, logits, p.top_p);
  if (p.min_p > 0.0) {
    const double max_p = *std::max_element(d.probs.begin(), d.probs.end());
    const double threshold = p.min_p * max_p;
    size_t n = 0;
    for (size_t i = 0; i < d.ids.size(); ++i) {
      if (!(d.probs[i] >= threshold)) continue;
      d.ids[n] = d.ids[i];
      d.probs[n] = d.probs[i];
      ++n;
    }
    d.ids.resize(n);
    d.probs.resize(n);
  }
  double sum = 0;
  for (double q : d.probs) sum += q;
  for (double& q : d.probs) q /= sum;
  return true;
}

int32_t draw(const Dist& d, double u) {
  double cum = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    cum += d.probs[i];
    if (u < cum) return d.ids[i];
  }
  return d.ids.back();
}

}  // namespace legacy
// ---- end of the frozen copy ----

// A random row: normal logits of a random scale, some ties, -inf masks and NaN now and then.
std::vector<float> random_row(Rng& rng, size_t V) {
  std::vector<float> row(V);
  const double scale = rng.uniform() < 0.3 ? 0.01 : 0.5 + 4 * rng.uniform();
  const bool levels = rng.uniform() < 0.25;  // quantised: many ties
  for (auto& x : row) {
    x = float(rng.normal() * scale);
    if (levels) x = std::round(x * 2) / 2;
  }
  if (V > 4) row[rng.below(V)] = row[rng.below(V)];
  if (rng.uniform() < 0.3)
    for (size_t i = 0; i < V / 8 + 1; ++i) row[rng.below(V)] = -INFINITY;
  if (rng.uniform() < 0.1) row[rng.below(V)] = NAN;
  return row;
}

SampleSpec random_spec(Rng& rng, size_t V) {
  SampleSpec s;
  const double t = rng.uniform();
  s.temperature = t < 0.1 ? 0.0 : t < 0.2 ? 1e-3 : t < 0.3 ? 1e4 : 0.1 + 2 * rng.uniform();
  s.top_k = rng.uniform() < 0.4 ? 0 : int64_t(rng.below(V + 3));
  s.top_p = rng.uniform() < 0.4 ? 1.0 : 0.05 + 0.95 * rng.uniform();
  s.min_p = rng.uniform() < 0.5 ? 0.0 : rng.uniform() * 0.5;
  s.u = rng.uniform();
  return s;
}

TEST(SampleTwin, SameDistributionsAndTokensAsTheOldEngineSampler) {
  Rng rng(2026);
  int sampled = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const size_t V = trial % 50 == 0 ? 129280 : 1 + rng.below(trial % 3 == 0 ? 5000 : 64);
    const std::vector<float> row = random_row(rng, V);
    const SampleSpec s = random_spec(rng, V);
    legacy::Dist want;
    const bool ok = legacy::distribution(row, s, want);
    auto got = sample_distribution(row, s);
    ASSERT_EQ(got.ok(), ok) << "trial " << trial;
    if (!ok) continue;
    ASSERT_EQ(got->ids, want.ids) << "trial " << trial;
    ASSERT_EQ(got->probs, want.probs) << "trial " << trial;  // bitwise
    auto tok = sample_row(row, s);
    ASSERT_TRUE(tok.ok());
    EXPECT_EQ(*tok, legacy::draw(want, s.u)) << "trial " << trial;
    sampled += !s.greedy();
  }
  EXPECT_GT(sampled, 400);
}

TEST(SampleTwin, RowsMatchSampleRowAndMarkRowsWithoutFiniteLogits) {
  Rng rng(7);
  const int64_t R = 9, V = 301;
  std::vector<float> logits;
  std::vector<SampleSpec> specs;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> row = random_row(rng, size_t(V));
    if (r == 4) std::fill(row.begin(), row.end(), -INFINITY);
    if (r == 6) std::fill(row.begin(), row.end(), NAN);
    logits.insert(logits.end(), row.begin(), row.end());
    specs.push_back(random_spec(rng, size_t(V)));
  }
  specs[6].temperature = 0;  // greedy row without a finite logit
  std::vector<int32_t> out(size_t(R), 12345);
  SampleRowsParams p;
  p.logits = logits.data(), p.rows = R, p.vocab = V, p.specs = specs.data(), p.out = out.data();
  ASSERT_TRUE(sample_rows_ref(p).ok());
  for (int64_t r = 0; r < R; ++r) {
    if (r == 4 || r == 6) {
      EXPECT_EQ(out[size_t(r)], -1);
      continue;
    }
    auto want = sample_row(std::span<const float>(logits).subspan(size_t(r * V), size_t(V)), specs[size_t(r)]);
    ASSERT_TRUE(want.ok());
    EXPECT_EQ(out[size_t(r)], *want) << "row " << r;
  }
}

TEST(SampleTwin, ErrorsNameTheFieldAndRow) {
  std::vector<float> logits(6, 0.5f);
  std::vector<SampleSpec> specs(2);
  std::vector<int32_t> out(2);
  SampleRowsParams p;
  p.logits = logits.data(), p.rows = 2, p.vocab = 3, p.specs = specs.data(), p.out = out.data();
  ASSERT_TRUE(sample_rows_ref(p).ok());
  specs[1].top_p = 0;
  Status st = sample_rows_ref(p);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("row 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("top_p"), std::string::npos) << st.message();
  specs[1] = {};
  specs[0].u = 1.0;
  st = sample_rows_ref(p);
  EXPECT_NE(st.message().find("u must be"), std::string::npos) << st.message();
  specs[0] = {};
  specs[0].min_p = -0.1;
  EXPECT_NE(sample_rows_ref(p).message().find("min_p"), std::string::npos);
  specs[0] = {};
  specs[0].temperature = INFINITY;
  EXPECT_NE(sample_rows_ref(p).message().find("temperature"), std::string::npos);
  specs[0] = {};
  p.vocab = 0;
  EXPECT_NE(sample_rows_ref(p).message().find("vocab"), std::string::npos);
  p.vocab = 3;
  p.out = nullptr;
  EXPECT_FALSE(sample_rows_ref(p).ok());
  p.rows = 0;  // nothing to do: null pointers are fine
  EXPECT_TRUE(sample_rows_ref(p).ok());
}

// Exact dyadic boundaries: with 4 equal logits each candidate holds 1/4, and u = j/4 lands on
// token j (the draw takes the first cumulative mass strictly above u).
TEST(SampleTwin, DyadicBoundariesGoToTheNextToken) {
  const std::vector<float> flat(4, 1.5f);
  for (int j = 0; j < 4; ++j) {
    SampleSpec s;
    s.u = j / 4.0;
    EXPECT_EQ(*sample_row(flat, s), j);
    s.top_p = 0.999;  // sorted order: descending logit, lower id first on ties = the same order
    EXPECT_EQ(*sample_row(flat, s), j);
  }
}

}  // namespace
}  // namespace flashseek::ops
