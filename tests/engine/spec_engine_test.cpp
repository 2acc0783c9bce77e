// Speculative decoding through the engine on the real CPU forward pass (tiny-v41 from make-tiny):
// greedy output with speculation equals greedy output without it over 500+ tokens, alone and
// batched; seeded sampling is batch-invariant. A wrapper whose draft is the target's own greedy
// continuation with scripted corruptions drives every acceptance length (0 … B, bonus) through
// the engine, where the real random draft accepts almost nothing.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "model/make_tiny.h"
#include "test_util.h"

namespace flashseek::engine {
namespace {

using testing::make_engine;

// Forwards everything to `inner`; propose() returns the target's greedy continuation, except
// that the draft for position p is corrupted when hash(p) % 4 == 0 — so over consecutive steps
// every accepted length 0 … B occurs. `logits_like_target`: the draft logits
// are the target's (a sampling request then has q_i == p_i and accepts everything uncorrupted).
class OracleDraft final : public forward::Model {
 public:
  explicit OracleDraft(forward::Model& inner) : inner_(inner) {}
  const model::ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<forward::SequenceState> new_sequence() const override {
    return inner_.new_sequence();
  }
  Status forward(std::span<forward::BatchItem> batch, std::vector<float>& logits) override {
    return inner_.forward(batch, logits);
  }
  Status rollback(forward::SequenceState& s, int64_t n) const override {
    return inner_.rollback(s, n);
  }
  bool has_draft() const override { return true; }
  Result<forward::DraftBlock> propose(const forward::SequenceState& state, int32_t x0,
                                      const forward::DraftChooser& choose) const override {
    const int64_t B = config().dspark_block_size, V = config().vocab_size;
    auto st = state.clone();
    forward::DraftBlock out;
    int32_t feed = x0;
    for (int64_t i = 1; i <= B; ++i) {
      std::vector<float> row;
      forward::BatchItem item{st.get(), std::span<const int32_t>(&feed, 1), false};
      FS_RETURN_IF_ERROR(inner_.forward(std::span<forward::BatchItem>(&item, 1), row));
      int32_t y =
          choose ? choose(i, row) : int32_t(std::max_element(row.begin(), row.end()) - row.begin());
      if (mix64(uint64_t(state.length() + i)) % 4 == 0)
        y = (y + 1) % int32_t(V);  // logits stay the target's
      out.logits.insert(out.logits.end(), row.begin(), row.end());
      out.tokens.push_back(y);
      out.confidence.push_back(0.0f);
      feed = y;
    }
    ++proposals;
    return out;
  }
  mutable int64_t proposals = 0;

 private:
  forward::Model& inner_;
};

// Forwards everything to `inner` and advances a scripted clock (the engine's cost measurement)
// on every forward call by base + per_token × tokens and on every proposal by draft_cost: the
// policy then decides from these costs, not from the wall clock.
class Clocked final : public forward::Model {
 public:
  Clocked(forward::Model& inner, double base, double per_token, double draft_cost)
      : inner_(inner), base_(base), per_token_(per_token), draft_(draft_cost) {}
  mutable double now = 0;  // the scripted clock, in seconds
  const model::ModelConfig& config() const override { return inner_.config(); }
  std::unique_ptr<forward::SequenceState> new_sequence() const override {
    return inner_.new_sequence();
  }
  Status forward(std::span<forward::BatchItem> batch, std::vector<float>& logits) override {
    for (const auto& item : batch) now += per_token_ * double(item.tokens.size());
    now += base_;
    return inner_.forward(batch, logits);
  }
  Status rollback(forward::SequenceState& s, int64_t n) const override { return inner_.rollback(s, n); }
  bool has_draft() const override { return inner_.has_draft(); }
  int64_t draft_block_size() const override { return inner_.draft_block_size(); }
  Result<forward::DraftBlock> propose(const forward::SequenceState& state, int32_t x0,
                                      const forward::DraftChooser& choose) const override {
    now += draft_;
    return inner_.propose(state, x0, choose);
  }

