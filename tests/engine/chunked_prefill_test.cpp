// Chunked prefill under the step budget (batch_planner.h): a long prompt is prefilled in chunks
// between the decode steps of the sequences already running, so they advance in every step instead
// of waiting for the whole prompt; the chunks respect the budget; results equal each request alone.
#include <gtest/gtest.h>

#include <map>

#include "engine_test_util.h"

namespace flashseek::engine {
namespace {

using testing::FakeModel;
using testing::greedy_request;
using testing::make_engine;
using testing::random_prompt;
using testing::run_alone;


// Per forward call, the item of each state (nullptr-free: every item names its state).
std::map<const forward::SequenceState*, testing::RecordedItem> items_by_state(
    const std::vector<testing::RecordedItem>& call) {
  std::map<const forward::SequenceState*, testing::RecordedItem> m;
  for (const auto& it : call) {
    EXPECT_NE(it.state, nullptr);
    EXPECT_TRUE(m.emplace(it.state, it).second) << "a state appears twice in one call";
  }
  return m;
}

// One sequence decoding, then a prompt much longer than a step's budget arrives: every step while
// the prompt is prefilling carries exactly one decode token of the first sequence (its stream gets
// one token per step), the prompt goes in chunks of what is left of the budget, and nothing
// exceeds the budget.
TEST(ChunkedPrefill, DecodingSequenceAdvancesInEveryStepWhileALongPromptPrefills) {
  FakeModel model(61);
  Rng rng(17);
  // The chunk cap equals the step budget: only the decode-first rule leaves room for a's token.
  const EngineOptions opt{.max_batch = 4, .budget = {.max_step_tokens = 48, .max_prefill_chunk = 48}};
  auto engine = make_engine(model, opt);
  const Request a = greedy_request(1, random_prompt(rng, 5, 61), 400);
  auto sa = *engine->submit(a);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->step().ok());  // a's prompt, then decoding
  while (sa->try_pop()) {
  }
  constexpr int64_t kLong = 1000;
  const Request b = greedy_request(2, random_prompt(rng, kLong, 61), 5);
  auto sb = *engine->submit(b);

  const size_t first_call = model.calls().size();
  int64_t b_done = 0, steps = 0;
  const forward::SequenceState* a_state = nullptr;
  const forward::SequenceState* b_state = nullptr;
  int64_t a_len = -1;
  while (b_done < kLong) {
    ASSERT_LT(steps, kLong) << "the long prompt made no progress";
    ASSERT_TRUE(engine->step().ok());
    ++steps;
    const auto call = model.calls().back();
    ASSERT_EQ(call.size(), 2u) << "step " << steps << ": a decode of a and a chunk of b";
    // Admission order: a first. The first call identifies the states.
    if (!a_state) {
      a_state = call[0].state;
      b_state = call[1].state;
      a_len = call[0].start;
      ASSERT_NE(a_state, b_state);
    }
    auto by = items_by_state(call);
    ASSERT_EQ(by.count(a_state), 1u);
    ASSERT_EQ(by.count(b_state), 1u);
    const auto& ia = by[a_state];
    const auto& ib = by[b_state];
    // a: one decode token, exactly one position further than in the previous step.
    EXPECT_EQ(ia.n_tokens, 1) << "step " << steps;
    EXPECT_EQ(ia.start, a_len) << "step " << steps;
    a_len = ia.start + 1;
    // b: the next chunk of its prompt, as large as the budget allows.
    EXPECT_EQ(ib.start, b_done) << "step " << steps;
    EXPECT_EQ(ib.n_tokens, std::min({kLong - b_done, opt.budget.max_prefill_chunk,
                                     opt.budget.max_step_tokens - 1}))
        << "step " << steps;
    EXPECT_LE(ia.n_tokens + ib.n_tokens, opt.budget.max_step_tokens);
    b_done += ib.n_tokens;
    // a's stream got its token of this step.
    auto ev = sa->try_pop();
    ASSERT_TRUE(ev.has_value()) << "a got no token in step " << steps;
    EXPECT_GE(ev->token, 0);
    EXPECT_FALSE(sa->try_pop().has_value()) << "a got more than one token in step " << steps;
  }
  // 1000 tokens in chunks of 48 - 1 = 47: 22 steps, not one 1000-token stall.
  EXPECT_EQ(steps, (kLong + 46) / 47);
  EXPECT_EQ(int64_t(model.calls().size() - first_call), steps);
  ASSERT_TRUE(engine->run_until_idle().ok());
  // Interleaving changes nothing in either result.
  testing::expect_same_result(collect(*sb), run_alone(model, b));
  auto rest = collect(*sa);
  EXPECT_EQ(rest.finish, FinishReason::kLength);
}

// With a prompt chunk larger than the step budget, the budget is what bounds the step: decodes of
// every running sequence first, then the prompt gets the remainder; the decoding sequences still
// advance in every step.
TEST(ChunkedPrefill, StepBudgetBoundsTheChunkAndDecodesComeFirst) {
  FakeModel model(47);
  Rng rng(5);
  const EngineOptions opt{.max_batch = 4, .budget = {.max_step_tokens = 16, .max_prefill_chunk = 256}};
  auto engine = make_engine(model, opt);
  std::vector<Request> reqs;
  std::vector<std::shared_ptr<EventStream>> streams;
  for (uint64_t i = 0; i < 3; ++i) {
    reqs.push_back(greedy_request(i + 1, random_prompt(rng, 3, 47), 200));
    streams.push_back(*engine->submit(reqs.back()));
  }
  ASSERT_TRUE(engine->step().ok());  // three 3-token prompts in one step (9 <= 16)
  ASSERT_EQ(model.calls().back().size(), 3u);
  reqs.push_back(greedy_request(9, random_prompt(rng, 300, 47), 3));
  streams.push_back(*engine->submit(reqs.back()));
  int64_t prefilled = 0, steps = 0;
  while (prefilled < 300) {
    ASSERT_LT(steps, 300);
    ASSERT_TRUE(engine->step().ok());
    ++steps;
    const auto call = model.calls().back();
    ASSERT_EQ(call.size(), 4u);
    int64_t decodes = 0, total = 0;
    for (size_t i = 0; i < 3; ++i) decodes += call[i].n_tokens == 1 && call[i].start >= 3;
    for (const auto& it : call) total += it.n_tokens;
    EXPECT_EQ(decodes, 3) << "step " << steps << ": every decoding sequence advances";
    EXPECT_EQ(call[3].start, prefilled);
    EXPECT_EQ(call[3].n_tokens, std::min<int64_t>(300 - prefilled, 16 - 3));
    EXPECT_LE(total, opt.budget.max_step_tokens);
    prefilled += call[3].n_tokens;
  }
  EXPECT_EQ(steps, (300 + 12) / 13);
  ASSERT_TRUE(engine->run_until_idle().ok());
  for (size_t i = 0; i < reqs.size(); ++i)
    testing::expect_same_result(collect(*streams[i]), run_alone(model, reqs[i]));
}

}  // namespace
}  // namespace flashseek::engine
