// Self-consistency of the CPU forward on make-tiny checkpoints (tiny-v41, tiny-v4), in both
// numerics: full prefill == prefill-then-decode == any chunking == snapshot/continue == batched,
// all bit for bit (the backend is batch-invariant by construction).
#include <cstring>
#include <filesystem>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "forward/cpu_model.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

struct Param {
  const char* config;
  Numerics numerics;
  bool bf16;
};

// Removes the checkpoints written by tiny_dir when the test program ends.
std::vector<std::string>& made_dirs() {
  static std::vector<std::string> dirs;
  return dirs;
}
class RemoveTinyDirs : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& d : made_dirs()) fs::remove_all(d);
  }
};
[[maybe_unused]] ::testing::Environment* const kRemoveTinyDirs =
    ::testing::AddGlobalTestEnvironment(new RemoveTinyDirs);

std::string tiny_dir(const char* name, bool bf16) {
  const fs::path dir = fs::temp_directory_path() /
                       (std::string("fs_fwd_") + name + (bf16 ? "_bf16_" : "_q_") + std::to_string(::getpid()));
  if (fs::exists(dir / "config.json")) return dir.string();
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::MakeTinyOptions opt;
  opt.seed = 7;
  opt.bf16 = bf16;
  made_dirs().push_back(dir.string());
  auto st = model::make_tiny_checkpoint(cfg.value(), opt, dir.string());
  EXPECT_TRUE(st.ok()) << st.to_string();
  return dir.string();
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng.below(uint64_t(vocab)));
  return t;
}

// Runs `tokens` through a fresh sequence in chunks of `chunk` (all logits).
std::vector<float> run_chunked(Model& m, const std::vector<int32_t>& tokens, int64_t chunk) {
  auto st = m.new_sequence();
  std::vector<float> logits;
  for (size_t i = 0; i < tokens.size(); i += size_t(chunk)) {
    const size_t n = std::min(tokens.size() - i, size_t(chunk));
    BatchItem item{st.get(), std::span<const int32_t>(tokens.data() + i, n), true};
    EXPECT_TRUE(m.forward({&item, 1}, logits).ok());
  }
  return logits;
}

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}
bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

class Consistency : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    auto m = load_model(tiny_dir(GetParam().config, GetParam().bf16), GetParam().numerics);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value();
    vocab_ = model_->config().vocab_size;
  }
  std::unique_ptr<Model> model_;
  int64_t vocab_ = 0;
};

TEST_P(Consistency, PrefillEqualsPrefillThenDecodeOver400Tokens) {
  const auto toks = random_tokens(410, vocab_, 1);
  const auto full = run_chunked(*model_, toks, int64_t(toks.size()));
  for (int64_t prefill : {1, 9, 129}) {
    auto st = model_->new_sequence();
    std::vector<float> logits;
    BatchItem first{st.get(), std::span<const int32_t>(toks.data(), size_t(prefill)), true};
    ASSERT_TRUE(model_->forward({&first, 1}, logits).ok());
    for (size_t t = size_t(prefill); t < toks.size(); ++t) {
      BatchItem step{st.get(), std::span<const int32_t>(toks.data() + t, 1), false};
      ASSERT_TRUE(model_->forward({&step, 1}, logits).ok());
    }
    ASSERT_EQ(logits.size(), full.size());
    EXPECT_LT(max_abs(logits, full), 1e-3) << "prefill " << prefill;
    EXPECT_TRUE(bit_equal(logits, full)) << "prefill " << prefill << " max " << max_abs(logits, full);
  }
  for (float v : full) ASSERT_TRUE(std::isfinite(v));
}

TEST_P(Consistency, ChunkSizesGiveIdenticalLogits) {
  const auto toks = random_tokens(300, vocab_, 2);
  const auto whole = run_chunked(*model_, toks, 300);
  for (int64_t chunk : {1, 3, 4, 127, 128, 129}) {
    const auto got = run_chunked(*model_, toks, chunk);
    EXPECT_TRUE(bit_equal(got, whole)) << "chunk " << chunk << " max " << max_abs(got, whole);
  }
}

