// Engine behaviour against the FakeModel: decoding equals a reference loop, stop ids / EOS /
// max_tokens, logprobs, prompt logprobs, validation, cancellation, forward errors, prefix states.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace flashseek::engine {
namespace {

using testing::FakeModel;
using testing::greedy_request;
using testing::reference_decode;
using testing::run_alone;


TEST(Engine, GreedyAndSeededMatchReferenceLoop) {
  FakeModel model(97);
  Request g = greedy_request(1, {5, 9, 13, 2}, 12);
  auto res = run_alone(model, g);
  EXPECT_EQ(res.tokens, reference_decode(model, g));
  EXPECT_EQ(res.finish, FinishReason::kLength);
  EXPECT_EQ(res.tokens.size(), 12u);

  Request s = g;
  s.sampling = {.temperature = 0.9, .top_k = 20, .top_p = 0.95};
  s.seed = 1234;
  auto a = run_alone(model, s);
  EXPECT_EQ(a.tokens, reference_decode(model, s));
  EXPECT_NE(a.tokens, res.tokens);  // sampling really happened (97-token vocab, 12 draws)
  s.seed = 1235;
  EXPECT_NE(run_alone(model, s).tokens, a.tokens);
}

TEST(Engine, StopIdsEosAndMaxTokens) {
  FakeModel model(50, /*eos=*/1);
  // Greedy picks token 7 once the history reaches 10 tokens, token 1 (EOS) from 14 on.
  model.set_logits_fn([](std::span<const int32_t> h, std::span<float> out) {
    for (size_t v = 0; v < out.size(); ++v) out[v] = float(v % 5) * 0.1f;  // argmax 4
    if (h.size() >= 10) out[7] = 5;
    if (h.size() >= 14) out[1] = 9;
  });
  Request r = greedy_request(1, {3, 3, 3}, 100);
  r.stop_ids = {7};
  auto res = run_alone(model, r);
  // Positions 3..9 are filled by generated tokens: 4 x7, then the token at history 10 is 7.
  EXPECT_EQ(res.tokens, (std::vector<int32_t>{4, 4, 4, 4, 4, 4, 4, 7}));
  EXPECT_EQ(res.finish, FinishReason::kStop);

  r.stop_ids = {};
  r.ignore_eos = false;
  res = run_alone(model, r);
  ASSERT_EQ(res.tokens.size(), 12u);  // history 14 -> the 12th generated token is EOS
  EXPECT_EQ(res.tokens.back(), 1);
  EXPECT_EQ(res.finish, FinishReason::kStop);

  r.ignore_eos = true;
  r.max_tokens = 20;
  res = run_alone(model, r);
  EXPECT_EQ(res.tokens.size(), 20u);
  EXPECT_EQ(res.finish, FinishReason::kLength);
}

TEST(Engine, ContextLimitEndsWithLength) {
  FakeModel model(40);
  auto engine = testing::make_engine(model, {.max_context = 10});
  auto s = *engine->submit(greedy_request(1, {1, 2, 3, 4}, 100));
  ASSERT_TRUE(engine->run_until_idle().ok());
  auto res = collect(*s);
  EXPECT_EQ(res.finish, FinishReason::kLength);
  EXPECT_EQ(res.tokens.size(), 6u);  // 4 prompt + 6 generated = 10 positions
  auto too_long = engine->submit(greedy_request(2, std::vector<int32_t>(10, 1), 1));
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("context of 10"), std::string::npos);
  EXPECT_FALSE(Engine::create(model, {.max_context = -1}).ok());
}

