// Whole-model parity of the CUDA backend (backends/cuda/gpu_model.h) with the CPU reference backend on
// make-tiny checkpoints over 410 tokens: tie-free variants (index top-k covering every compressed
// position, every expert active, every candidate block kept) must agree to max|Δlogit| < 2e-2 at
// every position; the standard tiny configs (where routing / top-k near-ties may flip under the
// simulations) must agree on the teacher-forced argmax at >= 90% of positions. The same criteria
// hold for GPU prefill (one chunk) vs GPU decode (one token per step) and odd chunk sizes.
// Skips visibly without a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "backends/cuda/gpu_model.h"
#include "model/make_tiny.h"
#include "gpu_test_util.h"
#include "test_util.h"

#if FLASHSEEK_HAVE_CUDA
#include "ops/cuda/runtime/cuda_check.h"
#endif

namespace flashseek::forward {
namespace {
namespace fs = std::filesystem;
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)
#define REQUIRE_GPU() FS_REQUIRE_GPU()

constexpr int64_t kTokens = 410;

// A make-tiny checkpoint of `name`; tie_free widens every selection so that nothing is dropped.
std::string make_ckpt(const std::string& name, bool tie_free) {
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig c = cfg.value();
  if (tie_free) widen_selections(c);
  return tiny_checkpoint("fs_gpu_" + name + (tie_free ? "_tf" : "_std"), c, 11);
}

std::vector<int32_t> tokens_for(int64_t vocab) {
  Rng rng(1234);
  std::vector<int32_t> t(kTokens);
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

struct Param {
  const char* config;
  bool tie_free;
  Numerics numerics;
};

class GpuParity : public ::testing::TestWithParam<Param> {};

TEST_P(GpuParity, MatchesCpuAndDecodeMatchesPrefill) {
  REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config, p.tie_free);
  auto cpu = load_model(dir, p.numerics);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = load_model_gpu(dir, p.numerics, 0, cpu_twin_weights(p.numerics));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  const int64_t V = cpu.value()->config().vocab_size;
  const auto tokens = tokens_for(V);
  const auto ref = run_chunked(*cpu.value(), tokens, kTokens);
  const auto g_prefill = run_chunked(*gpu.value(), tokens, kTokens);
  const auto g_decode = run_chunked(*gpu.value(), tokens, 1);
  const auto g_chunks = run_chunked(*gpu.value(), tokens, 129);
  ASSERT_EQ(ref.size(), size_t(kTokens * V));
  const Cmp vs_cpu = compare_logits(ref, g_prefill, V), pd = compare_logits(g_prefill, g_decode, V),
            pc = compare_logits(g_prefill, g_chunks, V);
  std::printf("[gpu parity] %s %s %s: cpu-gpu max|d| %.3g argmax %.4f; prefill-decode %.3g / %.4f; "
              "prefill-chunk129 %.3g / %.4f\n",
              p.config, p.tie_free ? "tie-free" : "standard",
              p.numerics == Numerics::kExact ? "exact" : "reference", vs_cpu.max_abs, vs_cpu.argmax_agree,
              pd.max_abs, pd.argmax_agree, pc.max_abs, pc.argmax_agree);
  if (p.tie_free) {
    EXPECT_LT(vs_cpu.max_abs, 2e-2);
    EXPECT_LT(pd.max_abs, 2e-2);
    EXPECT_LT(pc.max_abs, 2e-2);
  }
  EXPECT_GE(vs_cpu.argmax_agree, 0.9);
  EXPECT_GE(pd.argmax_agree, 0.9);
  EXPECT_GE(pc.argmax_agree, 0.9);
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, GpuParity,
    ::testing::Values(Param{"tiny-v41", true, Numerics::kReference}, Param{"tiny-v4", true, Numerics::kReference},
                      Param{"tiny-v41", true, Numerics::kExact}, Param{"tiny-v4", true, Numerics::kExact},
                      Param{"tiny-v41", false, Numerics::kReference}, Param{"tiny-v4", false, Numerics::kReference}),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::string(std::string(info.param.config) == "tiny-v41" ? "v41" : "v4") +
             (info.param.tie_free ? "_tiefree_" : "_standard_") +
             (info.param.numerics == Numerics::kExact ? "exact" : "reference");
    });

