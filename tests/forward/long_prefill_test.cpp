// Chunked prefill is exact at length on the CPU oracle: a prompt of 20k+ tokens gives bit-identical
// logits (every position) and states whether it is fed in one shot, in chunks of 4096 or 127, or
// one token at a time (decode). At that length every sparse-attention selection is really choosing:
// thousands of compressed keys per kv source against index_topk, and on V4.1 the candidate
// pre-filter keeps a small fraction of the candidate source's keys for the REINDEX layer. The test
// checks those facts on the selections it records, so a config change that made the selections
// trivial would fail it rather than pass vacuously.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "model/make_tiny.h"
#include "state_test_util.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

// 20 × 1024 + 77: not a multiple of any chunk size or compression ratio, so chunks end inside open
// compression groups and candidate blocks.
constexpr int64_t kLong = 20 * 1024 + 77;
// Decode (chunk 1) costs one forward call per token; it runs over a shorter prompt that still has
// the pre-filter active at every one of its last positions.
constexpr int64_t kDecodeTokens = 3 * 1024 + 5;

struct Param {
  const char* config;
  Numerics numerics;
};

std::string tiny_ckpt(const char* name) {
  const fs::path dir = fs::temp_directory_path() /
                       (std::string("fs_long_") + name + "_" + std::to_string(::getpid()));
  if (fs::exists(dir / "config.json")) return dir.string();
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::MakeTinyOptions opt;
  opt.seed = 23;
  EXPECT_TRUE(model::make_tiny_checkpoint(cfg.value(), opt, dir.string()).ok());
  return dir.string();
}

class RemoveLongDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const char* name : {"tiny-v41", "tiny-v4"})
      fs::remove_all(fs::temp_directory_path() /
                     (std::string("fs_long_") + name + "_" + std::to_string(::getpid())));
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveLongDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveLongDirs);

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(size_t(n), 0);
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

struct ChunkedRun {
  std::vector<float> logits;  // [n, V]: all positions
  std::unique_ptr<SequenceState> state;
  ForwardTrace last;  // selections of the last forward call (its rows only)
};

// Feeds `tokens` to a fresh sequence in chunks of `chunk` with all logits; with `trace`, records the
// last call's selections (not for a one-shot run: its candidate masks alone are [n, n] bytes).
ChunkedRun run_chunked(CpuModel& m, std::span<const int32_t> tokens, int64_t chunk, bool trace = true) {
  ChunkedRun r;
  r.state = m.new_sequence();
  r.logits.reserve(tokens.size() * size_t(m.config().vocab_size));
  for (size_t i = 0; i < tokens.size(); i += size_t(chunk)) {
    const size_t n = std::min(tokens.size() - i, size_t(chunk));
    const bool last = i + n == tokens.size();
    m.set_trace(last && trace ? &r.last : nullptr);
    BatchItem item{r.state.get(), tokens.subspan(i, n), true};
    const Status s = m.forward({&item, 1}, r.logits);
    m.set_trace(nullptr);
    EXPECT_TRUE(s.ok()) << s.to_string();
    if (!s.ok()) break;
  }
  return r;
}

bool bit_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// First differing position (row) of two [n, V] logit arrays, or -1.
int64_t first_diff_row(std::span<const float> a, std::span<const float> b, int64_t V) {
  for (int64_t r = 0; r * V < int64_t(std::min(a.size(), b.size())); ++r)
    if (std::memcmp(a.data() + r * V, b.data() + r * V, size_t(V) * sizeof(float)) != 0) return r;
  return a.size() == b.size() ? -1 : int64_t(std::min(a.size(), b.size())) / V;
}

