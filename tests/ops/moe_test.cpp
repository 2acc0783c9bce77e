#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "ops/moe.h"
#include "test_util.h"

namespace flashseek::ops {

namespace {
double sqsp(double x) { return std::sqrt(std::log1p(std::exp(x))); }
}

TEST(Router, BiasSelectsButDoesNotWeight) {
  std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f}, bias = {0, 0, 0, 10};
  int32_t sel[2];
  float w[2];
  RouteParams p{logits.data(), bias.data(), nullptr, 4, 2};
  p.renorm_eps = true;
  p.route_scale = 1.5f;
  p.sel = sel;
  p.weight = w;
  route(p);
  EXPECT_EQ(sel[0], 0);
  EXPECT_EQ(sel[1], 3);  // chosen only through its bias
  const double s0 = sqsp(2.0), s3 = sqsp(-1.0);
  EXPECT_NEAR(w[0], s0 / (s0 + s3) * 1.5, 1e-6);
  EXPECT_NEAR(w[1], s3 / (s0 + s3) * 1.5, 1e-6);
}

TEST(Router, TopOneIsNotRenormalisedInV41AndGateTempDivides) {
  std::vector<float> logits = {0.3f, 4.0f};
  int32_t sel[1];
  float w[1];
  RouteParams p{logits.data(), nullptr, nullptr, 2, 1};
  p.renorm_eps = true;
  p.gate_temp = 2.0f;
  p.route_scale = 1.5f;
  p.sel = sel;
  p.weight = w;
  route(p);
  EXPECT_EQ(sel[0], 1);
  EXPECT_NEAR(w[0], sqsp(2.0) * 1.5, 1e-6);  // raw score × scale
  p.renorm_eps = false;                        // V4 rule: always renormalise → 1 × scale
  route(p);
  EXPECT_NEAR(w[0], 1.5, 1e-6);
}

TEST(Router, HashIdsOverrideSelection) {
  std::vector<float> logits = {5, 0, 0, 1};
  int32_t ids[2] = {3, 1}, sel[2];
  float w[2];
  RouteParams p{logits.data(), nullptr, ids, 4, 2};
  p.sel = sel;
  p.weight = w;
  route(p);
  EXPECT_EQ(sel[0], 1);
  EXPECT_EQ(sel[1], 3);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-6);
}

TEST(Router, RepeatedHashIdContributesOnce) {
  std::vector<float> logits = {1, 2, 3};
  int32_t ids[3] = {2, 0, 2}, sel[3];
  float w[3];
  RouteParams p{logits.data(), nullptr, ids, 3, 3};
  p.sel = sel;
  p.weight = w;
  route(p);
  EXPECT_EQ(sel[0], 0);
  EXPECT_EQ(sel[1], 2);
  EXPECT_EQ(sel[2], 2);
  const double s0 = sqsp(1), s2 = sqsp(3), den = s0 + 2 * s2;  // duplicates stay in the sum
  EXPECT_NEAR(w[0], s0 / den, 1e-6);
  EXPECT_NEAR(w[1], s2 / den, 1e-6);
  EXPECT_EQ(w[2], 0.0f);
}

TEST(Swiglu, ClampIsOneSidedOnGate) {
  std::vector<float> g = {20, -20, 1}, u = {20, -20, 2}, h(3);
  swiglu(g.data(), u.data(), h.data(), 3, 10, 0.5f);
  EXPECT_NEAR(h[0], 10 / (1 + std::exp(-10.0)) * 10 * 0.5, 1e-4);
  EXPECT_NEAR(h[1], -20 / (1 + std::exp(20.0)) * -10 * 0.5, 1e-9);  // gate not clamped below
  EXPECT_NEAR(h[2], 1 / (1 + std::exp(-1.0)) * 2 * 0.5, 1e-6);
}