TEST_P(Consistency, SnapshotThenContinueEqualsUninterrupted) {
  const auto toks = random_tokens(60, vocab_, 3);
  auto st = model_->new_sequence();
  std::vector<float> a, b, c;
  BatchItem head{st.get(), std::span<const int32_t>(toks.data(), 33), false};
  ASSERT_TRUE(model_->forward({&head, 1}, a).ok());
  auto snap = st->clone();
  EXPECT_EQ(snap->length(), 33);
  BatchItem tail{st.get(), std::span<const int32_t>(toks.data() + 33, 27), true};
  ASSERT_TRUE(model_->forward({&tail, 1}, b).ok());
  // Diverge the original with other tokens, then continue the snapshot: unaffected.
  const auto other = random_tokens(5, vocab_, 4);
  BatchItem noise{st.get(), other, false};
  ASSERT_TRUE(model_->forward({&noise, 1}, a).ok());
  BatchItem tail2{snap.get(), std::span<const int32_t>(toks.data() + 33, 27), true};
  ASSERT_TRUE(model_->forward({&tail2, 1}, c).ok());
  EXPECT_TRUE(bit_equal(b, c));
}

TEST_P(Consistency, BatchEqualsEachSequenceAlone) {
  const auto t1 = random_tokens(23, vocab_, 5), t2 = random_tokens(1, vocab_, 6), t3 = random_tokens(40, vocab_, 7);
  std::vector<std::vector<int32_t>> seqs = {t1, t2, t3};
  std::vector<std::unique_ptr<SequenceState>> states;
  std::vector<BatchItem> batch;
  for (size_t i = 0; i < seqs.size(); ++i) {
    states.push_back(model_->new_sequence());
    batch.push_back({states.back().get(), seqs[i], i != 1});
  }
  std::vector<float> together;
  ASSERT_TRUE(model_->forward(batch, together).ok());
  std::vector<float> alone;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto st = model_->new_sequence();
    BatchItem item{st.get(), seqs[i], i != 1};
    ASSERT_TRUE(model_->forward({&item, 1}, alone).ok());
  }
  EXPECT_TRUE(bit_equal(together, alone));
  EXPECT_EQ(together.size(), size_t((23 + 1 + 40) * vocab_));
}

TEST_P(Consistency, DraftProposalIndependentOfHowTheStateWasBuilt) {
  auto* cpu = dynamic_cast<CpuModel*>(model_.get());
  ASSERT_NE(cpu, nullptr);
  // Both tiny configs carry a draft (V4.1: DSpark; V4: the MTP layer, a 1-token draft).
  ASSERT_TRUE(cpu->has_draft()) << GetParam().config;
  const auto toks = random_tokens(45, vocab_, 8);
  auto a = model_->new_sequence(), b = model_->new_sequence();
  std::vector<float> logits;
  BatchItem whole{a.get(), toks, false};
  ASSERT_TRUE(model_->forward({&whole, 1}, logits).ok());
  for (size_t i = 0; i < toks.size(); ++i) {
    BatchItem step{b.get(), std::span<const int32_t>(toks.data() + i, 1), false};
    ASSERT_TRUE(model_->forward({&step, 1}, logits).ok());
  }
  auto da = cpu->propose(*a, 5), db = cpu->propose(*b, 5);
  ASSERT_TRUE(da.ok() && db.ok());
  EXPECT_EQ(da->tokens, db->tokens);
  EXPECT_TRUE(bit_equal(da->logits, db->logits));
  EXPECT_TRUE(bit_equal(da->confidence, db->confidence));
  EXPECT_EQ(int64_t(da->tokens.size()), cpu->draft_block_size());  // V4 MTP: 1, DSpark: B
  // A chooser decides each token, and (DSpark) the Markov head conditions the next row on it.
  auto dc = cpu->propose(*a, 5, [](int64_t, std::span<const float>) { return int32_t(3); });
  ASSERT_TRUE(dc.ok());
  EXPECT_EQ(dc->tokens, std::vector<int32_t>(da->tokens.size(), 3));
  EXPECT_TRUE(std::equal(dc->logits.begin(), dc->logits.begin() + vocab_, da->logits.begin()));
  EXPECT_FALSE(cpu->propose(*model_->new_sequence(), 5).ok());  // nothing committed yet
}

