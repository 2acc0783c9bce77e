// Device sampling in the engine (BatchItem::sample, Model::samples_on_device) against a fake model
// that "samples on the device" with the CPU twin ops::sample_rows_ref: the engine sets `sample`
// only on items whose row the host does not need, accounts rows accordingly, and every request's
// result is the same with device sampling on or off (EngineOptions::device_sampling, the CLI's
// --device-sampling).
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "ops/sample.h"

namespace flashseek::engine {
namespace {

using testing::FakeModel;
using testing::make_engine;
using testing::random_prompt;
using testing::random_sampling;

// FakeModel whose forward samples items with `sample` set (no row appended), and checks the
// contract: never with all_logits.
class SamplingFakeModel : public FakeModel {
 public:
  using FakeModel::FakeModel;
  bool samples_on_device() const override { return true; }
  Status forward(std::span<forward::BatchItem> batch, std::vector<float>& logits) override {
    for (auto& item : batch) {
      if (!item.sample) {
        FS_RETURN_IF_ERROR(FakeModel::forward(std::span<forward::BatchItem>(&item, 1), logits));
        continue;
      }
      if (item.all_logits) return internal_error("sample set together with all_logits");
      std::vector<float> row;
      FS_RETURN_IF_ERROR(FakeModel::forward(std::span<forward::BatchItem>(&item, 1), row));
      ops::SampleRowsParams p;
      p.logits = row.data(), p.rows = 1, p.vocab = config().vocab_size, p.specs = item.sample;
      p.out = &item.sampled;
      FS_RETURN_IF_ERROR(ops::sample_rows_ref(p));
      ++device_sampled;
    }
    return {};
  }
  int64_t device_sampled = 0;
};

Request random_request(Rng& rng, uint64_t id, int64_t vocab, bool logprobs) {
  Request r;
  r.id = id;
  r.prompt = random_prompt(rng, 1 + int64_t(rng.below(rng.uniform() < 0.3 ? 200 : 30)), vocab);
  r.max_tokens = int64_t(rng.below(40));
  r.ignore_eos = rng.uniform() < 0.5;
  random_sampling(rng, vocab, r);
  if (logprobs && rng.uniform() < 0.3) r.logprobs = int64_t(rng.below(4));
  if (logprobs && rng.uniform() < 0.2) r.prompt_logprobs = int64_t(rng.below(3));
  return r;
}

std::vector<GenerationResult> run_all(forward::Model& model, const std::vector<Request>& reqs,
                                      EngineOptions opt) {
  auto engine = make_engine(model, opt);
  std::vector<std::shared_ptr<EventStream>> streams;
  for (const Request& r : reqs) streams.push_back(*engine->submit(r));
  EXPECT_TRUE(engine->run_until_idle().ok());
  std::vector<GenerationResult> out;
  for (auto& s : streams) out.push_back(collect(*s));
  return out;
}

TEST(DeviceSampling, SameResultsOnAndOffWithRandomMixes) {
  const int64_t V = 61;
  Rng rng(77);
  for (int round = 0; round < 5; ++round) {
    EngineOptions opt;
    opt.max_batch = 1 + int64_t(rng.below(5));
    opt.budget.max_step_tokens = opt.max_batch + int64_t(rng.below(80));
    opt.budget.max_prefill_chunk = 1 + int64_t(rng.below(50));
    std::vector<Request> reqs;
    for (uint64_t i = 0; i < 8; ++i) reqs.push_back(random_request(rng, i, V, /*logprobs=*/true));
    SamplingFakeModel on_model(V), off_model(V);
    EngineOptions off = opt;
    off.device_sampling = false;
    auto on = run_all(on_model, reqs, opt);
    auto ref = run_all(off_model, reqs, off);
    EXPECT_EQ(off_model.device_sampled, 0);
    int64_t plain_tokens = 0;  // tokens of requests without logprobs: all sampled on the device
    for (size_t i = 0; i < reqs.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "round " << round << " request " << i);
      testing::expect_same_result(on[i], ref[i]);
      // (the first token of a request with prompt logprobs comes from the prompt's rows)
      if (reqs[i].logprobs < 0 && !on[i].tokens.empty())
        plain_tokens += int64_t(on[i].tokens.size()) - (reqs[i].prompt_logprobs >= 0 ? 1 : 0);
    }
    EXPECT_EQ(on_model.device_sampled, plain_tokens) << "round " << round;
  }
}

TEST(DeviceSampling, NoItemNeedingRowsIsSampledOnTheDevice) {
  const int64_t V = 40;
  Rng rng(5);
  Request r = random_request(rng, 1, V, false);
  r.max_tokens = 12;
  r.ignore_eos = true;
  r.logprobs = 2;
  SamplingFakeModel model(V);
  auto res = run_all(model, {r}, {});
  EXPECT_EQ(res[0].tokens.size(), 12u);
  EXPECT_EQ(res[0].logprobs.size(), 12u);
  EXPECT_EQ(model.device_sampled, 0);
  // prompt logprobs alone: the prompt rows come back, the generated tokens are sampled on device
  r.logprobs = -1;
  r.prompt_logprobs = 1;
  SamplingFakeModel model2(V);
  res = run_all(model2, {r}, {});
  EXPECT_EQ(res[0].prompt_logprobs.size(), r.prompt.size());
  EXPECT_EQ(model2.device_sampled, 11);  // every token but the first (from the prompt's rows)
}

TEST(DeviceSampling, RowWithoutFiniteLogitEndsTheRequestWithAnError) {
  const int64_t V = 16;
  for (bool device : {true, false}) {
    SamplingFakeModel model(V);
    model.set_logits_fn([](std::span<const int32_t> history, std::span<float> out) {
      for (size_t v = 0; v < out.size(); ++v) out[v] = history.size() >= 4 ? -INFINITY : float(v % 5);
    });
    Request r;
    r.id = 3;
    r.prompt = {1, 2};
    r.max_tokens = 8;
    r.ignore_eos = true;
    EngineOptions opt;
    opt.device_sampling = device;
    auto res = run_all(model, {r}, opt);
    EXPECT_EQ(res[0].finish, FinishReason::kError) << "device " << device;
    EXPECT_NE(res[0].error.find("no finite logit"), std::string::npos) << res[0].error;
    EXPECT_EQ(res[0].tokens.size(), 2u) << "device " << device;  // positions 2 and 3 had logits
  }
}

}  // namespace
}  // namespace flashseek::engine
