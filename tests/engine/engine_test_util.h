// Helpers for engine tests: run one request alone, and an independent reference decode loop.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <optional>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "fake_model.h"

namespace flashseek::engine::testing {

// An engine for tests; fails the test on bad options.
// A greedy request that ignores EOS (runs exactly max_tokens).
inline Request greedy_request(uint64_t id, std::vector<int32_t> prompt, int64_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  return r;
}

inline std::unique_ptr<Engine> make_engine(forward::Model& model, EngineOptions options = {}) {
  auto engine = Engine::create(model, std::move(options));
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

// engine::collect for a stream fed by the threaded scheduler: waits at most `limit` for the
// final event, so a scheduler that stops producing fails the test instead of hanging it.
inline GenerationResult collect_within(EventStream& stream,
                                       std::chrono::seconds limit = std::chrono::seconds(60)) {
  GenerationResult r;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    auto e = left.count() > 0 ? stream.pop_for(left.count()) : std::nullopt;
    if (!e) {
      ADD_FAILURE() << "request " << stream.request_id() << ": no final event within " << limit.count() << " s";
      return r;
    }
    if (!e->prompt_logprobs.empty()) r.prompt_logprobs = std::move(e->prompt_logprobs);
    if (e->token >= 0) {
      r.tokens.push_back(e->token);
      if (e->logprobs) r.logprobs.push_back(std::move(*e->logprobs));
    }
    if (e->finish != FinishReason::kNone) {
      r.finish = e->finish;
      r.error = e->error;
      return r;
    }
  }
}

// Runs `r` in a fresh engine with default options, on the calling thread.
inline GenerationResult run_alone(forward::Model& model, Request r) {
  auto engine = Engine::create(model, {});
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  auto stream = (*engine)->submit(std::move(r));
  EXPECT_TRUE(stream.ok()) << stream.status().to_string();
  if (!stream.ok()) return {};
  EXPECT_TRUE((*engine)->run_until_idle().ok());
  return collect(**stream);
}

// Reference: feed the prompt as one block, then one token at a time, sampling with sample_token
// (no engine, no batching, no chunking). Stops on max_tokens / stop ids / EOS like the engine.
inline std::vector<int32_t> reference_decode(forward::Model& model, const Request& r) {
  auto state = model.new_sequence();
  std::vector<int32_t> out;
  std::vector<int32_t> feed = r.prompt;
  SamplingParams params = r.sampling;
  params.seed = r.seed.value_or(0);
  while (int64_t(out.size()) < r.max_tokens) {
    forward::BatchItem item{state.get(), feed, false};
    std::vector<float> logits;
    EXPECT_TRUE(model.forward(std::span<forward::BatchItem>(&item, 1), logits).ok());
    auto tok = sample_token(logits, params, state->length());
    EXPECT_TRUE(tok.ok());
    out.push_back(*tok);
    const bool eos = !r.ignore_eos && *tok == model.config().eos_token_id;
    if (eos || std::find(r.stop_ids.begin(), r.stop_ids.end(), *tok) != r.stop_ids.end()) break;
    feed = {*tok};
  }
  return out;
}

inline std::vector<int32_t> random_prompt(Rng& rng, int64_t len, int64_t vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = int32_t(rng.below(uint64_t(vocab)));
  return p;
}

// Random sampling parameters for `r`: greedy (30 %) or seeded sampling with random temperature,
// top-k, top-p and min-p filters.
inline void random_sampling(Rng& rng, int64_t vocab, Request& r) {
  if (rng.uniform() < 0.3) {
    r.sampling.temperature = 0;
  } else {
    r.sampling.temperature = 0.3 + rng.uniform();
    r.sampling.top_k = int64_t(rng.below(uint64_t(vocab)));
    r.sampling.top_p = rng.uniform() < 0.5 ? 1.0 : 0.5 + 0.5 * rng.uniform();
    r.sampling.min_p = rng.uniform() < 0.7 ? 0.0 : 0.05;
    r.seed = rng.next_u64();
  }
}

inline void expect_same_logprobs(const PositionLogprobs& a, const PositionLogprobs& b) {
  EXPECT_EQ(a.chosen.id, b.chosen.id);
  EXPECT_EQ(a.chosen.logprob, b.chosen.logprob);
  ASSERT_EQ(a.top.size(), b.top.size());
  for (size_t i = 0; i < a.top.size(); ++i) {
    EXPECT_EQ(a.top[i].id, b.top[i].id);
    EXPECT_EQ(a.top[i].logprob, b.top[i].logprob);
  }
}

inline void expect_same_result(const GenerationResult& a, const GenerationResult& b) {
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.finish, b.finish);
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
  for (size_t i = 0; i < a.logprobs.size(); ++i) expect_same_logprobs(a.logprobs[i], b.logprobs[i]);
  ASSERT_EQ(a.prompt_logprobs.size(), b.prompt_logprobs.size());
  for (size_t i = 0; i < a.prompt_logprobs.size(); ++i) {
    ASSERT_EQ(a.prompt_logprobs[i].has_value(), b.prompt_logprobs[i].has_value());
    if (a.prompt_logprobs[i]) expect_same_logprobs(*a.prompt_logprobs[i], *b.prompt_logprobs[i]);
  }
}

}  // namespace flashseek::engine::testing