// Grouping pairs by expert: every pair lands once, inside its expert's range, in slot order,
// with its token row and weight; out-of-range ids are refused.
TEST(MoeGroup, StablePermutationByExpert) {
  const int64_t k = 3, E = 5;
  const std::vector<int32_t> sel{4, 0, 4, 2, 2, 4, 0, 1, 4, 3, 3, 3};
  std::vector<float> w(sel.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) + 0.5f;
  std::vector<int32_t> gs(E + 1), row(sel.size()), pos(sel.size());
  std::vector<float> sw(sel.size());
  ASSERT_TRUE(group_pairs_by_expert(sel.data(), w.data(), int64_t(sel.size()), E, k, gs.data(), row.data(), sw.data(),
                                    pos.data()));
  EXPECT_EQ(gs.front(), 0);
  EXPECT_EQ(gs.back(), int32_t(sel.size()));
  std::vector<int> seen(sel.size(), 0);
  for (size_t p = 0; p < sel.size(); ++p) {
    const int32_t s = pos[p];
    ASSERT_GE(s, 0);
    ASSERT_LT(size_t(s), sel.size());
    ++seen[size_t(s)];
    EXPECT_GE(s, gs[size_t(sel[p])]);
    EXPECT_LT(s, gs[size_t(sel[p]) + 1]);
    EXPECT_EQ(row[size_t(s)], int32_t(p / k));
    EXPECT_EQ(sw[size_t(s)], w[p]);
    for (size_t q = 0; q < p; ++q)
      if (sel[q] == sel[p]) EXPECT_LT(pos[q], s);  // stable
  }
  for (int c : seen) EXPECT_EQ(c, 1);
  const std::vector<int32_t> bad{0, 5};
  EXPECT_FALSE(group_pairs_by_expert(bad.data(), w.data(), 2, E, k, gs.data(), row.data(), sw.data(), pos.data()));
}

// The compact groups cover exactly the experts that have pairs, in ascending order, each with
// its pairs' range of the full grouping; the slots after them are empty groups of expert -1; too
// few slots is refused. Random selections over many experts, and the edge cases: no pairs, every
// pair on one expert, as many touched experts as slots.
TEST(MoeGroup, CompactGroupsSkipExpertsWithoutPairs) {
  Rng rng(77);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t E = 1 + int64_t(rng.below(400)), k = 1 + int64_t(rng.below(8));
    const int64_t T = int64_t(rng.below(9)), P = T * k;
    std::vector<int32_t> sel(static_cast<size_t>(P));
    const int mode = int(rng.below(3));  // 0: uniform, 1: one expert, 2: two hot experts
    for (auto& e : sel)
      e = int32_t(mode == 1 ? E - 1 : mode == 2 ? int64_t(rng.below(2)) * (E - 1) : int64_t(rng.below(uint64_t(E))));
    std::vector<float> w(static_cast<size_t>(P), 1.0f), sw(static_cast<size_t>(P));
    std::vector<int32_t> gs(static_cast<size_t>(E + 1)), row(static_cast<size_t>(P)), pos(static_cast<size_t>(P));
    ASSERT_TRUE(group_pairs_by_expert(sel.data(), w.data(), P, E, k, gs.data(), row.data(), sw.data(), pos.data()));
    std::vector<int32_t> want_e;
    for (int64_t e = 0; e < E; ++e)
      if (gs[size_t(e + 1)] > gs[size_t(e)]) want_e.push_back(int32_t(e));
    const int64_t touched = int64_t(want_e.size());
    ASSERT_LE(touched, std::min(P, E));
    const int64_t slots = touched + int64_t(rng.below(5));
    std::vector<int32_t> cs(static_cast<size_t>(slots + 1), -7), ce(static_cast<size_t>(slots), -7);
    ASSERT_EQ(compact_expert_groups(gs.data(), E, slots, cs.data(), ce.data()), touched);
    for (int64_t g = 0; g < slots; ++g) {
      if (g < touched) {
        const int32_t e = want_e[size_t(g)];
        EXPECT_EQ(ce[size_t(g)], e);
        EXPECT_EQ(cs[size_t(g)], gs[size_t(e)]);
        EXPECT_EQ(cs[size_t(g + 1)], gs[size_t(e + 1)]) << "group " << g << " ends where its expert's pairs end";
      } else {
        EXPECT_EQ(ce[size_t(g)], -1);
        EXPECT_EQ(cs[size_t(g)], int32_t(P));
      }
    }
    EXPECT_EQ(cs[size_t(slots)], int32_t(P));
    if (touched > 0) EXPECT_EQ(compact_expert_groups(gs.data(), E, touched - 1, cs.data(), ce.data()), -1);
  }
}

}  // namespace flashseek::ops
