// The speculation policy inside the engine, on a fake model with a scripted draft and a scripted
// clock (no wall time): the engine measures the step and draft costs from the clock, the policy
// turns speculation off on a draft that is never accepted, back on once the draft agrees with
// the target, and off at a batch where a verify costs as much as its width in plain steps. Greedy
// output is the plain decode's in every mode.
#include <gtest/gtest.h>

#include <atomic>

#include "engine/spec_metrics.h"
#include "engine_test_util.h"

namespace flashseek::engine {
namespace {

using testing::FakeModel;
using testing::FakeState;
using testing::make_engine;

constexpr int64_t kVocab = 97;
constexpr int64_t kBlock = 3;

// FakeModel plus a draft: propose() returns the target's own greedy continuation for its first
// `agreeing` drafts and, for the later ones, the runner-up of the target's row (never the
// target's argmax, so never accepted by a greedy request). Every forward call advances `clock` by base + per_token × tokens, every
// proposal by draft_cost.
class ScriptedDraft final : public FakeModel {
 public:
  ScriptedDraft(double* clock, double base, double per_token, double draft_cost)
      : FakeModel(kVocab), clock_(clock), base_(base), per_token_(per_token), draft_(draft_cost) {
    mutable_config().dspark_block_size = kBlock;
  }
  std::atomic<int64_t> agreeing{0};  // 0: never accepted; kBlock: always accepted in full

  bool has_draft() const override { return true; }
  Status forward(std::span<forward::BatchItem> batch, std::vector<float>& logits) override {
    int64_t tokens = 0;
    for (const auto& item : batch) tokens += int64_t(item.tokens.size());
    *clock_ += base_ + per_token_ * double(tokens);
    return FakeModel::forward(batch, logits);
  }
  Status rollback(forward::SequenceState& s, int64_t n) const override {
    auto& h = static_cast<FakeState&>(s).history;
    if (n < 0 || n > int64_t(h.size())) return invalid_argument("rollback to {}", n);
    h.resize(size_t(n));
    return {};
  }
  Result<forward::DraftBlock> propose(const forward::SequenceState& state, int32_t x0,
                                      const forward::DraftChooser& choose) const override {
    *clock_ += draft_;
    auto st = state.clone();
    forward::DraftBlock out;
    int32_t feed = x0;
    for (int64_t i = 1; i <= kBlock; ++i) {
      std::vector<float> row;
      forward::BatchItem item{st.get(), std::span<const int32_t>(&feed, 1), false};
      FS_RETURN_IF_ERROR(target_.forward(std::span<forward::BatchItem>(&item, 1), row));
      if (i > agreeing) row[size_t(std::max_element(row.begin(), row.end()) - row.begin())] = -1e30f;
      const int32_t y = choose ? choose(i, row)
                               : int32_t(std::max_element(row.begin(), row.end()) - row.begin());
      out.tokens.push_back(y);
      out.logits.insert(out.logits.end(), row.begin(), row.end());
      out.confidence.push_back(0);
      feed = y;
    }
    return out;
  }

