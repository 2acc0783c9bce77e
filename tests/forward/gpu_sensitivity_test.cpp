// Whole-model parity of the CUDA backend with the CPU reference backend, bounded by the CPU
// backend's own sensitivity (docs/cuda.md, "Whole-model parity"): teacher-forced over 410 tokens
// on tiny-v41 and tiny-v4, standard and tie-free, the CUDA backend (default load options,
// reference numerics) against the CPU reference must have a per-position max|Δlogit| median and
// p99 no larger, and an argmax agreement (reference ties excluded) no lower, than the worst of
// the CPU backend against itself with every FP8-activation dot perturbed by the backward-error
// model of another summation order: y + s·1e-7·Σ|x_i·w_i| (DotPerturbationMode::kTermMagnitude;
// three perturbation seeds, measured in the same process: parity_test_util.h). No slack is added:
// the worst of three seeds already covers the spread between summation orders. The
// well-conditioned checkpoints (make-tiny --well-conditioned) are held to the same bound, and the
// tie-free ones also to max|Δlogit| < 5e-2 and argmax agreement >= 99 % (the standard
// well-conditioned ones cannot be: there the CPU against itself flips routing or top-k choices;
// sensitivity_test.cpp). Both the one-chunk prefill and the token-by-token decode of the GPU are
// held to it. Every line prints the CUDA number next to the CPU bound; skips visibly without a
// CUDA device.
//
// History: with the older model (y·(1 ± 1e-7), DotPerturbationMode::kRelative) as the bound, an
// H200 (2026-12-01) measured the default path at 0.92-1.30x the bound, so these tests were
// disabled; a relative perturbation of the result under-models a reordered sum whose terms cancel.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "backends/cuda/gpu_model.h"
#include "parity_test_util.h"

