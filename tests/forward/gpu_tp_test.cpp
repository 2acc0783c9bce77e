// Multi-GPU tensor + expert parallel model (backends/cuda/gpu_tp.h). CPU: the shard index math (which
// heads / output groups / experts / vocabulary rows each rank owns, uneven sizes rejected), the
// weight slicing and the --gpus list parsing. GPU: TP=N logits equal TP=1 logits within 2e-2 on
// tiny-v41 and tiny-v4 (prefill, and prefill + one-token decode steps) with the host-staged
// communicator (N ranks sharing GPU 0) and, with >= 2 GPUs, with NCCL (TP=2; TP=4 with >= 4 GPUs).
// Drafts (GpuTpDraft.*, GpuTpCli.RunSpeculativeOnTwoRanks): a host-staged TP=2 model offers the
// checkpoint's DSpark / V4 MTP draft, proposes the one-GPU model's draft tokens, rolls back like a
// clone, and speculates through the engine and `flashseek run` with greedy output == plain.
// GPU tests skip visibly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "core/rng.h"
#include "engine/engine.h"
#include "backends/cuda/gpu_model.h"
#include "backends/cuda/gpu_tp.h"
#include "backends/cuda/stored_slice.h"
#include "forward/memory_plan.h"
#include "forward/state_io.h"
#include "forward/state.h"
#include "gpu_test_util.h"
#include "model/checkpoint.h"
#include "model/make_tiny.h"
#include "model/weights.h"
#include "test_util.h"

#if FLASHSEEK_HAVE_CUDA
#include "ops/cuda/runtime/comm.h"
#include "ops/cuda/runtime/cuda_check.h"
#endif

namespace flashseek::forward {
namespace {
namespace fs = std::filesystem;

int gpu_count(std::string* why) {
#if FLASHSEEK_HAVE_CUDA
  if (!ops::cuda::cuda_device_available(why)) return 0;
  int n = 0;
  cudaGetDeviceCount(&n);
  return n;
#else
  *why = "this build has no CUDA backend";
  return 0;
#endif
}

model::ModelConfig config(const char* name) {
  auto c = model::builtin_config(name);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.value();
}

// ---- shard math (CPU) ------------------------------------------------------------------------

TEST(TpShard, RanksCoverHeadsGroupsExpertsAndVocabExactlyOnce) {
  for (const char* name : {"tiny-v4", "tiny-v41"}) {
    const model::ModelConfig c = config(name);
    for (int world : {1, 2}) {
      std::vector<int> head_owner(size_t(c.num_heads), -1), group_owner(size_t(c.o_groups), -1);
      std::vector<int> expert_owner(size_t(c.n_routed_experts), -1), vocab_owner(size_t(c.vocab_size), -1);
      int shared = 0;
      for (int r = 0; r < world; ++r) {
        auto s = make_tp_shard(c, Numerics::kReference, r, world);
        ASSERT_TRUE(s.ok()) << name << " world " << world << ": " << s.status().to_string();
        EXPECT_EQ(s->rank, r);
        EXPECT_EQ(s->split(), world > 1);
        EXPECT_EQ(s->heads * world, c.num_heads);
        EXPECT_EQ(s->groups * world, c.o_groups);
        // A rank's heads feed exactly its output groups (wo_a group g reads heads g·H/G ...).
        EXPECT_EQ(s->head0 * c.o_groups, s->group0 * c.num_heads);
        auto mark = [&](std::vector<int>& own, int64_t b, int64_t n) {
          for (int64_t i = b; i < b + n; ++i) {
            ASSERT_LT(i, int64_t(own.size()));
            EXPECT_EQ(own[size_t(i)], -1) << "index " << i << " owned twice";
            own[size_t(i)] = r;
          }
        };
        mark(head_owner, s->head0, s->heads);
        mark(group_owner, s->group0, s->groups);
        mark(expert_owner, s->expert0, s->experts);
        mark(vocab_owner, s->vocab0, s->vocab);
        shared += s->shared_expert;
      }
      for (const auto* own : {&head_owner, &group_owner, &expert_owner, &vocab_owner})
        EXPECT_EQ(std::count(own->begin(), own->end(), -1), 0) << name << " world " << world;
      EXPECT_EQ(shared, 1);
    }
  }
}

TEST(TpShard, UnevenVocabularySplitsAndUnevenHeadsGroupsExpertsAreRejected) {
  model::ModelConfig c = config("tiny-v4");  // 16 heads, 4 groups, 8 experts
  c.vocab_size = 1027;
  auto r0 = make_tp_shard(c, Numerics::kExact, 0, 2), r1 = make_tp_shard(c, Numerics::kExact, 1, 2);
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_EQ(r0->vocab, 514);
  EXPECT_EQ(r1->vocab0, 514);
  EXPECT_EQ(r1->vocab, 513);
  auto w3 = make_tp_shard(c, Numerics::kExact, 0, 3);  // 16 heads / 3
  ASSERT_FALSE(w3.ok());
  EXPECT_NE(w3.status().message().find("num_heads 16"), std::string::npos) << w3.status().to_string();
  auto w8 = make_tp_shard(c, Numerics::kExact, 0, 8);  // 16 heads / 8 fine, 4 groups / 8 not
  ASSERT_FALSE(w8.ok());
  EXPECT_NE(w8.status().message().find("o_groups 4"), std::string::npos) << w8.status().to_string();
  model::ModelConfig e = config("tiny-v4");
  e.n_routed_experts = 6;
  auto w4 = make_tp_shard(e, Numerics::kExact, 0, 4);
  ASSERT_FALSE(w4.ok());
  EXPECT_NE(w4.status().message().find("n_routed_experts 6"), std::string::npos) << w4.status().to_string();
  EXPECT_FALSE(make_tp_shard(c, Numerics::kExact, 2, 2).ok());
  EXPECT_FALSE(make_tp_shard(c, Numerics::kExact, 0, 0).ok());
  // Reference numerics: wo_b's FP8 activation blocks (128 on V4) must not straddle ranks:
  // 4 groups × 64 columns over 4 ranks = 64 columns each.
  ASSERT_TRUE(c.fp8_weights);
  EXPECT_TRUE(make_tp_shard(c, Numerics::kExact, 0, 4).ok());
  auto ref4 = make_tp_shard(c, Numerics::kReference, 0, 4);
  ASSERT_FALSE(ref4.ok());
  EXPECT_NE(ref4.status().message().find("activation block 128"), std::string::npos) << ref4.status().to_string();
}

TEST(TpShard, ShardWeightsKeepsTheRanksRowsColumnsAndExperts) {
  model::ModelConfig c = config("tiny-v41");  // 4 heads × 64, q_lora 64, 2 groups × 32, 4 experts
  const int64_t H = c.num_heads, Dh = c.head_dim, Rq = c.q_lora_rank, G = c.o_groups, Ro = c.o_lora_rank;
  const int64_t D = c.hidden_size, V = c.vocab_size, E = c.n_routed_experts, in_g = H * Dh / G;
  auto iota = [](int64_t n) {
    Vec v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), 0.0f);
    return v;
  };
  ModelWeights w;
  w.head = iota(V * D);
  w.layers.resize(1);
  auto& A = w.layers[0].attn;
  A.wq_b = iota(H * Dh * Rq), A.attn_sink = iota(H), A.wo_a = iota(G * Ro * in_g), A.wo_b = iota(D * G * Ro);
  auto& F = w.layers[0].ffn;
  for (int64_t e = 0; e < E; ++e) F.w1.push_back(Vec(4, float(e))), F.w2.push_back(Vec(4, float(e))), F.w3.push_back(Vec(4, float(e)));
  F.s_w1 = F.s_w2 = F.s_w3 = Vec(4, 1.0f);
  auto s = make_tp_shard(c, Numerics::kReference, 1, 2);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(shard_weights(w, c, *s).ok());
  EXPECT_EQ(int64_t(A.wq_b.size()), H / 2 * Dh * Rq);
  EXPECT_EQ(A.wq_b[0], float(H / 2 * Dh * Rq));  // first row of head H/2
  ASSERT_EQ(int64_t(A.attn_sink.size()), H / 2);
  EXPECT_EQ(A.attn_sink[0], float(H / 2));
  EXPECT_EQ(A.wo_a[0], float(G / 2 * Ro * in_g));
  ASSERT_EQ(int64_t(A.wo_b.size()), D * G / 2 * Ro);
  const int64_t cols = G / 2 * Ro;  // wo_b row r keeps columns [G/2·Ro, G·Ro) of G·Ro
  for (int64_t r : {int64_t(0), D - 1}) {
    EXPECT_EQ(A.wo_b[size_t(r * cols)], float(r * G * Ro + G / 2 * Ro));
    EXPECT_EQ(A.wo_b[size_t(r * cols + cols - 1)], float(r * G * Ro + G * Ro - 1));
  }
  ASSERT_EQ(int64_t(F.w1.size()), E / 2);
  EXPECT_EQ(F.w1[0][0], float(E / 2));
  EXPECT_EQ(F.w3.back()[0], float(E - 1));
  EXPECT_TRUE(F.s_w1.empty() && F.s_w2.empty() && F.s_w3.empty());  // shared expert: rank 0 only
  ASSERT_EQ(int64_t(w.head.size()), (V - s->vocab0) * D);
  EXPECT_EQ(w.head[0], float(s->vocab0 * D));
  // The draft is never split: rank 0 keeps it whole (it runs the draft), rank 1 drops it.
  auto with_draft = [&] {
    ModelWeights d;
    d.has_dspark = d.has_mtp = true;
    d.dspark.stages.resize(1);
    d.dspark.stages[0].attn.wq_a = iota(16);
    d.dspark.main_proj = iota(8), d.dspark.markov_head = iota(8), d.dspark.confidence = iota(4);
    d.mtp.e_proj = iota(8), d.mtp.block.ffn.s_w1 = iota(8);
    return d;
  };
  ModelWeights d1 = with_draft(), d0 = with_draft();
  ASSERT_TRUE(shard_weights(d1, c, *s).ok());
  EXPECT_TRUE(d1.dspark.stages.empty() && d1.dspark.main_proj.empty() && d1.dspark.markov_head.empty() &&
              d1.dspark.confidence.empty() && d1.mtp.e_proj.empty() && d1.mtp.block.ffn.s_w1.empty())
      << "rank 1 keeps no draft weights";
  EXPECT_TRUE(d1.has_dspark && d1.has_mtp) << "the flags still describe the checkpoint";
  auto s0 = make_tp_shard(c, Numerics::kReference, 0, 2);
  ASSERT_TRUE(s0.ok());
  ASSERT_TRUE(shard_weights(d0, c, *s0).ok());
  ASSERT_EQ(d0.dspark.stages.size(), 1u);
  EXPECT_EQ(d0.dspark.stages[0].attn.wq_a, iota(16)) << "rank 0 keeps the draft whole";
  EXPECT_EQ(d0.dspark.main_proj, iota(8));
  EXPECT_EQ(d0.dspark.markov_head, iota(8));
  EXPECT_EQ(d0.mtp.e_proj, iota(8));
  EXPECT_EQ(d0.mtp.block.ffn.s_w1, iota(8)) << "the MTP block's shared expert is not the backbone's";
  // A weight of the wrong size is an error, not a crash.
  ModelWeights bad;
  bad.layers.resize(1);
  bad.layers[0].attn.wo_b = Vec(7, 0.0f);
  EXPECT_FALSE(shard_weights(bad, c, *s).ok());
}

