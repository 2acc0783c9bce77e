// Batch invariance of the CUDA backend (forward/backend.h FwdChunk): a step runs every
// item's tokens through each weight matrix at once, and a sequence's logits must not depend on
// which other sequences share the step. Bitwise, for both weight paths (FP32 copies and the
// checkpoint's block-scaled formats through the GEMV kernels) on tiny-v41 and tiny-v4:
// * prefills of different lengths in one step == each alone;
// * decode steps of 5 sequences together (with a 6-token verify block and a new prefill in the
//   same step) == each alone, and of 2 and 3 sequences (the routed pairs grouped in compact form);
// * a 6-token verify block == the same tokens decoded one at a time, and a long prompt in one
//   chunk == the same prompt in odd chunks.
// With the prefill GEMMs on (GpuLoadOptions::moe_gemm_min_tokens / dense_gemm_min_tokens 64, the
// `_gemm` cases) the same holds, the choice being per sequence: the steps mix sequences above and
// below the threshold in unsorted order (the model reorders them, runs the GEMMs on the long ones
// and returns logits and samples in the callers' order); the chunked prompt compares chunk sizes
// on the same side of the threshold (260 vs 130: both GEMM), and the GEMMs must have run. The
// `_attntc` cases run the attention on the tensor cores (GpuLoadOptions::prefill_attention kAuto
// for chunks of 64+ rows, decode_attention_tensor for every other row): the same properties hold,
// the 260-token prompt's one chunk (the prefill kernel) against chunks of 37 (the row kernel).
// The `_stack` cases keep wq_a + wkv stacked (GpuLoadOptions::stack_query_kv): one launch for
// both, the same properties.
// Skips visibly without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cuda/gpu_model.h"
#include "core/rng.h"
#include "gpu_test_util.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)

struct Param {
  const char* config;
  bool native;
  bool gemms = false;  // the prefill GEMMs from 64 tokens per sequence
  bool attn_tc = false;  // the tensor-core attention for prefill chunks and for every other row
  bool stack = false;    // wq_a + wkv stacked (GpuLoadOptions::stack_query_kv)
};

std::vector<int32_t> random_tokens(uint64_t seed, int64_t n, int64_t vocab) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