namespace flashseek::forward {
namespace {
using namespace parity_test;  // NOLINT: test helpers (parity_test_util.h)

// The GPU's teacher-forced logits of the prompt in chunks of `chunk` (kTokens: one prefill; 1:
// decode steps).
std::vector<float> gpu_logits(Model& gpu, int64_t chunk) {
  auto l = teacher_forced_logits(gpu, prompt(gpu.config().vocab_size), chunk);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return l.ok() ? std::move(l).value() : std::vector<float>{};
}

class GpuSensitivity : public ::testing::TestWithParam<Ckpt> {};

// The CUDA numbers against the CPU reference next to the CPU bound; with `flips`, also every
// argmax flip with the reference's top-2 gap (near-ties, or not).
void print_against_bound(const Ckpt& c, const char* how, const ParityStats& s, const ParityStats& bound,
                         bool flips = false) {
  std::printf("[parity] %s cuda(%s) vs cpu | cpu-perturbed(%s 1e-7, worst of %zu) vs cpu:\n"
              "[parity]   median %.3g | %.3g   p99 %.3g | %.3g   max %.3g | %.3g   argmax %lld/%lld = %.4f | %.4f\n",
              c.tag().c_str(), how, mode_name(kBoundMode), std::size(kSeeds), s.median, bound.median, s.p99,
              bound.p99, s.max, bound.max, static_cast<long long>(s.agree), static_cast<long long>(s.compared),
              s.argmax_agreement(), bound.argmax_agreement());
  if (!flips) return;
  for (const ArgmaxFlip& f : s.flips)
    std::printf("[parity]   cuda(%s) argmax flip at %lld: reference top-2 gap %.3g, max|dlogit| there %.3g\n", how,
                static_cast<long long>(f.position), f.ref_gap, f.max_diff);
}

// Four settings: the exactness kernels; GpuLoadOptions::tensor_core_linears (wo_a and the LM
// head on the BF16 tensor cores in another FP32 order); and with it the tensor-core attention
// everywhere (prefill_attention kAuto for the 410-row prefill, decode_attention_tensor for the
// decode rows: the CLI's settings); and with those wq_a + wkv stacked (stack_query_kv: one GEMV
// launch, another k split). Each within the bound, prefill and decode; and the
// tensor-core settings keep prefill == decode exactly where the exactness kernels do (the
// linears' order never depends on the row count; a prefill row of the tensor-core attention is
// the bits of the same row decoded).
TEST_P(GpuSensitivity, CudaNoWorseThanCpuSelfSensitivity) {
  FS_REQUIRE_GPU();
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
  const ParityStats& bound = m.sens.worst;
  bool same[4] = {false, false, false, false};
  constexpr const char* kModes[4] = {"", ", tensor-core linears", ", tensor-core linears + attention",
                                     ", tensor-core linears + attention + stacked wq_a / wkv"};
  for (const int tc : {0, 1, 2, 3}) {
    GpuLoadOptions o;
    o.tensor_core_linears = tc >= 1;
    if (tc >= 2) o.prefill_attention = GpuPrefillAttention::kAuto, o.decode_attention_tensor = true;
    o.stack_query_kv = tc == 3;
    auto gpu = load_model_gpu(m.dir, Numerics::kReference, 0, o);
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    std::vector<float> by_chunk[2];
    for (int64_t chunk : {kTokens, int64_t(1)}) {
      const std::string how = std::string(chunk == kTokens ? "prefill" : "decode") + kModes[tc];
      by_chunk[chunk == 1] = gpu_logits(*gpu.value(), chunk);
      const ParityStats s = stats(m.ref, by_chunk[chunk == 1], m.vocab);
      print_against_bound(c, how.c_str(), s, bound);
      EXPECT_TRUE(s.finite) << how;
      EXPECT_EQ(s.positions, kTokens) << how;
      EXPECT_LE(s.median, bound.median) << how << ": median max|dlogit| above the CPU self-sensitivity";
      EXPECT_LE(s.p99, bound.p99) << how << ": p99 max|dlogit| above the CPU self-sensitivity";
      EXPECT_GE(s.argmax_agreement(), bound.argmax_agreement()) << how << ": argmax agreement below the CPU's";
    }
    if (tc == 3) {  // the stack ran (wq_a and wkv of these checkpoints fit it)
      auto st = gpu_graph_stats(*gpu.value());
      ASSERT_TRUE(st.ok()) << st.status().to_string();
      EXPECT_GT(st.value().paired_linears, 0) << "no stacked wq_a + wkv launch";
    }
    same[tc] = by_chunk[0].size() == by_chunk[1].size() &&
               std::memcmp(by_chunk[0].data(), by_chunk[1].data(), by_chunk[0].size() * sizeof(float)) == 0;
  }
  std::printf("[parity] %s prefill == decode bitwise: exactness linears %s, tensor-core linears %s, + attention %s, "
              "+ stacked wq_a / wkv %s\n",
              c.tag().c_str(), same[0] ? "yes" : "no", same[1] ? "yes" : "no", same[2] ? "yes" : "no",
              same[3] ? "yes" : "no");
  EXPECT_EQ(same[1], same[0]) << "the tensor-core linears changed whether prefill equals decode";
  EXPECT_EQ(same[2], same[0]) << "the tensor-core attention changed whether prefill equals decode";
  EXPECT_EQ(same[3], same[0]) << "the stacked wq_a / wkv changed whether prefill equals decode";
}

const auto ckpt_name = [](const ::testing::TestParamInfo<Ckpt>& info) {
  std::string t = info.param.tag();
  std::replace(t.begin(), t.end(), '-', '_');
  return t;
};
// Every tiny checkpoint, standard, tie-free and well-conditioned (the routed experts' fast path
// rounds each expert's output to BF16 as the CPU does; without that rounding tiny-v41 was above
// the bound).
INSTANTIATE_TEST_SUITE_P(Tiny, GpuSensitivity,
                         ::testing::Values(Ckpt{"tiny-v4", false}, Ckpt{"tiny-v4", true}, Ckpt{"tiny-v41", false},
                                           Ckpt{"tiny-v41", true}, Ckpt{"tiny-v41", false, true},
                                           Ckpt{"tiny-v4", false, true}, Ckpt{"tiny-v41", true, true},
                                           Ckpt{"tiny-v4", true, true}),
                         ckpt_name);

class GpuWellConditioned : public ::testing::TestWithParam<Ckpt> {};

TEST_P(GpuWellConditioned, CudaWithinFiveHundredthsOfCpu) {
  FS_REQUIRE_GPU();
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
  auto gpu = load_model_gpu(m.dir, Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  for (int64_t chunk : {kTokens, int64_t(1)}) {
    const ParityStats s = stats(m.ref, gpu_logits(*gpu.value(), chunk), m.vocab);
    const char* how = chunk == kTokens ? "prefill" : "decode";
    print_against_bound(c, how, s, m.sens.worst, true);
    EXPECT_TRUE(s.finite) << how;
    EXPECT_LT(s.max, 5e-2) << how;
    EXPECT_GE(s.argmax_agreement(), 0.99) << how;
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuWellConditioned,
                         ::testing::Values(Ckpt{"tiny-v41", true, true}, Ckpt{"tiny-v4", true, true}), ckpt_name);

}  // namespace
}  // namespace flashseek::forward