// ---- stored slices (CPU): what a rank uploads of a split matrix with native weights -----------

// Random stored bytes of an [n, k] matrix: codes of every format, E8M0 scales around 2^0.
struct StoredBytes {
  std::vector<uint8_t> codes, scales;
  StoredMatrixView view;
};

StoredBytes random_stored(StoredFormat f, int64_t n, int64_t k, int64_t br, int64_t bc, uint64_t seed) {
  StoredBytes b;
  Rng rng(seed);
  const int64_t per_value_x2 = f == StoredFormat::kF32 ? 8 : f == StoredFormat::kFp8 ? 2 : f == StoredFormat::kFp4 ? 1 : 4;
  b.codes.resize(size_t(n * k * per_value_x2 / 2));
  for (auto& c : b.codes) c = uint8_t(rng.below(256));
  if (f == StoredFormat::kFp8 || f == StoredFormat::kFp4) {
    b.scales.resize(size_t((n + br - 1) / br * ((k + bc - 1) / bc)));
    for (auto& s : b.scales) s = uint8_t(112 + rng.below(30));
  }
  b.view.format = f, b.view.n = n, b.view.k = k, b.view.block_rows = br, b.view.block_cols = bc;
  b.view.codes = b.codes, b.view.scales = b.scales;
  return b;
}

// Slices [start, start + count) along `axis` of the stored bytes and of the dequantised matrix:
// the dequantised slice equals the slice of the dequantised matrix bit for bit.
void expect_slice_matches(const StoredMatrixView& m, const Vec& full, SliceAxis axis, int64_t start, int64_t count,
                          const std::string& what) {
  const std::string where = what + (axis == SliceAxis::kRows ? " rows [" : " columns [") + std::to_string(start) +
                            ", " + std::to_string(start + count) + ")";
  auto s = slice_stored(m, axis, start, count);
  ASSERT_TRUE(s.ok()) << where << ": " << s.status().to_string();
  EXPECT_EQ(s->gathered, axis == SliceAxis::kCols) << where;  // row slices point into the source
  if (axis == SliceAxis::kRows) {
    EXPECT_GE(s->codes().data(), m.codes.data()) << where;
    EXPECT_LE(s->codes().data() + s->codes().size(), m.codes.data() + m.codes.size()) << where;
  }
  const StoredMatrixView sv = s->view(m);
  ASSERT_TRUE(check_stored(sv).ok()) << where << ": " << check_stored(sv).to_string();
  auto got = dequant_stored(sv);
  ASSERT_TRUE(got.ok()) << where << ": " << got.status().to_string();
  Vec want = full;
  ASSERT_TRUE(slice_f32(want, m.n, m.k, axis, start, count, "test").ok());
  ASSERT_EQ(got->size(), want.size()) << where;
  EXPECT_EQ(std::memcmp(got->data(), want.data(), want.size() * sizeof(float)), 0) << where;
  // The slice's bytes are only its own: codes of its values, scales of its blocks.
  const int64_t extent = axis == SliceAxis::kRows ? m.n : m.k;
  EXPECT_EQ(int64_t(s->codes().size()) * extent, int64_t(m.codes.size()) * count) << where;
}

TEST(TpShard, StoredSlicesDequantiseToTheSlicesOfTheDequantisedMatrix) {
  struct Case {
    const char* what;
    StoredFormat f;
    int64_t n, k, br, bc;
  };
  // Edge blocks partial where the shapes allow (FP8 n, k not multiples of the block).
  const Case cases[] = {{"FP8 32x32 blocks", StoredFormat::kFp8, 7 * 32 + 5, 5 * 32 + 9, 32, 32},
                        {"FP8 128x128 blocks", StoredFormat::kFp8, 3 * 128 + 40, 3 * 128 + 17, 128, 128},
                        {"FP8 per-row 32-groups", StoredFormat::kFp8, 37, 5 * 32 + 3, 1, 32},
                        {"MXFP4", StoredFormat::kFp4, 41, 7 * 32, 1, 32},
                        {"BF16", StoredFormat::kBf16, 29, 45, 1, 1},
                        {"F32", StoredFormat::kF32, 13, 11, 1, 1}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const StoredBytes b = random_stored(c.f, c.n, c.k, c.br, c.bc, seed++);
    ASSERT_TRUE(check_stored(b.view).ok()) << c.what << ": " << check_stored(b.view).to_string();
    auto full = dequant_stored(b.view);
    ASSERT_TRUE(full.ok()) << c.what;
    for (SliceAxis axis : {SliceAxis::kRows, SliceAxis::kCols}) {
      const int64_t extent = axis == SliceAxis::kRows ? c.n : c.k;
      const int64_t blk = axis == SliceAxis::kRows ? c.br : c.bc;
      const int64_t blocks = (extent + blk - 1) / blk;
      // Whole-block ranges: the first block, odd block counts inside, the tail (ending at the
      // matrix's end, partial where the shape is), the whole extent.
      std::vector<std::pair<int64_t, int64_t>> ranges = {{0, blk}, {0, extent}, {(blocks - 1) * blk, extent - (blocks - 1) * blk}};
      if (blocks >= 4) ranges.push_back({blk, 3 * blk});
      if (blocks >= 3) ranges.push_back({2 * blk, extent - 2 * blk});
      if (blocks >= 6) ranges.push_back({3 * blk, blk});
      for (const auto& [start, count] : ranges)
        if (start + count <= extent) expect_slice_matches(b.view, *full, axis, start, count, c.what);
    }
  }
}

