// Sampling on the device through the engine (issue 4): the engine on the CUDA model with device
// sampling on (BatchItem::sample, one int32 per item comes back) and off (the [vocab] row comes
// back and the host samples) gives the same tokens, greedy and seeded, with and without DSpark
// speculation, on make-tiny tiny-v41, also for the full 129,280-token vocabulary ("demo" config).
// Timing is not a test's business: `flashseek run --gpus 0 ...` prints decode tok/s with
// --device-sampling off / on, `flashseek bench --kernels sampling` the per-row op.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/rng.h"
#include "engine/engine.h"
#include "backends/cuda/gpu_model.h"
#include "gpu_test_util.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)

std::string make_ckpt(const std::string& config) {
  auto cfg = model::builtin_config(config);
  EXPECT_TRUE(cfg.ok());
  return tiny_checkpoint("fs_gpusample_" + config, cfg.value(), 13);
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per request
};

// Two requests with the same sampling params (different prompts and seeds) through one engine.
Outcome generate(Model& m, const engine::SamplingParams& sp, int64_t n, bool device, bool spec) {
  engine::EngineOptions o;
  o.max_batch = 2;
  o.device_sampling = device;
  o.speculative = spec ? engine::SpecMode::kOn : engine::SpecMode::kOff;
  auto eng = engine::Engine::create(m, o);
  EXPECT_TRUE(eng.ok()) << eng.status().to_string();
  Outcome run;
  if (!eng.ok()) return run;
  std::vector<std::shared_ptr<engine::EventStream>> streams;
  Rng rng(41);
  for (uint64_t id = 1; id <= 2; ++id) {
    engine::Request r;
    r.id = id;
    for (int i = 0; i < 7 + int(id); ++i) r.prompt.push_back(int32_t(rng.below(uint64_t(m.config().vocab_size))));
    r.max_tokens = n;
    r.ignore_eos = true;
    r.sampling = sp;
    r.seed = 1000 + id;
    auto s = (*eng)->submit(r);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return run;
    streams.push_back(*s);
  }
  EXPECT_TRUE((*eng)->run_until_idle().ok());
  for (auto& s : streams) run.tokens.push_back(engine::collect(*s).tokens);
  return run;
}

struct Case {
  const char* name;
  engine::SamplingParams sp;
};
std::vector<Case> cases() {
  std::vector<Case> c(4);
  c[0].name = "greedy";
  c[0].sp.temperature = 0;
  c[1].name = "T=0.8";
  c[1].sp.temperature = 0.8;
  c[2].name = "T=1 top-k 50 top-p 0.9";
  c[2].sp.top_k = 50;
  c[2].sp.top_p = 0.9;
  c[3].name = "T=0.7 min-p 0.05";
  c[3].sp.temperature = 0.7;
  c[3].sp.min_p = 0.05;
  return c;
}

TEST(GpuSampling, EngineOnEqualsOffOver240TokensTinyV41) {
  FS_REQUIRE_GPU();
  auto gpu = load_model_gpu(make_ckpt("tiny-v41"), Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = *gpu.value();
  ASSERT_TRUE(G.samples_on_device());
  for (const Case& c : cases()) {
    const Outcome on = generate(G, c.sp, 240, true, false);
    const Outcome off = generate(G, c.sp, 240, false, false);
    ASSERT_EQ(on.tokens.size(), 2u);
    ASSERT_EQ(off.tokens.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_EQ(on.tokens[r].size(), 240u) << c.name;
      ASSERT_EQ(on.tokens[r], off.tokens[r]) << c.name << ", request " << r;
    }
  }
  if (auto g = gpu_graph_stats(G); g.ok())
    std::printf("[gpu sample] tiny-v41 graph counters: %lld forwards, %lld eligible, %lld launches (%lld patched), "
                "%lld eager fallbacks\n",
                (long long)g->forwards, (long long)g->eligible, (long long)g->launches, (long long)g->patched,
                (long long)g->eager_fallbacks);
}

// Speculation verifies with rows (never sampled on the device); its plain decodes are.
TEST(GpuSampling, SpeculativeOnEqualsOffTinyV41) {
  FS_REQUIRE_GPU();
  auto gpu = load_model_gpu(make_ckpt("tiny-v41"), Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = *gpu.value();
  ASSERT_TRUE(G.has_draft()) << "make-tiny tiny-v41 writes a DSpark draft; the GPU loader lost it";
  for (const Case& c : {cases()[0], cases()[2]}) {
    const Outcome on = generate(G, c.sp, 200, true, true);
    const Outcome off = generate(G, c.sp, 200, false, true);
    ASSERT_EQ(on.tokens.size(), 2u);
    ASSERT_EQ(off.tokens.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_EQ(on.tokens[r].size(), 200u) << c.name;
      ASSERT_EQ(on.tokens[r], off.tokens[r]) << c.name << ", request " << r;
    }
  }
}

// The full vocabulary: where copying and sampling a [129,280] row on the host costs the most.
TEST(GpuSampling, FullVocabularyOnEqualsOff) {
  FS_REQUIRE_GPU();
  auto gpu = load_model_gpu(make_ckpt("demo"), Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = *gpu.value();
  ASSERT_EQ(G.config().vocab_size, 129280);
  for (const Case& c : cases()) {
    generate(G, c.sp, 4, true, false);  // warm-up (buffers, graphs)
    const Outcome on = generate(G, c.sp, 64, true, false);
    const Outcome off = generate(G, c.sp, 64, false, false);
    ASSERT_EQ(on.tokens.size(), 2u);
    ASSERT_EQ(off.tokens.size(), 2u);
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_EQ(on.tokens[r].size(), 64u) << c.name;
      ASSERT_EQ(on.tokens[r], off.tokens[r]) << c.name << ", request " << r;
    }
  }
}

}  // namespace
}  // namespace flashseek::forward