TEST_P(Consistency, MtpLogitsIndependentOfHowTheStateWasBuilt) {
  auto* cpu = dynamic_cast<CpuModel*>(model_.get());
  ASSERT_NE(cpu, nullptr);
  // make-tiny writes the MTP block for V4 only (V4.1's mtp.* tensors are its DSpark draft).
  const bool v4 = std::string(GetParam().config) == "tiny-v4";
  ASSERT_EQ(cpu->has_mtp(), v4);
  if (!v4) {
    auto st = model_->new_sequence();
    std::vector<float> logits;
    const auto t = random_tokens(3, vocab_, 10);
    BatchItem item{st.get(), t, false};
    ASSERT_TRUE(model_->forward({&item, 1}, logits).ok());
    auto none = cpu->mtp_logits(*st, 11);
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.status().message().find("no MTP block"), std::string::npos) << none.status().to_string();
    return;
  }
  const auto toks = random_tokens(141, vocab_, 10);
  auto a = model_->new_sequence(), b = model_->new_sequence();
  std::vector<float> logits;
  BatchItem whole{a.get(), toks, false};
  ASSERT_TRUE(model_->forward({&whole, 1}, logits).ok());
  for (size_t i = 0; i < toks.size(); i += 7) {
    BatchItem step{b.get(), std::span<const int32_t>(toks.data() + i, std::min<size_t>(7, toks.size() - i)), false};
    ASSERT_TRUE(model_->forward({&step, 1}, logits).ok());
  }
  auto la = cpu->mtp_logits(*a, 11), lb = cpu->mtp_logits(*b, 11), lc = cpu->mtp_logits(*a, 12);
  ASSERT_TRUE(la.ok() && lb.ok() && lc.ok()) << la.status().to_string();
  ASSERT_EQ(int64_t(la->size()), vocab_);
  EXPECT_TRUE(bit_equal(la.value(), lb.value()));
  EXPECT_FALSE(bit_equal(la.value(), lc.value()));  // conditioned on the next token
  for (float v : la.value()) ASSERT_TRUE(std::isfinite(v));
  EXPECT_FALSE(cpu->mtp_logits(*model_->new_sequence(), 11).ok());
  EXPECT_FALSE(cpu->mtp_logits(*a, int32_t(vocab_)).ok());
}

TEST_P(Consistency, BadInputIsAnError) {
  auto st = model_->new_sequence();
  std::vector<float> logits;
  std::vector<int32_t> bad = {0, int32_t(vocab_)};
  BatchItem item{st.get(), bad, false};
  EXPECT_FALSE(model_->forward({&item, 1}, logits).ok());
  BatchItem empty{st.get(), {}, false};
  EXPECT_FALSE(model_->forward({&empty, 1}, logits).ok());
  EXPECT_FALSE(load_model("/nonexistent/ckpt", Numerics::kExact).ok());
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, Consistency,
    ::testing::Values(Param{"tiny-v41", Numerics::kExact, true}, Param{"tiny-v41", Numerics::kReference, false},
                      Param{"tiny-v4", Numerics::kExact, true}, Param{"tiny-v4", Numerics::kReference, false}),
    [](const auto& info) {
      return std::string(std::string(info.param.config) == "tiny-v41" ? "v41" : "v4") +
             (info.param.numerics == Numerics::kExact ? "_exact_bf16" : "_reference_fp8");
    });

}  // namespace
}  // namespace flashseek::forward

namespace flashseek::forward {
namespace {

// The reference simulations really run: `reference` logits differ from `exact` ones, but only
// by quantisation noise. Tiny random models are chaotic under it (MoE routing and top-k
// near-ties flip, v41 §9.x), so the bound is on the median per-position cosine.
TEST(Numerics, ReferenceDiffersFromExactByQuantisationNoise) {
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    for (bool bf16 : {true, false}) {
      const std::string dir = tiny_dir(name, bf16);
      auto ex = load_model(dir, Numerics::kExact);
      auto rf = load_model(dir, Numerics::kReference);
      ASSERT_TRUE(ex.ok() && rf.ok());
      const int64_t V = ex.value()->config().vocab_size, T = 64;
      const auto toks = random_tokens(T, V, 9);
      const auto a = run_chunked(*ex.value(), toks, T), b = run_chunked(*rf.value(), toks, T);
      EXPECT_FALSE(bit_equal(a, b)) << name;
      std::vector<double> cosines;
      for (int64_t r = 0; r < T; ++r) {
        double na = 0, nb = 0, dot = 0;
        for (int64_t v = r * V; v < (r + 1) * V; ++v) {
          na += double(a[v]) * a[v];
          nb += double(b[v]) * b[v];
          dot += double(a[v]) * b[v];
        }
        cosines.push_back(dot / std::sqrt(na * nb));
      }
      std::sort(cosines.begin(), cosines.end());
      EXPECT_GT(cosines[T / 2], bf16 ? 0.99 : 0.9) << name << (bf16 ? " bf16" : " fp8");
    }
  }
}

}  // namespace
}  // namespace flashseek::forward