 private:
  forward::Model& inner_;
  double base_, per_token_, draft_;
};

class SpecEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = model::builtin_config("tiny-v41");
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 3}, dir_.path().string()).ok());
    auto m = forward::load_model(dir_.path().string(), forward::Numerics::kReference);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    ASSERT_TRUE(model_->has_draft()) << "tiny-v41 should carry DSpark weights";
  }
  // Runs `reqs` in one engine (max_batch 3, small budget so prompts chunk) and returns results.
  std::vector<GenerationResult> run(forward::Model& model, const std::vector<Request>& reqs,
                                    SpecMode spec, EngineStats* stats = nullptr) {
    auto engine = make_engine(model, {.max_batch = 3, .budget = {32, 16}, .speculative = spec});
    std::vector<std::shared_ptr<EventStream>> streams;
    for (const Request& r : reqs) {
      auto s = engine->submit(r);
      EXPECT_TRUE(s.ok()) << s.status().to_string();
      if (s.ok()) streams.push_back(*s);
    }
    EXPECT_TRUE(engine->run_until_idle().ok());
    if (stats) *stats = engine->stats();
    std::vector<GenerationResult> out;
    for (auto& s : streams) out.push_back(collect(*s));
    return out;
  }
  Request greedy_request(uint64_t id, int64_t prompt_len, int64_t max_tokens) const {
    Rng rng(id + 40);
    Request r;
    r.id = id;
    r.prompt = testing::random_prompt(rng, prompt_len, model_->config().vocab_size);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.logprobs = 2;
    r.sampling.temperature = 0;
    return r;
  }
  flashseek::testing::TempDir dir_;
  std::unique_ptr<forward::Model> model_;
};

void log_stats(const char* what, const EngineStats& s) {
  std::string per;
  for (int64_t a : s.spec_accepted_at) per += " " + std::to_string(a);
  std::printf(
      "[spec] %s: %lld verify steps, %lld drafted, %lld accepted (per position:%s), %.3f "
      "tokens/step\n",
      what, (long long)s.spec_steps, (long long)s.spec_drafted, (long long)s.spec_accepted,
      per.c_str(), s.spec_steps ? double(s.spec_emitted) / double(s.spec_steps) : 0.0);
}

TEST_F(SpecEngine, GreedyEqualsPlainOver500TokensWithTheRealDraft) {
  const std::vector<Request> reqs = {greedy_request(1, 9, 520)};
  EngineStats st;
  EngineStats st_auto;
  const auto spec = run(*model_, reqs, SpecMode::kOn, &st);
  const auto autos = run(*model_, reqs, SpecMode::kAuto, &st_auto);
  const auto plain = run(*model_, reqs, SpecMode::kOff);
  ASSERT_EQ(spec[0].tokens.size(), 520u);
  ASSERT_EQ(plain[0].tokens.size(), 520u);
  for (size_t i = 0; i < 520; ++i)
    ASSERT_EQ(spec[0].tokens[i], plain[0].tokens[i]) << "first difference at generated token " << i;
  testing::expect_same_result(spec[0], plain[0]);
  testing::expect_same_result(autos[0], plain[0]);
  EXPECT_GT(st.spec_steps, 0);
  EXPECT_GT(st_auto.spec_probes, 0);
  log_stats("tiny-v41 random draft", st);
  log_stats("tiny-v41 random draft, auto", st_auto);
}