 private:
  mutable FakeModel target_{kVocab};  // same logits function as this model (the default one)
  double* clock_;
  double base_, per_token_, draft_;
};

Request greedy(uint64_t id, int64_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt = {int32_t(3 + id), 5, 7, int32_t(11 + id)};
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  return r;
}

EngineOptions options(SpecMode mode, double* clock, int64_t max_batch = 1) {
  EngineOptions o;
  o.max_batch = max_batch;
  o.speculative = mode;
  o.spec_policy.probe_every = 4;
  o.spec_policy.max_probe_every = 16;
  o.clock = [clock] { return *clock; };
  return o;
}

// Steps `engine` until `stream` holds at least `n` tokens (or ends); returns them all so far.
void step_until(Engine& engine, EventStream& stream, std::vector<int32_t>& tokens, size_t n) {
  for (int guard = 0; guard < 100000 && tokens.size() < n && !stream.finished(); ++guard) {
    ASSERT_TRUE(engine.step().ok());
    while (auto e = stream.try_pop())
      if (e->token >= 0) tokens.push_back(e->token);
  }
}

TEST(SpecPolicyEngine, OffOnANeverAcceptedDraftBackOnWhenItAgrees) {
  double clock = 0;
  ScriptedDraft model(&clock, 1e-3, 0.1e-3, 0.2e-3);
  const Request req = greedy(1, 300);
  auto engine = make_engine(model, options(SpecMode::kAuto, &clock));
  auto stream = engine->submit(req);
  ASSERT_TRUE(stream.ok());
  std::vector<int32_t> tokens;

  // Phase 1: the draft never agrees. After the first probe the policy decodes plainly, probing
  // at a doubling interval (4, 8, 16, 16, …).
  step_until(*engine, **stream, tokens, 120);
  const int64_t phase1_tokens = int64_t(tokens.size());
  const EngineStats off = engine->stats();
  EXPECT_EQ(off.spec_mode, SpecMode::kAuto);
  EXPECT_EQ(off.spec_accepted, 0);
  EXPECT_EQ(off.spec_steps, off.spec_probes) << "only probes verify";
  EXPECT_LE(off.spec_steps, 12);
  EXPECT_GE(off.spec_plain_steps, 100);
  EXPECT_EQ(off.spec_sequences_plain, 1);
  // The costs the engine measured are the scripted ones: 1 ms + 0.1 ms per token, draft 0.2 ms.
  bool saw_plain = false, saw_verify = false;
  for (const SpecCosts::Entry& e : off.spec_step_costs) {
    EXPECT_EQ(e.bucket, 0);
    EXPECT_NEAR(e.seconds, 1e-3 + 0.1e-3 * double(e.width), 1e-9) << "width " << e.width;
    saw_plain |= e.width == 1;
    saw_verify |= e.width == kBlock + 1;
  }
  EXPECT_TRUE(saw_plain && saw_verify);
  EXPECT_NEAR(off.spec_draft_seconds, 0.2e-3, 1e-9);
  const std::string metrics = spec_metrics_text(off);
  EXPECT_NE(metrics.find("flashseek_spec_policy_info{mode=\"auto\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("flashseek_spec_policy_sequences{state=\"plain\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("flashseek_spec_step_seconds{batch=\"1\",width=\"4\"}"), std::string::npos);
  EXPECT_NE(metrics.find("flashseek_spec_draft_seconds"), std::string::npos);

  // Phase 2: the draft agrees. The next probe (at most 16 steps away) is accepted in full and the
  // policy speculates from then on: 4 tokens per step.
  model.agreeing = kBlock;
  const int64_t steps_before = off.steps;
  step_until(*engine, **stream, tokens, 300);
  const EngineStats on = engine->stats();
  ASSERT_EQ(tokens.size(), 300u);
  const int64_t phase2_steps = on.steps - steps_before;
  const int64_t phase2_tokens = 300 - phase1_tokens;
  // Up to 16 plain steps before the probe, then 4 tokens per step (fewer at the very end).
  EXPECT_LE(phase2_steps, 18 + (phase2_tokens + kBlock) / (kBlock + 1))
      << "speculation must resume within one probe interval";
  EXPECT_LT(phase2_steps, phase2_tokens / 2);
  EXPECT_GT(on.spec_accepted, 100);
  EXPECT_EQ(on.spec_sequences_speculating + on.spec_sequences_plain, 0) << "request finished";

  // Greedy output equals plain decoding.
  double clock2 = 0;
  ScriptedDraft plain_model(&clock2, 1e-3, 0.1e-3, 0.2e-3);
  auto plain = make_engine(plain_model, options(SpecMode::kOff, &clock2));
  auto ps = plain->submit(req);
  ASSERT_TRUE(ps.ok());
  ASSERT_TRUE(plain->run_until_idle().ok());
  EXPECT_EQ(collect(**ps).tokens, tokens);
  EXPECT_EQ(plain->stats().spec_steps, 0);
  EXPECT_TRUE(spec_metrics_text(plain->stats()).empty());
}

// Only the first draft of each block is ever accepted (the later ones never are): where a step's
// cost is mostly fixed the policy verifies a shorter block of 1 draft (2 tokens per step for
// less than the full block's cost, which also gives 2), with a full-block verification every
// probe_every steps to refresh the later positions. The current block length shows in the stats,
// the metrics and the summary line.
TEST(SpecPolicyEngine, ShortensTheBlockWhenOnlyTheFirstDraftIsAccepted) {
  double clock = 0;
  ScriptedDraft model(&clock, 4e-3, 0.05e-3, 0.2e-3);
  model.agreeing = 1;
  const Request req = greedy(7, 200);
  auto engine = make_engine(model, options(SpecMode::kAuto, &clock));
  auto stream = engine->submit(req);
  ASSERT_TRUE(stream.ok());
  std::vector<int64_t> steps_by_block(kBlock + 1, 0);  // decode steps by drafts verified
  bool saw_k1_in_summary = false, saw_k1_in_metrics = false;
  std::vector<int32_t> tokens;
  for (int guard = 0; guard < 1000 && !(*stream)->finished(); ++guard) {
    ASSERT_TRUE(engine->step().ok());
    while (auto e = (*stream)->try_pop())
      if (e->token >= 0) tokens.push_back(e->token);
    const EngineStats st = engine->stats();
    if (st.spec_sequences_speculating + st.spec_sequences_plain == 0) continue;  // prefill / done
    ASSERT_EQ(st.spec_block_sequences.size(), size_t(kBlock + 1));
    for (int64_t k = 0; k <= kBlock; ++k) steps_by_block[size_t(k)] += st.spec_block_sequences[size_t(k)];
    if (st.spec_block_sequences[1] == 1) {
      saw_k1_in_summary |= spec_summary_text(st).find("1 speculating (k=1: 1)") != std::string::npos;
      saw_k1_in_metrics |= spec_metrics_text(st).find(
                               "flashseek_spec_policy_block_sequences{drafts=\"1\"} 1\n") != std::string::npos;
    }
  }
  ASSERT_EQ(tokens.size(), 200u);
  EXPECT_EQ(tokens, testing::reference_decode(model, req));
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.spec_accepted, st.spec_steps) << "exactly the first draft of every block survives";
  // Mostly 1-draft blocks, with full-block refreshes every probe_every (4) steps.
  EXPECT_GT(steps_by_block[1], 2 * steps_by_block[kBlock]) << ::testing::PrintToString(steps_by_block);
  EXPECT_GE(steps_by_block[kBlock], 5) << "the later positions are probed again";
  EXPECT_LE(steps_by_block[2], 1) << "2 drafts only where the tokens left cut a probe";
  EXPECT_LT(st.steps, 200 * 2 / 3) << "about 2 tokens per step";
  EXPECT_TRUE(saw_k1_in_summary);
  EXPECT_TRUE(saw_k1_in_metrics);
  // The measured costs: plain step 4.05 ms, a 2-token verify 4.10 ms (ratio 1.0123).
  EXPECT_NE(spec_metrics_text(st).find("flashseek_spec_verify_cost_ratio{batch=\"1\",width=\"2\"} 1.0123"),
            std::string::npos)
      << spec_metrics_text(st);
  EXPECT_NE(spec_summary_text(st).find("verify x2 4.100 ms (1.01x step)"), std::string::npos)
      << spec_summary_text(st);
}

// A perfect draft at batch 4: it pays where a step's cost is mostly fixed (a GPU at small
// batch), and not where every token costs the same (a verify of 1 + k tokens costs 1 + k plain
// steps, as at a large batch): there the policy runs plain steps except for probes.
TEST(SpecPolicyEngine, TurnsItselfOffWhereAVerifyCostsItsWidthInSteps) {
  struct Case {
    double base, per_token;
    bool pays;
  };
  for (const Case c : {Case{4e-3, 0.05e-3, true}, Case{0, 1e-3, false}}) {
    SCOPED_TRACE(::testing::Message() << "base " << c.base << ", per token " << c.per_token);
    double clock = 0;
    ScriptedDraft model(&clock, c.base, c.per_token, 0.2e-3);
    model.agreeing = kBlock;
    auto engine = make_engine(model, options(SpecMode::kAuto, &clock, 4));
    std::vector<std::shared_ptr<EventStream>> streams;
    std::vector<Request> reqs;
    for (uint64_t i = 0; i < 4; ++i) {
      reqs.push_back(greedy(10 + i, 120));
      auto s = engine->submit(reqs.back());
      ASSERT_TRUE(s.ok());
      streams.push_back(*s);
    }
    ASSERT_TRUE(engine->run_until_idle().ok());
    const EngineStats st = engine->stats();
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto got = collect(*streams[i]);
      ASSERT_EQ(got.tokens.size(), 120u);
      EXPECT_EQ(got.tokens, testing::reference_decode(model, reqs[i])) << "request " << i;
    }
    if (c.pays) {
      EXPECT_GT(st.spec_steps, 4 * st.spec_plain_steps);
      EXPECT_LT(st.steps, 120 / 2);
    } else {
      EXPECT_GT(st.spec_plain_steps, 4 * st.spec_steps);
      EXPECT_EQ(st.spec_steps, st.spec_probes) << "only probes verify";
    }
  }
}

// The engine's acceptance over past sequences seeds new ones: after a request that found the
// draft useless, the next request decodes plainly from its first step (no probe of its own
// within the probe interval).
TEST(SpecPolicyEngine, NewSequencesStartFromTheEngineAcceptance) {
  double clock = 0;
  ScriptedDraft model(&clock, 1e-3, 0.1e-3, 0.2e-3);  // never accepted
  auto engine = make_engine(model, options(SpecMode::kAuto, &clock));
  auto first = engine->submit(greedy(3, 40));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(engine->run_until_idle().ok());
  const EngineStats a = engine->stats();
  EXPECT_GE(a.spec_probes, 1);
  const Request req = greedy(4, 6);
  auto second = engine->submit(req);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(engine->run_until_idle().ok());
  const EngineStats b = engine->stats();
  EXPECT_EQ(b.spec_probes, a.spec_probes);
  EXPECT_EQ(b.spec_steps, a.spec_steps);
  // Decode steps for tokens 2 … 5 decide plainly; the last token needs no decision.
  EXPECT_EQ(b.spec_plain_steps, a.spec_plain_steps + 4);
  EXPECT_EQ(collect(**second).tokens, testing::reference_decode(model, req));
}

// Under auto a sampled request with an explicit seed decodes plainly (its tokens cannot depend
// on measured times), so it equals the same request with speculation off, even with a perfect
// draft; without a seed it speculates.
TEST(SpecPolicyEngine, SeededSampledRequestsStayReproducibleUnderAuto) {
  Request r = greedy(5, 30);
  r.sampling = {.temperature = 0.8, .top_k = 20};
  r.seed = 99;
  std::vector<std::vector<int32_t>> got;
  for (SpecMode mode : {SpecMode::kAuto, SpecMode::kOff}) {
    double clock = 0;
    ScriptedDraft model(&clock, 4e-3, 0.05e-3, 0.2e-3);
    model.agreeing = kBlock;
    auto engine = make_engine(model, options(mode, &clock));
    auto s = engine->submit(r);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(engine->run_until_idle().ok());
    got.push_back(collect(**s).tokens);
    EXPECT_EQ(engine->stats().spec_steps, 0);
    Request unseeded = r;
    unseeded.id = 6;
    unseeded.seed.reset();
    ASSERT_TRUE(engine->submit(unseeded).ok());
    ASSERT_TRUE(engine->run_until_idle().ok());
    if (mode == SpecMode::kAuto) EXPECT_GT(engine->stats().spec_steps, 0);
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0].size(), 30u);
}

TEST(SpecPolicyEngine, OnVerifiesEveryStepOffNever) {
  for (SpecMode mode : {SpecMode::kOn, SpecMode::kOff}) {
    double clock = 0;
    ScriptedDraft model(&clock, 1e-3, 0.1e-3, 0.2e-3);  // never accepted
    auto engine = make_engine(model, options(mode, &clock));
    auto s = engine->submit(greedy(2, 40));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(engine->run_until_idle().ok());
    EXPECT_EQ(collect(**s).tokens.size(), 40u);
    const EngineStats st = engine->stats();
    EXPECT_EQ(st.spec_plain_steps, 0);
    if (mode == SpecMode::kOn) {
      // One token per verify (never accepted); the block shrinks to the tokens left − 1, and the
      // last token is a plain decode.
      EXPECT_EQ(st.spec_steps, 38);
      EXPECT_EQ(st.spec_drafted, 36 * kBlock + 2 + 1);
    } else {
      EXPECT_EQ(st.spec_steps, 0);
    }
  }
}

}  // namespace
}  // namespace flashseek::engine
