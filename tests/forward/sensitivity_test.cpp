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
  ASSERT_EQ(s->flips.size(), 1u);
  EXPECT_EQ(s->flips[0].position, 7);
  EXPECT_DOUBLE_EQ(s->flips[0].ref_gap, 1.0);   // 3 - 2
  EXPECT_DOUBLE_EQ(s->flips[0].max_diff, 3.0);  // |5 - 2|
  const std::vector<double> gaps = top2_gaps(ref, V);
  ASSERT_EQ(gaps.size(), size_t(n));
  EXPECT_DOUBLE_EQ(gaps[0], 1.0);
  EXPECT_LE(gaps[9], kParityTieEps);  // the tie
  EXPECT_DOUBLE_EQ(gaps[7], 1.0);      // the reference's gap, not the other run's
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
  o.perturbation_mode = static_cast<DotPerturbationMode>(7);
  auto bad_mode = CpuModel::load(dir, Numerics::kReference, o);
  ASSERT_FALSE(bad_mode.ok());
  EXPECT_NE(bad_mode.status().to_string().find("perturbation_mode"), std::string::npos)
      << bad_mode.status().to_string();
  o.perturbation_mode = DotPerturbationMode::kTermMagnitude;
  auto ex = CpuModel::load(dir, Numerics::kExact, o);
  ASSERT_FALSE(ex.ok());
  EXPECT_NE(ex.status().to_string().find("reference"), std::string::npos) << ex.status().to_string();
}

// ---- self-sensitivity ---------------------------------------------------------------------------

class SelfSensitivity : public ::testing::TestWithParam<Ckpt> {};

// Unperturbed == unperturbed bit for bit (with and without a zero perturbation option), the
// perturbed backend is deterministic for a seed and differs between seeds and between the two
// perturbation models, the perturbation changes the logits, and the statistics are finite and
// ordered. Both models' numbers are printed (docs/cuda.md compares them).
TEST_P(SelfSensitivity, PerturbedCpuAgainstCpu) {
  const Ckpt c = GetParam();
  const Measured& m = measured(c);
  ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
  const Sensitivity& rel = relative_sensitivity(c);
  CpuLoadOptions zero;
  zero.perturbation_seed = 99;  // a seed alone perturbs nothing, in either model
  zero.perturbation_mode = DotPerturbationMode::kTermMagnitude;
  EXPECT_TRUE(bit_equal(m.ref, cpu_logits(m.dir, zero))) << "unperturbed runs differ";
  for (const Sensitivity* sens : {&m.sens, &rel}) {
    ASSERT_EQ(sens->runs.size(), std::size(kSeeds));
    for (const ParityStats& r : sens->runs) {
      EXPECT_TRUE(r.finite);
      EXPECT_EQ(r.positions, kTokens);
      EXPECT_GT(r.max, 0.0) << "the perturbation changed no logit";
      EXPECT_LE(r.median, r.p99);
      EXPECT_LE(r.p99, r.max);
      EXPECT_GT(r.compared, kTokens / 2) << "most positions must be comparable (not ties)";
    }
    EXPECT_FALSE(bit_equal(sens->logits[0], sens->logits[1])) << "two seeds perturbed alike";
  }
  CpuLoadOptions o;
  o.dot_perturbation = kDotPerturbation;
  o.perturbation_seed = kSeeds[0];
  o.perturbation_mode = kBoundMode;
  EXPECT_TRUE(bit_equal(m.sens.logits[0], cpu_logits(m.dir, o))) << "perturbed runs of one seed differ";
  EXPECT_FALSE(bit_equal(m.sens.logits[0], rel.logits[0])) << "the two models perturbed alike";
  std::printf("[parity] %s worst of %zu seeds, terms | relative: median %.3g | %.3g  p99 %.3g | %.3g  max %.3g | %.3g  "
              "argmax %.4f | %.4f\n",
              c.tag().c_str(), std::size(kSeeds), m.sens.worst.median, rel.worst.median, m.sens.worst.p99,
              rel.worst.p99, m.sens.worst.max, rel.worst.max, m.sens.worst.argmax_agreement(),
              rel.worst.argmax_agreement());
}