// The selections of the last recorded rows are real choices: every index source picks index_topk
// of far more visible compressed keys, and (V4.1) the candidate mask keeps at most
// candidate_topk_blocks × candidate_block_size of them, a small fraction, with the REINDEX layer's
// picks inside it. Also: the state holds one index key per complete compression group.
void expect_selection_is_active(const CpuModel& m, const ChunkedRun& r, int64_t n_tokens) {
  const auto& c = m.config();
  const auto& st = dynamic_cast<const CpuSequenceState&>(*r.state);
  const ForwardTrace& tr = r.last;
  ASSERT_FALSE(tr.pos.empty());
  EXPECT_EQ(tr.pos.back(), n_tokens - 1);
  int index_sources = 0;
  for (int l = 0; l < int(c.num_layers); ++l) {
    const auto& role = c.role(l);
    if (!role.index_source) continue;
    ++index_sources;
    const int64_t keys = st.layers[size_t(role.kv_src)].ikeys.size();
    EXPECT_EQ(keys, n_tokens / role.ratio) << "layer " << l;
    ASSERT_EQ(tr.topk[size_t(l)].size(), tr.pos.size()) << "layer " << l;
    for (size_t t = 0; t < tr.pos.size(); ++t) {
      const int64_t clen = (tr.pos[t] + 1) / role.ratio;
      // Hundreds of candidates per pick at least (4 of >= 700 on tiny-v4, of >= 1500 on tiny-v41).
      ASSERT_GT(clen, 100 * c.index_topk) << "layer " << l;
      EXPECT_EQ(int64_t(tr.topk[size_t(l)][t].size()), c.index_topk) << "layer " << l << " row " << t;
    }
  }
  EXPECT_GE(index_sources, 2);
  if (!c.is_v41()) return;
  const int64_t cap = c.candidate_topk_blocks * c.candidate_block_size;
  int cand_source = -1, filtered = -1;
  for (int l = 0; l < int(c.num_layers); ++l) {
    if (c.role(l).candidate_source) cand_source = l;
    if (c.role(l).candidate_filtered) filtered = l;
  }
  ASSERT_GE(cand_source, 0);
  ASSERT_GE(filtered, 0);
  ASSERT_EQ(tr.cand.size(), tr.pos.size());
  const int64_t ratio = c.role(cand_source).ratio;
  for (size_t t = 0; t < tr.pos.size(); ++t) {
    const auto& mask = tr.cand[t];
    const int64_t clen = (tr.pos[t] + 1) / ratio;
    ASSERT_EQ(int64_t(mask.size()), clen);
    const int64_t kept = std::count(mask.begin(), mask.end(), uint8_t(1));
    // The pre-filter is active: the compressed keys outnumber what it can keep by far.
    ASSERT_GT(clen, 100 * cap);
    EXPECT_GE(kept, c.index_topk) << "row " << t;
    EXPECT_LE(kept, cap) << "row " << t;
    for (int32_t i : tr.topk[size_t(filtered)][t]) EXPECT_EQ(mask[size_t(i)], 1) << "REINDEX outside the mask";
  }
}

class LongPrefill : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto m = CpuModel::load(tiny_ckpt(GetParam().config), GetParam().numerics);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    vocab_ = model_->config().vocab_size;
  }
  std::unique_ptr<CpuModel> model_;
  int64_t vocab_ = 0;
};

void expect_same_run(const ChunkedRun& got, const ChunkedRun& want, int64_t V) {
  EXPECT_TRUE(bit_equal(got.logits, want.logits))
      << "first differing position " << first_diff_row(got.logits, want.logits, V);
  state_test::expect_same_state(dynamic_cast<const CpuSequenceState&>(*got.state),
                                dynamic_cast<const CpuSequenceState&>(*want.state));
}

// Two cases of two 20k runs each (one shot == 4096, 127 == 4096) rather than one of three, so that
// each stays well inside the per-test timeout on a loaded 2-core CI machine.
TEST_P(LongPrefill, ChunksOf4096EqualOneShotBitwiseAt20kTokens) {
  const auto toks = random_tokens(kLong, vocab_, 41);
  const ChunkedRun whole = run_chunked(*model_, toks, kLong, /*trace=*/false);
  ASSERT_EQ(whole.logits.size(), size_t(kLong * vocab_));
  for (float v : whole.logits) ASSERT_TRUE(std::isfinite(v));
  const ChunkedRun got = run_chunked(*model_, toks, 4096);
  expect_same_run(got, whole, vocab_);
  // Checked on the last chunk's 77 rows (20,557 = 5 × 4096 + 77).
  expect_selection_is_active(*model_, got, kLong);
}

TEST_P(LongPrefill, ChunksOf127EqualChunksOf4096BitwiseAt20kTokens) {
  const auto toks = random_tokens(kLong, vocab_, 41);
  const ChunkedRun big = run_chunked(*model_, toks, 4096);
  const ChunkedRun small = run_chunked(*model_, toks, 127);
  expect_same_run(small, big, vocab_);
  // Checked on the last chunk's 110 rows (20,557 = 161 × 127 + 110).
  expect_selection_is_active(*model_, small, kLong);
}

// One token per forward call (the decode path) over a prompt long enough for every selection to be
// active, against the one-shot prefill of the same prompt.
TEST_P(LongPrefill, DecodeEqualsOneShotBitwise) {
  const auto toks = random_tokens(kDecodeTokens, vocab_, 43);
  const ChunkedRun whole = run_chunked(*model_, toks, kDecodeTokens, /*trace=*/false);
  const ChunkedRun decode = run_chunked(*model_, toks, 1);
  expect_same_run(decode, whole, vocab_);
  expect_selection_is_active(*model_, decode, kDecodeTokens);
}

INSTANTIATE_TEST_SUITE_P(Tiny, LongPrefill,
                         ::testing::Values(Param{"tiny-v41", Numerics::kReference},
                                           Param{"tiny-v4", Numerics::kReference}),
                         [](const auto& info) {
                           return std::string(std::string(info.param.config) == "tiny-v41" ? "v41" : "v4") +
                                  (info.param.numerics == Numerics::kExact ? "_exact" : "_reference");
                         });

}  // namespace
}  // namespace flashseek::forward
