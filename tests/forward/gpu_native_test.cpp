// The CUDA backend with native weights (backends/cuda/gpu_model.h GpuLoadOptions, opt-in): in reference
// numerics the FP8 linears and the FP4 routed experts stay on the device as stored and run through
// the block-scaled kernels (ops/cuda/gemv/gemv.h).
// * Native weights take less device memory than the FP32 copies and every listed matrix is native.
// * Exact numerics never use them; FLASHSEEK_GPU_WEIGHTS selects them, a bad value is an error.
// * Parity with the CPU reference backend (make-tiny, 410 tokens): tie-free variants max|Δlogit|
//   < 2e-2 at every position, GPU prefill vs decode likewise; standard configs teacher-forced
//   argmax >= 90%. DISABLED: on an H200 (2026-11-29, docs/cuda.md) native prefill == decode
//   exactly, but native vs CPU gave max|Δ| 0.69 / 0.36 (tie-free v41 / v4) and argmax 0.76-0.89.
//   The CPU reference itself moves as much when its FP8-input dots are perturbed by 1e-7·Σ|x·w|
//   (FP8 activation codes flip and cascade on these tiny models), so only a bit-identical kernel
//   can pass; native weights stay opt-in until a sound criterion replaces this one.
// Skips visibly without a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "backends/cuda/gpu_model.h"
#include "gpu_test_util.h"
#include "model/make_tiny.h"

#if FLASHSEEK_HAVE_CUDA
#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/runtime/cuda_check.h"
#endif

namespace flashseek::forward {
namespace {
namespace fs = std::filesystem;
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)
#define REQUIRE_GPU() FS_REQUIRE_GPU()

constexpr int64_t kTokens = 410;

// A make-tiny checkpoint of `name` (FP8 linears, FP4 experts); tie_free widens every selection.
std::string make_ckpt(const std::string& name, bool tie_free) {
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig c = cfg.value();
  EXPECT_TRUE(c.fp8_weights);
  EXPECT_TRUE(c.fp4_experts);
  if (tie_free) widen_selections(c);
  return tiny_checkpoint("fs_native_" + name + (tie_free ? "_tf" : "_std"), c, 23);
}

std::vector<int32_t> tokens_for(int64_t vocab) {
  Rng rng(4321);
  std::vector<int32_t> t(kTokens);
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

#if FLASHSEEK_HAVE_CUDA
const gpu::GpuModel& as_gpu(const Model& m) { return dynamic_cast<const gpu::GpuModel&>(m); }
#endif

struct Param {
  const char* config;
  bool tie_free;
};

class GpuNative : public ::testing::TestWithParam<Param> {};

TEST_P(GpuNative, DISABLED_MatchesCpuReferenceAndDecodeMatchesPrefill) {
  REQUIRE_GPU();
#if FLASHSEEK_HAVE_CUDA
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config, p.tie_free);
  auto cpu = load_model(dir, Numerics::kReference);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  GpuLoadOptions native;
  native.native_weights = true;
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0, native);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  const auto& c = gpu.value()->config();
  const int64_t V = c.vocab_size;
  const auto tokens = tokens_for(V);
  const auto ref = run_chunked(*cpu.value(), tokens, kTokens);
  const auto g_prefill = run_chunked(*gpu.value(), tokens, kTokens);
  const auto g_decode = run_chunked(*gpu.value(), tokens, 1);
  const auto g_chunks = run_chunked(*gpu.value(), tokens, 37);
  ASSERT_EQ(ref.size(), size_t(kTokens * V));
  const Cmp vs_cpu = compare_logits(ref, g_prefill, V), pd = compare_logits(g_prefill, g_decode, V),
            pc = compare_logits(g_prefill, g_chunks, V);
  std::printf("[gpu native] %s %s reference: cpu-gpu max|d| %.3g argmax %.4f; prefill-decode %.3g / %.4f; "
              "prefill-chunk37 %.3g / %.4f\n",
              p.config, p.tie_free ? "tie-free" : "standard", vs_cpu.max_abs, vs_cpu.argmax_agree, pd.max_abs,
              pd.argmax_agree, pc.max_abs, pc.argmax_agree);
  if (p.tie_free) {
    EXPECT_LT(vs_cpu.max_abs, 2e-2);
    EXPECT_LT(pd.max_abs, 2e-2);
    EXPECT_LT(pc.max_abs, 2e-2);
  }
  EXPECT_GE(vs_cpu.argmax_agree, 0.9);
  EXPECT_GE(pd.argmax_agree, 0.9);
  EXPECT_GE(pc.argmax_agree, 0.9);
#endif
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuNative,
                         ::testing::Values(Param{"tiny-v41", true}, Param{"tiny-v4", true}, Param{"tiny-v41", false},
                                           Param{"tiny-v4", false}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(std::string(info.param.config) == "tiny-v41" ? "v41" : "v4") +
                                  (info.param.tie_free ? "_tiefree" : "_standard");
                         });

