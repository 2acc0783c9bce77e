// DSpark speculative decoding on the CUDA backend (gpu_draft.cpp, gpu_rollback.cpp) on make-tiny
// tiny-v41 checkpoints: (a) GpuModel::propose equals CpuModel::propose (logits within 2e-2,
// same draft tokens) on tie-free variants, after prefill chunks and one-token decodes alike;
// (b) GpuModel::rollback: forwarding k tokens then rolling them back continues exactly like a
// snapshot that never saw them (logits and proposals), for every k ≤ kMaxRollback and both parities
// of the compressor groups; too-far rollbacks are errors; (c) the engine on the GPU model: greedy
// with speculation equals greedy without it over 520 tokens on a tie-free variant; on the standard
// tiny-v41 the agreement is printed and the teacher-forced agreement must be >= 90%.
// Skips visibly without a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/rng.h"
#include "engine/engine.h"
#include "forward/cpu_model.h"
#include "backends/cuda/gpu_model.h"
#include "gpu_test_util.h"
#include "forward/state.h"
#include "model/make_tiny.h"

#if FLASHSEEK_HAVE_CUDA
#include "ops/cuda/runtime/cuda_check.h"
#endif

namespace flashseek::forward {
namespace {
namespace fs = std::filesystem;
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)
#define REQUIRE_GPU() FS_REQUIRE_GPU()

// A make-tiny tiny-v41 checkpoint; tie_free widens every selection (index top-k, experts of the
// backbone and of the draft, candidate blocks) so that no near-tie can flip a choice.
std::string make_ckpt(bool tie_free) {
  auto cfg = model::builtin_config("tiny-v41");
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig c = cfg.value();
  if (tie_free) widen_selections(c, /*draft=*/true);
  return tiny_checkpoint(std::string("fs_gpuspec_") + (tie_free ? "tf" : "std"), c, 11);
}

struct ProposeParam {
  bool tie_free;
  Numerics numerics;
};
class GpuSpecPropose : public ::testing::TestWithParam<ProposeParam> {};

// Proposals after a prefill longer than the ring, then after one-token decodes and small chunks
// (the draft rings are written by every target forward, wrapping around).
TEST_P(GpuSpecPropose, MatchesCpu) {
  REQUIRE_GPU();
  const ProposeParam p = GetParam();
  const std::string dir = make_ckpt(p.tie_free);
  auto cpu = load_model(dir, p.numerics);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = load_model_gpu(dir, p.numerics, 0, cpu_twin_weights(p.numerics));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& C = *cpu.value();
  Model& G = *gpu.value();
  ASSERT_TRUE(G.has_draft());
  const int64_t V = C.config().vocab_size;
  const auto tokens = random_tokens(120, V, 99);
  auto sc = C.new_sequence(), sg = G.new_sequence();
  std::vector<float> sink;
  double worst = 0, worst_conf = 0;
  int64_t same = 0, total = 0, proposals = 0;
  size_t at = 0;
  // Feed pattern: one 41-token chunk, then 1-token steps, then chunks of 3 and 6.
  const std::vector<size_t> steps = {41, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 6, 3, 1, 1, 6, 1, 2, 1};
  for (size_t n : steps) {
    const std::span<const int32_t> chunk(tokens.data() + at, n);
    ASSERT_TRUE(feed(C, *sc, chunk, sink, false).ok());
    ASSERT_TRUE(feed(G, *sg, chunk, sink, false).ok());
    at += n;
    const int32_t x0 = tokens[at];
    auto bc = C.propose(*sc, x0);
    auto bg = G.propose(*sg, x0);
    ASSERT_TRUE(bc.ok()) << bc.status().to_string();
    ASSERT_TRUE(bg.ok()) << bg.status().to_string();
    ASSERT_EQ(bg->tokens.size(), size_t(C.config().dspark_block_size));
    ASSERT_EQ(bg->logits.size(), bc->logits.size());
    ASSERT_EQ(sg->length(), int64_t(at)) << "propose must not advance the state";
    worst = std::max(worst, max_abs_diff(bc->logits, bg->logits));
    worst_conf = std::max(worst_conf, max_abs_diff(bc->confidence, bg->confidence));
    for (size_t i = 0; i < bc->tokens.size(); ++i) same += bc->tokens[i] == bg->tokens[i];
    total += int64_t(bc->tokens.size());
    ++proposals;
  }
  const double agree = double(same) / double(total);
  std::printf("[gpu spec] propose %s %s: %lld proposals, max|d logit| %.3g, max|d confidence| %.3g, "
              "same draft tokens %.4f\n",
              p.tie_free ? "tie-free" : "standard", p.numerics == Numerics::kExact ? "exact" : "reference",
              (long long)proposals, worst, worst_conf, agree);
  if (p.tie_free) {
    EXPECT_LT(worst, 2e-2);
    EXPECT_LT(worst_conf, 2e-2);
    EXPECT_EQ(same, total);
  }
  EXPECT_GE(agree, 0.9);
  // Bad input is an error value.
  EXPECT_FALSE(G.propose(*sg, int32_t(V)).ok());
  EXPECT_FALSE(G.propose(*G.new_sequence(), 3).ok());
  EXPECT_FALSE(G.propose(*sc, 3).ok()) << "a CPU state is refused";
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuSpecPropose,
                         ::testing::Values(ProposeParam{true, Numerics::kExact}, ProposeParam{true, Numerics::kReference},
                                           ProposeParam{false, Numerics::kExact}),
                         [](const ::testing::TestParamInfo<ProposeParam>& info) {
                           return std::string(info.param.tie_free ? "tiefree_" : "standard_") +
                                  (info.param.numerics == Numerics::kExact ? "exact" : "reference");
                         });

// For several committed lengths L (both parities of the ratio-2 groups, before and after the
// ring wraps) and every k ≤ kMaxRollback: forward k extra tokens, roll back to L, continue with
// the same tokens in uneven chunks: logits and proposals equal those of a snapshot taken at L.
TEST(GpuSpecRollback, ContinuesLikeAStateThatNeverSawTheTokens) {
  REQUIRE_GPU();
  const std::string dir = make_ckpt(false);
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = *gpu.value();
  const int64_t V = G.config().vocab_size;
  const auto tokens = random_tokens(200, V, 5);
  const auto junk = random_tokens(kMaxRollback, V, 6);
  double worst = 0, worst_prop = 0;
  int cases = 0;
  for (int64_t L : {1, 2, 7, 12, 33, 70}) {
    auto base = G.new_sequence();
    std::vector<float> sink;
    ASSERT_TRUE(feed(G, *base, std::span<const int32_t>(tokens.data(), size_t(L)), sink, false).ok());
    for (int64_t k = 1; k <= kMaxRollback; ++k) {
      auto snap = base->clone();
      auto st = base->clone();
      // The rejected tokens: the next real token then junk (a verification block), or one by one.
      std::vector<int32_t> rej(junk.begin(), junk.begin() + k);
      rej[0] = tokens[size_t(L)];
      if (k % 2) {
        ASSERT_TRUE(feed(G, *st, rej, sink).ok());
      } else {
        for (int32_t t : rej) ASSERT_TRUE(feed(G, *st, std::span<const int32_t>(&t, 1), sink).ok());
      }
      ASSERT_TRUE(G.rollback(*st, L).ok()) << "L " << L << " k " << k;
      ASSERT_EQ(st->length(), L);
      auto pa = G.propose(*st, tokens[size_t(L)]);
      auto pb = G.propose(*snap, tokens[size_t(L)]);
      ASSERT_TRUE(pa.ok() && pb.ok());
      worst_prop = std::max(worst_prop, max_abs_diff(pa->logits, pb->logits));
      std::vector<float> la, lb;
      size_t at = size_t(L);
      for (size_t n : {size_t(1), size_t(3), size_t(2), size_t(9), size_t(1)}) {
        const std::span<const int32_t> c(tokens.data() + at, n);
        ASSERT_TRUE(feed(G, *st, c, la).ok());
        ASSERT_TRUE(feed(G, *snap, c, lb).ok());
        at += n;
      }
      const double d = max_abs_diff(la, lb);
      worst = std::max(worst, d);
      EXPECT_LT(d, 1e-6) << "L " << L << " k " << k;
      ++cases;
    }
  }
  std::printf("[gpu spec] rollback: %d cases, max|d logit| vs snapshot %.3g, proposals %.3g\n", cases, worst,
              worst_prop);
  EXPECT_LT(worst_prop, 1e-6);
  // Against a fresh prefill of the same committed tokens (different chunking: within fp tolerance).
  auto fresh = G.new_sequence();
  auto rolled = G.new_sequence();
  std::vector<float> sink, lf, lr;
  ASSERT_TRUE(feed(G, *fresh, std::span<const int32_t>(tokens.data(), 50), sink, false).ok());
  ASSERT_TRUE(feed(G, *rolled, std::span<const int32_t>(tokens.data(), 45), sink, false).ok());
  ASSERT_TRUE(feed(G, *rolled, junk, sink).ok());  // 8 wrong tokens at 45 … 52
  ASSERT_TRUE(G.rollback(*rolled, 45).ok());
  ASSERT_TRUE(feed(G, *rolled, std::span<const int32_t>(tokens.data() + 45, 5), sink).ok());
  ASSERT_TRUE(feed(G, *fresh, std::span<const int32_t>(tokens.data() + 50, 30), lf).ok());
  ASSERT_TRUE(feed(G, *rolled, std::span<const int32_t>(tokens.data() + 50, 30), lr).ok());
  const double df = max_abs_diff(lf, lr);
  std::printf("[gpu spec] rollback vs fresh prefill: max|d logit| %.3g\n", df);
  EXPECT_LT(df, 2e-2);
  // Limits are errors, state unchanged.
  auto st = G.new_sequence();
  ASSERT_TRUE(feed(G, *st, std::span<const int32_t>(tokens.data(), 40), sink, false).ok());
  EXPECT_FALSE(G.rollback(*st, 40 - kMaxRollback - 1).ok());
  EXPECT_FALSE(G.rollback(*st, 41).ok());
  EXPECT_FALSE(G.rollback(*st, -1).ok());
  EXPECT_EQ(st->length(), 40);
  auto cpu = load_model(dir, Numerics::kReference);
  ASSERT_TRUE(cpu.ok());
  auto cst = cpu.value()->new_sequence();
  EXPECT_FALSE(G.rollback(*cst, 0).ok()) << "a CPU state is refused";
}

void log_stats(const char* what, const engine::EngineStats& s) {
  std::string per;
  for (int64_t a : s.spec_accepted_at) per += " " + std::to_string(a);
  std::printf("[gpu spec] %s: %lld verify steps, %lld drafted, %lld accepted (per position:%s), %.3f tokens/step\n",
              what, (long long)s.spec_steps, (long long)s.spec_drafted, (long long)s.spec_accepted, per.c_str(),
              s.spec_steps ? double(s.spec_emitted) / double(s.spec_steps) : 0.0);
}

TEST(GpuSpecEngine, GreedyEqualsPlainOver520TokensTieFree) {
  REQUIRE_GPU();
  auto gpu = load_model_gpu(make_ckpt(true), Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = *gpu.value();
  const auto prompt = random_tokens(9, G.config().vocab_size, 41);
  engine::EngineStats st;
  const auto spec = gpu_test::greedy_generate(G, prompt, 520, true, &st);
  const auto plain = gpu_test::greedy_generate(G, prompt, 520, false, nullptr);
  ASSERT_EQ(spec.size(), 520u);
  ASSERT_EQ(plain.size(), 520u);
  for (size_t i = 0; i < 520; ++i) ASSERT_EQ(spec[i], plain[i]) << "first difference at generated token " << i;
  EXPECT_GT(st.spec_steps, 0);
  log_stats("engine tie-free tiny-v41 (GPU)", st);
}

TEST(GpuSpecEngine, AgreementOnStandardTinyV41) {
  REQUIRE_GPU();
  auto gpu = load_model_gpu(make_ckpt(false), Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = *gpu.value();
  const int64_t n = 520, V = G.config().vocab_size, B = G.config().dspark_block_size;
  const auto prompt = random_tokens(9, V, 42);
  engine::EngineStats st;
  const auto spec = gpu_test::greedy_generate(G, prompt, n, true, &st);
  const auto plain = gpu_test::greedy_generate(G, prompt, n, false, nullptr);
  ASSERT_EQ(spec.size(), size_t(n));
  ASSERT_EQ(plain.size(), size_t(n));
  int64_t same = 0, first_diff = -1;
  for (int64_t i = 0; i < n; ++i) {
    same += spec[size_t(i)] == plain[size_t(i)];
    if (first_diff < 0 && spec[size_t(i)] != plain[size_t(i)]) first_diff = i;
  }
  // Teacher-forced: the plain continuation fed in verification-sized chunks (1 + B rows, as a
  // speculative step) — does the argmax of every row reproduce the plain greedy token?
  std::vector<int32_t> all(prompt);
  all.insert(all.end(), plain.begin(), plain.end());
  auto s = G.new_sequence();
  std::vector<float> sink, lg;
  ASSERT_TRUE(feed(G, *s, std::span<const int32_t>(all.data(), prompt.size() - 1), sink, false).ok());
  for (size_t at = prompt.size() - 1; at + 1 < all.size(); at += size_t(B + 1)) {
    const size_t m = std::min(size_t(B + 1), all.size() - 1 - at);
    ASSERT_TRUE(feed(G, *s, std::span<const int32_t>(all.data() + at, m), lg).ok());
  }
  int64_t tf = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = lg.data() + i * V;
    tf += int32_t(std::max_element(row, row + V) - row) == plain[size_t(i)];
  }
  log_stats("engine standard tiny-v41 (GPU)", st);
  std::printf("[gpu spec] standard tiny-v41: spec on == off for %lld/%lld tokens (first difference %lld); "
              "teacher-forced chunked agreement %.4f\n",
              (long long)same, (long long)n, (long long)first_diff, double(tf) / double(n));
  EXPECT_GE(double(tf) / double(n), 0.9);
}

}  // namespace
}  // namespace flashseek::forward
