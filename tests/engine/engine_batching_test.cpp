// Continuous batching against the FakeModel: any mix of requests, chunk sizes and batch limits
// gives every request exactly the result it gets alone; new requests join running batches;
// limits hold; the threaded scheduler serves concurrent clients.
#include <gtest/gtest.h>

#include <thread>

#include "engine_test_util.h"

namespace flashseek::engine {
namespace {

using testing::FakeModel;
using testing::make_engine;
using testing::random_prompt;
using testing::random_sampling;
using testing::run_alone;

// A random request: odd prompt lengths (some longer than a chunk), greedy or seeded sampling
// with random filters, logprobs and prompt logprobs now and then, stop ids sometimes.
Request random_request(Rng& rng, uint64_t id, int64_t vocab) {
  Request r;
  r.id = id;
  r.prompt = random_prompt(rng, 1 + int64_t(rng.below(rng.uniform() < 0.3 ? 400 : 40)), vocab);
  r.max_tokens = int64_t(rng.below(30));
  r.ignore_eos = rng.uniform() < 0.5;
  random_sampling(rng, vocab, r);
  if (rng.uniform() < 0.3) r.stop_ids = {int32_t(rng.below(uint64_t(vocab)))};
  if (rng.uniform() < 0.4) r.logprobs = int64_t(rng.below(5));
  if (rng.uniform() < 0.3) r.prompt_logprobs = int64_t(rng.below(4));
  return r;
}

TEST(EngineBatching, BatchedEqualsAloneForRandomMixes) {
  FakeModel model(53);
  Rng rng(2024);
  for (int round = 0; round < 6; ++round) {
    EngineOptions opt;
    opt.max_batch = 1 + int64_t(rng.below(6));
    opt.budget.max_step_tokens = opt.max_batch + int64_t(rng.below(100));
    opt.budget.max_prefill_chunk = 1 + int64_t(rng.below(70));
    auto engine = make_engine(model, opt);
    std::vector<Request> reqs;
    std::vector<std::shared_ptr<EventStream>> streams;
    for (uint64_t i = 0; i < 9; ++i) {
      reqs.push_back(random_request(rng, 100 * uint64_t(round) + i, 53));
      streams.push_back(*engine->submit(reqs.back()));
      // Interleave steps with arrivals so requests join at different points.
      if (rng.uniform() < 0.5) {
        ASSERT_TRUE(engine->step().ok());
      }
    }
    ASSERT_TRUE(engine->run_until_idle().ok());
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE("round " + std::to_string(round) + " request " + std::to_string(i));
      auto batched = collect(*streams[i]);
      auto alone = run_alone(model, reqs[i]);
      testing::expect_same_result(batched, alone);
      if (reqs[i].seed || reqs[i].sampling.temperature == 0) {
        EXPECT_EQ(batched.tokens, testing::reference_decode(model, reqs[i]));
      }
    }
  }
  // The mixes really were mixed: some forward call carried a decode step next to a prompt chunk.
  int mixed = 0;
  for (const auto& call : model.calls()) {
    bool decode = false, prefill = false;
    for (const auto& item : call) (item.start > 0 && item.n_tokens == 1 ? decode : prefill) = true;
    mixed += decode && prefill;
  }
  EXPECT_GT(mixed, 10);
}

TEST(EngineBatching, StepsRespectBatchAndTokenLimits) {
  FakeModel model(31);
  Rng rng(8);
  EngineOptions opt{.max_batch = 3, .budget = {.max_step_tokens = 20, .max_prefill_chunk = 7}};
  auto engine = make_engine(model, opt);
  for (uint64_t i = 0; i < 8; ++i) {
    Request r;
    r.id = i;
    r.prompt = random_prompt(rng, 1 + int64_t(rng.below(30)), 31);
    r.max_tokens = 5;
    r.ignore_eos = true;
    ASSERT_TRUE(engine->submit(r).ok());
  }
  ASSERT_TRUE(engine->run_until_idle().ok());
  for (const auto& call : model.calls()) {
    EXPECT_LE(int64_t(call.size()), opt.max_batch);
    int64_t tokens = 0;
    for (const auto& item : call) {
      tokens += item.n_tokens;
      EXPECT_LE(item.n_tokens, opt.budget.max_prefill_chunk);
    }
    EXPECT_LE(tokens, opt.budget.max_step_tokens);
  }
  EXPECT_EQ(engine->stats().generated_tokens, 8 * 5);
}

TEST(EngineBatching, NewRequestsJoinTheRunningBatch) {
  FakeModel model(41);
  auto engine = make_engine(model, {.max_batch = 4});
  Request a;
  a.id = 1;
  a.prompt = {1, 2, 3, 4, 5};
  a.max_tokens = 40;
  a.ignore_eos = true;
  a.sampling.temperature = 0;
  auto sa = *engine->submit(a);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(engine->step().ok());
  Request b = a;
  b.id = 2;
  b.prompt = {9, 8, 7};
  b.max_tokens = 6;
  b.seed = 77;
  b.sampling.temperature = 1.0;
  auto sb = *engine->submit(b);
  const size_t before = model.calls().size();
  ASSERT_TRUE(engine->step().ok());
  auto call = model.calls()[before];
  ASSERT_EQ(call.size(), 2u);  // one ragged batch: A's decode step and B's whole prompt
  EXPECT_EQ(call[0].start, 9);  // A: 5 prompt + 4 fed generated tokens
  EXPECT_EQ(call[0].n_tokens, 1);
  EXPECT_EQ(call[1].start, 0);
  EXPECT_EQ(call[1].n_tokens, 3);
  EXPECT_EQ(engine->stats().running, 2);
  ASSERT_TRUE(engine->run_until_idle().ok());
  testing::expect_same_result(collect(*sa), run_alone(model, a));
  testing::expect_same_result(collect(*sb), run_alone(model, b));
}

TEST(EngineBatching, ThreadedSchedulerServesConcurrentClients) {
  FakeModel model(67);
  auto engine = make_engine(model, {.max_batch = 5, .budget = {32, 16}});
  engine->start();
  Rng seeds(99);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 24; ++i) reqs.push_back(random_request(seeds, i, 67));
  std::vector<GenerationResult> got(reqs.size());
  std::vector<std::thread> clients;
  for (size_t c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      for (size_t i = c; i < reqs.size(); i += 4) {
        auto s = engine->submit(reqs[i]);
        if (!s.ok()) {  // the queue holds all 24: a refusal is a bug, not a case to skip
          ADD_FAILURE() << "submit " << i << ": " << s.status().to_string();
          continue;
        }
        got[i] = testing::collect_within(**s);
      }
    });
  }
  for (auto& t : clients) t.join();
  engine->stop();
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    testing::expect_same_result(got[i], run_alone(model, reqs[i]));
  }
}

