// load_weights(ck, {.matrices = false}) (the CUDA backend's native-weights load, no FP32 copy of
// a matrix on the host): every matrix is left empty and named in deferred_matrices, exactly the
// matrices a full load fills (same count, same element total), every vector is loaded as in the
// full load. A full load dequantises the matrices in parallel with the same result on any number of
// threads and reports its progress in stored bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "forward/weights.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/make_tiny.h"
#include "model/weights.h"
#include "test_util.h"

namespace flashseek::forward {
namespace {

// Every matrix field of `w` (the oracle list of this test), then every vector field.
void matrices_of(LayerWeights& L, std::vector<Vec*>& m) {
  AttentionWeights& A = L.attn;
  for (Vec* v : {&L.hc_attn_fn, &L.hc_ffn_fn, &A.wq_a, &A.wq_b, &A.wkv, &A.wo_a, &A.wo_b, &A.idx_wq_b,
                 &A.idx_weights_proj, &A.idx_wk, &A.compressor.wkv, &A.compressor.wgate, &A.idx_compressor.wkv,
                 &A.idx_compressor.wgate, &L.ffn.gate, &L.ffn.s_w1, &L.ffn.s_w2, &L.ffn.s_w3, &L.engram.wkv})
    m.push_back(v);
  for (auto* ws : {&L.ffn.w1, &L.ffn.w2, &L.ffn.w3})
    for (Vec& v : *ws) m.push_back(&v);
}
std::vector<Vec*> matrices_of(ModelWeights& w) {
  std::vector<Vec*> m = {&w.embed, &w.head, &w.hc_head_fn};
  for (LayerWeights& L : w.layers) matrices_of(L, m);
  if (w.has_mtp) {
    matrices_of(w.mtp.block, m);
    for (Vec* v : {&w.mtp.e_proj, &w.mtp.h_proj, &w.mtp.hc_head_fn}) m.push_back(v);
  }
  for (LayerWeights& L : w.dspark.stages) matrices_of(L, m);
  for (Vec* v : {&w.dspark.main_proj, &w.dspark.markov_embed, &w.dspark.markov_head}) m.push_back(v);
  return m;
}
void vectors_of(LayerWeights& L, std::vector<Vec*>& v) {
  AttentionWeights& A = L.attn;
  for (Vec* x : {&L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_base, &L.hc_ffn_scale, &L.attn_norm, &L.ffn_norm,
                 &A.q_norm, &A.kv_norm, &A.attn_sink, &A.idx_k_norm, &A.rope_inv_freq, &A.compressor.ape,
                 &A.compressor.norm, &A.idx_compressor.ape, &A.idx_compressor.norm, &L.ffn.bias, &L.engram.wqk})
    v.push_back(x);
}
std::vector<Vec*> vectors_of(ModelWeights& w) {
  std::vector<Vec*> v = {&w.norm, &w.hc_head_base, &w.hc_head_scale};
  for (LayerWeights& L : w.layers) vectors_of(L, v);
  for (LayerWeights& L : w.dspark.stages) vectors_of(L, v);
  for (Vec* x : {&w.dspark.main_norm, &w.dspark.norm, &w.dspark.confidence}) v.push_back(x);
  return v;
}

class WeightsLoad : public ::testing::TestWithParam<const char*> {};

TEST_P(WeightsLoad, MatricesDeferredVectorsLoaded) {
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  flashseek::testing::TempDir dir;
  model::MakeTinyOptions opt;
  opt.seed = 5;
  ASSERT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir.path().string()).ok());
  auto ck = model::Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  auto full = load_weights(ck.value());
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  WeightLoadOptions lean_opt;
  lean_opt.matrices = false;
  auto lean = load_weights(ck.value(), lean_opt);
  ASSERT_TRUE(lean.ok()) << lean.status().to_string();
  EXPECT_TRUE(full.value().deferred_matrices.empty());

  int64_t full_count = 0, full_numel = 0;
  for (Vec* v : matrices_of(full.value()))
    if (!v->empty()) ++full_count, full_numel += int64_t(v->size());
  for (Vec* v : matrices_of(lean.value())) EXPECT_TRUE(v->empty());
  const auto& names = lean.value().deferred_matrices;
  EXPECT_EQ(int64_t(names.size()), full_count);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size()) << "a name listed twice";
  int64_t lean_numel = 0;
  for (const std::string& n : names) {
    auto s = ck.value().logical_shape(n);
    ASSERT_TRUE(s.ok()) << n;
    lean_numel += shape_numel(s.value());
  }
  EXPECT_EQ(lean_numel, full_numel);
  EXPECT_GT(full_count, 10);

  const auto fv = vectors_of(full.value()), lv = vectors_of(lean.value());
  ASSERT_EQ(fv.size(), lv.size());
  int64_t nonempty = 0;
  for (size_t i = 0; i < fv.size(); ++i) {
    EXPECT_EQ(*fv[i], *lv[i]) << "vector field " << i;
    nonempty += !fv[i]->empty();
  }
  EXPECT_GT(nonempty, 10);
}

// The matrices are dequantised in parallel: one thread and four give the same weights bit for bit,
// each matrix equals the checkpoint's own dequantisation, and the progress callback counts every
// stored byte of the matrices exactly once, reaching the total on its last call.
TEST_P(WeightsLoad, ParallelLoadEqualsOneThreadAndReportsEveryByte) {
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  flashseek::testing::TempDir dir;
  model::MakeTinyOptions opt;
  opt.seed = 7;
  ASSERT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir.path().string()).ok());
  auto ck = model::Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  WeightLoadOptions one_opt;
  one_opt.threads = 1;
  auto one = load_weights(ck.value(), one_opt);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  WeightLoadOptions four_opt;
  four_opt.threads = 4;
  four_opt.progress = [&](uint64_t done, uint64_t total) {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back({done, total});
  };
  auto four = load_weights(ck.value(), four_opt);
  ASSERT_TRUE(four.ok()) << four.status().to_string();
  const auto a = matrices_of(one.value()), b = matrices_of(four.value());
  ASSERT_EQ(a.size(), b.size());
  int64_t nonempty = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(*a[i], *b[i]) << "matrix field " << i;
    nonempty += !a[i]->empty();
  }
  EXPECT_GT(nonempty, 10);
  auto embed = ck.value().dequant_f32("embed.weight");
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(*embed, four.value().embed);
  // Progress: one call per matrix, the totals agree, `done` reaches the total once, at the end of
  // the sum of the matrices' stored bytes (codes + scales).
  ASSERT_EQ(int64_t(calls.size()), nonempty);
  uint64_t stored = 0;
  WeightLoadOptions lean_opt;
  lean_opt.matrices = false;
  auto lean = load_weights(ck.value(), lean_opt);
  ASSERT_TRUE(lean.ok());
  for (const std::string& n : lean.value().deferred_matrices) {
    stored += ck.value().find(n)->data.size();
    if (auto s = ck.value().find(model::scale_name_for(n)); s.ok()) stored += s->data.size();
  }
  uint64_t max_done = 0;
  int at_total = 0;
  for (auto [done, total] : calls) {
    EXPECT_EQ(total, stored);
    max_done = std::max(max_done, done);
    at_total += done == total;
  }
  EXPECT_EQ(max_done, stored);
  EXPECT_EQ(at_total, 1);
}

INSTANTIATE_TEST_SUITE_P(Tiny, WeightsLoad, ::testing::Values("tiny-v41", "tiny-v4"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "tiny-v41" ? std::string("v41") : std::string("v4");
                         });

}  // namespace
}  // namespace flashseek::forward