TEST(TpShard, MisalignedOrOutOfRangeStoredSlicesAreRefused) {
  const StoredBytes fp8 = random_stored(StoredFormat::kFp8, 128, 96, 32, 32, 7);
  const StoredBytes fp4 = random_stored(StoredFormat::kFp4, 8, 96, 1, 32, 8);
  const StoredBytes v4 = random_stored(StoredFormat::kFp8, 256, 256, 128, 128, 9);
  struct Bad {
    const StoredMatrixView* m;
    SliceAxis axis;
    int64_t start, count;
    const char* expect;
  };
  const Bad bad[] = {
      {&fp8.view, SliceAxis::kRows, 16, 32, "scale blocks"},   // starts inside a block
      {&fp8.view, SliceAxis::kRows, 32, 48, "scale blocks"},   // ends inside one (not at the end)
      {&fp8.view, SliceAxis::kCols, 8, 32, "scale blocks"},
      {&fp8.view, SliceAxis::kCols, 0, 40, "scale blocks"},
      {&fp4.view, SliceAxis::kCols, 16, 32, "scale blocks"},   // MXFP4: 32-value blocks
      {&fp4.view, SliceAxis::kCols, 32, 48, "scale blocks"},
      {&v4.view, SliceAxis::kRows, 64, 64, "128x128"},         // a V4 TP=4 wo_a slice
      {&v4.view, SliceAxis::kCols, 0, 64, "128x128"},
      {&fp8.view, SliceAxis::kRows, 96, 64, "range"},           // past the end
      {&fp8.view, SliceAxis::kRows, -32, 32, "range"},
      {&fp8.view, SliceAxis::kCols, 0, 0, "range"},              // empty
  };
  for (const Bad& b : bad) {
    auto s = slice_stored(*b.m, b.axis, b.start, b.count);
    ASSERT_FALSE(s.ok()) << "[" << b.start << ", " << b.start + b.count << ") accepted";
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(b.expect), std::string::npos) << s.status().to_string();
    EXPECT_NE(s.status().message().find(std::to_string(b.start)), std::string::npos) << s.status().to_string();
  }
  // Bytes that do not match the shape are refused before any slicing.
  StoredMatrixView shortv = fp8.view;
  shortv.codes = shortv.codes.first(shortv.codes.size() - 1);
  EXPECT_FALSE(slice_stored(shortv, SliceAxis::kRows, 0, 32).ok());
  StoredMatrixView noscale = fp8.view;
  noscale.scales = {};
  EXPECT_FALSE(slice_stored(noscale, SliceAxis::kRows, 0, 32).ok());
}

TEST(TpShard, SliceForNamesTheRanksPartOfEverySplitMatrix) {
  const model::ModelConfig c = config("tiny-v41");  // 4 heads × 64, 2 groups × 32, 4 experts, 256 vocab
  auto one = make_tp_shard(c, Numerics::kReference, 0, 1);
  ASSERT_TRUE(one.ok());
  for (const char* n : {"layers.0.attn.wq_b.weight", "head.weight", "layers.2.ffn.experts.3.w1.weight"})
    EXPECT_EQ(tp_slice_for(n, c, *one).kind, TpSlice::kAll) << n;  // one GPU: everything
  auto r1 = make_tp_shard(c, Numerics::kReference, 1, 2);
  ASSERT_TRUE(r1.ok());
  auto is = [&](const char* n, TpSlice::Kind k, int64_t start, int64_t count) {
    const TpSlice s = tp_slice_for(n, c, *r1);
    EXPECT_EQ(s.kind, k) << n;
    if (k == TpSlice::kRows || k == TpSlice::kCols) {
      EXPECT_EQ(s.start, start) << n;
      EXPECT_EQ(s.count, count) << n;
    }
  };
  is("layers.3.attn.wq_b.weight", TpSlice::kRows, 2 * 64, 2 * 64);
  is("layers.3.attn.wo_a.weight", TpSlice::kRows, 32, 32);
  is("layers.3.attn.wo_b.weight", TpSlice::kCols, 32, 32);
  is("head.weight", TpSlice::kRows, 128, 128);
  is("layers.6.ffn.experts.1.w2.weight", TpSlice::kNone, 0, 0);  // rank 0's expert
  is("layers.6.ffn.experts.2.w2.weight", TpSlice::kAll, 0, 0);
  is("layers.6.ffn.experts.3.w3.weight", TpSlice::kAll, 0, 0);
  is("layers.6.ffn.shared_experts.w1.weight", TpSlice::kNone, 0, 0);  // rank 0 only
  for (const char* n : {"embed.weight", "layers.3.attn.wq_a.weight", "layers.3.attn.wkv.weight",
                        "layers.3.ffn.gate.weight", "layers.1.engram.wkv.weight", "layers.3.attn.indexer.wq_b.weight"})
    is(n, TpSlice::kAll, 0, 0);
  auto r0 = make_tp_shard(c, Numerics::kReference, 0, 2);
  ASSERT_TRUE(r0.ok());
  EXPECT_EQ(tp_slice_for("layers.6.ffn.shared_experts.w1.weight", c, *r0).kind, TpSlice::kAll);
  EXPECT_EQ(tp_slice_for("layers.6.ffn.experts.2.w1.weight", c, *r0).kind, TpSlice::kNone);
  // The draft (mtp.*: DSpark stages, tap projection, Markov tables; the V4 MTP block) is never
  // split: whole on rank 0, which runs it, nothing on rank 1 — its split-looking roles included.
  for (const char* n : {"mtp.0.attn.wq_b.weight", "mtp.0.attn.wo_b.weight", "mtp.0.ffn.experts.0.w1.weight",
                        "mtp.0.ffn.shared_experts.w1.weight", "mtp.0.main_proj.weight", "mtp.1.e_proj.weight"}) {
    EXPECT_EQ(tp_slice_for(n, c, *r0).kind, TpSlice::kAll) << n;
    is(n, TpSlice::kNone, 0, 0);
  }
}

// The view of a stored checkpoint matrix as GpuModel keeps it (plan_stored's formats).
StoredMatrixView checkpoint_view(const model::Checkpoint& ck, const std::string& name) {
  StoredMatrixView v;
  auto t = ck.find(name);
  EXPECT_TRUE(t.ok()) << name;
  if (!t.ok()) return v;
  v.n = t->shape[0], v.k = t->shape[1], v.codes = t->data;
  switch (t->dtype) {
    case DType::kBF16: v.format = StoredFormat::kBf16; break;
    case DType::kF32: v.format = StoredFormat::kF32; break;
    case DType::kF8E4M3: v.format = StoredFormat::kFp8; break;
    default: v.format = StoredFormat::kFp4, v.k *= 2; break;  // packed e2m1
  }
  if (v.format == StoredFormat::kFp8 || v.format == StoredFormat::kFp4) {
    auto s = ck.find(model::scale_name_for(name));
    EXPECT_TRUE(s.ok()) << name;
    if (!s.ok()) return v;
    v.scales = s->data;
    const int64_t b = ck.config().weight_block_size;
    const bool square = v.format == StoredFormat::kFp8 && s->shape[0] == (v.n + b - 1) / b;
    v.block_rows = square ? b : 1, v.block_cols = square ? b : 32;
  }
  return v;
}

