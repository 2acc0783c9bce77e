// V4.1 `exact` forward vs the official reference fixture (tests/golden/v41-official-continuous):
// full prefill, prefill-40-then-decode, greedy continuation and Engram hash ids.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "forward/cpu_model.h"
#include "npy.h"

namespace flashseek::forward {
namespace {

namespace fs = std::filesystem;

// Extracts the fixture once per process into a temp dir.
const std::string& fixture_dir() {
  static std::string dir = [] {
    const fs::path tmp = fs::temp_directory_path() / ("fs_v41_fixture_" + std::to_string(::getpid()));
    fs::create_directories(tmp);
    const std::string cmd = "tar xzf " FLASHSEEK_SOURCE_DIR "/tests/golden/v41-official-continuous.tgz -C " +
                            tmp.string();
    if (std::system(cmd.c_str()) != 0) return std::string();
    return (tmp / "v41-official-continuous").string();
  }();
  return dir;
}

class V41Fixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_FALSE(fixture_dir().empty());
    auto m = CpuModel::load(fixture_dir(), Numerics::kExact);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value().release();
    std::ifstream f(fixture_dir() + "/expected.json");
    expected_ = new nlohmann::json(nlohmann::json::parse(f));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete expected_;
    fs::remove_all(fs::path(fixture_dir()).parent_path());
  }
  static std::vector<int32_t> tokens(const char* key) {
    return (*expected_)["sequences"][key].get<std::vector<int32_t>>();
  }
  // Max |Δ| per row between our logits and a fixture array [rows, V].
  static void expect_close(const std::vector<float>& got, const std::string& npy, double tol) {
    auto ref = testing::read_npy(fixture_dir() + "/" + npy);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    auto want = ref->f32();
    ASSERT_EQ(got.size(), want.size());
    const int64_t V = model_->config().vocab_size;
    double worst = 0;
    for (size_t r = 0; r < want.size() / size_t(V); ++r) {
      double m = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, std::fabs(double(got[r * V + v]) - want[r * V + v]));
      EXPECT_LT(m, tol) << npy << " position " << r;
      worst = std::max(worst, m);
    }
    std::printf("%s: max |dlogit| = %.3g\n", npy.c_str(), worst);
  }
  static CpuModel* model_;
  static nlohmann::json* expected_;
};
CpuModel* V41Fixture::model_ = nullptr;
nlohmann::json* V41Fixture::expected_ = nullptr;

TEST_F(V41Fixture, PrefillMatchesOfficialLogits) {
  auto toks = tokens("long");
  auto st = model_->new_sequence();
  std::vector<float> logits;
  BatchItem item{st.get(), toks, true};
  ASSERT_TRUE(model_->forward({&item, 1}, logits).ok());
  expect_close(logits, "logits_prefill.npy", 1e-4);
}

TEST_F(V41Fixture, Prefill40ThenDecodeMatchesOfficialLogits) {
  auto toks = tokens("long");
  auto st = model_->new_sequence();
  std::vector<float> logits;
  BatchItem first{st.get(), std::span<const int32_t>(toks.data(), 40), true};
  ASSERT_TRUE(model_->forward({&first, 1}, logits).ok());
  for (size_t t = 40; t < toks.size(); ++t) {
    BatchItem step{st.get(), std::span<const int32_t>(toks.data() + t, 1), false};
    ASSERT_TRUE(model_->forward({&step, 1}, logits).ok());
  }
  expect_close(logits, "logits_incremental40_fixed.npy", 1e-4);
}

TEST_F(V41Fixture, Prefill37ThenDecodeMatchesOfficialLogits) {
  // A ratio-2 group straddles the prefill/decode boundary.
  auto toks = tokens("long");
  auto st = model_->new_sequence();
  std::vector<float> logits;
  BatchItem first{st.get(), std::span<const int32_t>(toks.data(), 37), true};
  ASSERT_TRUE(model_->forward({&first, 1}, logits).ok());
  for (size_t t = 37; t < toks.size(); ++t) {
    BatchItem step{st.get(), std::span<const int32_t>(toks.data() + t, 1), false};
    ASSERT_TRUE(model_->forward({&step, 1}, logits).ok());
  }
  expect_close(logits, "logits_incremental37_fixed.npy", 1e-4);
}