// Runs `items` (state, tokens, all_logits) as one forward and returns each item's logits rows.
std::vector<std::vector<float>> run_step(Model& m, const std::vector<std::pair<SequenceState*, std::vector<int32_t>>>& items,
                                         bool all_logits) {
  std::vector<BatchItem> batch;
  for (const auto& [st, toks] : items) batch.push_back(BatchItem{st, std::span<const int32_t>(toks), all_logits});
  std::vector<float> out;
  const Status s = m.forward(batch, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  const int64_t V = m.config().vocab_size;
  std::vector<std::vector<float>> per;
  size_t off = 0;
  for (const auto& [st, toks] : items) {
    const size_t n = size_t(all_logits ? int64_t(toks.size()) : 1) * size_t(V);
    if (off + n > out.size()) break;
    per.emplace_back(out.begin() + int64_t(off), out.begin() + int64_t(off + n));
    off += n;
  }
  EXPECT_EQ(off, out.size());
  return per;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GpuBatch : public ::testing::TestWithParam<Param> {};

TEST_P(GpuBatch, StepResultsDoNotDependOnTheOtherItems) {
  FS_REQUIRE_GPU();
  const Param p = GetParam();
  auto cfg = model::builtin_config(p.config);
  ASSERT_TRUE(cfg.ok());
  const std::string dir = tiny_checkpoint(std::string("fs_batch_") + p.config, cfg.value(), 5);
  GpuLoadOptions opt;
  opt.weights = p.native ? GpuWeights::kNative : GpuWeights::kFp32;
  if (p.gemms) opt.moe_gemm_min_tokens = opt.dense_gemm_min_tokens = 64;
  if (p.attn_tc) opt.prefill_attention = GpuPrefillAttention::kAuto, opt.decode_attention_tensor = true;
  opt.stack_query_kv = p.stack;
  auto loaded = load_model_gpu(dir, Numerics::kReference, 0, opt);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  Model& m = *loaded.value();
  const int64_t V = m.config().vocab_size;
  constexpr int kSeqs = 5;
  const int64_t lens[kSeqs] = {150, 37, 301, 1, 88};  // crosses compression blocks at different phases

  // Alone: each sequence prefilled alone, then 3 decode steps alone, a 6-token verify block and
  // the same 6 tokens decoded one by one on a clone.
  std::vector<std::unique_ptr<SequenceState>> alone(kSeqs), batched(kSeqs);
  std::vector<std::vector<int32_t>> prompts(kSeqs);
  std::vector<std::vector<float>> pre_alone(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    prompts[size_t(i)] = random_tokens(100 + uint64_t(i), lens[i], V);
    alone[size_t(i)] = m.new_sequence();
    batched[size_t(i)] = m.new_sequence();
    pre_alone[size_t(i)] = run_step(m, {{alone[size_t(i)].get(), prompts[size_t(i)]}}, true).at(0);
  }
  // All prefills in one step.
  {
    std::vector<std::pair<SequenceState*, std::vector<int32_t>>> items;
    for (int i = 0; i < kSeqs; ++i) items.emplace_back(batched[size_t(i)].get(), prompts[size_t(i)]);
    const auto got = run_step(m, items, true);
    ASSERT_EQ(got.size(), size_t(kSeqs));
    for (int i = 0; i < kSeqs; ++i) EXPECT_TRUE(same_bits(got[size_t(i)], pre_alone[size_t(i)])) << "prefill of sequence " << i;
  }
  // Decode steps: all sequences together vs alone; sequence 0 verifies a 6-token block while
  // the others decode one token.
  for (int step = 0; step < 3; ++step) {
    std::vector<std::pair<SequenceState*, std::vector<int32_t>>> items;
    std::vector<std::vector<float>> want;
    for (int i = 0; i < kSeqs; ++i) {
      const auto toks = random_tokens(1000 + uint64_t(step * kSeqs + i), i == 0 ? 6 : 1, V);
      want.push_back(run_step(m, {{alone[size_t(i)].get(), toks}}, true).at(0));
      items.emplace_back(batched[size_t(i)].get(), toks);
    }
    const auto got = run_step(m, items, true);
    ASSERT_EQ(got.size(), size_t(kSeqs));
    for (int i = 0; i < kSeqs; ++i)
      EXPECT_TRUE(same_bits(got[size_t(i)], want[size_t(i)])) << "step " << step << " sequence " << i;
  }
  // Decode steps of 2 and 3 sequences: fewer routed pairs than experts (tiny-v4: 8 experts, 2 per
  // token; tiny-v41: 4), which the block-scaled path groups in compact form
  // (GpuLoadOptions::moe_compact_groups) where each alone is ungrouped.
  const int64_t compact_before = p.native ? gpu_graph_stats(m).value().moe_compact_groupings : 0;
  for (const int n : {2, 3}) {
    std::vector<std::pair<SequenceState*, std::vector<int32_t>>> items;
    std::vector<std::vector<float>> want;
    for (int i = 1; i <= n; ++i) {
      const auto toks = random_tokens(3000 + uint64_t(n * kSeqs + i), 1, V);
      want.push_back(run_step(m, {{alone[size_t(i)].get(), toks}}, true).at(0));
      items.emplace_back(batched[size_t(i)].get(), toks);
    }
    const auto got = run_step(m, items, true);
    ASSERT_EQ(got.size(), size_t(n));
    for (int i = 0; i < n; ++i)
      EXPECT_TRUE(same_bits(got[size_t(i)], want[size_t(i)])) << n << "-sequence step, sequence " << i + 1;
  }
  if (p.native) {
    EXPECT_GT(gpu_graph_stats(m).value().moe_compact_groupings, compact_before) << "no compact grouping ran";
  }
  // A new sequence's prefill in the same step as the others' decode (only last rows returned).
  {
    auto fresh_alone = m.new_sequence(), fresh = m.new_sequence();
    const auto prompt = random_tokens(77, 203, V);
    std::vector<std::pair<SequenceState*, std::vector<int32_t>>> items{{fresh.get(), prompt}};
    std::vector<std::vector<float>> want{run_step(m, {{fresh_alone.get(), prompt}}, false).at(0)};
    for (int i = 0; i < kSeqs; ++i) {
      const auto toks = random_tokens(5000 + uint64_t(i), 1, V);
      want.push_back(run_step(m, {{alone[size_t(i)].get(), toks}}, false).at(0));
      items.emplace_back(batched[size_t(i)].get(), toks);
    }
    const auto got = run_step(m, items, false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << "mixed step item " << i;
  }
  // A verify block equals the same tokens decoded one by one (speculation never changes output).
  {
    auto a = alone[2]->clone(), b = alone[2]->clone();
    const auto block = random_tokens(9, 6, V);
    const auto whole = run_step(m, {{a.get(), block}}, true).at(0);
    std::vector<float> one_by_one;
    for (int32_t t : block) {
      const auto r = run_step(m, {{b.get(), std::vector<int32_t>{t}}}, true).at(0);
      one_by_one.insert(one_by_one.end(), r.begin(), r.end());
    }
    EXPECT_TRUE(same_bits(whole, one_by_one)) << "verify block vs decode";
  }
  // A prompt in one chunk equals it in odd chunks (prefill rows go through the same kernels).
  {
    const auto prompt = random_tokens(31, 260, V);
    const int64_t chunk = p.gemms ? 130 : 37;
    EXPECT_TRUE(same_bits(run_chunked(m, prompt, 260), run_chunked(m, prompt, chunk))) << "prefill vs chunks of " << chunk;
  }
  if (p.gemms) {  // the GEMMs ran (tiny-v41's expert width 64 is no multiple of 128: its experts keep the GEMV)
    const auto st = gpu_graph_stats(m);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_GT(st.value().dense_gemm_linears, 0) << "the dense prefill GEMM never ran";
    if (std::string(p.config) == "tiny-v4") {
      EXPECT_GT(st.value().moe_gemm_layers, 0) << "the MoE prefill GEMM never ran";
    }
  }
  if (p.stack) {  // the stacked launches ran
    const auto st = gpu_graph_stats(m);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_GT(st.value().paired_linears, 0) << "no stacked wq_a + wkv launch";
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuBatch,
                         ::testing::Values(Param{"tiny-v41", true}, Param{"tiny-v4", true}, Param{"tiny-v41", false},
                                           Param{"tiny-v4", false}, Param{"tiny-v41", true, true},
                                           Param{"tiny-v4", true, true}, Param{"tiny-v41", true, false, true},
                                           Param{"tiny-v4", true, false, true}, Param{"tiny-v41", true, true, true},
                                           Param{"tiny-v41", true, false, true, true},
                                           Param{"tiny-v4", true, true, true, true}),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(std::string(info.param.config) == "tiny-v41" ? "v41" : "v4") +
                                  (info.param.native ? "_native" : "_fp32") + (info.param.gemms ? "_gemm" : "") +
                                  (info.param.attn_tc ? "_attntc" : "") + (info.param.stack ? "_stack" : "");
                         });

// GpuLoadOptions::gemv_tiled_min_rows only picks the kernel of the block-scaled GEMVs above
// kGpuGraphMaxTokens rows (the tiled kernel over pre-quantised inputs, or the decode GEMV in
// 16-token passes): the logits are the same bits either way, for a prefill chunk and for a step
// of many short sequences (the routed experts' groups above 8 pairs on average).
class GpuGemvPasses : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuGemvPasses, TiledKernelAndPassesGiveTheSameBits) {
  FS_REQUIRE_GPU();
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok());
  const std::string dir = tiny_checkpoint(std::string("fs_gemvpass_") + GetParam(), cfg.value(), 7);
  GpuLoadOptions tiled, passes;
  tiled.weights = passes.weights = GpuWeights::kNative;
  tiled.gemv_tiled_min_rows = 0;  // the tiled kernel from 9 rows on
  passes.gemv_tiled_min_rows = int64_t(1) << 40;
  auto a = load_model_gpu(dir, Numerics::kReference, 0, tiled);
  auto b = load_model_gpu(dir, Numerics::kReference, 0, passes);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const int64_t V = a.value()->config().vocab_size;
  const auto prompt = random_tokens(41, 203, V);
  const auto pa = run_step(*a.value(), {{a.value()->new_sequence().get(), prompt}}, true);
  const auto pb = run_step(*b.value(), {{b.value()->new_sequence().get(), prompt}}, true);
  ASSERT_EQ(pa.size(), 1u);
  ASSERT_EQ(pb.size(), 1u);
  EXPECT_TRUE(same_bits(pa[0], pb[0])) << "203-token prefill";
  // 40 sequences of 3 tokens in one step (120 rows), then one decode token each (40 rows).
  constexpr int kSeqs = 40;
  std::vector<std::unique_ptr<SequenceState>> sa, sb;
  for (int i = 0; i < kSeqs; ++i) sa.push_back(a.value()->new_sequence()), sb.push_back(b.value()->new_sequence());
  for (int step = 0; step < 2; ++step) {
    std::vector<std::pair<SequenceState*, std::vector<int32_t>>> ia, ib;
    for (int i = 0; i < kSeqs; ++i) {
      const auto toks = random_tokens(300 + uint64_t(step * kSeqs + i), step == 0 ? 3 : 1, V);
      ia.emplace_back(sa[size_t(i)].get(), toks);
      ib.emplace_back(sb[size_t(i)].get(), toks);
    }
    const auto ga = run_step(*a.value(), ia, true), gb = run_step(*b.value(), ib, true);
    ASSERT_EQ(ga.size(), size_t(kSeqs));
    ASSERT_EQ(gb.size(), size_t(kSeqs));
    for (int i = 0; i < kSeqs; ++i) EXPECT_TRUE(same_bits(ga[size_t(i)], gb[size_t(i)])) << "step " << step << " sequence " << i;
  }
}

// GpuLoadOptions::gemv_prequant_min_rows only decides where the dense block-scaled GEMVs quantise
// their input (once before the launch, or in every CTA): with 1 (every launch) the logits of a
// prefill, of decode steps of one and of four sequences and of a 6-token verify block are the
// default's bits. Out-of-range values are refused before any device work.
TEST_P(GpuGemvPasses, PrequantisedDecodeInputsGiveTheSameBits) {
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok());
  const std::string dir = tiny_checkpoint(std::string("fs_gemvpreq_") + GetParam(), cfg.value(), 7);
  GpuLoadOptions bad;
  bad.weights = GpuWeights::kNative;
  bad.gemv_prequant_min_rows = 0;
  const auto refused = load_model_gpu(dir, Numerics::kReference, 0, bad);
  ASSERT_FALSE(refused.ok());
  if (refused.status().code() == StatusCode::kUnimplemented) GTEST_SKIP() << "this build has no CUDA backend";
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().to_string();
  FS_REQUIRE_GPU();
  GpuLoadOptions inside, once;
  inside.weights = once.weights = GpuWeights::kNative;
  once.gemv_prequant_min_rows = 1;
  auto a = load_model_gpu(dir, Numerics::kReference, 0, inside);
  auto b = load_model_gpu(dir, Numerics::kReference, 0, once);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  const int64_t V = a.value()->config().vocab_size;
  constexpr int kSeqs = 4;
  std::vector<std::unique_ptr<SequenceState>> sa, sb;
  for (int i = 0; i < kSeqs; ++i) sa.push_back(a.value()->new_sequence()), sb.push_back(b.value()->new_sequence());
  // Step 0: four 30-token prompts; steps 1-3: sequence 0 alone decodes one token; steps 4-5: all
  // four decode one token; step 6: sequence 1 takes a 6-token verify block alone.
  for (int step = 0; step < 7; ++step) {
    std::vector<std::pair<SequenceState*, std::vector<int32_t>>> ia, ib;
    for (int i = 0; i < kSeqs; ++i) {
      const bool in = step == 0 || (step <= 3 && i == 0) || (step >= 4 && step <= 5) || (step == 6 && i == 1);
      if (!in) continue;
      const auto toks = random_tokens(500 + uint64_t(step * kSeqs + i), step == 0 ? 30 : step == 6 ? 6 : 1, V);
      ia.emplace_back(sa[size_t(i)].get(), toks);
      ib.emplace_back(sb[size_t(i)].get(), toks);
    }
    const auto ga = run_step(*a.value(), ia, true), gb = run_step(*b.value(), ib, true);
    ASSERT_EQ(ga.size(), ia.size());
    ASSERT_EQ(gb.size(), ib.size());
    for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(same_bits(ga[i], gb[i])) << "step " << step << " item " << i;
  }
}