// Every split matrix of the tiny checkpoints, every rank: the stored slice (when its range is
// whole blocks) dequantises to the rank's rows / columns of the checkpoint's dequantised tensor;
// where it is not whole blocks (tiny-v4 over 4 ranks: 64 of 128-wide blocks) the slice is refused,
// which is the case GpuModel turns into an FP32 copy of the rank's slice.
TEST(TpShard, CheckpointSlicesOfEveryRankMatchTheDequantisedTensor) {
  const std::pair<const char*, int> runs[] = {{"tiny-v41", 2}, {"tiny-v4", 2}, {"tiny-v4", 4}};
  for (const auto& [name, world] : runs) {
    const model::ModelConfig c = config(name);
    const std::string dir = gpu_test::tiny_checkpoint(std::string("fs_tp_slices_") + name, c, 5);
    auto ck = model::Checkpoint::open(dir);
    ASSERT_TRUE(ck.ok()) << ck.status().to_string();
    int sliced = 0, refused = 0;
    for (int r = 0; r < world; ++r) {
      auto sh = make_tp_shard(c, Numerics::kExact, r, world);
      ASSERT_TRUE(sh.ok()) << sh.status().to_string();
      for (const std::string& t : {std::string("head.weight"), std::string("layers.1.attn.wq_b.weight"),
                                   std::string("layers.1.attn.wo_a.weight"), std::string("layers.1.attn.wo_b.weight")}) {
        const TpSlice sl = tp_slice_for(t, c, *sh);
        ASSERT_TRUE(sl.kind == TpSlice::kRows || sl.kind == TpSlice::kCols) << t;
        const SliceAxis axis = sl.kind == TpSlice::kRows ? SliceAxis::kRows : SliceAxis::kCols;
        const StoredMatrixView v = checkpoint_view(*ck, t);
        auto full = ck->dequant_f32(t);
        ASSERT_TRUE(full.ok()) << t;
        const int64_t blk = axis == SliceAxis::kRows ? v.block_rows : v.block_cols;
        if (sl.start % blk != 0 || sl.count % blk != 0) {
          auto s = slice_stored(v, axis, sl.start, sl.count);
          EXPECT_FALSE(s.ok()) << name << " TP=" << world << " " << t;
          ++refused;
          continue;
        }
        expect_slice_matches(v, *full, axis, sl.start, sl.count,
                             std::string(name) + " TP=" + std::to_string(world) + " rank " + std::to_string(r) + " " + t);
        ++sliced;
      }
      // The rank's routed experts as stored (MXFP4 on both configs): whole matrices, never sliced.
      for (int64_t e = 0; e < c.n_routed_experts; ++e) {
        const std::string t = "layers.1.ffn.experts." + std::to_string(e) + ".w1.weight";
        const bool mine = e >= sh->expert0 && e < sh->expert0 + sh->experts;
        EXPECT_EQ(tp_slice_for(t, c, *sh).kind, mine ? TpSlice::kAll : TpSlice::kNone) << t;
      }
    }
    EXPECT_GT(sliced, 0) << name;
    EXPECT_EQ(refused > 0, world == 4) << name << " TP=" << world;  // only tiny-v4 TP=4 cuts 128-blocks
  }
}

// The start-up memory plan per GPU of a multi-GPU model with native weights is rank 0's device
// weights: the stored bytes of what the loader uploads there (tp_slice_for: its rows / columns,
// its experts, the shared expert; attn_sink's heads), every replicated matrix whole, and the
// whole draft (rank 0 runs it).
TEST(TpShard, MemoryPlanPerGpuCountsRankZerosNativeSlices) {
  const std::pair<const char*, int> runs[] = {{"tiny-v41", 2}, {"tiny-v4", 2}, {"tiny-v4", 4}};
  for (const auto& [name, world] : runs) {
    const model::ModelConfig c = config(name);
    auto sh = make_tp_shard(c, Numerics::kExact, 0, world);
    ASSERT_TRUE(sh.ok()) << sh.status().to_string();
    uint64_t want = 0;
    for (const model::WeightSpec& w : model::expected_weights(c)) {
      if (w.optional || w.component == model::Component::kVision || w.kind == model::WeightKind::kEngramTable)
        continue;
      const bool draft = w.component == model::Component::kDraftDense || w.component == model::Component::kDraftExperts;
      if (w.shape.size() < 2) {  // vectors as FP32; the backbone's attn_sink: the rank's heads
        const bool sink = !draft && w.name.find(".attn.attn_sink") != std::string::npos;
        want += 4 * uint64_t(shape_numel(w.shape)) / (sink ? uint64_t(world) : 1);
        continue;
      }
      uint64_t bytes = 0;
      for (const auto& t : model::release_tensors(w, c)) bytes += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
      const TpSlice sl = tp_slice_for(w.name, c, *sh);
      if (sl.kind == TpSlice::kNone) continue;
      if (sl.kind == TpSlice::kAll || draft) {
        want += bytes;
        continue;
      }
      const int64_t extent = sl.kind == TpSlice::kRows ? w.shape[0] : w.shape[1];
      EXPECT_EQ(bytes * uint64_t(sl.count) % uint64_t(extent), 0u) << w.name;  // tiny shapes split evenly
      want += bytes * uint64_t(sl.count) / uint64_t(extent);
    }
    MemoryPlanOptions o;
    o.gpu = true;
    o.native_weights = true;
    o.max_context = 256;
    o.tensor_parallel = world;
    const SnapshotGeometry g = snapshot_geometry(c, !c.is_v41(), c.is_v41(), 256);
    const MemoryPlan plan = plan_memory(c, g, true, o, uint64_t(1) << 40);
    EXPECT_EQ(plan.weights, want) << name << " TP=" << world;
    o.tensor_parallel = 1;
    const MemoryPlan one = plan_memory(c, g, true, o, uint64_t(1) << 40);
    EXPECT_LT(plan.weights, one.weights) << name;
    EXPECT_GT(plan.weights, one.weights / uint64_t(world)) << name;  // replicated parts stay whole
  }
}

TEST(TpShard, ParsesGpuLists) {
  auto a = parse_gpu_list("0,1");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int>{0, 1}));
  auto b = parse_gpu_list("3,0,0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int>{3, 0, 0}));
  for (const char* bad : {"", "0,", ",1", "0,,1", "a,1", "-1,0", "0;1", "0, 1"}) {
    auto r = parse_gpu_list(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "'";
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("--gpus"), std::string::npos);
    }
  }
}

TEST(TpShard, DeviceListWithoutGpusIsAClearError) {
  std::string why;
  if (gpu_count(&why) > 0) GTEST_SKIP() << "a GPU is present: the GPU tests below load multi-GPU models";
  auto m = load_model_for("/nonexistent-ckpt", Numerics::kExact, "0,1");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("--gpus"), std::string::npos) << m.status().to_string();
}

// ---- running the ranks together (for_each_rank, CPU) -------------------------------------------

// A count that threads raise and wait on (with a deadline: false when it was not reached).
struct Count {
  std::mutex mu;
  std::condition_variable cv;
  int n = 0;
  void add() {
    std::lock_guard<std::mutex> lock(mu);
    ++n;
    cv.notify_all();
  }
  bool wait_until(int k) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return n >= k; });
  }
};