INSTANTIATE_TEST_SUITE_P(Tiny, SelfSensitivity,
                         ::testing::Values(Ckpt{"tiny-v41", false}, Ckpt{"tiny-v41", true}, Ckpt{"tiny-v4", false},
                                           Ckpt{"tiny-v4", true}, Ckpt{"tiny-v41", false, true},
                                           Ckpt{"tiny-v41", true, true}, Ckpt{"tiny-v4", false, true},
                                           Ckpt{"tiny-v4", true, true}),
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

// The argmax disagreements of the well-conditioned tie-free checkpoints are near-ties: at every
// position where a perturbed run's argmax differs from the reference's, the reference's top-2 gap
// is below the run's p99 max|Δlogit| (the noise that run puts on a logit), i.e. a summation-order
// sized change flips it about as often as not; no well-separated position flips (a cascade would).
// Prints every flip with its gap, and how many of the reference's positions have a gap below the
// worst median and p99 noise (the positions any other summation order puts at risk).
TEST(WellConditioned, ArgmaxFlipsAreNearTies) {
  for (const char* config : {"tiny-v41", "tiny-v4"}) {
    const Measured& m = measured(Ckpt{config, true, true});
    ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
    const std::vector<double> gaps = top2_gaps(m.ref, m.vocab);
    const auto below = [&](double x) { return std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g < x; }); };
    std::printf("[parity] %s_tf_wc: reference top-2 gaps below the worst median noise %.3g: %td, below the worst p99 "
                "noise %.3g: %td (of %zu positions)\n",
                config, m.sens.worst.median, below(m.sens.worst.median), m.sens.worst.p99, below(m.sens.worst.p99),
                gaps.size());
    for (const ParityStats& r : m.sens.runs) {
      for (const ArgmaxFlip& f : r.flips) {
        std::printf("[parity]   %s_tf_wc flip at %lld: reference gap %.3g, max|dlogit| there %.3g (run p99 %.3g)\n",
                    config, static_cast<long long>(f.position), f.ref_gap, f.max_diff, r.p99);
        EXPECT_DOUBLE_EQ(f.ref_gap, gaps[size_t(f.position)]);
        EXPECT_LT(f.ref_gap, r.p99) << config << " position " << f.position << " flipped with a wide gap";
      }
    }
  }
}

// make-tiny --well-conditioned is well-conditioned in the sense of the issue — one flipped FP8
// code does not cascade — on the tie-free checkpoints: the self-sensitivity follows the size of
// the perturbation instead of saturating. 100x the perturbation (1e-5 instead of 1e-7, seed 1)
// must raise the median max|Δlogit| by at least 1.5x. A cascading model's noise is set by the
// cascade, not by the trigger: with the branches 2^8 smaller (the shift before 10) it rose only
// 1.19x (v41 and v4), and stayed at 0.011-0.015 for every perturbation from 1e-9 to 1e-5; with
// 2^10 it rises 1.9-2.2x.
TEST(WellConditioned, NoSaturatedCascade) {
  constexpr double kMinGrowth = 1.5;
  for (const char* config : {"tiny-v41", "tiny-v4"}) {
    const Measured& m = measured(Ckpt{config, true, true});
    ASSERT_EQ(m.ref.size(), size_t(kTokens * m.vocab));
    CpuLoadOptions o;
    o.dot_perturbation = 100 * kDotPerturbation;
    o.perturbation_seed = kSeeds[0];
    o.perturbation_mode = kBoundMode;
    const ParityStats big = stats(m.ref, cpu_logits(m.dir, o), m.vocab);
    const ParityStats& small = m.sens.runs[0];
    std::printf("[parity] %s_tf_wc median max|dlogit| at 1e-7 %.3g, at 1e-5 %.3g (x%.2f); p99 %.3g -> %.3g\n", config,
                small.median, big.median, small.median > 0 ? big.median / small.median : 0.0, small.p99, big.p99);
    EXPECT_TRUE(big.finite);
    EXPECT_GT(small.median, 0.0) << config;
    EXPECT_GE(big.median, kMinGrowth * small.median) << config << ": the noise does not follow the perturbation";
  }
}

}  // namespace
}  // namespace flashseek::forward
