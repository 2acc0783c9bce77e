// Hand-checked properties of the V4.1 sparse selection on tiny-v41 (v41 §8 layout: 1 FULL ratio 2,
// 2 reuse of 1, 3 FULL ratio 1 + candidate source, 4 reuse of 3, 5 REINDEX filtered by 3's
// candidates, index_topk 4, candidate 2 blocks of 4) — what the official fixture cannot reach
// because it keeps every position.
#include <filesystem>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

class Selection : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("fs_sel_tiny_" + std::to_string(::getpid()))).string();
    auto cfg = model::builtin_config("tiny-v41");
    ASSERT_TRUE(cfg.ok());
    model::MakeTinyOptions opt;
    opt.seed = 11;
    opt.bf16 = true;
    ASSERT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir_).ok());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // Runs `n` random tokens (prefill of `prefill`, then decode) and returns the trace of the
  // last forward plus the final state.
  void run(int64_t n, ForwardTrace& trace, std::unique_ptr<SequenceState>& st, uint64_t seed = 1) {
    auto m = CpuModel::load(dir_, Numerics::kExact);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    Rng rng(seed);
    std::vector<int32_t> toks(static_cast<size_t>(n));
    for (auto& t : toks) t = int32_t(rng.below(uint64_t(model_->config().vocab_size)));
    st = model_->new_sequence();
    model_->set_trace(&trace);
    std::vector<float> logits;
    BatchItem item{st.get(), toks, true};
    ASSERT_TRUE(model_->forward({&item, 1}, logits).ok());
  }
  std::unique_ptr<CpuModel> model_;
  static std::string dir_;
};
std::string Selection::dir_;

TEST_F(Selection, RolesOfTheTinyLayout) {
  auto m = CpuModel::load(dir_, Numerics::kExact);
  ASSERT_TRUE(m.ok());
  const auto& c = m.value()->config();
  EXPECT_TRUE(c.role(1).kv_source && c.role(1).index_source);
  EXPECT_EQ(c.role(2).idx_src, 1);
  EXPECT_TRUE(c.role(3).candidate_source);
  EXPECT_EQ(c.role(4).idx_src, 3);
  EXPECT_TRUE(c.role(5).index_source && !c.role(5).kv_source && c.role(5).candidate_filtered);
  EXPECT_EQ(c.role(5).kv_src, 3);
  EXPECT_EQ(c.index_topk, 4);
}

TEST_F(Selection, TopkSizeIsMinOfKAndReachableAndDropsTheRest) {
  ForwardTrace tr;
  std::unique_ptr<SequenceState> st;
  run(40, tr, st);
  const auto& c = model_->config();
  bool dropped = false;
  for (int l : {1, 3, 5}) {
    const int64_t ratio = c.role(l).ratio;
    ASSERT_EQ(tr.topk[size_t(l)].size(), 40u);
    for (int64_t t = 0; t < 40; ++t) {
      const auto& sel = tr.topk[size_t(l)][size_t(t)];
      const int64_t clen = (tr.pos[size_t(t)] + 1) / ratio;
      EXPECT_EQ(int64_t(sel.size()), std::min<int64_t>(c.index_topk, clen)) << "layer " << l << " t " << t;
      for (size_t i = 0; i < sel.size(); ++i) {
        EXPECT_LT(sel[i], clen);  // never a position the query cannot reach
        if (i) EXPECT_LT(sel[i - 1], sel[i]);  // ascending, unique
      }
      dropped |= clen > int64_t(sel.size());
    }
  }
  EXPECT_TRUE(dropped);
}

TEST_F(Selection, ReuseLayersAttendTheirSourceSelection) {
  ForwardTrace tr;
  std::unique_ptr<SequenceState> st;
  run(33, tr, st);
  EXPECT_EQ(tr.topk[2], tr.topk[1]);
  EXPECT_EQ(tr.topk[4], tr.topk[3]);
  EXPECT_TRUE(tr.topk[0].empty());
  EXPECT_TRUE(tr.topk[6].empty());
}

TEST_F(Selection, CandidateMaskPinsNewestBlockAndFiltersReindex) {
  ForwardTrace tr;
  std::unique_ptr<SequenceState> st;
  run(48, tr, st);
  const auto& c = model_->config();
  const int64_t B = c.candidate_block_size, K = c.candidate_topk_blocks;
  bool filtered = false;
  for (int64_t t = 0; t < 48; ++t) {
    const auto& mask = tr.cand[size_t(t)];
    const int64_t clen = tr.pos[size_t(t)] + 1;  // ratio 1
    ASSERT_EQ(int64_t(mask.size()), clen);
    EXPECT_EQ(mask[size_t(clen - 1)], 1) << "newest block pinned at t " << t;
    int64_t blocks = 0;
    for (int64_t b = 0; b * B < clen; ++b) blocks += mask[size_t(b * B)];
    EXPECT_LE(blocks, K);
    for (int32_t i : tr.topk[5][size_t(t)]) EXPECT_EQ(mask[size_t(i)], 1) << "REINDEX picked a filtered position";
    // The candidate source's own top-k is unfiltered: it may pick outside the mask.
    for (int32_t i : tr.topk[3][size_t(t)]) filtered |= mask[size_t(i)] == 0;
  }
  EXPECT_TRUE(filtered) << "expected the candidate source to select outside its own mask at least once";
}

TEST_F(Selection, ReindexUsesItsOwnQueryWithTheSourceKeys) {
  ForwardTrace tr;
  std::unique_ptr<SequenceState> st;
  run(48, tr, st);
  // Different queries over the same keys: the selections differ somewhere.
  EXPECT_NE(tr.topk[5], tr.topk[3]);
  // Keys exist only at kv sources (layer 3 for layer 5): one compressed row and one index key per
  // token at ratio 1, one per pair at ratio 2; nothing is stored for reuse / REINDEX layers.
  const auto& s = dynamic_cast<const CpuSequenceState&>(*st);
  const auto& c = model_->config();
  EXPECT_EQ(s.layers[3].ikeys.size() * s.layers[3].ikeys.width(), 48 * c.index_head_dim);
  EXPECT_EQ(s.layers[3].ckv.size() * s.layers[3].ckv.width(), 48 * c.head_dim);
  EXPECT_EQ(s.layers[1].ckv.size() * s.layers[1].ckv.width(), 24 * c.head_dim);
  for (int l : {0, 2, 4, 5, 6}) {
    EXPECT_TRUE(s.layers[size_t(l)].ikeys.empty()) << l;
    EXPECT_TRUE(s.layers[size_t(l)].ckv.empty()) << l;
  }
}

}  // namespace
}  // namespace flashseek::forward