TEST(TpRanks, EveryRankRunsOnceAtTheSameTimeRankZeroOnTheCallerAndAllAreJoined) {
  const std::vector<int> devices = {0, 1, 2, 3};
  const int W = int(devices.size());
  Count arrived, zero_done;
  std::vector<std::thread::id> ran_on(devices.size());
  std::vector<std::atomic<int>> runs(devices.size());
  std::vector<std::atomic<bool>> finished(devices.size());
  const Status st = for_each_rank("test", devices, [&](size_t r) -> Status {
    ran_on[r] = std::this_thread::get_id();
    ++runs[r];
    // Every rank waits for all the others: this returns only if the ranks run at the same time,
    // as TpModel's collectives need.
    arrived.add();
    if (!arrived.wait_until(W)) return internal_error("rank {} waited for the others in vain", r);
    // Ranks > 0 finish only after rank 0's work has ended: a return before they are joined shows.
    if (r == 0) {
      zero_done.add();
    } else if (!zero_done.wait_until(1)) {
      return internal_error("rank 0 never finished");
    }
    finished[r] = true;
    return {};
  });
  ASSERT_TRUE(st.ok()) << st.to_string();
  for (size_t r = 0; r < devices.size(); ++r) {
    EXPECT_EQ(runs[r].load(), 1) << "rank " << r;
    EXPECT_TRUE(finished[r].load()) << "rank " << r << " still running after the return";
    if (r == 0) {
      EXPECT_EQ(ran_on[r], std::this_thread::get_id());
    } else {
      EXPECT_NE(ran_on[r], std::this_thread::get_id()) << "rank " << r;
    }
  }
  EXPECT_TRUE(for_each_rank("one rank", {7}, [](size_t) { return Status(); }).ok());
}

TEST(TpRanks, TheFirstFailureIsReturnedNamingItsRankAndEveryFailedRankIsReported) {
  const std::vector<int> devices = {4, 5, 6, 7};
  std::vector<std::atomic<int>> failed(devices.size()), runs(devices.size());
  const Status st = for_each_rank(
      "step", devices,
      [&](size_t r) -> Status {
        ++runs[r];
        if (r == 2) return invalid_argument("two is bad");
        if (r == 3) return internal_error("three is bad");
        return {};
      },
      [&](size_t r) { ++failed[r]; });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message(), "step: rank 2 of 4 (device 6): two is bad");
  for (size_t r = 0; r < devices.size(); ++r) {
    EXPECT_EQ(runs[r].load(), 1) << "rank " << r;  // a failure does not stop the other ranks
    EXPECT_EQ(failed[r].load(), r >= 2 ? 1 : 0) << "rank " << r;
  }
}

// TpModel::forward: a failed rank aborts the group, the ranks waiting for it in a collective
// return kCancelled; the error reported is the cause, whichever rank it was.
TEST(TpRanks, ACancelledRankYieldsToTheRankThatFailed) {
  const std::vector<int> devices = {0, 1, 2};
  std::mutex mu;
  std::condition_variable cv;
  bool aborted = false;
  auto wait_for_abort = [&]() -> Status {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return aborted; }))
      return internal_error("never aborted");
    return Status(StatusCode::kCancelled, "woken by an abort");
  };
  auto abort = [&](size_t) {
    std::lock_guard<std::mutex> lock(mu);
    aborted = true;
    cv.notify_all();
  };
  const Status st = for_each_rank(
      "forward", devices, [&](size_t r) { return r == 2 ? internal_error("rank two broke") : wait_for_abort(); },
      abort);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInternal) << st.to_string();
  EXPECT_EQ(st.message(), "forward: rank 2 of 3 (device 2): rank two broke");
  // Only cancellations: the first of them.
  const Status all = for_each_rank("forward", devices,
                                   [](size_t) { return Status(StatusCode::kCancelled, "woken by an abort"); });
  EXPECT_EQ(all.code(), StatusCode::kCancelled);
  EXPECT_EQ(all.message(), "forward: rank 0 of 3 (device 0): woken by an abort");
}

TEST(TpRanks, ExceptionsBecomeTheRanksErrors) {
  const std::vector<int> devices = {0, 1, 2};
  std::vector<std::atomic<int>> failed(devices.size());
  const Status st = for_each_rank(
      "import_state", devices,
      [](size_t r) -> Status {
        if (r == 1) throw std::runtime_error("out of host memory");
        if (r == 2) throw 42;
        return {};
      },
      [&](size_t r) { ++failed[r]; });
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_EQ(st.message(), "import_state: rank 1 of 3 (device 1): exception: out of host memory");
  EXPECT_EQ(failed[0].load(), 0);
  EXPECT_EQ(failed[1].load(), 1);
  EXPECT_EQ(failed[2].load(), 1);
  // Rank 0 (the caller's thread) throwing is an error too, not an exception out of for_each_rank.
  const Status zero = for_each_rank("draft head", devices, [](size_t r) -> Status {
    if (r == 0) throw 1;
    return {};
  });
  EXPECT_EQ(zero.message(), "draft head: rank 0 of 3 (device 0): unknown exception");
}

// ---- TP=N vs TP=1 on the GPU -----------------------------------------------------------------

std::string make_ckpt(const std::string& name, bool tie_free) {
  model::ModelConfig c = config(name.c_str());
  if (tie_free) gpu_test::widen_selections(c);  // every expert active, every entry selected: no discrete flips
  return gpu_test::tiny_checkpoint("fs_tp_" + name + (tie_free ? "_tf" : "_std"), c, 11);
}

constexpr int64_t kTokens = 96, kPrefill = 48;

// All logits of `tokens`: one prefill chunk (decode = false) or kPrefill tokens then one-token
// decode steps, continued on a clone taken after the prefill (snapshot/restore across ranks).
std::vector<float> run(Model& m, const std::vector<int32_t>& tokens, bool decode) {
  auto st = m.new_sequence();
  std::vector<float> out;
  auto step = [&](SequenceState* s, size_t i, size_t n) {
    BatchItem item{s, std::span<const int32_t>(tokens.data() + i, n), true};
    const Status r = m.forward({&item, 1}, out);
    EXPECT_TRUE(r.ok()) << r.to_string();
    return r.ok();
  };
  if (!decode) {
    step(st.get(), 0, tokens.size());
    return out;
  }
  if (!step(st.get(), 0, kPrefill)) return out;
  auto snap = st->clone();
  EXPECT_EQ(snap->length(), kPrefill);
  for (size_t i = size_t(kPrefill); i < tokens.size(); ++i)
    if (!step(snap.get(), i, 1)) break;
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size() || a.empty()) return 1e30;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

struct TpParam {
  const char* config;
  bool tie_free;
  Numerics numerics;
  int world;
  // kNative: one-GPU native vs ranks holding their slices as stored (the default). kFp32: the
  // debug path, ranks slicing FP32 copies, against the one-GPU model with the CPU twin's weights.
  GpuWeights weights = GpuWeights::kFp32;
};

