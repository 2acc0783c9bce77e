// The engine on the real CPU forward pass (tiny-v41 / tiny-v4 checkpoints from make-tiny):
// batched with continuous joining and chunked prompts == each request alone, for greedy and
// seeded sampling, and the prefix-state hook with real SequenceState clones.
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "model/make_tiny.h"
#include "test_util.h"

namespace flashseek::engine {
namespace {

using testing::make_engine;
using testing::run_alone;

class RealModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto cfg = model::builtin_config(GetParam());
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 3}, dir_.path().string()).ok());
    auto m = forward::load_model(dir_.path().string(), forward::Numerics::kReference);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
  }
  flashseek::testing::TempDir dir_;
  std::unique_ptr<forward::Model> model_;
};

std::vector<Request> mixed_requests(int64_t vocab) {
  Rng rng(11);
  std::vector<Request> reqs;
  for (uint64_t i = 0; i < 5; ++i) {
    Request r;
    r.id = i;
    r.prompt = testing::random_prompt(rng, int64_t(1 + rng.below(i == 2 ? 150 : 20)), vocab);
    r.max_tokens = 4 + int64_t(rng.below(6));
    r.ignore_eos = true;
    r.logprobs = 2;
    if (i % 2) {
      r.sampling = {.temperature = 0.8, .top_k = 40, .top_p = 0.9};
      r.seed = 100 + i;
    } else {
      r.sampling.temperature = 0;
    }
    if (i == 3) r.prompt_logprobs = 2;
    reqs.push_back(r);
  }
  return reqs;
}

TEST_P(RealModel, BatchedEqualsAlone) {
  const auto reqs = mixed_requests(model_->config().vocab_size);
  auto engine = make_engine(*model_, {.max_batch = 3, .budget = {24, 16}});
  std::vector<std::shared_ptr<EventStream>> streams;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto s = engine->submit(reqs[i]);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    streams.push_back(*s);
    if (i == 1) {
      ASSERT_TRUE(engine->step().ok());  // later requests join a running batch
    }
  }
  ASSERT_TRUE(engine->run_until_idle().ok());
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    auto batched = collect(*streams[i]);
    EXPECT_EQ(batched.finish, FinishReason::kLength) << batched.error;
    testing::expect_same_result(batched, run_alone(*model_, reqs[i]));
  }
}

TEST_P(RealModel, PrefixStateContinuesExactly) {
  Rng rng(5);
  Request r;
  r.id = 1;
  r.prompt = testing::random_prompt(rng, 30, model_->config().vocab_size);
  r.max_tokens = 6;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  r.logprobs = 3;
  const auto want = run_alone(*model_, r);
  auto snap = model_->new_sequence();
  forward::BatchItem item{snap.get(), std::span<const int32_t>(r.prompt).first(17), false};
  std::vector<float> scratch;
  ASSERT_TRUE(model_->forward(std::span<forward::BatchItem>(&item, 1), scratch).ok());
  r.prefix = std::shared_ptr<const forward::SequenceState>(std::move(snap));
  testing::expect_same_result(run_alone(*model_, r), want);
}

INSTANTIATE_TEST_SUITE_P(TinyConfigs, RealModel, ::testing::Values("tiny-v41", "tiny-v4"),
                         [](const auto& info) {
                           return info.param == "tiny-v41" ? std::string("V41")
                                                           : std::string("V4");
                         });

}  // namespace
}  // namespace flashseek::engine