TEST(Engine, LogprobsAndPromptLogprobs) {
  FakeModel model(61);
  Request r = greedy_request(1, {4, 8, 15, 16, 23, 42}, 5);
  r.logprobs = 3;
  r.prompt_logprobs = 2;
  auto res = run_alone(model, r);
  ASSERT_EQ(res.logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(res.logprobs[i].chosen.id, res.tokens[i]);
    ASSERT_EQ(res.logprobs[i].top.size(), 3u);
    EXPECT_EQ(res.logprobs[i].top[0].id, res.tokens[i]);  // greedy picks the top token
  }
  ASSERT_EQ(res.prompt_logprobs.size(), r.prompt.size());
  EXPECT_FALSE(res.prompt_logprobs[0].has_value());
  std::vector<float> row(61);
  auto fn_history = std::vector<int32_t>{};
  for (size_t i = 1; i < r.prompt.size(); ++i) {
    ASSERT_TRUE(res.prompt_logprobs[i].has_value());
    const auto& lp = *res.prompt_logprobs[i];
    EXPECT_EQ(lp.chosen.id, r.prompt[i]);
    EXPECT_EQ(lp.top.size(), 2u);
    // Independent check: the logits after prompt[0..i) give this logprob for prompt[i].
    auto st = model.new_sequence();
    forward::BatchItem item{st.get(), std::span<const int32_t>(r.prompt).first(i), false};
    std::vector<float> logits;
    ASSERT_TRUE(model.forward(std::span<forward::BatchItem>(&item, 1), logits).ok());
    double mx = -INFINITY, sum = 0;
    for (float x : logits) mx = std::max(mx, double(x));
    for (float x : logits) sum += std::exp(double(x) - mx);
    EXPECT_NEAR(lp.chosen.logprob, logits[size_t(r.prompt[i])] - mx - std::log(sum), 1e-5);
  }
  // max_tokens = 0 scores the prompt only.
  r.max_tokens = 0;
  auto scored = run_alone(model, r);
  EXPECT_TRUE(scored.tokens.empty());
  EXPECT_EQ(scored.finish, FinishReason::kLength);
  ASSERT_EQ(scored.prompt_logprobs.size(), r.prompt.size());
  testing::expect_same_logprobs(*scored.prompt_logprobs[3], *res.prompt_logprobs[3]);
}

TEST(Engine, RejectsBadRequestsWithFieldNames) {
  FakeModel model(30);
  auto engine = testing::make_engine(model);
  auto expect_error = [&](Request r, const std::string& needle) {
    auto s = engine->submit(std::move(r));
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().message();
  };
  expect_error(greedy_request(1, {}, 4), "prompt is empty");
  expect_error(greedy_request(1, {1, 30}, 4), "prompt token 30 at position 1");
  expect_error(greedy_request(1, {1, -2}, 4), "prompt token -2");
  expect_error(greedy_request(1, {1}, -1), "max_tokens");
  Request r = greedy_request(1, {1}, 4);
  r.stop_ids = {99};
  expect_error(r, "stop id 99");
  r = greedy_request(1, {1}, 4);
  r.sampling.top_p = 2;
  expect_error(r, "top_p");
  r = greedy_request(1, {1}, 4);
  r.logprobs = -3;
  expect_error(r, "logprobs");
  ASSERT_TRUE(engine->submit(greedy_request(7, {1, 2}, 4)).ok());
  expect_error(greedy_request(7, {1, 2}, 4), "already in use");
  EXPECT_FALSE(Engine::create(model, {.max_batch = 0}).ok());
  EXPECT_FALSE(Engine::create(model, {.max_batch = 8, .budget = {4, 4}}).ok());
}

TEST(Engine, CancelFreesTheSlotAtOnce) {
  FakeModel model(30);
  auto engine = testing::make_engine(model, {.max_batch = 1});
  auto a = *engine->submit(greedy_request(1, {1, 2, 3}, 1000));
  auto b = *engine->submit(greedy_request(2, {4, 5}, 3));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine->step().ok());
  EXPECT_EQ(engine->stats().running, 1);
  EXPECT_EQ(engine->stats().waiting, 1);
  EXPECT_TRUE(engine->cancel(1));
  EXPECT_EQ(engine->stats().running, 0);  // before any further step
  EXPECT_FALSE(engine->cancel(1));        // no longer live
  ASSERT_TRUE(engine->run_until_idle().ok());
  auto ra = collect(*a);
  EXPECT_EQ(ra.finish, FinishReason::kCancelled);
  EXPECT_EQ(ra.tokens.size(), 4u);  // one token per step before the cancel, none after
  auto rb = collect(*b);
  EXPECT_EQ(rb.finish, FinishReason::kLength);
  EXPECT_EQ(rb.tokens, run_alone(model, greedy_request(2, {4, 5}, 3)).tokens);
  // Cancelling a waiting request.
  auto c = *engine->submit(greedy_request(3, {1}, 5));
  EXPECT_TRUE(engine->cancel(3));
  EXPECT_EQ(engine->stats().waiting, 0);
  EXPECT_EQ(collect(*c).finish, FinishReason::kCancelled);
  EXPECT_FALSE(engine->cancel(12345));
}