TEST(EngineBatching, CancelWhileTheSchedulerRuns) {
  FakeModel model(29);
  auto engine = make_engine(model, {.max_batch = 2});
  engine->start();
  Request r;
  r.id = 5;
  r.prompt = {1, 2};
  r.max_tokens = 1 << 30;
  r.ignore_eos = true;
  auto s = *engine->submit(r);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(s->pop_for(60'000).has_value());  // it is generating
  EXPECT_TRUE(engine->cancel(5));
  EXPECT_EQ(engine->stats().running, 0);
  // Whatever was already queued ends with the cancel event and nothing after it.
  std::optional<TokenEvent> e, last;
  while ((e = s->pop_for(60'000))) last = e;  // ends when exhausted (or after 60 s: then it fails)
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->finish, FinishReason::kCancelled);
  EXPECT_FALSE(s->pop_for(50).has_value());
  // The slot is reusable.
  r.id = 6;
  r.max_tokens = 3;
  EXPECT_EQ(testing::collect_within(**engine->submit(r)).tokens.size(), 3u);
  engine->stop();
}

TEST(EngineBatching, StopCancelsUnfinishedRequests) {
  FakeModel model(29);
  auto engine = make_engine(model);
  Request r;
  r.id = 1;
  r.prompt = {3};
  r.max_tokens = 10;
  auto s = *engine->submit(r);
  engine->stop();
  EXPECT_EQ(collect(*s).finish, FinishReason::kCancelled);
  EXPECT_FALSE(engine->submit(r).ok());
}

}  // namespace
}  // namespace flashseek::engine