TEST_F(V41Fixture, GreedyContinuationMatches) {
  std::vector<int32_t> seq = (*expected_)["greedy_prompt"].get<std::vector<int32_t>>();
  const auto want = (*expected_)["greedy_output"].get<std::vector<int32_t>>();
  auto st = model_->new_sequence();
  std::vector<int32_t> out;
  std::span<const int32_t> next(seq);
  std::vector<int32_t> cur;
  const int64_t V = model_->config().vocab_size;
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<float> logits;
    BatchItem item{st.get(), next, false};
    ASSERT_TRUE(model_->forward({&item, 1}, logits).ok());
    const int32_t tok = int32_t(std::max_element(logits.begin(), logits.begin() + V) - logits.begin());
    out.push_back(tok);
    cur = {tok};
    next = cur;
  }
  EXPECT_EQ(out, want);
}

TEST_F(V41Fixture, EngramHashIdsMatch) {
  auto toks = tokens("long");
  auto ref = testing::read_npy(fixture_dir() + "/engram_hash_ids.npy");
  ASSERT_TRUE(ref.ok());
  auto st = model_->new_sequence();
  auto ids = model_->engram_hash_ids(*st, toks);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids.value(), ref->i64());
  // Chunked: hashing the second half after advancing the state by the first half agrees.
  std::vector<float> logits;
  BatchItem item{st.get(), std::span<const int32_t>(toks.data(), 150), false};
  ASSERT_TRUE(model_->forward({&item, 1}, logits).ok());
  auto tail = model_->engram_hash_ids(*st, std::span<const int32_t>(toks.data() + 150, 150));
  ASSERT_TRUE(tail.ok());
  const auto all = ref->i64();
  EXPECT_EQ(tail.value(), std::vector<int64_t>(all.begin() + int64_t(all.size()) / 2, all.end()));
}

TEST_F(V41Fixture, DSparkDraftsMatchOfficialLogits) {
  // Greedy decode from the 20-token prompt; at steps t = 20..59 feed the input token, take the
  // anchor (target argmax) and propose a block (v41 §5.4); compare with the official drafts.
  ASSERT_TRUE(model_->has_draft());
  auto ref = testing::read_npy(fixture_dir() + "/dspark_draft_logits_fixed.npy");
  ASSERT_TRUE(ref.ok());
  const auto want = ref->f32();
  const auto& steps = (*expected_)["oracle"]["dspark"]["fixed"]["steps"];
  const int64_t V = model_->config().vocab_size, B = model_->config().dspark_block_size;
  ASSERT_EQ(int64_t(want.size()), int64_t(steps.size()) * B * V);
  auto prompt = (*expected_)["greedy_prompt"].get<std::vector<int32_t>>();
  auto st = model_->new_sequence();
  std::vector<float> logits;
  BatchItem item{st.get(), prompt, false};
  ASSERT_TRUE(model_->forward({&item, 1}, logits).ok());
  int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  double worst = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    EXPECT_EQ(next, steps[k]["input_token"].get<int32_t>()) << "step " << k;
    EXPECT_EQ(st->length(), steps[k]["pos"].get<int64_t>());
    logits.clear();
    BatchItem step{st.get(), std::span<const int32_t>(&next, 1), false};
    ASSERT_TRUE(model_->forward({&step, 1}, logits).ok());
    const int32_t anchor = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(anchor, steps[k]["anchor_token"].get<int32_t>());
    auto draft = model_->propose(*st, anchor);
    ASSERT_TRUE(draft.ok()) << draft.status().to_string();
    EXPECT_EQ(draft->tokens, steps[k]["draft_tokens"].get<std::vector<int32_t>>()) << "step " << k;
    const auto conf = steps[k]["confidence_logits"].get<std::vector<float>>();
    for (int64_t i = 0; i < B; ++i) EXPECT_NEAR(draft->confidence[size_t(i)], conf[size_t(i)], 1e-3 * std::max(1.0f, std::fabs(conf[size_t(i)])));
    for (int64_t i = 0; i < B * V; ++i)
      worst = std::max(worst, std::fabs(double(draft->logits[size_t(i)]) - want[k * B * V + size_t(i)]));
    next = anchor;
  }
  EXPECT_LT(worst, 1e-4);
  std::printf("dspark_draft_logits_fixed.npy: max |dlogit| = %.3g\n", worst);
}

}  // namespace
}  // namespace flashseek::forward