TEST(Engine, ForwardErrorEndsInFlightRequestsOnly) {
  FakeModel model(30);
  auto engine = testing::make_engine(model);
  auto a = *engine->submit(greedy_request(1, {1, 2, 3}, 5));
  model.fail_next_forward();
  Status st = engine->step();
  EXPECT_FALSE(st.ok());
  auto ra = collect(*a);
  EXPECT_EQ(ra.finish, FinishReason::kError);
  EXPECT_NE(ra.error.find("injected failure"), std::string::npos);
  EXPECT_EQ(engine->stats().running, 0);
  auto b = *engine->submit(greedy_request(2, {1, 2, 3}, 5));  // the engine is still usable
  ASSERT_TRUE(engine->run_until_idle().ok());
  EXPECT_EQ(collect(*b).tokens.size(), 5u);
}

TEST(Engine, PrefixStateSkipsItsTokens) {
  FakeModel model(45);
  Request full = greedy_request(1, {3, 1, 4, 1, 5, 9, 2, 6}, 7);
  auto want = run_alone(model, full);
  // Snapshot after 5 prompt tokens, made by running them once.
  auto snap = model.new_sequence();
  forward::BatchItem item{snap.get(), std::span<const int32_t>(full.prompt).first(5), false};
  std::vector<float> scratch;
  ASSERT_TRUE(model.forward(std::span<forward::BatchItem>(&item, 1), scratch).ok());
  Request r = full;
  r.prefix = std::shared_ptr<const forward::SequenceState>(snap->clone());
  const size_t calls_before = model.calls().size();
  auto got = run_alone(model, r);
  EXPECT_EQ(got.tokens, want.tokens);
  auto calls = model.calls();
  ASSERT_GT(calls.size(), calls_before);
  EXPECT_EQ(calls[calls_before][0].start, 5);     // started from the snapshot
  EXPECT_EQ(calls[calls_before][0].n_tokens, 3);  // only the rest of the prompt
  EXPECT_EQ(snap->length(), 5);                   // the snapshot itself is untouched (cloned)

  auto engine = testing::make_engine(model);
  Request too_long = full;
  too_long.prefix = std::shared_ptr<const forward::SequenceState>(snap->clone());
  too_long.prompt.resize(5);
  EXPECT_FALSE(engine->submit(too_long).ok());
  Request with_lp = r;
  with_lp.prompt_logprobs = 1;
  EXPECT_FALSE(engine->submit(with_lp).ok());
}

TEST(Engine, UnseededRequestsFollowTheEngineSeed) {
  FakeModel model(80);
  auto sample = [&](uint64_t engine_seed) {
    auto engine = testing::make_engine(model, {.seed = engine_seed});
    Request r = greedy_request(1, {1, 2, 3}, 10);
    r.sampling.temperature = 1.0;  // no Request::seed: the engine picks one
    auto s = *engine->submit(r);
    EXPECT_TRUE(engine->run_until_idle().ok());
    return collect(*s).tokens;
  };
  EXPECT_EQ(sample(5), sample(5));
  EXPECT_NE(sample(5), sample(6));
}

TEST(EventStream, FinalEventClosesTheStream) {
  EventStream s(3);
  EXPECT_FALSE(s.try_pop().has_value());
  EXPECT_FALSE(s.pop_for(10).has_value());  // times out
  TokenEvent tok;
  tok.token = 4;
  s.push(tok);
  TokenEvent fin;
  fin.finish = FinishReason::kCancelled;
  s.push(fin);
  s.push(tok);  // after the final event: dropped
  EXPECT_TRUE(s.finished());
  EXPECT_EQ(s.pop()->token, 4);
  EXPECT_EQ(s.pop()->finish, FinishReason::kCancelled);
  EXPECT_FALSE(s.pop().has_value());  // exhausted: returns at once instead of blocking
  EXPECT_FALSE(s.pop_for(1000).has_value());
}

}  // namespace
}  // namespace flashseek::engine