// A snapshot (clone) continues exactly like the original; state of one sequence does not leak
// into another; bad input is an error, not a crash.
TEST(GpuModel, CloneContinuesAndErrorsAreValues) {
  REQUIRE_GPU();
  const std::string dir = make_ckpt("tiny-v41", false);
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& m = *gpu.value();
  const auto tokens = tokens_for(m.config().vocab_size);
  auto a = m.new_sequence();
  std::vector<float> sink;
  BatchItem first{a.get(), std::span<const int32_t>(tokens.data(), 77), false};
  ASSERT_TRUE(m.forward({&first, 1}, sink).ok());
  auto b = a->clone();
  EXPECT_EQ(b->length(), 77);
  std::vector<float> la, lb;
  BatchItem ia{a.get(), std::span<const int32_t>(tokens.data() + 77, 40), true};
  BatchItem ib{b.get(), std::span<const int32_t>(tokens.data() + 77, 40), true};
  ASSERT_TRUE(m.forward({&ia, 1}, la).ok());
  ASSERT_TRUE(m.forward({&ib, 1}, lb).ok());
  EXPECT_EQ(la, lb);
  const int32_t bad = int32_t(m.config().vocab_size);
  BatchItem ibad{a.get(), std::span<const int32_t>(&bad, 1), false};
  const Status s = m.forward({&ibad, 1}, la);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("vocabulary"), std::string::npos) << s.to_string();
  EXPECT_FALSE(load_model_gpu(dir, Numerics::kReference, 999).ok());
  EXPECT_FALSE(load_model_gpu("/nonexistent/ckpt", Numerics::kReference, 0).ok());
}

}  // namespace
}  // namespace flashseek::forward

namespace flashseek::forward {
namespace {

// `flashseek run --gpus 0` generates the same greedy continuation as the CPU backend.
TEST(GpuModel, CliRunOnGpuEqualsCpu) {
  REQUIRE_GPU();
  const std::string dir = make_ckpt("tiny-v41", true);
  const std::string base = flashseek::testing::flashseek_bin() + " run --ckpt " + dir +
                           " --prompt-ids 5,17,99,3,250,7 --max-tokens 24 --json";
  const auto cpu = flashseek::testing::run_command(base);
  // Reference numerics: the FP32 weights are the CPU backend's bitwise twin (native weights run the
  // block-scaled GEMVs there, docs/cuda.md).
  const auto gpu = flashseek::testing::run_command(base + " --gpus 0 --gpu-weights fp32");
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  const auto tokens_of = [](const std::string& out) {  // the JSON "tokens" array, not the timings
    const auto p = out.find("\"tokens\"");
    return p == std::string::npos ? std::string() : out.substr(p, out.find(']', p) - p);
  };
  EXPECT_FALSE(tokens_of(cpu.output).empty()) << cpu.output;
  EXPECT_EQ(tokens_of(cpu.output), tokens_of(gpu.output)) << cpu.output << "\n" << gpu.output;
  // A device list is the multi-GPU model (backends/cuda/gpu_tp.h): a repeated device runs two
  // host-staged ranks on GPU 0 and must give the same greedy tokens (FP32 slices: the CPU's twin,
  // as above); a missing device is an error.
  const auto tp = flashseek::testing::run_command(base + " --gpus 0,0 --gpu-weights fp32");
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_EQ(tokens_of(cpu.output), tokens_of(tp.output)) << cpu.output << "\n" << tp.output;
  const auto bad = flashseek::testing::run_command(base + " --gpus 0,99");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--gpus"), std::string::npos) << bad.output;
  // Exact numerics: native weights (the default) give the FP32 copies' tokens and log-probs (the
  // exactness kernels are bitwise equal); each load prints its weight line; a bad value is refused.
  const std::string exact = base + " --numerics exact --logprobs 3 --gpus 0";
  const auto native = flashseek::testing::run_command(exact);
  const auto fp32 = flashseek::testing::run_command(exact + " --gpu-weights fp32");
  ASSERT_EQ(native.exit_code, 0) << native.output;
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const auto json_of = [](const std::string& out) {  // "tokens" and "logprobs", not the timings
    const auto p = out.find("\"tokens\"");
    return p == std::string::npos ? std::string() : out.substr(p, out.find("]]", out.find("\"logprobs\"", p)) - p);
  };
  EXPECT_FALSE(json_of(native.output).empty()) << native.output;
  EXPECT_EQ(json_of(native.output), json_of(fp32.output)) << native.output << "\n" << fp32.output;
  EXPECT_NE(native.output.find("weights (native)"), std::string::npos) << native.output;
  EXPECT_NE(fp32.output.find("weights (fp32)"), std::string::npos) << fp32.output;
  const auto bad_w = flashseek::testing::run_command(base + " --gpus 0 --gpu-weights fp16");
  EXPECT_NE(bad_w.exit_code, 0);
  EXPECT_NE(bad_w.output.find("--gpu-weights"), std::string::npos) << bad_w.output;
}

}  // namespace
}  // namespace flashseek::forward
