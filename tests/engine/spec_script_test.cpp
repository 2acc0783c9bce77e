// The benchmark-only scripted acceptance (EngineOptions::spec_script_accept): every verification
// step accepts exactly the scripted number of drafts (capped at the block), whatever the target
// says, the bonus is the target's own token after them, and the engine refuses the option for bad
// values, with speculation off and for a model without a draft.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/spec_accept.h"
#include "engine_test_util.h"

namespace flashseek::engine {
namespace {

using testing::FakeModel;
using testing::make_engine;

constexpr int64_t kVocab = 97;

// Index of the largest / second largest logit (the fake rows are pseudo-random floats, no ties).
int32_t top(std::span<const float> row, int rank) {
  std::vector<int32_t> ids(row.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + rank + 1, ids.end(),
                    [&](int32_t a, int32_t b) { return row[size_t(a)] > row[size_t(b)]; });
  return ids[size_t(rank)];
}

// FakeModel with a draft of `block` tokens that always proposes the target's runner-up token
// (never its argmax): a greedy verifier accepts none of them, so every accepted draft in the
// output is the script's doing, and each emitted token tells whether it was a draft (runner-up of
// the target row after its history) or a bonus (the row's argmax).
class RunnerUpDraft final : public FakeModel {
 public:
  explicit RunnerUpDraft(int64_t block) : FakeModel(kVocab), block_(block) {
    mutable_config().dspark_block_size = block;
  }
  bool has_draft() const override { return true; }
  int64_t draft_block_size() const override { return block_; }
  Status rollback(forward::SequenceState& s, int64_t n) const override {
    auto& h = static_cast<testing::FakeState&>(s).history;
    if (n < 0 || n > int64_t(h.size())) return invalid_argument("rollback to {}", n);
    h.resize(size_t(n));
    return {};
  }
  Result<forward::DraftBlock> propose(const forward::SequenceState& state, int32_t x0,
                                      const forward::DraftChooser& choose) const override {
    std::vector<int32_t> h = static_cast<const testing::FakeState&>(state).history;
    h.push_back(x0);
    forward::DraftBlock out;
    for (int64_t i = 1; i <= block_; ++i) {
      std::vector<float> row = logits_after(h);
      row[size_t(top(row, 0))] = -1e30f;  // the runner-up becomes the draft's argmax
      const int32_t y = choose ? choose(i, row) : top(row, 0);
      out.tokens.push_back(y);
      out.logits.insert(out.logits.end(), row.begin(), row.end());
      out.confidence.push_back(0);
      h.push_back(y);
    }
    return out;
  }
  // The target's logits after `history` (the same function forward() uses).
  std::vector<float> logits_after(std::span<const int32_t> history) const {
    testing::FakeState st;
    st.history.assign(history.begin(), history.end() - 1);
    std::vector<float> row;
    const int32_t last = history.back();
    forward::BatchItem item{&st, std::span<const int32_t>(&last, 1), false};
    EXPECT_TRUE(target_.forward(std::span<forward::BatchItem>(&item, 1), row).ok());
    return row;
  }

 private:
  int64_t block_;
  mutable FakeModel target_{kVocab};
};

// Splits greedy output after `prompt` into verification steps: the number of drafts (the target
// row's runner-up) before each bonus (its argmax). Token 0 comes from the prefill (an argmax).
// A token that is neither fails the test.
std::vector<int64_t> accepted_per_step(const RunnerUpDraft& model, std::vector<int32_t> history,
                                       std::span<const int32_t> out, bool& complete) {
  std::vector<int64_t> steps;
  int64_t run = 0;
  complete = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const std::vector<float> row = model.logits_after(history);
    const int32_t t = out[i];
    if (t == top(row, 0)) {
      if (i > 0) steps.push_back(run);
      run = 0;
    } else {
      EXPECT_EQ(t, top(row, 1)) << "token " << i << " is neither the target's argmax nor the draft's";
      EXPECT_GT(i, 0u) << "the prefill's token is the target's argmax";
      ++run;
    }
    history.push_back(t);
  }
  complete = run == 0;  // a block cut by max_tokens ends without its bonus
  return steps;
}

TEST(SpecScript, ScriptedAcceptedAveragesTheMeanExactly) {
  for (double mean : {1.0, 1.5, 2.0, 2.25, 3.5, 4.6, 5.6, 6.0}) {
    SCOPED_TRACE(mean);
    const double a = mean - 1.0;
    int64_t total = 0;
    for (int64_t s = 0; s < 1000; ++s) {
      const int64_t n = scripted_accepted(mean, s);
      EXPECT_GE(n, int64_t(std::floor(a))) << "step " << s;
      EXPECT_LE(n, int64_t(std::ceil(a))) << "step " << s;
      total += n;
      // Every prefix accepts floor(S·a) drafts (a in thousandths: exact for these values).
      ASSERT_EQ(total, ((s + 1) * std::llround(a * 1000)) / 1000) << "after " << s + 1 << " steps";
    }
  }
  // 3.5 tokens/step = 2.5 drafts: 2, 3, 2, 3, …
  EXPECT_EQ(scripted_accepted(3.5, 0), 2);
  EXPECT_EQ(scripted_accepted(3.5, 1), 3);
  EXPECT_EQ(scripted_accepted(3.5, 2), 2);
}

TEST(SpecScript, ScriptedVerdictTakesTheDraftsAndTheTargetBonus) {
  const int64_t V = 5;
  // Rows 0..2: argmax 4, 0, 2.
  const std::vector<float> target = {0, 1, 2, 3, 4, /**/ 4, 3, 2, 1, 0, /**/ 0, 1, 9, 1, 0};
  const std::vector<int32_t> drafts = {1, 3};
  const SamplingParams greedy{.temperature = 0};
  for (int64_t n : {0, 1, 2, 5}) {
    auto v = scripted_verdict(drafts, target, V, greedy, 10, n);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->accepted, std::min<int64_t>(n, 2));
    const int32_t argmax_of_row[3] = {4, 0, 2};
    EXPECT_EQ(v->bonus, argmax_of_row[v->accepted]);
  }
  EXPECT_FALSE(scripted_verdict(drafts, std::span(target).first(10), V, greedy, 10, 1).ok());
  EXPECT_FALSE(scripted_verdict(drafts, target, V, greedy, 10, -1).ok());
  const std::vector<int32_t> bad = {1, 7};
  EXPECT_FALSE(scripted_verdict(bad, target, V, greedy, 10, 1).ok());
}