std::string param_name(const ::testing::TestParamInfo<TpParam>& i) {
  std::string n = std::string(i.param.config) + (i.param.tie_free ? "_tiefree_" : "_std_") +
                  (i.param.numerics == Numerics::kExact ? "exact" : "ref") + "_tp" + std::to_string(i.param.world) +
                  (i.param.weights == GpuWeights::kNative ? "_native" : "_fp32");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

// Every split slice of the checkpoint is whole scale blocks except on tiny-v4 over 4 ranks (wo_a
// rows / wo_b columns of 64 in 128-wide blocks): those go up as FP32 slices.
bool slices_fall_back(const TpParam& p) { return std::string(p.config) == "tiny-v4" && p.world == 4; }

// What each rank holds: native ranks keep their slices as stored (device bytes == the checkpoint
// bytes of the slices), fewer than the one-GPU model's; FP32 ranks none as stored.
void check_rank_bytes(const TpParam& p, const Model& one, const Model& tp) {
  auto o = gpu_rank_weight_bytes(one);
  auto r = gpu_rank_weight_bytes(tp);
  ASSERT_TRUE(o.ok() && r.ok()) << o.status().to_string() << " " << r.status().to_string();
  ASSERT_EQ(o->size(), 1u);
  ASSERT_EQ(int(r->size()), p.world);
  const GpuWeightBytes& w1 = (*o)[0];
  for (int k = 0; k < p.world; ++k) {
    const GpuWeightBytes& w = (*r)[size_t(k)];
    std::printf("[gpu tp] %s rank %d/%d (%s): %.3f MiB as stored (%lld matrices; checkpoint %.3f MiB), %.3f MiB FP32 "
                "(%lld fallback matrices, %.3f MiB); one GPU: %.3f MiB as stored\n",
                p.config, k, p.world, p.weights == GpuWeights::kNative ? "native" : "fp32", w.stored / 1048576.0,
                static_cast<long long>(w.stored_matrices), w.checkpoint / 1048576.0, w.fp32 / 1048576.0,
                static_cast<long long>(w.fallback_matrices), w.fallback / 1048576.0, w1.stored / 1048576.0);
    if (p.weights == GpuWeights::kNative) {
      EXPECT_GT(w.stored, 0) << "rank " << k;
      EXPECT_EQ(w.stored, w.checkpoint) << "rank " << k;  // the slices' own bytes, nothing more
      EXPECT_LT(w.stored, w1.stored) << "rank " << k;     // really a slice of the model
      if (slices_fall_back(p)) {
        EXPECT_GT(w.fallback_matrices, 0) << "rank " << k;
      } else {
        EXPECT_EQ(w.fallback_matrices, 0) << "rank " << k;
        EXPECT_EQ(w.fallback, 0) << "rank " << k;
      }
    } else {
      EXPECT_EQ(w.stored, 0) << "rank " << k;
      EXPECT_EQ(w.stored_matrices, 0) << "rank " << k;
    }
  }
}

// TP=world vs TP=1; `devices` empty: every rank on GPU 0 (host-staged).
void check_tp(const TpParam& p, const std::vector<int>& devices, TpComm comm) {
  const std::string dir = make_ckpt(p.config, p.tie_free);
  GpuLoadOptions one_opts = gpu_test::cpu_twin_weights(p.numerics);
  if (p.weights == GpuWeights::kNative) one_opts.weights = GpuWeights::kNative;
  auto one = load_model_gpu(dir, p.numerics, 0, one_opts);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  GpuLoadOptions o;
  o.tp_comm = comm;
  o.weights = p.weights;
  auto tp = load_model_tp(dir, p.numerics, devices, o);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  check_rank_bytes(p, *one.value(), *tp.value());
  const int64_t V = one.value()->config().vocab_size;
  EXPECT_EQ(tp.value()->config().vocab_size, V);
  Rng rng(99);
  std::vector<int32_t> tokens(kTokens);
  for (auto& t : tokens) t = int32_t(rng.below(uint64_t(V)));
  for (bool decode : {false, true}) {
    const auto a = run(*one.value(), tokens, decode);
    const auto b = run(*tp.value(), tokens, decode);
    ASSERT_EQ(a.size(), size_t(kTokens * V));
    const double d = max_abs_diff(a, b);
    double scale = 0;
    for (float x : a) scale = std::max(scale, double(std::fabs(x)));
    std::printf("[gpu tp] %s %s %s %s TP=%zu (%s) %s: max|TP - TP1| %.3g (max|logit| %.3g)\n", p.config,
                p.tie_free ? "tie-free" : "standard", p.numerics == Numerics::kExact ? "exact" : "reference",
                p.weights == GpuWeights::kNative ? "native" : "fp32", devices.size(),
                comm == TpComm::kNccl ? "nccl" : "host", decode ? "prefill+decode" : "prefill", d, scale);
    EXPECT_LT(d, 2e-2) << (decode ? "prefill+decode" : "prefill");
  }
}

class GpuTpHost : public ::testing::TestWithParam<TpParam> {};

TEST_P(GpuTpHost, HostStagedRanksOnOneGpuMatchOneGpu) {
  std::string why;
  if (gpu_count(&why) < 1) GTEST_SKIP() << "GPU test skipped: " << why;
  const TpParam p = GetParam();
  check_tp(p, std::vector<int>(size_t(p.world), 0), TpComm::kHost);
}

// The FP32-slice debug path (GpuLoadOptions::weights kFp32) and native slices on both sides; tiny-v4
// over 4 ranks also takes the FP32 fallback of the slices that cut 128-wide scale blocks.
INSTANTIATE_TEST_SUITE_P(
    Configs, GpuTpHost,
    ::testing::Values(TpParam{"tiny-v41", false, Numerics::kExact, 2}, TpParam{"tiny-v4", false, Numerics::kExact, 2},
                      TpParam{"tiny-v41", true, Numerics::kReference, 2},
                      TpParam{"tiny-v4", true, Numerics::kReference, 2}, TpParam{"tiny-v4", false, Numerics::kExact, 4},
                      TpParam{"tiny-v41", true, Numerics::kReference, 2, GpuWeights::kNative},
                      TpParam{"tiny-v4", true, Numerics::kReference, 2, GpuWeights::kNative},
                      TpParam{"tiny-v41", false, Numerics::kExact, 2, GpuWeights::kNative},
                      TpParam{"tiny-v4", false, Numerics::kExact, 2, GpuWeights::kNative},
                      TpParam{"tiny-v4", false, Numerics::kExact, 4, GpuWeights::kNative}),
    param_name);

class GpuTpNccl : public ::testing::TestWithParam<TpParam> {};

// TP=world over NCCL on GPUs 0..world-1 (TP=4 runs where 4 GPUs are present; tiny-v4 exact
// only: 4 ranks split tiny-v41's 2 output groups unevenly, and in reference numerics tiny-v4's
// 128-wide FP8 activation blocks would straddle ranks).
TEST_P(GpuTpNccl, NcclRanksOnDistinctGpusMatchOneGpu) {
  const TpParam p = GetParam();
  std::string why;
  const int n = gpu_count(&why);
  if (n < p.world)
    GTEST_SKIP() << "NCCL TP=" << p.world << " test skipped: needs " << p.world << " GPUs, this machine has " << n
                 << (why.empty() ? "" : " (" + why + ")");
#if FLASHSEEK_HAVE_CUDA
  if (!ops::cuda::nccl_built()) GTEST_SKIP() << "NCCL TP=" << p.world << " test skipped: this build has no NCCL";
#endif
  std::vector<int> devices(size_t(p.world));
  std::iota(devices.begin(), devices.end(), 0);
  check_tp(p, devices, TpComm::kNccl);
}

INSTANTIATE_TEST_SUITE_P(Configs, GpuTpNccl,
                         ::testing::Values(TpParam{"tiny-v41", false, Numerics::kExact, 2},
                                           TpParam{"tiny-v4", false, Numerics::kExact, 2},
                                           TpParam{"tiny-v41", true, Numerics::kReference, 2},
                                           TpParam{"tiny-v4", true, Numerics::kReference, 2},
                                           TpParam{"tiny-v4", false, Numerics::kExact, 4},
                                           TpParam{"tiny-v41", true, Numerics::kReference, 2, GpuWeights::kNative},
                                           TpParam{"tiny-v4", true, Numerics::kReference, 2, GpuWeights::kNative},
                                           TpParam{"tiny-v4", false, Numerics::kExact, 4, GpuWeights::kNative}),
                         param_name);

TEST(GpuTpCli, GpusListSelectsTheMultiGpuModel) {
  std::string why;
  if (gpu_count(&why) < 1) GTEST_SKIP() << "GPU test skipped: " << why;
  const std::string dir = make_ckpt("tiny-v41", false);
  auto m = load_model_for(dir, Numerics::kExact, "0,0");  // a repeated device: host-staged ranks
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto st = m.value()->new_sequence();
  std::vector<int32_t> toks = {1, 2, 3};
  BatchItem item{st.get(), toks, false};
  std::vector<float> lg;
  ASSERT_TRUE(m.value()->forward({&item, 1}, lg).ok());
  EXPECT_EQ(int64_t(lg.size()), m.value()->config().vocab_size);
  EXPECT_EQ(st->length(), 3);
  // Bad input is an error and leaves the model usable.
  std::vector<int32_t> bad = {1, 100000};
  BatchItem b{st.get(), bad, false};
  EXPECT_FALSE(m.value()->forward({&b, 1}, lg).ok());
  ASSERT_TRUE(m.value()->forward({&item, 1}, lg).ok());
  EXPECT_EQ(st->length(), 6);
  GpuLoadOptions nccl;
  nccl.tp_comm = TpComm::kNccl;
  auto nccl_dup = load_model_tp(dir, Numerics::kExact, {0, 0}, nccl);
  ASSERT_FALSE(nccl_dup.ok());
  EXPECT_NE(nccl_dup.status().message().find("distinct"), std::string::npos);
  auto missing = load_model_for(dir, Numerics::kExact, "0,99");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("99"), std::string::npos);
}

