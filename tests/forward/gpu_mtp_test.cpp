// V4's MTP draft on the CUDA backend (backends/cuda/gpu_mtp.cpp) on make-tiny tiny-v4 checkpoints,
// against the CPU oracle (forward/mtp.cpp):
// (a) the GPU model has the one-token draft; GpuModel::propose equals CpuModel::propose after a
//     prefill longer than the window ring, one-token decodes and small chunks: bitwise in
//     `reference` numerics on a tie-free variant (FP32 weight copies, where the backbone is
//     bitwise too), within 1e-4 and the same tokens in `exact`; >= 90 % same tokens on the
//     standard tiny-v4;
// (b) rollback after rejected tokens continues exactly like a clone that never saw them (logits
//     and proposals bitwise), for every k <= kMaxRollback; too-far rollbacks are errors;
// (c) snapshots: the GPU state's export carries the MTP ring and history the CPU keeps (the CPU
//     imports it and proposes what it proposes itself), and a GPU import of the CPU's snapshot
//     proposes what the GPU state does;
// (d) the engine on the GPU model: greedy with `--speculative on` equals `off` over 300 tokens.
// Skips visibly without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/rng.h"
#include "engine/engine.h"
#include "forward/cpu_model.h"
#include "forward/state.h"
#include "gpu_test_util.h"

namespace flashseek::forward {
namespace {
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)

// tiny-v4 (MTP block mtp.0.*); tie_free widens every selection, the MTP block's experts included.
std::string make_v4(bool tie_free) {
  auto cfg = model::builtin_config("tiny-v4");
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig c = cfg.value();
  if (tie_free) widen_selections(c);
  return tiny_checkpoint(std::string("fs_gpumtp_") + (tie_free ? "tf" : "std"), c, 13);
}

struct Param {
  bool tie_free;
  Numerics numerics;
};
class GpuMtpPropose : public ::testing::TestWithParam<Param> {};

TEST_P(GpuMtpPropose, MatchesCpu) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  const std::string dir = make_v4(p.tie_free);
  auto cpu = load_model(dir, p.numerics);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = load_model_gpu(dir, p.numerics, 0, cpu_twin_weights(p.numerics));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& C = *cpu.value();
  Model& G = *gpu.value();
  ASSERT_TRUE(C.has_draft());
  ASSERT_TRUE(G.has_draft()) << "a V4 checkpoint with MTP weights has a draft on one GPU";
  ASSERT_EQ(G.draft_block_size(), 1);
  const int64_t V = C.config().vocab_size;
  const auto tokens = random_tokens(400, V, 77);
  auto sc = C.new_sequence(), sg = G.new_sequence();
  std::vector<float> lc, lg;
  double worst = 0, worst_backbone = 0;
  int64_t same = 0, total = 0;
  size_t at = 0;
  // A prefill past the window ring (window + kMaxRollback rows), then decodes and small chunks.
  std::vector<size_t> steps = {size_t(C.config().window + 41), 1, 1, 1, 2, 1, 3, 6, 1, 1, 9, 1, 2, 1};
  for (int i = 0; i < 20; ++i) steps.push_back(1 + size_t(i % 4));
  for (size_t n : steps) {
    const std::span<const int32_t> chunk(tokens.data() + at, n);
    lc.clear(), lg.clear();
    ASSERT_TRUE(feed(C, *sc, chunk, lc).ok());
    ASSERT_TRUE(feed(G, *sg, chunk, lg).ok());
    worst_backbone = std::max(worst_backbone, max_abs_diff(lc, lg));
    at += n;
    const int32_t x0 = tokens[at];
    auto bc = C.propose(*sc, x0);
    auto bg = G.propose(*sg, x0);
    ASSERT_TRUE(bc.ok()) << bc.status().to_string();
    ASSERT_TRUE(bg.ok()) << bg.status().to_string();
    ASSERT_EQ(bg->tokens.size(), 1u);
    ASSERT_EQ(bg->logits.size(), size_t(V));
    ASSERT_EQ(sg->length(), int64_t(at)) << "propose must not advance the state";
    worst = std::max(worst, max_abs_diff(bc->logits, bg->logits));
    same += bc->tokens[0] == bg->tokens[0];
    ++total;
  }
  const double agree = double(same) / double(total);
  std::printf("[gpu mtp] propose %s %s: %lld proposals, max|d logit| %.3g (backbone %.3g), same draft %.4f\n",
              p.tie_free ? "tie-free" : "standard", p.numerics == Numerics::kExact ? "exact" : "reference",
              (long long)total, worst, worst_backbone, agree);
  if (p.tie_free) {
    EXPECT_EQ(same, total);
    if (p.numerics == Numerics::kReference) {
      EXPECT_EQ(worst_backbone, 0.0) << "precondition: the backbone is bitwise here";
      EXPECT_EQ(worst, 0.0) << "MTP proposal bitwise == CPU in reference numerics";
    } else {
      EXPECT_LT(worst, 1e-4);
    }
  }
  EXPECT_GE(agree, 0.9);
  // Bad input is an error value.
  EXPECT_FALSE(G.propose(*sg, int32_t(V)).ok());
  EXPECT_FALSE(G.propose(*G.new_sequence(), 3).ok()) << "no committed token";
  EXPECT_FALSE(G.propose(*sc, 3).ok()) << "a CPU state is refused";
}