// Native weights: every FP8 linear of the list and every routed expert kept as stored (the tiny
// dims fit the kernels), in less device memory than the FP32 copies.
TEST_P(GpuNative, UsesLessDeviceMemory) {
  REQUIRE_GPU();
#if FLASHSEEK_HAVE_CUDA
  const Param p = GetParam();
  const std::string dir = make_ckpt(p.config, p.tie_free);
  GpuLoadOptions native, fp32;
  native.native_weights = true;
  fp32.native_weights = false;
  auto n = load_model_gpu(dir, Numerics::kReference, 0, native);
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  auto f = load_model_gpu(dir, Numerics::kReference, 0, fp32);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const auto& g = as_gpu(*n.value());
  const auto& gf = as_gpu(*f.value());
  const auto& c = g.config();
  EXPECT_GE(g.native_matrices(), c.num_layers * (4 + 3 + 3 * c.n_routed_experts));
  EXPECT_EQ(gf.native_matrices(), 0);
  std::printf("[gpu native] %s %s: weights on the device %.3f MiB native (%lld matrices) vs %.3f MiB fp32\n",
              p.config, p.tie_free ? "tie-free" : "standard", double(g.weight_bytes()) / (1 << 20),
              static_cast<long long>(g.native_matrices()), double(gf.weight_bytes()) / (1 << 20));
  EXPECT_LT(g.weight_bytes(), gf.weight_bytes());
#endif
}

// Exact numerics (the oracle) keep every matrix in FP32 even when native weights are asked for;
// FLASHSEEK_GPU_WEIGHTS selects the default and a bad value is an error naming it.
TEST(GpuNativeOptions, ExactKeepsFp32AndEnvIsChecked) {
  REQUIRE_GPU();
#if FLASHSEEK_HAVE_CUDA
  const std::string dir = make_ckpt("tiny-v41", false);
  GpuLoadOptions native;
  native.native_weights = true;
  auto exact = load_model_gpu(dir, Numerics::kExact, 0, native);
  ASSERT_TRUE(exact.ok()) << exact.status().to_string();
  EXPECT_EQ(as_gpu(*exact.value()).native_matrices(), 0);

  const char* old = std::getenv("FLASHSEEK_GPU_WEIGHTS");
  const std::string saved = old ? old : "";
  ::unsetenv("FLASHSEEK_GPU_WEIGHTS");
  auto dflt = load_model_gpu(dir, Numerics::kReference, 0);  // opt-in: FP32 by default
  ::setenv("FLASHSEEK_GPU_WEIGHTS", "fp32", 1);
  auto f = load_model_gpu(dir, Numerics::kReference, 0);
  ::setenv("FLASHSEEK_GPU_WEIGHTS", "native", 1);
  auto n = load_model_gpu(dir, Numerics::kReference, 0);
  ::setenv("FLASHSEEK_GPU_WEIGHTS", "fp16", 1);
  auto bad = load_model_gpu(dir, Numerics::kReference, 0);
  if (old) ::setenv("FLASHSEEK_GPU_WEIGHTS", saved.c_str(), 1); else ::unsetenv("FLASHSEEK_GPU_WEIGHTS");
  ASSERT_TRUE(dflt.ok()) << dflt.status().to_string();
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(as_gpu(*dflt.value()).native_matrices(), 0);
  EXPECT_EQ(as_gpu(*f.value()).native_matrices(), 0);
  EXPECT_GT(as_gpu(*n.value()).native_matrices(), 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().to_string().find("FLASHSEEK_GPU_WEIGHTS"), std::string::npos) << bad.status().to_string();
#endif
}

}  // namespace
}  // namespace flashseek::forward