TEST(GpuTpCli, RunOnTwoGpusEqualsOneGpu) {
  std::string why;
  const int n = gpu_count(&why);
  if (n < 2) GTEST_SKIP() << "CLI --gpus 0,1 test skipped: needs 2 GPUs, this machine has " << n;
#if FLASHSEEK_HAVE_CUDA
  if (!ops::cuda::nccl_built()) GTEST_SKIP() << "CLI --gpus 0,1 test skipped: this build has no NCCL";
#endif
  const std::string dir = make_ckpt("tiny-v41", true);
  const std::string base = flashseek::testing::flashseek_bin() + " run --ckpt " + dir +
                           " --prompt-ids 5,17,99,3,250,7 --max-tokens 24 --json --speculative off";
  const auto one = flashseek::testing::run_command(base + " --gpus 0");
  const auto two = flashseek::testing::run_command(base + " --gpus 0,1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const auto tokens_of = [](const std::string& out) {  // the JSON "tokens" array, not the timings
    const auto p = out.find("\"tokens\"");
    return p == std::string::npos ? std::string() : out.substr(p, out.find(']', p) - p);
  };
  EXPECT_FALSE(tokens_of(one.output).empty()) << one.output;
  EXPECT_EQ(tokens_of(one.output), tokens_of(two.output)) << one.output << "\n" << two.output;
}

// ---- drafts on tensor-parallel ranks ---------------------------------------------------------
// Rank 0 runs the whole draft (DSpark on tiny-v41, the V4 MTP block on tiny-v4) on its own state;
// its LM head is gathered from every rank's vocabulary slice. Criterion: on tie-free checkpoints
// (every backbone and draft expert active, every compressed entry selected: no discrete choice can
// flip on an FP32 rounding difference) the TP=2 proposals are the one-GPU model's tokens at every
// draft position, and their logits agree within 2e-2 (the TP vs TP=1 logit bound above; TP=2
// differs from one GPU only in the FP32 summation order of the two all-reduced sums per layer).

std::string make_draft_ckpt(const std::string& name) {
  model::ModelConfig c = config(name.c_str());
  gpu_test::widen_selections(c, /*draft=*/true);
  return gpu_test::tiny_checkpoint("fs_tpdraft_" + name, c, 17);
}

struct TpDraftParam {
  const char* config;
  Numerics numerics;
};