INSTANTIATE_TEST_SUITE_P(TinyV4, GpuMtpPropose,
                         ::testing::Values(Param{true, Numerics::kReference}, Param{true, Numerics::kExact},
                                           Param{false, Numerics::kReference}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(info.param.tie_free ? "tiefree_" : "standard_") +
                                  (info.param.numerics == Numerics::kExact ? "exact" : "reference");
                         });

// For several committed lengths L (before and after the rings wrap) and every k <= kMaxRollback:
// forward k rejected tokens (a verification chunk or one by one), roll back to L, then propose and
// continue in uneven chunks: logits and proposals bitwise equal to a clone taken at L.
TEST(GpuMtpRollback, ContinuesLikeAStateThatNeverSawTheTokens) {
  FS_REQUIRE_GPU();
  auto gpu = load_model_gpu(make_v4(false), Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = *gpu.value();
  ASSERT_TRUE(G.has_draft());
  const int64_t V = G.config().vocab_size, W = G.config().window;
  const auto tokens = random_tokens(W + 200, V, 5);
  const auto junk = random_tokens(kMaxRollback, V, 6);
  double worst = 0, worst_prop = 0;
  int cases = 0;
  for (int64_t L : {int64_t(1), int64_t(2), int64_t(7), int64_t(33), W + 3, W + 70}) {
    auto base = G.new_sequence();
    std::vector<float> sink;
    ASSERT_TRUE(feed(G, *base, std::span<const int32_t>(tokens.data(), size_t(L)), sink, false).ok());
    for (int64_t k = 1; k <= kMaxRollback; ++k) {
      auto snap = base->clone();
      auto st = base->clone();
      std::vector<int32_t> rej(junk.begin(), junk.begin() + k);
      rej[0] = tokens[size_t(L)];  // the anchor, then the rejected drafts
      if (k % 2) {
        ASSERT_TRUE(feed(G, *st, rej, sink).ok());
      } else {
        for (int32_t t : rej) ASSERT_TRUE(feed(G, *st, std::span<const int32_t>(&t, 1), sink).ok());
      }
      ASSERT_TRUE(G.rollback(*st, L).ok()) << "L " << L << " k " << k;
      ASSERT_EQ(st->length(), L);
      std::vector<float> la, lb;
      size_t at = size_t(L);
      for (size_t n : {size_t(1), size_t(3), size_t(2), size_t(9), size_t(1)}) {
        auto pa = G.propose(*st, tokens[at]);
        auto pb = G.propose(*snap, tokens[at]);
        ASSERT_TRUE(pa.ok() && pb.ok()) << "L " << L << " k " << k;
        worst_prop = std::max(worst_prop, max_abs_diff(pa->logits, pb->logits));
        EXPECT_EQ(pa->tokens, pb->tokens);
        const std::span<const int32_t> c(tokens.data() + at, n);
        ASSERT_TRUE(feed(G, *st, c, la).ok());
        ASSERT_TRUE(feed(G, *snap, c, lb).ok());
        at += n;
      }
      worst = std::max(worst, max_abs_diff(la, lb));
      ++cases;
    }
  }
  std::printf("[gpu mtp] rollback: %d cases, max|d logit| vs clone %.3g, proposals %.3g\n", cases, worst, worst_prop);
  EXPECT_EQ(worst, 0.0);
  EXPECT_EQ(worst_prop, 0.0);
  // Limits are errors, the state unchanged.
  auto st = G.new_sequence();
  std::vector<float> sink;
  ASSERT_TRUE(feed(G, *st, std::span<const int32_t>(tokens.data(), 40), sink, false).ok());
  EXPECT_FALSE(G.rollback(*st, 40 - kMaxRollback - 1).ok());
  EXPECT_FALSE(G.rollback(*st, 41).ok());
  EXPECT_EQ(st->length(), 40);
  EXPECT_TRUE(G.propose(*st, tokens[40]).ok());
}

// The canonical host state carries the MTP ring and history: GPU export → CPU import proposes
// like the CPU's own state (tie-free, reference, FP32 copies: bitwise), CPU export → GPU import
// proposes like the GPU state, and the exported MTP fields equal the CPU's.
TEST(GpuMtpSnapshot, ExportImportKeepTheMtpState) {
  FS_REQUIRE_GPU();
  const std::string dir = make_v4(true);
  auto cpu = load_model(dir, Numerics::kReference);
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0, cpu_twin_weights(Numerics::kReference));
  ASSERT_TRUE(cpu.ok() && gpu.ok());
  Model& C = *cpu.value();
  Model& G = *gpu.value();
  const int64_t V = C.config().vocab_size;
  const auto tokens = random_tokens(C.config().window + 60, V, 21);
  for (int64_t L : {int64_t(1), int64_t(5), C.config().window + 20}) {
    SCOPED_TRACE(L);
    auto sc = C.new_sequence(), sg = G.new_sequence();
    std::vector<float> sink;
    // Different chunkings, with a rollback on the GPU side: the history lengths differ.
    ASSERT_TRUE(feed(C, *sc, std::span<const int32_t>(tokens.data(), size_t(L)), sink, false).ok());
    for (int64_t i = 0; i < L; ++i) ASSERT_TRUE(feed(G, *sg, std::span<const int32_t>(&tokens[size_t(i)], 1), sink).ok());
    ASSERT_TRUE(feed(G, *sg, std::span<const int32_t>(tokens.data() + L, 3), sink).ok());
    ASSERT_TRUE(G.rollback(*sg, L).ok());
    auto eg = G.export_state(*sg);
    ASSERT_TRUE(eg.ok()) << eg.status().to_string();
    const auto& csc = static_cast<const CpuSequenceState&>(*sc);
    // The ring rows the next proposal reads (positions L−W … L−2; the GPU state also holds rows
    // of the rolled-back pairs, which nothing reads) are the CPU's.
    const int64_t Dh = C.config().head_dim, rs = csc.ring_size;
    ASSERT_EQ((*eg)->mtp_ring.size(), csc.mtp_ring.size());
    for (int64_t q = std::max<int64_t>(0, L - C.config().window); q <= L - 2; ++q)
      EXPECT_TRUE(std::equal(csc.mtp_ring.begin() + (q % rs) * Dh, csc.mtp_ring.begin() + (q % rs + 1) * Dh,
                             (*eg)->mtp_ring.begin() + (q % rs) * Dh))
          << "MTP ring row of position " << q;
    const size_t row = size_t(C.config().hc_mult * C.config().hidden_size);
    ASSERT_FALSE((*eg)->mtp_hist_x.empty());
    ASSERT_EQ((*eg)->mtp_hist_x.size() % row, 0u);
    // The newest history row (position L−1) is what the next proposal reads.
    EXPECT_TRUE(std::equal((*eg)->mtp_hist_x.end() - long(row), (*eg)->mtp_hist_x.end(), csc.mtp_hist_x.end() - long(row)));
    auto ci = C.import_state(**eg);
    ASSERT_TRUE(ci.ok()) << ci.status().to_string();
    auto ec = C.export_state(*sc);
    ASSERT_TRUE(ec.ok());
    auto gi = G.import_state(**ec);
    ASSERT_TRUE(gi.ok()) << gi.status().to_string();
    const int32_t x0 = tokens[size_t(L)];
    auto p_c = C.propose(*sc, x0), p_ci = C.propose(**ci, x0), p_g = G.propose(*sg, x0), p_gi = G.propose(**gi, x0);
    ASSERT_TRUE(p_c.ok() && p_ci.ok() && p_g.ok() && p_gi.ok());
    EXPECT_EQ(max_abs_diff(p_c->logits, p_ci->logits), 0.0);
    EXPECT_EQ(max_abs_diff(p_g->logits, p_gi->logits), 0.0);
    EXPECT_EQ(max_abs_diff(p_c->logits, p_g->logits), 0.0);
    // And the imported GPU state continues like the original.
    std::vector<float> la, lb;
    ASSERT_TRUE(feed(G, *sg, std::span<const int32_t>(tokens.data() + L, 4), la).ok());
    ASSERT_TRUE(feed(G, **gi, std::span<const int32_t>(tokens.data() + L, 4), lb).ok());
    EXPECT_EQ(max_abs_diff(la, lb), 0.0);
    auto q1 = G.propose(*sg, tokens[size_t(L + 4)]), q2 = G.propose(**gi, tokens[size_t(L + 4)]);
    ASSERT_TRUE(q1.ok() && q2.ok());
    EXPECT_EQ(max_abs_diff(q1->logits, q2->logits), 0.0);
  }
}

