// The speculation policy (engine/spec_policy.h) as pure logic: costs and acceptance are fed by
// the test, no clock and no model. Properties: it speculates exactly when the expected token
// rate beats plain decoding, verifies a shorter prefix when only the first drafts survive, turns
// off when a verify costs about as much as k plain steps (large batch), probes again with a
// backing-off interval while off and turns back on when the probe is accepted; `on` and `off`
// ignore the numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/spec_policy.h"

namespace flashseek::engine {
namespace {

constexpr int64_t kBlock = 3;

// Costs of one batch size: a step of width w costs base + per_token * w; one draft `draft`.
SpecCosts costs(double base, double per_token, double draft, int64_t batch = 1) {
  SpecCosts c;
  for (int64_t w : {int64_t(1), kBlock + 1}) c.observe_step(batch, w, base + per_token * double(w));
  c.observe_draft(draft);
  return c;
}

// A policy that has seen `n` verifications of the full block, each accepting `accepted` drafts.
SpecPolicy seen(int64_t n, int64_t accepted, SpecPolicyOptions o = {}) {
  SpecPolicy p(SpecMode::kAuto, kBlock, o);
  for (int64_t i = 0; i < n; ++i) p.observe(kBlock, accepted);
  return p;
}

TEST(SpecCosts, BucketsAndInterpolation) {
  EXPECT_EQ(SpecCosts::bucket(1), 0);
  EXPECT_EQ(SpecCosts::bucket(2), 1);
  EXPECT_EQ(SpecCosts::bucket(3), 2);
  EXPECT_EQ(SpecCosts::bucket(4), 2);
  EXPECT_EQ(SpecCosts::bucket(5), 3);
  EXPECT_EQ(SpecCosts::bucket(64), 6);
  EXPECT_EQ(SpecCosts::bucket(65), 7);
  for (int b = 0; b < 10; ++b) {
    const auto [lo, hi] = SpecCosts::bucket_range(b);
    EXPECT_EQ(SpecCosts::bucket(lo), b);
    EXPECT_EQ(SpecCosts::bucket(hi), b);
  }
  SpecCosts c;
  EXPECT_FALSE(c.step(1, 1));
  c.observe_step(1, 1, 2.0);
  EXPECT_EQ(c.step(1, 1), 2.0);
  EXPECT_FALSE(c.step(1, 4)) << "one width measured: nothing to interpolate";
  EXPECT_FALSE(c.step(2, 1)) << "batch 2 is another bucket";
  c.observe_step(1, 4, 5.0);
  EXPECT_DOUBLE_EQ(*c.step(1, 2), 3.0);
  EXPECT_DOUBLE_EQ(*c.step(1, 3), 4.0);
  EXPECT_DOUBLE_EQ(*c.step(1, 6), 7.0);  // extrapolated from the two widest
  // Warm-started EWMA (alpha 0.2): the first 5 samples are averaged, then a new sample moves the
  // estimate by alpha of the difference.
  c.observe_step(1, 1, 4.0);
  EXPECT_DOUBLE_EQ(*c.step(1, 1), 3.0);
  for (int i = 0; i < 3; ++i) c.observe_step(1, 1, 3.0);
  EXPECT_DOUBLE_EQ(*c.step(1, 1), 3.0) << "mean of 2, 4, 3, 3, 3";
  c.observe_step(1, 1, 8.0);
  EXPECT_DOUBLE_EQ(*c.step(1, 1), 3.0 + 0.2 * 5.0);
  EXPECT_FALSE(c.draft());
  c.observe_draft(1.0);
  c.observe_draft(-1.0);  // ignored
  EXPECT_EQ(c.draft(), 1.0);
  EXPECT_EQ(c.entries().size(), 2u);
}

TEST(SpecPolicy, ExpectedTokensFromConditionalSurvival) {
  SpecPolicy p(SpecMode::kAuto, kBlock);
  EXPECT_DOUBLE_EQ(p.expected_tokens(kBlock), 1.0) << "nothing observed: only the bonus token";
  p.observe(3, 3);
  EXPECT_DOUBLE_EQ(p.expected_tokens(3), 4.0);
  EXPECT_DOUBLE_EQ(p.expected_tokens(1), 2.0);
  p.observe(3, 1);  // draft 1 survives, draft 2 does not, draft 3 unobserved
  EXPECT_DOUBLE_EQ(*p.survival(1), 1.0);
  EXPECT_DOUBLE_EQ(*p.survival(2), 0.5) << "the first samples are averaged";
  EXPECT_DOUBLE_EQ(*p.survival(3), 1.0);
  EXPECT_DOUBLE_EQ(p.expected_tokens(3), 1.0 + 1.0 + 0.5 + 0.5);
  // A prefix verification of 1 draft observes only position 1.
  p.observe(1, 0);
  EXPECT_DOUBLE_EQ(*p.survival(1), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(*p.survival(2), 0.5);
  // Past 1/alpha (4) samples a new one moves the estimate by alpha (0.25).
  p.observe(1, 1);
  EXPECT_DOUBLE_EQ(*p.survival(1), 0.75);
  p.observe(1, 0);
  EXPECT_DOUBLE_EQ(*p.survival(1), 0.75 - 0.25 * 0.75);
}

// One unlucky first probe (its first draft rejected) does not keep a good draft off: the second
// probe's acceptance weighs as much as the first, and the policy turns on.
TEST(SpecPolicy, OneUnluckyFirstProbeDoesNotDominate) {
  // A full-block verify + draft costs 2 plain steps: it pays when 1 + 3·s1 (drafts 2 and 3
  // accepted whenever reached) beats 2 × 1.05, i.e. s1 > 0.37.
  SpecCosts c;
  c.observe_step(1, 1, 1e-3);
  c.observe_step(1, kBlock + 1, 1.8e-3);
  c.observe_draft(0.2e-3);
  SpecPolicy p(SpecMode::kAuto, kBlock);
  EXPECT_TRUE(p.decide(c, 1).probe);
  p.observe(kBlock, 0);
  EXPECT_EQ(p.decide(c, 1).drafts, 0) << "nothing accepted yet: off";
  p.observe(kBlock, kBlock);  // the next probe: all accepted
  EXPECT_DOUBLE_EQ(*p.survival(1), 0.5) << "the mean of 0 and 1 (a plain EWMA would say 0.25)";
  const auto d = p.decide(c, 1);
  EXPECT_EQ(d.drafts, kBlock) << p.reason();
}

TEST(SpecPolicy, FirstDecisionsMeasureAcceptanceThenCosts) {
  SpecPolicy p(SpecMode::kAuto, kBlock);
  SpecCosts c;
  auto d = p.decide(c, 1);
  EXPECT_EQ(d.drafts, kBlock);
  EXPECT_TRUE(d.probe) << "no acceptance yet: verify the full block";
  p.observe(kBlock, kBlock);
  c.observe_step(1, kBlock + 1, 1.4e-3);
  c.observe_draft(0.1e-3);
  d = p.decide(c, 1);
  EXPECT_EQ(d.drafts, 0) << "the plain step cost is unknown: measure it";
  c.observe_step(1, 1, 1.1e-3);
  d = p.decide(c, 1);
  EXPECT_EQ(d.drafts, kBlock);
  EXPECT_FALSE(d.probe);
  EXPECT_TRUE(p.speculating());
  // A batch size never seen: its verify cost is measured by one full-block probe.
  SpecCosts plain_only;
  plain_only.observe_step(8, 1, 1e-3);
  d = p.decide(plain_only, 8);
  EXPECT_EQ(d.drafts, kBlock);
  EXPECT_TRUE(d.probe);
}

TEST(SpecPolicy, SpeculatesExactlyWhenTheRateBeatsPlain) {
  // A perfect draft on a backend where width barely matters (GPU at batch 1): 4 tokens per
  // step for ~1.3 steps' time.
  SpecPolicy good = seen(4, kBlock);
  auto d = good.decide(costs(1e-3, 0.05e-3, 0.2e-3), 1);
  EXPECT_EQ(d.drafts, kBlock);
  // The same draft where a verify costs as much as its width in plain steps plus the draft (a
  // large batch, or the CPU): no gain, so off.
  SpecPolicy same = seen(4, kBlock);
  EXPECT_EQ(same.decide(costs(0, 1e-3, 0.2e-3, 64), 64).drafts, 0);
  EXPECT_FALSE(same.speculating());
  // A draft that is never accepted is never worth it, however cheap the verify — even when
  // (noisy) measurements say a verify costs less than a plain step.
  SpecPolicy bad = seen(4, 0);
  EXPECT_EQ(bad.decide(costs(1e-3, 0, 0), 1).drafts, 0);
  SpecCosts noisy;
  noisy.observe_step(1, 1, 5e-3);
  noisy.observe_step(1, kBlock + 1, 1e-3);
  noisy.observe_draft(0);
  EXPECT_EQ(bad.decide(noisy, 1).drafts, 0);
  // Around break-even: a verify cost (independent of width) set so that the expected rate is
  // `factor` times plain decoding's; the policy speculates iff factor >= min_gain (1.05).
  SpecPolicy half(SpecMode::kAuto, kBlock);
  half.observe(kBlock, kBlock);
  for (int i = 0; i < 40; ++i) half.observe(kBlock, i % 2 ? kBlock : 0);  // draft 1: ~half
  const double e = half.expected_tokens(kBlock);
  EXPECT_GT(e, 2.0);
  EXPECT_LT(e, 3.0);
  for (double factor : {0.9, 1.0, 1.1, 1.5}) {
    SpecPolicy p = half;
    SpecCosts c;
    c.observe_step(1, 1, 1e-3);
    c.observe_step(1, kBlock + 1, e / factor * 1e-3);
    c.observe_draft(0);
    const auto d = p.decide(c, 1);
    SCOPED_TRACE(::testing::Message() << "factor " << factor << ", expected tokens " << e);
    EXPECT_EQ(d.drafts, factor >= 1.05 ? kBlock : 0);
  }
}

TEST(SpecPolicy, ShortensTheBlockWhenOnlyTheFirstDraftSurvives) {
  // Draft 1 always accepted, draft 2 never: verifying 1 draft gives 2 tokens for less than the
  // full block's cost, which still gives 2.
  SpecPolicy p = seen(6, 1);
  const SpecCosts c = costs(1e-3, 0.2e-3, 0.1e-3);
  const auto d = p.decide(c, 1);
  EXPECT_EQ(d.drafts, 1);
  EXPECT_FALSE(d.probe);
  // Every probe_every steps the full block is verified again (later positions may recover).
  SpecPolicyOptions o;
  o.probe_every = 5;
  SpecPolicy q = seen(6, 1, o);
  int64_t probes = 0, ones = 0;
  for (int step = 0; step < 20; ++step) {
    const auto e = q.decide(c, 1);
    probes += e.probe;
    ones += e.drafts == 1;
    q.observe(e.drafts, 1);
  }
  EXPECT_EQ(probes, 4);
  EXPECT_EQ(ones, 16);
}

TEST(SpecPolicy, OffWhileRejectedProbesWithBackoffAndTurnsBackOn) {
  SpecPolicyOptions o;
  o.probe_every = 4;
  o.max_probe_every = 16;
  o.max_probe_overhead = 0.05;  // a probe costs ~0.36 plain steps more: 5 % keeps gaps <= 16
  SpecPolicy p = seen(1, 0, o);
  const SpecCosts c = costs(1e-3, 0.1e-3, 0.1e-3);
  std::vector<int> probe_steps;
  for (int step = 1; step <= 60; ++step) {
    const auto d = p.decide(c, 1);
    if (d.drafts > 0) {
      EXPECT_TRUE(d.probe) << "step " << step;
      probe_steps.push_back(step);
      p.observe(d.drafts, 0);
    }
  }
  // The gaps between probes double up to max_probe_every.
  ASSERT_GE(probe_steps.size(), 4u);
  std::vector<int> gaps;
  for (size_t i = 1; i < probe_steps.size(); ++i) gaps.push_back(probe_steps[i] - probe_steps[i - 1]);
  for (size_t i = 1; i < gaps.size(); ++i) EXPECT_GE(gaps[i], gaps[i - 1]);
  EXPECT_EQ(gaps.back(), 16);
  EXPECT_EQ(p.probe_interval(), 16);
  // The draft starts to agree: the next probe is accepted in full and the policy turns on.
  int steps_to_probe = 0;
  for (int step = 1; step <= 40; ++step) {
    const auto d = p.decide(c, 1);
    if (d.drafts > 0) {
      EXPECT_TRUE(d.probe);
      p.observe(d.drafts, kBlock);
      steps_to_probe = step;
      break;
    }
  }
  ASSERT_GT(steps_to_probe, 0);
  ASSERT_LE(steps_to_probe, 16);
  const auto d = p.decide(c, 1);
  EXPECT_EQ(d.drafts, kBlock) << p.reason();
  EXPECT_FALSE(d.probe);
  EXPECT_EQ(p.probe_interval(), o.probe_every) << "back on: the backoff resets";
}

// Where a probe costs many plain steps (the CPU: verify 4x, draft 6x a step), probes while off
// cost at most max_probe_overhead of the decoding time.
TEST(SpecPolicy, ProbesStayWithinTheOverheadBudget) {
  SpecPolicy p = seen(1, 0);
  SpecCosts c;
  c.observe_step(1, 1, 1e-3);
  c.observe_step(1, kBlock + 1, 4e-3);
  c.observe_draft(6e-3);
  const double extra = 4e-3 + 6e-3 - 1e-3;
  int64_t probes = 0;
  const int64_t n = 3000;
  for (int64_t step = 0; step < n; ++step) {
    const auto d = p.decide(c, 1);
    if (d.drafts > 0) ++probes, p.observe(d.drafts, 0);
  }
  EXPECT_GE(probes, 5) << "it still probes now and then";
  EXPECT_LE(double(probes) * extra, SpecPolicyOptions{}.max_probe_overhead * double(n) * 1e-3 + extra);
}

// However much a probe costs (here a draft of 1000 plain steps), the gap between probes while
// off never exceeds max_probe_gap steps: a draft that starts to agree is found again.
TEST(SpecPolicy, ProbeGapIsBoundedEvenForAVeryCostlyProbe) {
  SpecPolicyOptions o;
  o.max_probe_gap = 300;
  SpecPolicy p = seen(1, 0, o);
  SpecCosts c;
  c.observe_step(1, 1, 1e-3);
  c.observe_step(1, kBlock + 1, 4e-3);
  c.observe_draft(1.0);
  std::vector<int64_t> probe_steps;
  for (int64_t step = 0; step < 2000; ++step) {
    const auto d = p.decide(c, 1);
    if (d.drafts > 0) probe_steps.push_back(step), p.observe(d.drafts, 0);
  }
  ASSERT_GE(probe_steps.size(), 6u) << "2000 steps hold at least 6 gaps of <= 300";
  EXPECT_LE(probe_steps.front(), o.max_probe_gap);
  for (size_t i = 1; i < probe_steps.size(); ++i) {
    EXPECT_LE(probe_steps[i] - probe_steps[i - 1], o.max_probe_gap) << "gap " << i;
    EXPECT_GE(probe_steps[i] - probe_steps[i - 1], o.max_probe_every) << "still backed off";
  }
}

// A new sequence that adopts the engine's acceptance estimate decides at once (no first probe).
TEST(SpecPolicy, AdoptedAcceptanceSkipsTheFirstProbe) {
  const SpecCosts c = costs(1e-3, 0.1e-3, 0.1e-3);
  SpecPolicy fresh(SpecMode::kAuto, kBlock);
  SpecPolicy good(SpecMode::kAuto, kBlock), bad(SpecMode::kAuto, kBlock);
  good.adopt_acceptance(seen(3, kBlock));
  bad.adopt_acceptance(seen(3, 0));
  EXPECT_TRUE(fresh.decide(c, 1).probe);
  const auto g = good.decide(c, 1), b = bad.decide(c, 1);
  EXPECT_EQ(g.drafts, kBlock);
  EXPECT_FALSE(g.probe);
  EXPECT_EQ(b.drafts, 0);
}

TEST(SpecPolicy, OnAndOffIgnoreTheNumbers) {
  SpecPolicy on(SpecMode::kOn, kBlock), off(SpecMode::kOff, kBlock);
  const SpecCosts c = costs(0, 1e-3, 1e-3, 64);  // speculation could not pay here
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(on.decide(c, 64).drafts, kBlock);
    on.observe(kBlock, 0);
    EXPECT_EQ(off.decide(c, 64).drafts, 0);
  }
  SpecPolicy none(SpecMode::kAuto, 0);
  EXPECT_EQ(none.decide(c, 1).drafts, 0) << "no draft block";
}

TEST(SpecPolicy, OptionsAreValidated) {
  EXPECT_TRUE(validate_spec_policy({}).empty());
  SpecPolicyOptions o;
  o.acceptance_alpha = 0;
  EXPECT_NE(validate_spec_policy(o).find("acceptance_alpha"), std::string::npos);
  o = {};
  o.cost_alpha = 1.5;
  EXPECT_NE(validate_spec_policy(o).find("cost_alpha"), std::string::npos);
  o = {};
  o.probe_every = 0;
  EXPECT_NE(validate_spec_policy(o).find("probe_every"), std::string::npos);
  o = {};
  o.max_probe_every = 2;
  EXPECT_NE(validate_spec_policy(o).find("max_probe_every"), std::string::npos);
  o = {};
  o.max_probe_gap = o.max_probe_every - 1;
  EXPECT_NE(validate_spec_policy(o).find("max_probe_gap"), std::string::npos);
  o = {};
  o.max_probe_overhead = 0;
  EXPECT_NE(validate_spec_policy(o).find("max_probe_overhead"), std::string::npos);
  o = {};
  o.min_gain = std::nan("");
  EXPECT_NE(validate_spec_policy(o).find("min_gain"), std::string::npos);
}

}  // namespace
}  // namespace flashseek::engine