std::string draft_param_name(const ::testing::TestParamInfo<TpDraftParam>& i) {
  std::string n = std::string(i.param.config) + (i.param.numerics == Numerics::kExact ? "_exact" : "_ref");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

Result<std::unique_ptr<Model>> load_tp2_host(const std::string& dir, Numerics numerics) {
  GpuLoadOptions o;
  o.tp_comm = TpComm::kHost;
  return load_model_tp(dir, numerics, {0, 0}, o);
}

// Proposals after a prefill past the window ring, then after one-token decodes and small chunks
// (the draft's rings / MTP history are written by every forward of rank 0), TP=2 on `devices`
// over `comm` vs one GPU.
void check_tp_proposals(const TpDraftParam& p, const std::vector<int>& devices, TpComm comm) {
  const std::string dir = make_draft_ckpt(p.config);
  auto one = load_model_gpu(dir, p.numerics, 0, gpu_test::cpu_twin_weights(p.numerics));
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  GpuLoadOptions o;
  o.tp_comm = comm;
  auto tp = load_model_tp(dir, p.numerics, devices, o);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  Model& G = *one.value();
  Model& T = *tp.value();
  ASSERT_TRUE(G.has_draft());
  ASSERT_TRUE(T.has_draft()) << "a multi-GPU model offers the checkpoint's draft";
  ASSERT_EQ(T.draft_block_size(), G.draft_block_size());
  const int64_t V = G.config().vocab_size;
  const auto tokens = gpu_test::random_tokens(240, V, 23);
  auto sg = G.new_sequence(), st = T.new_sequence();
  std::vector<float> sink;
  double worst = 0, worst_conf = 0;
  int64_t same = 0, total = 0;
  size_t at = 0;
  std::vector<size_t> steps = {size_t(G.config().window + 41), 1, 1, 1, 2, 1, 3, 6, 1, 1, 5, 1, 2, 1};
  for (int i = 0; i < 16; ++i) steps.push_back(1 + size_t(i % 3));
  for (size_t n : steps) {
    ASSERT_LT(at + n, tokens.size());
    const std::span<const int32_t> chunk(tokens.data() + at, n);
    ASSERT_TRUE(gpu_test::feed(G, *sg, chunk, sink, false).ok());
    const Status f = gpu_test::feed(T, *st, chunk, sink, false);
    ASSERT_TRUE(f.ok()) << f.to_string();
    at += n;
    const int32_t x0 = tokens[at];
    auto bg = G.propose(*sg, x0);
    auto bt = T.propose(*st, x0);
    ASSERT_TRUE(bg.ok()) << bg.status().to_string();
    ASSERT_TRUE(bt.ok()) << bt.status().to_string();
    ASSERT_EQ(bt->tokens.size(), size_t(T.draft_block_size()));
    ASSERT_EQ(bt->logits.size(), bg->logits.size());
    ASSERT_EQ(bt->confidence.size(), bg->confidence.size());
    ASSERT_EQ(st->length(), int64_t(at)) << "propose must not advance the state";
    worst = std::max(worst, gpu_test::max_abs_diff(bg->logits, bt->logits));
    worst_conf = std::max(worst_conf, gpu_test::max_abs_diff(bg->confidence, bt->confidence));
    for (size_t i = 0; i < bg->tokens.size(); ++i) same += bg->tokens[i] == bt->tokens[i];
    total += int64_t(bg->tokens.size());
  }
  std::printf("[gpu tp draft] %s %s TP=%zu (%s): %lld draft tokens, same as one GPU %lld, max|d logit| %.3g, "
              "max|d confidence| %.3g\n",
              p.config, p.numerics == Numerics::kExact ? "exact" : "reference", devices.size(),
              comm == TpComm::kNccl ? "nccl" : "host", (long long)total, (long long)same, worst, worst_conf);
  EXPECT_EQ(same, total);
  EXPECT_LT(worst, 2e-2);
  EXPECT_LT(worst_conf, 2e-2);
  // Bad input is an error value, the state unchanged.
  EXPECT_FALSE(T.propose(*st, int32_t(V)).ok());
  EXPECT_FALSE(T.propose(*T.new_sequence(), 3).ok()) << "no committed token";
  EXPECT_FALSE(T.propose(*sg, 3).ok()) << "a one-GPU state is refused";
  EXPECT_EQ(st->length(), int64_t(at));
}

class GpuTpDraft : public ::testing::TestWithParam<TpDraftParam> {};

TEST_P(GpuTpDraft, HostStagedTp2ProposesTheOneGpuDrafts) {
  std::string why;
  if (gpu_count(&why) < 1) GTEST_SKIP() << "GPU test skipped: " << why;
  check_tp_proposals(GetParam(), {0, 0}, TpComm::kHost);
}

INSTANTIATE_TEST_SUITE_P(TieFree, GpuTpDraft,
                         ::testing::Values(TpDraftParam{"tiny-v41", Numerics::kReference},
                                           TpDraftParam{"tiny-v41", Numerics::kExact},
                                           TpDraftParam{"tiny-v4", Numerics::kReference},
                                           TpDraftParam{"tiny-v4", Numerics::kExact}),
                         draft_param_name);

// Rollback across ranks (TpModel::rollback: every rank, the draft's state on rank 0): forward k
// rejected tokens (one verification chunk), roll back, then continue: logits and proposals equal
// to a clone taken before the rejected tokens (the same tokens; values within 1e-6, the one-GPU
// rollback tests' bound: a rolled-back compressor rebuilds its open group).
TEST_P(GpuTpDraft, HostStagedTp2RollbackContinuesLikeAClone) {
  std::string why;
  if (gpu_count(&why) < 1) GTEST_SKIP() << "GPU test skipped: " << why;
  const TpDraftParam p = GetParam();
  auto tp = load_tp2_host(make_draft_ckpt(p.config), p.numerics);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  Model& T = *tp.value();
  const int64_t V = T.config().vocab_size;
  const auto tokens = gpu_test::random_tokens(200, V, 31);
  std::vector<float> sink;
  int cases = 0;
  for (int64_t L : {int64_t(37), T.config().window + 45}) {
    for (int64_t k = 1; k <= kMaxRollback; k += 2) {
      auto st = T.new_sequence();
      ASSERT_TRUE(gpu_test::feed(T, *st, std::span<const int32_t>(tokens.data(), size_t(L)), sink, false).ok());
      auto snap = st->clone();
      std::vector<int32_t> rejected(tokens.begin() + L, tokens.begin() + L + k);
      rejected[0] = (rejected[0] + 1) % int32_t(V);  // not the tokens that follow
      ASSERT_TRUE(gpu_test::feed(T, *st, rejected, sink, true).ok());
      const Status r = T.rollback(*st, L);
      ASSERT_TRUE(r.ok()) << r.to_string();
      ASSERT_EQ(st->length(), L);
      auto pa = T.propose(*st, tokens[size_t(L)]), pb = T.propose(*snap, tokens[size_t(L)]);
      ASSERT_TRUE(pa.ok() && pb.ok());
      EXPECT_EQ(pa->tokens, pb->tokens) << "L " << L << " k " << k;
      EXPECT_LT(gpu_test::max_abs_diff(pa->logits, pb->logits), 1e-6) << "L " << L << " k " << k;
      std::vector<float> la, lb;
      const std::span<const int32_t> next(tokens.data() + L, 5);
      ASSERT_TRUE(gpu_test::feed(T, *st, next, la).ok());
      ASSERT_TRUE(gpu_test::feed(T, *snap, next, lb).ok());
      EXPECT_LT(gpu_test::max_abs_diff(la, lb), 1e-6) << "L " << L << " k " << k;
      auto qa = T.propose(*st, tokens[size_t(L + 5)]), qb = T.propose(*snap, tokens[size_t(L + 5)]);
      ASSERT_TRUE(qa.ok() && qb.ok());
      EXPECT_EQ(qa->tokens, qb->tokens) << "L " << L << " k " << k;
      EXPECT_LT(gpu_test::max_abs_diff(qa->logits, qb->logits), 1e-6) << "L " << L << " k " << k;
      ++cases;
    }
  }
  EXPECT_GT(cases, 0);
  auto st = T.new_sequence();
  ASSERT_TRUE(gpu_test::feed(T, *st, std::span<const int32_t>(tokens.data(), 40), sink, false).ok());
  EXPECT_FALSE(T.rollback(*st, 40 - kMaxRollback - 1).ok()) << "beyond the rollback reserve";
  EXPECT_FALSE(T.rollback(*st, 41).ok());
  EXPECT_EQ(st->length(), 40);
}

// Through the engine on the TP=2 model: every step verifies [x0, drafts] and rolls rejected
// drafts back on both ranks; greedy output equals plain decoding token for token.
void check_tp_engine(const TpDraftParam& p, const std::vector<int>& devices, TpComm comm) {
  GpuLoadOptions o;
  o.tp_comm = comm;
  auto tp = load_model_tp(make_draft_ckpt(p.config), p.numerics, devices, o);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  Model& T = *tp.value();
  constexpr int64_t n = 64;
  const auto prompt = gpu_test::random_tokens(9, T.config().vocab_size, 45);
  engine::EngineStats es;
  const auto spec = gpu_test::greedy_generate(T, prompt, n, true, &es);
  const auto plain = gpu_test::greedy_generate(T, prompt, n, false, nullptr);
  ASSERT_EQ(spec.size(), size_t(n));
  ASSERT_EQ(plain.size(), size_t(n));
  for (size_t i = 0; i < size_t(n); ++i) ASSERT_EQ(spec[i], plain[i]) << "first difference at generated token " << i;
  EXPECT_GT(es.spec_steps, 0) << "the TP model speculated";
  EXPECT_GE(es.spec_drafted, es.spec_steps);
  std::printf("[gpu tp draft] engine %s %s TP=%zu (%s): %lld verify steps, %lld drafted, %lld accepted, "
              "%.3f tokens/step\n",
              p.config, p.numerics == Numerics::kExact ? "exact" : "reference", devices.size(),
              comm == TpComm::kNccl ? "nccl" : "host", (long long)es.spec_steps, (long long)es.spec_drafted,
              (long long)es.spec_accepted, es.spec_steps ? double(es.spec_emitted) / double(es.spec_steps) : 0.0);
}

TEST_P(GpuTpDraft, HostStagedTp2EngineGreedySpeculativeEqualsPlain) {
  std::string why;
  if (gpu_count(&why) < 1) GTEST_SKIP() << "GPU test skipped: " << why;
  check_tp_engine(GetParam(), {0, 0}, TpComm::kHost);
}

// The same over NCCL on GPUs 0 and 1, where decode steps run as CUDA graphs (on by default) and
// rank 0's graphs also hold the draft's ring / MTP work.
TEST(GpuTpDraftNccl, Tp2ProposesTheOneGpuDraftsAndSpeculatesThroughTheEngine) {
  std::string why;
  const int n = gpu_count(&why);
  if (n < 2) GTEST_SKIP() << "NCCL TP=2 draft test skipped: needs 2 GPUs, this machine has " << n;
#if FLASHSEEK_HAVE_CUDA
  if (!ops::cuda::nccl_built()) GTEST_SKIP() << "NCCL TP=2 draft test skipped: this build has no NCCL";
#endif
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    SCOPED_TRACE(name);
    const TpDraftParam p{name, Numerics::kReference};
    check_tp_proposals(p, {0, 1}, TpComm::kNccl);
    check_tp_engine(p, {0, 1}, TpComm::kNccl);
  }
}

// `flashseek run --gpus 0,0 --speculative on` (host-staged ranks on GPU 0) speculates and gives
// the tokens of `--speculative off`.
TEST(GpuTpCli, RunSpeculativeOnTwoRanks) {
  std::string why;
  if (gpu_count(&why) < 1) GTEST_SKIP() << "GPU test skipped: " << why;
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    SCOPED_TRACE(name);
    const std::string base = flashseek::testing::flashseek_bin() + " run --ckpt " + make_draft_ckpt(name) +
                             " --numerics reference --prompt-ids 5,17,99,3,250,7 --max-tokens 32 --ignore-eos --json --gpus 0,0";
    const auto on = flashseek::testing::run_command(base + " --speculative on");
    const auto off = flashseek::testing::run_command(base + " --speculative off");
    ASSERT_EQ(on.exit_code, 0) << on.output;
    ASSERT_EQ(off.exit_code, 0) << off.output;
    const auto tokens_of = [](const std::string& out) {
      const auto p = out.find("\"tokens\"");
      return p == std::string::npos ? std::string() : out.substr(p, out.find(']', p) - p);
    };
    EXPECT_FALSE(tokens_of(on.output).empty()) << on.output;
    EXPECT_EQ(tokens_of(on.output), tokens_of(off.output)) << on.output << "\n" << off.output;
    const auto p = on.output.find("speculative: on, ");
    ASSERT_NE(p, std::string::npos) << on.output;
    EXPECT_GT(std::atoll(on.output.c_str() + p + std::strlen("speculative: on, ")), 0) << "verify steps: " << on.output;
  }
}

}  // namespace
}  // namespace flashseek::forward
