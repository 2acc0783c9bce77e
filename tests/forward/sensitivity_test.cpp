// The CPU backend's own sensitivity (docs/cuda.md, "Whole-model parity"): reference numerics
// against itself with every FP8-activation dot product perturbed by a relative 1e-7
// (CpuLoadOptions::dot_perturbation), teacher-forced over 410 tokens on tiny-v41 and tiny-v4,
// standard and tie-free, and on the well-conditioned checkpoints (make-tiny --well-conditioned).
// This is the bound the CUDA backend is held to (gpu_sensitivity_test.cpp); the numbers are printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "parity_test_util.h"

namespace flashseek::forward {
namespace {
using namespace parity_test;  // NOLINT: test helpers (parity_test_util.h)

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- the statistics themselves, on hand-made logits -------------------------------------------

TEST(ParityStats, QuantilesTiesAndArgmax) {
  const int64_t V = 4, n = 100;
  std::vector<float> ref(size_t(n * V)), other(size_t(n * V));
  for (int64_t p = 0; p < n; ++p) {
    float* a = ref.data() + p * V;
    float* b = other.data() + p * V;
    a[0] = 1, a[1] = 3, a[2] = 2, a[3] = 0;  // argmax 1, gap 1 to the runner-up
    std::copy_n(a, V, b);
    b[3] += float(p + 1) * 1e-3f;             // position p: max|Δ| = (p+1)e-3 (stays below a[1])
  }
  // Position 7: the other run's argmax moves to 2; position 9: the reference has a tie at 1e-7.
  other[7 * V + 2] = 5;
  ref[9 * V + 2] = ref[9 * V + 1] - 1e-7f;
  other[9 * V + 2] = 4;
  auto s = parity_stats(ref, other, V);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->positions, n);
  EXPECT_TRUE(s->finite);
  EXPECT_EQ(s->ties, 1);
  EXPECT_EQ(s->compared, n - 1);
  EXPECT_EQ(s->agree, n - 2);  // position 7 disagrees, position 9 (a tie, also changed) is not counted
  EXPECT_NEAR(s->max, 3.0, 1e-6);  // position 7: |5 - 2|
  // Sorted per-position maxima: 1e-3 .. 100e-3 with positions 7 and 9 replaced by 3 and ~2.
  EXPECT_NEAR(s->median, 52e-3, 1e-6);  // rank 50 of the 98 small values plus two larger ones
  EXPECT_NEAR(s->p99, std::fabs(4.0 - (3.0 - 1e-7)), 1e-5);  // rank 99: the second largest
  other[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(parity_stats(ref, other, V)->finite);
  EXPECT_FALSE(parity_stats(ref, std::vector<float>(ref.begin(), ref.end() - 1), V).ok());
  EXPECT_FALSE(parity_stats(ref, other, 0).ok());
  EXPECT_FALSE(parity_stats(std::vector<float>(6), std::vector<float>(6), V).ok());
}

// ---- option validation -------------------------------------------------------------------------

TEST(DotPerturbation, BadOptionsAreErrors) {
  const std::string dir = checkpoint({"tiny-v41"});
  CpuLoadOptions o;
  for (double bad : {-1e-7, 1e-2, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    o.dot_perturbation = bad;
    auto m = CpuModel::load(dir, Numerics::kReference, o);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_NE(m.status().to_string().find("dot_perturbation"), std::string::npos) << m.status().to_string();
  }
  o.dot_perturbation = 1e-7;
  auto ex = CpuModel::load(dir, Numerics::kExact, o);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().to_string().find("reference"), std::string::npos) << ex.status().to_string();
}

// ---- self-sensitivity ---------------------------------------------------------------------------

class SelfSensitivity : public ::testing::TestWithParam<Ckpt> {};

// Unperturbed == unperturbed bit for bit (with and without a zero perturbation option), the
// perturbed backend is deterministic for a seed and differs between seeds, the perturbation
// changes the logits, and the statistics are finite and ordered.
TEST_P(SelfSensitivity, PerturbedCpuAgainstCpu) {
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
  CpuLoadOptions zero;
  zero.perturbation_seed = 99;  // a seed alone perturbs nothing
  EXPECT_TRUE(bit_equal(m.ref, cpu_logits(m.dir, zero))) << "unperturbed runs differ";
  ASSERT_EQ(m.sens.runs.size(), std::size(kSeeds));
  for (const ParityStats& r : m.sens.runs) {
    EXPECT_TRUE(r.finite);
    EXPECT_EQ(r.positions, kTokens);
    EXPECT_GT(r.max, 0.0) << "the perturbation changed no logit";
    EXPECT_LE(r.median, r.p99);
    EXPECT_LE(r.p99, r.max);
    EXPECT_GT(r.compared, kTokens / 2) << "most positions must be comparable (not ties)";
  }
  CpuLoadOptions o;
  o.dot_perturbation = kDotPerturbation;
  o.perturbation_seed = kSeeds[0];
  EXPECT_TRUE(bit_equal(m.sens.logits[0], cpu_logits(m.dir, o))) << "perturbed runs of one seed differ";
  EXPECT_FALSE(bit_equal(m.sens.logits[0], m.sens.logits[1])) << "two seeds perturbed alike";
}

INSTANTIATE_TEST_SUITE_P(Tiny, SelfSensitivity,
                         ::testing::Values(Ckpt{"tiny-v41", false}, Ckpt{"tiny-v41", true}, Ckpt{"tiny-v4", false},
                                           Ckpt{"tiny-v4", true}),
                         [](const auto& info) {
                           std::string t = info.param.tag();
                           std::replace(t.begin(), t.end(), '-', '_');
                           return t;
                         });

// make-tiny --well-conditioned: the same self-sensitivity experiment gives a much smaller
// median and p99 than the standard checkpoint of the same seed (measured ratios 18-25 for the
// median, 27-113 for the p99; asserted >= 8), and on the tie-free variant (no routing / top-k choice to flip) it is inside the
// GPU criterion of gpu_sensitivity_test.cpp (max|Δlogit| < 5e-2, argmax >= 99 %), so that
// criterion is met by anything that only sums in another order.
TEST(WellConditioned, FarLessSensitiveThanStandard) {
  constexpr double kRatio = 8;
  for (const char* config : {"tiny-v41", "tiny-v4"}) {
    for (bool tie_free : {false, true}) {
      const ParityStats& std_s = measured(Ckpt{config, tie_free, false}).sens.worst;
      const ParityStats& wc_s = measured(Ckpt{config, tie_free, true}).sens.worst;
      std::printf("[parity] %s %s: worst median %.3g -> %.3g, p99 %.3g -> %.3g, max %.3g -> %.3g, argmax %.4f -> %.4f "
                  "(standard -> well-conditioned)\n",
                  config, tie_free ? "tie-free" : "standard", std_s.median, wc_s.median, std_s.p99, wc_s.p99,
                  std_s.max, wc_s.max, std_s.argmax_agreement(), wc_s.argmax_agreement());
      EXPECT_TRUE(std_s.finite && wc_s.finite);
      EXPECT_GT(wc_s.max, 0.0) << "the perturbation changed nothing on the well-conditioned checkpoint";
      EXPECT_LE(wc_s.median * kRatio, std_s.median) << config << (tie_free ? " tie-free" : " standard");
      EXPECT_LE(wc_s.p99 * kRatio, std_s.p99) << config << (tie_free ? " tie-free" : " standard");
      EXPECT_GT(wc_s.argmax_agreement(), std_s.argmax_agreement()) << config;
      if (tie_free) {
        EXPECT_LT(wc_s.max, 5e-2) << config;
        EXPECT_GE(wc_s.argmax_agreement(), 0.99) << config;
      }
    }
  }
}

}  // namespace
}  // namespace flashseek::forward
