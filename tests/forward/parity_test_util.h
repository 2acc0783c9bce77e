// Helpers of the whole-model sensitivity / parity tests (sensitivity_test.cpp on the CPU,
// gpu_sensitivity_test.cpp on a GPU; docs/cuda.md, "Whole-model parity"): the make-tiny
// checkpoints (standard, tie-free, well-conditioned), the 410-token prompt, and the CPU backend's
// self-sensitivity (reference numerics against itself with every FP8-activation dot perturbed by
// kDotPerturbation: by default every product term by that relative amount, the backward-error
// model of another summation order; the older model perturbs only the dot's result).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "forward/parity.h"
#include "gpu_test_util.h"
#include "model/make_tiny.h"

namespace flashseek::forward::parity_test {

inline constexpr int64_t kTokens = 410;
inline constexpr double kDotPerturbation = 1e-7;
// The perturbation model of the bound (cpu_model.h, DotPerturbationMode): y + s·ε·Σ|x_i·w_i|.
inline constexpr DotPerturbationMode kBoundMode = DotPerturbationMode::kTermMagnitude;
inline const char* mode_name(DotPerturbationMode m) {
  return m == DotPerturbationMode::kTermMagnitude ? "terms" : "relative";
}
// Perturbation seeds of the self-sensitivity: the bound is the worst of these (one sample of
// "another summation order" is itself noisy; the GPU is one more such sample).
inline constexpr uint64_t kSeeds[] = {1, 2, 3};

struct Ckpt {
  const char* config;     // tiny-v41 | tiny-v4
  bool tie_free = false;  // every selection widened (gpu_test::widen_selections)
  bool well_conditioned = false;
  std::string tag() const {
    return std::string(config) + (tie_free ? "_tf" : "_std") + (well_conditioned ? "_wc" : "");
  }
};

// Test names and ctest listings show the tag, not the struct's bytes.
inline void PrintTo(const Ckpt& c, std::ostream* os) { *os << c.tag(); }

inline std::vector<std::string>& made_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
class RemoveParityDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& d : made_dirs()) std::filesystem::remove_all(d);
  }
};
inline ::testing::Environment* const kRemoveParityDirs = ::testing::AddGlobalTestEnvironment(new RemoveParityDirs);

// The checkpoint of `c` (seed 11), written once per process under <tmp>/fs_parity_<tag>_<pid>.
inline std::string checkpoint(const Ckpt& c) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("fs_parity_" + c.tag() + "_" + std::to_string(::getpid()));
  if (fs::exists(dir / "config.json")) return dir.string();
  auto cfg = model::builtin_config(c.config);
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig mc = cfg.value();
  if (c.tie_free) gpu_test::widen_selections(mc);
  model::MakeTinyOptions opt;
  opt.seed = 11;
  opt.well_conditioned = c.well_conditioned;
  made_dirs().push_back(dir.string());
  const Status s = model::make_tiny_checkpoint(mc, opt, dir.string());
  EXPECT_TRUE(s.ok()) << s.to_string();
  return dir.string();
}

inline std::vector<int32_t> prompt(int64_t vocab) {
  Rng rng(1234);
  std::vector<int32_t> t(kTokens);
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

// Teacher-forced logits of the CPU backend (reference numerics) over the prompt in one chunk.
inline std::vector<float> cpu_logits(const std::string& dir, const CpuLoadOptions& opts = {}) {
  auto m = CpuModel::load(dir, Numerics::kReference, opts);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  auto l = teacher_forced_logits(*m.value(), prompt(m.value()->config().vocab_size), kTokens);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  return l.ok() ? std::move(l).value() : std::vector<float>{};
}

inline ParityStats stats(const std::vector<float>& ref, const std::vector<float>& other, int64_t vocab) {
  auto s = parity_stats(ref, other, vocab);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? s.value() : ParityStats{};
}

// The CPU self-sensitivity over kSeeds against `ref` (the unperturbed logits) with perturbation
// model `mode`, each printed with `label`; `worst` holds the largest median / p99 / max and the
// lowest argmax agreement.
struct Sensitivity {
  std::vector<ParityStats> runs;                 // one per kSeeds entry
  std::vector<std::vector<float>> logits;        // the perturbed logits of each seed
  ParityStats worst;
};
inline Sensitivity self_sensitivity(const std::string& dir, const std::vector<float>& ref, int64_t vocab,
                                    const std::string& label, DotPerturbationMode mode = kBoundMode) {
  Sensitivity r;
  double worst_agree = 2;
  for (uint64_t seed : kSeeds) {
    CpuLoadOptions o;
    o.dot_perturbation = kDotPerturbation;
    o.perturbation_seed = seed;
    o.perturbation_mode = mode;
    r.logits.push_back(cpu_logits(dir, o));
    const ParityStats s = stats(ref, r.logits.back(), vocab);
    std::printf("[parity] %s cpu vs cpu-perturbed(%s 1e-7, seed %llu): %s\n", label.c_str(), mode_name(mode),
                static_cast<unsigned long long>(seed), s.to_string().c_str());
    r.runs.push_back(s);
    r.worst.positions = s.positions;
    r.worst.median = std::max(r.worst.median, s.median);
    r.worst.p99 = std::max(r.worst.p99, s.p99);
    r.worst.max = std::max(r.worst.max, s.max);
    r.worst.finite = r.worst.finite && s.finite;
    if (s.argmax_agreement() < worst_agree) {
      worst_agree = s.argmax_agreement();
      r.worst.agree = s.agree, r.worst.compared = s.compared, r.worst.ties = s.ties;
    }
  }
  return r;
}

// The unperturbed logits and the self-sensitivity (kBoundMode, the bound) of checkpoint `c`,
// computed once per process (several tests compare against the same numbers).
struct Measured {
  std::string dir;
  int64_t vocab = 0;
  std::vector<float> ref;
  Sensitivity sens;
};
inline const Measured& measured(const Ckpt& c) {
  static std::vector<std::pair<std::string, Measured>> cache;
  for (const auto& [tag, m] : cache)
    if (tag == c.tag()) return m;
  Measured m;
  m.dir = checkpoint(c);
  m.ref = cpu_logits(m.dir);
  m.vocab = int64_t(m.ref.size()) / kTokens;
  if (m.vocab > 0) m.sens = self_sensitivity(m.dir, m.ref, m.vocab, c.tag(), kBoundMode);
  cache.emplace_back(c.tag(), std::move(m));
  return cache.back().second;
}

// The self-sensitivity of `c` under the older DotPerturbationMode::kRelative (for comparison
// only), computed once per process.
inline const Sensitivity& relative_sensitivity(const Ckpt& c) {
  static std::vector<std::pair<std::string, Sensitivity>> cache;
  for (const auto& [tag, s] : cache)
    if (tag == c.tag()) return s;
  const Measured& m = measured(c);
  Sensitivity s;
  if (m.vocab > 0) s = self_sensitivity(m.dir, m.ref, m.vocab, c.tag(), DotPerturbationMode::kRelative);
  cache.emplace_back(c.tag(), std::move(s));
  return cache.back().second;
}

}  // namespace flashseek::forward::parity_test