// Through the engine: the output decomposes into exactly the scripted acceptance counts, the
// counters agree, and a mean above the block is capped (6 with a block of 5 is every draft).
TEST(SpecScript, EngineAcceptsExactlyTheScriptedCounts) {
  constexpr int64_t kBlock = 5;
  for (double mean : {1.0, 2.0, 3.5, 5.6, 6.0}) {
    SCOPED_TRACE(mean);
    RunnerUpDraft model(kBlock);
    EngineOptions o;
    o.speculative = SpecMode::kOn;
    o.spec_script_accept = mean;
    auto engine = make_engine(model, o);
    ASSERT_NE(engine, nullptr);
    const Request req = testing::greedy_request(1, {3, 5, 7, 11}, 121);
    auto stream = engine->submit(req);
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(engine->run_until_idle().ok());
    const GenerationResult r = collect(**stream);
    ASSERT_EQ(r.tokens.size(), 121u);
    bool complete = false;
    std::vector<int64_t> steps = accepted_per_step(model, req.prompt, r.tokens, complete);
    const EngineStats st = engine->stats();
    // The last token is a plain decode when exactly one was left (no room for a draft): an
    // argmax with no draft before it, like a verification that accepted nothing.
    int64_t plain = 0;
    if (int64_t(steps.size()) == st.spec_steps + 1 && steps.back() == 0) steps.pop_back(), plain = 1;
    ASSERT_EQ(int64_t(steps.size()), st.spec_steps);
    int64_t accepted = 0;
    for (size_t s = 0; s < steps.size(); ++s) {
      const int64_t want = std::min(scripted_accepted(mean, int64_t(s)), kBlock);
      // Each step verifies the full block except the last, which max_tokens may shorten.
      if (s + 1 < steps.size())
        EXPECT_EQ(steps[s], want) << "step " << s;
      else
        EXPECT_LE(steps[s], want) << "last step";
      accepted += steps[s];
    }
    // With --ignore-eos and drafts capped at the tokens left − 1, no block is cut.
    EXPECT_TRUE(complete);
    EXPECT_EQ(st.spec_accepted, accepted);
    EXPECT_EQ(st.spec_emitted, 120 - plain);
    const double per_step = double(120 - plain) / double(st.spec_steps);
    // The last step may be cut by max_tokens: the mean is the script's within one step's worth.
    EXPECT_NEAR(per_step, std::min(mean, double(kBlock + 1)), double(kBlock + 1) / double(st.spec_steps));
  }
}

// Scripted mean 1: every draft is rejected and the bonus is the target's argmax after the anchor,
// which is plain greedy decoding: the output equals speculation off.
TEST(SpecScript, MeanOneIsPlainGreedy) {
  RunnerUpDraft model(3);
  const Request req = testing::greedy_request(1, {2, 4, 6}, 50);
  EngineOptions off;
  auto plain = make_engine(model, off);
  auto s0 = plain->submit(req);
  ASSERT_TRUE(s0.ok());
  ASSERT_TRUE(plain->run_until_idle().ok());
  EngineOptions one;
  one.speculative = SpecMode::kOn;
  one.spec_script_accept = 1.0;
  auto scripted = make_engine(model, one);
  auto s1 = scripted->submit(req);
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(scripted->run_until_idle().ok());
  const auto a = collect(**s0).tokens, b = collect(**s1).tokens;
  EXPECT_EQ(a.size(), 50u);
  EXPECT_EQ(a, b);
  // 49 tokens after the prefill's: 48 verifications, the last token a plain decode.
  EXPECT_EQ(scripted->stats().spec_steps, 48);
  EXPECT_EQ(scripted->stats().spec_accepted, 0);
}

TEST(SpecScript, EngineRefusesBadValuesOffAndNoDraft) {
  RunnerUpDraft model(3);
  auto refused = [&](double mean, SpecMode mode) {
    EngineOptions o;
    o.speculative = mode;
    o.spec_script_accept = mean;
    auto e = Engine::create(model, o);
    if (e.ok()) return std::string();
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    return e.status().message();
  };
  for (double bad : {0.5, -2.0, 4.01, 100.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    SCOPED_TRACE(bad);
    EXPECT_NE(refused(bad, SpecMode::kOn).find("spec_script_accept must be in [1, 4]"),
              std::string::npos);
  }
  EXPECT_NE(refused(2, SpecMode::kOff).find("speculation on or auto"), std::string::npos);
  for (double ok : {1.0, 2.5, 4.0}) EXPECT_EQ(refused(ok, SpecMode::kOn), "") << ok;
  EXPECT_EQ(refused(3.5, SpecMode::kAuto), "");
  FakeModel no_draft(kVocab);
  EngineOptions o;
  o.speculative = SpecMode::kOn;
  o.spec_script_accept = 2;
  auto e = Engine::create(no_draft, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("needs a model with a draft"), std::string::npos);
}

}  // namespace
}  // namespace flashseek::engine