// GpuLoadOptions::mma_decode_tiles takes 0 (automatic), 1, 2 or 4 output tiles per CTA of the
// decode tensor-core linear (the op test CudaTypedWeights.TensorCoreLinearWithinReorderingBoundAndRowInvariant
// holds every count to the same bits); other values are refused before any device work.
TEST_P(GpuGemvPasses, MmaDecodeTilesOutOfRangeRefused) {
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok());
  const std::string dir = tiny_checkpoint(std::string("fs_mmadt_") + GetParam(), cfg.value(), 7);
  for (const int bad : {3, -1, 8}) {
    GpuLoadOptions o;
    o.weights = GpuWeights::kNative;
    o.mma_decode_tiles = bad;
    const auto refused = load_model_gpu(dir, Numerics::kReference, 0, o);
    ASSERT_FALSE(refused.ok());
    if (refused.status().code() == StatusCode::kUnimplemented) GTEST_SKIP() << "this build has no CUDA backend";
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << bad << ": " << refused.status().to_string();
  }
}

// GpuLoadOptions::gemv_fp4_chunk 4 (the FP4 GEMVs in 4-block chunks, each quad loading whole
// 16-byte blocks) is another summation order of the routed experts, and the prefill kernels follow
// it: a prompt in one chunk equals it in odd chunks, and a 6-token verify block equals its tokens
// decoded one by one, bit for bit; its logits stay near the default's (a gross-error guard: words
// exchanged wrongly in the quad would still give prefill == decode; the op tests
// CudaBlockLinear.EveryKSplitAndChunkMatchesTwin / CudaExpertGemv.FusedSwigluEveryKSplit hold the
// 4-block FP4 GEMV to its CPU twin); values other than 0, 2 and 4 are refused before any device
// work.
TEST_P(GpuGemvPasses, Fp4FourBlockChunksKeepPrefillEqualDecode) {
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok());
  const std::string dir = tiny_checkpoint(std::string("fs_gemvfp4c_") + GetParam(), cfg.value(), 7);
  GpuLoadOptions bad;
  bad.weights = GpuWeights::kNative;
  bad.gemv_fp4_chunk = 3;
  const auto refused = load_model_gpu(dir, Numerics::kReference, 0, bad);
  ASSERT_FALSE(refused.ok());
  if (refused.status().code() == StatusCode::kUnimplemented) GTEST_SKIP() << "this build has no CUDA backend";
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().to_string();
  FS_REQUIRE_GPU();
  GpuLoadOptions four, automatic;
  four.weights = automatic.weights = GpuWeights::kNative;
  four.gemv_fp4_chunk = 4;
  auto a = load_model_gpu(dir, Numerics::kReference, 0, four);
  auto d = load_model_gpu(dir, Numerics::kReference, 0, automatic);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  Model& m = *a.value();
  const int64_t V = m.config().vocab_size;
  const auto prompt = random_tokens(61, 90, V);
  auto whole = m.new_sequence(), chunked = m.new_sequence();
  const auto pw = run_step(m, {{whole.get(), prompt}}, true).at(0);
  std::vector<float> pc;
  for (size_t off = 0; off < prompt.size(); off += 13) {
    const std::vector<int32_t> part(prompt.begin() + int64_t(off), prompt.begin() + int64_t(std::min(off + 13, prompt.size())));
    const auto r = run_step(m, {{chunked.get(), part}}, true).at(0);
    pc.insert(pc.end(), r.begin(), r.end());
  }
  EXPECT_TRUE(same_bits(pw, pc)) << "90-token prompt in one chunk vs chunks of 13";
  auto b = whole->clone(), c = whole->clone();
  const auto block = random_tokens(62, 6, V);
  const auto vb = run_step(m, {{b.get(), block}}, true).at(0);
  std::vector<float> one_by_one;
  for (int32_t t : block) {
    const auto r = run_step(m, {{c.get(), std::vector<int32_t>{t}}}, true).at(0);
    one_by_one.insert(one_by_one.end(), r.begin(), r.end());
  }
  EXPECT_TRUE(same_bits(vb, one_by_one)) << "verify block vs decode";
  // Against the default order: close, not equal in general (the tiny configs' FP4 experts may sum
  // in one chunk either way, so equality is allowed).
  auto e = d.value()->new_sequence();
  const auto pd = run_step(*d.value(), {{e.get(), prompt}}, true).at(0);
  ASSERT_EQ(pd.size(), pw.size());
  double scale = 0, diff = 0;
  for (size_t i = 0; i < pd.size(); ++i) scale = std::max(scale, double(std::fabs(pd[i]))), diff = std::max(diff, double(std::fabs(pd[i] - pw[i])));
  EXPECT_LT(diff, 0.05 * std::max(scale, 1.0)) << "4-block chunks moved the logits by " << diff << " (scale " << scale << ")";
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuGemvPasses, ::testing::Values("tiny-v41", "tiny-v4"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(std::string(info.param) == "tiny-v41" ? "v41" : "v4");
                         });

}  // namespace
}  // namespace flashseek::forward
