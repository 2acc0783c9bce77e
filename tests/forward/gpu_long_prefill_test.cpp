// Chunked prefill at length on the CUDA backend (the GPU twin of long_prefill_test.cpp): a 20k+
// token prompt on the standard tiny-v41 / tiny-v4 (every selection choosing among thousands of
// compressed keys, V4.1's candidate pre-filter active; long_prefill_test proves both on the CPU
// twin of these kernels) fed in one shot, in chunks of 4096 and 127, and one token per call.
// The CUDA model runs a chunk of any length in the order of a decode step (one thread per output
// in ops::dot_f32's order, the same selection kernels), so its chunkings must agree bit for bit;
// against the CPU oracle the criterion of gpu_parity_test on the standard configs holds (same
// teacher-forced argmax at >= 90 % of positions), max|Δlogit| printed. Skips visibly without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "backends/cuda/gpu_model.h"
#include "core/rng.h"
#include "forward/cpu_model.h"
#include "gpu_test_util.h"

namespace flashseek::forward {
namespace {
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)

constexpr int64_t kLong = 20 * 1024 + 77;  // as in long_prefill_test.cpp

struct Param {
  const char* config;
};

class GpuLongPrefill : public ::testing::TestWithParam<Param> {};

TEST_P(GpuLongPrefill, ChunkSizesEqualOneShotBitwiseAndMatchCpu) {
  FS_REQUIRE_GPU();
  auto cfg = model::builtin_config(GetParam().config);
  ASSERT_TRUE(cfg.ok());
  const std::string dir =
      tiny_checkpoint(std::string("fs_gpu_long_") + GetParam().config, cfg.value(), 23);
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto cpu = load_model(dir, Numerics::kReference);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  const int64_t V = cpu.value()->config().vocab_size;
  Rng rng(41);
  std::vector<int32_t> tokens(size_t(kLong), 0);
  for (auto& t : tokens) t = int32_t(rng.below(uint64_t(V)));

  const auto g_whole = run_chunked(*gpu.value(), tokens, kLong);
  ASSERT_EQ(g_whole.size(), size_t(kLong * V));
  for (int64_t chunk : {4096, 127, 1}) {
    const auto got = run_chunked(*gpu.value(), tokens, chunk);
    ASSERT_EQ(got.size(), g_whole.size()) << "chunk " << chunk;
    int64_t first = -1;
    for (int64_t r = 0; r < kLong && first < 0; ++r)
      if (std::memcmp(got.data() + r * V, g_whole.data() + r * V, size_t(V) * sizeof(float)) != 0) first = r;
    const Cmp c = compare_logits(g_whole, got, V);
    std::printf("[gpu long prefill] %s: chunk %lld vs one-shot: max|d| %.3g, first differing position %lld\n",
                GetParam().config, static_cast<long long>(chunk), c.max_abs, static_cast<long long>(first));
    EXPECT_EQ(first, -1) << "chunk " << chunk << " max|d| " << c.max_abs;
  }
  for (float v : g_whole) ASSERT_TRUE(std::isfinite(v));
  // Against the CPU: the GPU's CPU-twin weights (the FP32-copy path, the CPU's summation order;
  // the block-scaled GEMVs of the default path are judged by gpu_sensitivity_test), with the
  // standard-config rule of gpu_parity_test; the default path's distance is printed.
  const auto ref = run_chunked(*cpu.value(), tokens, kLong);
  const Cmp native_cpu = compare_logits(ref, g_whole, V);
  std::printf("[gpu long prefill] %s: gpu (native weights) vs cpu over %lld positions: max|d| %.3g, argmax %.4f\n",
              GetParam().config, static_cast<long long>(kLong), native_cpu.max_abs, native_cpu.argmax_agree);
  auto twin = load_model_gpu(dir, Numerics::kReference, 0, cpu_twin_weights(Numerics::kReference));
  ASSERT_TRUE(twin.ok()) << twin.status().to_string();
  const Cmp vs_cpu = compare_logits(ref, run_chunked(*twin.value(), tokens, 4096), V);
  std::printf("[gpu long prefill] %s: gpu (cpu-twin weights) vs cpu over %lld positions: max|d| %.3g, argmax %.4f\n",
              GetParam().config, static_cast<long long>(kLong), vs_cpu.max_abs, vs_cpu.argmax_agree);
  EXPECT_GE(vs_cpu.argmax_agree, 0.9);
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuLongPrefill, ::testing::Values(Param{"tiny-v41"}, Param{"tiny-v4"}),
                         [](const auto& info) {
                           return std::string(std::string(info.param.config) == "tiny-v41" ? "v41" : "v4");
                         });

}  // namespace
}  // namespace flashseek::forward