// `auto` on the real model with costs where a good draft pays (a step's cost mostly fixed, as on
// a GPU at small batch: a 4-token verify costs 1.04x a plain step): with the checkpoint's random
// draft (which the target never accepts) it turns itself off after its first probe and only
// probes again now and then; with a draft that agrees (the oracle, ~75 % per position) it
// speculates in most steps. Greedy output is the plain decode's either way.
TEST_F(SpecEngine, AutoTurnsOffOnTheRandomDraftAndSpeculatesWithAnAgreeingOne) {
  const Request req = greedy_request(4, 7, 300);
  const auto plain = run(*model_, {req}, SpecMode::kOff);
  OracleDraft oracle(*model_);
  for (forward::Model* draft : {static_cast<forward::Model*>(model_.get()), static_cast<forward::Model*>(&oracle)}) {
    const bool agreeing = draft == &oracle;
    SCOPED_TRACE(agreeing ? "oracle draft" : "random draft");
    Clocked clocked(*draft, 4e-3, 0.05e-3, 0.5e-3);
    EngineOptions o{.max_batch = 1, .speculative = SpecMode::kAuto};
    o.clock = [&clocked] { return clocked.now; };
    auto engine = make_engine(clocked, o);
    auto stream = engine->submit(req);
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(engine->run_until_idle().ok());
    testing::expect_same_result(collect(**stream), plain[0]);
    const EngineStats st = engine->stats();
    log_stats(agreeing ? "tiny-v41 oracle draft, auto, scripted costs" : "tiny-v41 random draft, auto, scripted costs", st);
    if (agreeing) {
      // Most decode steps verify (the plain ones are while it learns the acceptance at the start),
      // and the 300 tokens take fewer than half as many forward calls.
      EXPECT_GT(st.spec_steps, st.spec_plain_steps);
      EXPECT_GT(st.spec_accepted, 100);
      EXPECT_LT(st.steps, 300 / 2);
    } else {
      EXPECT_EQ(st.spec_steps, st.spec_probes) << "only probes verify";
      EXPECT_GE(st.spec_probes, 2) << "it probes again while off";
      EXPECT_LE(st.spec_probes, 8);
      EXPECT_GE(st.spec_plain_steps, 280);
    }
  }
}

// V4's MTP block as the draft (one draft per step, CpuModel::propose): greedy output is the same
// with speculation on, auto and off, alone and batched with seeded sampling requests, which are
// batch-invariant.
TEST(SpecEngineV4, MtpDraftGreedySameOnAutoOff) {
  flashseek::testing::TempDir dir;
  auto cfg = model::builtin_config("tiny-v4");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 5}, dir.path().string()).ok());
  auto m = forward::load_model(dir.path().string(), forward::Numerics::kReference);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  forward::Model& model = **m;
  ASSERT_TRUE(model.has_draft()) << "tiny-v4 carries an MTP block";
  ASSERT_EQ(model.draft_block_size(), 1);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 3; ++i) {
    Rng rng(i + 90);
    Request r;
    r.id = i;
    r.prompt = testing::random_prompt(rng, 5 + int64_t(i) * 6, model.config().vocab_size);
    r.max_tokens = i == 0 ? 160 : 40;
    r.ignore_eos = true;
    r.logprobs = 2;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  reqs[2].sampling = {.temperature = 0.8, .top_k = 40};
  reqs[2].seed = 11;
  auto run = [&](const std::vector<Request>& rs, SpecMode mode, EngineStats* stats) {
    auto engine = make_engine(model, {.max_batch = 3, .budget = {32, 16}, .speculative = mode});
    std::vector<std::shared_ptr<EventStream>> streams;
    for (const Request& r : rs) streams.push_back(*engine->submit(r));
    EXPECT_TRUE(engine->run_until_idle().ok());
    if (stats) *stats = engine->stats();
    std::vector<GenerationResult> out;
    for (auto& s : streams) out.push_back(collect(*s));
    return out;
  };
  EngineStats on_stats, auto_stats;
  const auto on = run(reqs, SpecMode::kOn, &on_stats);
  const auto aut = run(reqs, SpecMode::kAuto, &auto_stats);
  const auto off = run(reqs, SpecMode::kOff, nullptr);
  for (size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(on[i].tokens.size(), size_t(reqs[i].max_tokens));
    testing::expect_same_result(on[i], off[i]);
    testing::expect_same_result(aut[i], off[i]);
  }
  EXPECT_EQ(run({reqs[2]}, SpecMode::kOn, nullptr)[0].tokens, on[2].tokens);
  EXPECT_EQ(on[2].tokens.size(), 40u);
  EXPECT_GT(on_stats.spec_steps, 100);
  EXPECT_EQ(on_stats.spec_accepted_at.size(), 1u);
  EXPECT_EQ(auto_stats.spec_mode, SpecMode::kAuto);
  log_stats("tiny-v4 MTP draft", on_stats);
}