// Greedy through the engine on the GPU model (CUDA graphs on, the default): every step verifies
// [x0, MTP draft] and rolls back a rejection; the output equals plain decoding token for token.
TEST(GpuMtpEngine, GreedyOnEqualsOff) {
  FS_REQUIRE_GPU();
  for (bool tie_free : {true, false}) {
    SCOPED_TRACE(tie_free ? "tie-free" : "standard");
    auto gpu = load_model_gpu(make_v4(tie_free), Numerics::kReference, 0);
    ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
    Model& G = *gpu.value();
    const auto prompt = random_tokens(9, G.config().vocab_size, 43);
    engine::EngineStats st;
    const auto spec = gpu_test::greedy_generate(G, prompt, 300, true, &st);
    const auto plain = gpu_test::greedy_generate(G, prompt, 300, false, nullptr);
    ASSERT_EQ(spec.size(), 300u);
    ASSERT_EQ(plain.size(), 300u);
    for (size_t i = 0; i < 300; ++i) ASSERT_EQ(spec[i], plain[i]) << "first difference at generated token " << i;
    EXPECT_GT(st.spec_steps, 100);
    EXPECT_EQ(st.spec_drafted, st.spec_steps) << "one MTP draft per verification";
    std::printf("[gpu mtp] engine %s: %lld verify steps, %lld accepted, %.3f tokens/step\n",
                tie_free ? "tie-free" : "standard", (long long)st.spec_steps, (long long)st.spec_accepted,
                st.spec_steps ? double(st.spec_emitted) / double(st.spec_steps) : 0.0);
  }
}

}  // namespace
}  // namespace flashseek::forward
