// The tensor-core prefill attention in the whole model (GpuLoadOptions::prefill_attention kAuto,
// docs/cuda.md "Prefill attention on the tensor cores"): teacher-forced over the 410-token prompt
// of the parity tests (parity_test_util.h) in chunks of 128 rows (three on the tensor cores, the
// last 26 rows on the staged kernel) and as one 410-row chunk, the CUDA backend with the option on
// and off against the CPU reference: both within the CPU's own sensitivity bound of docs/cuda.md
// "Whole-model parity" (median and p99 of max|Δlogit| no larger, argmax agreement no lower), the
// tie-free well-conditioned checkpoints also within 5e-2 and >= 99 % argmax. The option must take
// effect on chunks of 64+ rows (logits not bitwise those of the staged kernel) and none below
// (chunks of 8, a verify block's size: bitwise the staged kernel's). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "parity_test_util.h"

namespace flashseek::forward {
namespace {
using namespace parity_test;  // NOLINT: test helpers (parity_test_util.h)

std::vector<float> logits_in_chunks(Model& m, int64_t chunk) {
  auto l = teacher_forced_logits(m, prompt(m.config().vocab_size), chunk);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return l.ok() ? std::move(l).value() : std::vector<float>{};
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GpuTensorCorePrefill : public ::testing::TestWithParam<Ckpt> {};

TEST_P(GpuTensorCorePrefill, TensorCorePrefillWithinTheCpuSelfSensitivity) {
  FS_REQUIRE_GPU();
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
  GpuLoadOptions on, off;
  on.prefill_attention = GpuPrefillAttention::kAuto;
  off.prefill_attention = GpuPrefillAttention::kStaged;
  auto g_on = load_model_gpu(m.dir, Numerics::kReference, 0, on);
  auto g_off = load_model_gpu(m.dir, Numerics::kReference, 0, off);
  ASSERT_TRUE(g_on.ok()) << g_on.status().to_string();
  ASSERT_TRUE(g_off.ok()) << g_off.status().to_string();
  const ParityStats& bound = m.sens.worst;
  for (int64_t chunk : {int64_t(128), kTokens}) {
    const std::vector<float> a = logits_in_chunks(*g_on.value(), chunk), b = logits_in_chunks(*g_off.value(), chunk);
    EXPECT_FALSE(bitwise_equal(a, b)) << "chunks of " << chunk << ": the tensor-core path did not run";
    using Run = std::pair<const char*, const std::vector<float>*>;
    for (const auto& [how, l] : {Run{"tensor-core", &a}, Run{"staged", &b}}) {
      const ParityStats s = stats(m.ref, *l, m.vocab);
      std::printf("[parity] %s cuda(%s prefill, chunks of %lld) vs cpu | cpu-perturbed bound:\n"
                  "[parity]   median %.3g | %.3g   p99 %.3g | %.3g   max %.3g | %.3g   argmax %.4f | %.4f\n",
                  c.tag().c_str(), how, static_cast<long long>(chunk), s.median, bound.median, s.p99, bound.p99, s.max,
                  bound.max, s.argmax_agreement(), bound.argmax_agreement());
      EXPECT_TRUE(s.finite) << how;
      EXPECT_EQ(s.positions, kTokens) << how;
      EXPECT_LE(s.median, bound.median) << how << " chunks of " << chunk;
      EXPECT_LE(s.p99, bound.p99) << how << " chunks of " << chunk;
      EXPECT_GE(s.argmax_agreement(), bound.argmax_agreement()) << how << " chunks of " << chunk;
      if (c.tie_free && c.well_conditioned) {
        EXPECT_LT(s.max, 5e-2) << how << " chunks of " << chunk;
        EXPECT_GE(s.argmax_agreement(), 0.99) << how << " chunks of " << chunk;
      }
    }
  }
  // Below kGpuPrefillAttnMinRows rows the option changes nothing.
  EXPECT_TRUE(bitwise_equal(logits_in_chunks(*g_on.value(), 8), logits_in_chunks(*g_off.value(), 8)));
}

const auto ckpt_name = [](const ::testing::TestParamInfo<Ckpt>& info) {
  std::string t = info.param.tag();
  std::replace(t.begin(), t.end(), '-', '_');
  return t;
};
INSTANTIATE_TEST_SUITE_P(Tiny, GpuTensorCorePrefill,
                         ::testing::Values(Ckpt{"tiny-v41", false}, Ckpt{"tiny-v4", false}), ckpt_name);
// The tie-free well-conditioned checkpoints: a flipped code stays local there, so the noise follows
// the size of the perturbation, and BF16 attention inputs perturb far more than the bound's 1e-7
// of each product (docs/cuda.md); listed apart so that their result reads on its own.
INSTANTIATE_TEST_SUITE_P(WellConditioned, GpuTensorCorePrefill,
                         ::testing::Values(Ckpt{"tiny-v41", true, true}, Ckpt{"tiny-v4", true, true}), ckpt_name);

}  // namespace
}  // namespace flashseek::forward