TEST_F(SpecEngine, GreedyEqualsPlainOver500TokensWithEveryAcceptanceLength) {
  OracleDraft oracle(*model_);
  const std::vector<Request> reqs = {greedy_request(2, 5, 510)};
  EngineStats st;
  const auto spec = run(oracle, reqs, SpecMode::kOn, &st);
  const auto plain = run(*model_, reqs, SpecMode::kOff);
  testing::expect_same_result(spec[0], plain[0]);
  const int64_t B = model_->config().dspark_block_size;
  ASSERT_EQ(int64_t(st.spec_accepted_at.size()), B);
  // accepted_at[i] counts steps with n > i, so a strictly falling, positive sequence below the
  // step count means every length 0 … B occurred.
  EXPECT_LT(st.spec_accepted_at[0], st.spec_steps);
  for (int64_t i = 0; i < B; ++i) {
    EXPECT_GT(st.spec_accepted_at[size_t(i)], 0) << "position " << i + 1;
    if (i > 0)
      EXPECT_LT(st.spec_accepted_at[size_t(i)], st.spec_accepted_at[size_t(i - 1)])
          << "position " << i + 1;
  }
  EXPECT_GT(double(st.spec_emitted) / double(st.spec_steps), 1.5);
  EXPECT_LT(st.steps, 510 / 2) << "speculation should cut the number of forward calls";
  log_stats("tiny-v41 oracle draft", st);
}

TEST_F(SpecEngine, BatchedGreedyAndSampledRequests) {
  OracleDraft oracle(*model_);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 5; ++i)
    reqs.push_back(greedy_request(10 + i, 3 + int64_t(i) * 7, 40 + int64_t(i) * 9));
  reqs[1].sampling = {.temperature = 0.9, .top_k = 50};
  reqs[1].seed = 77;
  reqs[3].sampling = {.temperature = 1.1, .top_p = 0.9};
  reqs[3].seed = 78;
  reqs[4].stop_ids = {reqs[4].prompt[0]};  // may or may not be hit; must behave like plain
  const auto real_spec = run(*model_, reqs, SpecMode::kOn);
  const auto oracle_spec = run(oracle, reqs, SpecMode::kOn);
  const auto plain = run(*model_, reqs, SpecMode::kOff);
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE(i);
    if (reqs[i].sampling.greedy()) {
      testing::expect_same_result(real_spec[i], plain[i]);
      testing::expect_same_result(oracle_spec[i], plain[i]);
    }
    // Speculative requests alone give the same tokens as inside the batch.
    const auto alone = run(oracle, {reqs[i]}, SpecMode::kOn);
    testing::expect_same_result(alone[0], oracle_spec[i]);
    EXPECT_LE(oracle_spec[i].tokens.size(), size_t(reqs[i].max_tokens));
    EXPECT_EQ(oracle_spec[i].tokens.size(), plain[i].tokens.size()) << "length / stop as plain";
  }
}

TEST_F(SpecEngine, StopIdsAndMaxTokensCutAnAcceptedBlockLikePlainDecoding) {
  OracleDraft oracle(*model_);
  const Request base = greedy_request(30, 6, 60);
  const auto plain = run(*model_, {base}, SpecMode::kOff);
  ASSERT_EQ(plain[0].tokens.size(), 60u);
  // A stop id that first occurs mid-output (wherever that falls inside a verified block).
  for (size_t at : {size_t(7), size_t(20), size_t(33)}) {
    Request r = base;
    r.stop_ids = {plain[0].tokens[at]};
    const auto want = run(*model_, {r}, SpecMode::kOff);
    const auto got = run(oracle, {r}, SpecMode::kOn);
    SCOPED_TRACE(at);
    testing::expect_same_result(got[0], want[0]);
    EXPECT_EQ(got[0].finish, FinishReason::kStop);
  }
  // Every max_tokens from 1 to 12 ends exactly there.
  for (int64_t n = 1; n <= 12; ++n) {
    Request r = base;
    r.max_tokens = n;
    const auto got = run(oracle, {r}, SpecMode::kOn);
    SCOPED_TRACE(n);
    ASSERT_EQ(int64_t(got[0].tokens.size()), n);
    EXPECT_TRUE(std::equal(got[0].tokens.begin(), got[0].tokens.end(), plain[0].tokens.begin()));
    EXPECT_EQ(got[0].finish, FinishReason::kLength);
  }
}

}  // namespace
}  // namespace flashseek::engine
