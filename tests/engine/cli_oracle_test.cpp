// `flashseek run` against the official V4.1 reference fixture (tests/golden, exact numerics):
// the greedy continuation and every prompt logprob of the 300-token sequence, end to end through
// the CLI, the engine's chunked prefill and the JSON contract.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "forward/npy.h"
#include "test_util.h"

namespace flashseek::engine {
namespace {

using flashseek::testing::flashseek_bin;
using flashseek::testing::run_command;

class CliOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new flashseek::testing::TempDir();
    auto r = run_command("tar xzf " + (flashseek::testing::source_dir() / "tests/golden" /
                                       "v41-official-continuous.tgz").string() +
                         " -C " + tmp_->path().string());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::ifstream f(dir() + "/expected.json");
    expected_ = new nlohmann::json(nlohmann::json::parse(f));
  }
  static void TearDownTestSuite() {
    delete expected_;
    delete tmp_;
  }
  static std::string dir() { return (tmp_->path() / "v41-official-continuous").string(); }
  static nlohmann::json run_json(const std::string& args) {
    auto r = run_command("(" + flashseek_bin() + " run --ckpt " + dir() +
                         " --numerics exact --json " + args + " 2>/dev/null)");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json();
  }
  static flashseek::testing::TempDir* tmp_;
  static nlohmann::json* expected_;
};
flashseek::testing::TempDir* CliOracle::tmp_ = nullptr;
nlohmann::json* CliOracle::expected_ = nullptr;

TEST_F(CliOracle, GreedyContinuationMatchesOfficialReference) {
  std::string ids;
  for (const auto& t : (*expected_)["greedy_prompt"]) ids += std::to_string(t.get<int>()) + ",";
  auto j = run_json("--prompt-ids " + ids + " --max-tokens 40 --temperature 0 --ignore-eos");
  EXPECT_EQ(j["tokens"], (*expected_)["greedy_output"]);
}

TEST_F(CliOracle, PromptLogprobsMatchOfficialLogits) {
  const auto seq = (*expected_)["sequences"]["long"].get<std::vector<int32_t>>();
  const std::string ids_file = (tmp_->path() / "long.json").string();
  std::ofstream(ids_file) << nlohmann::json(seq).dump();
  auto j = run_json("--prompt-ids @" + ids_file + " --max-tokens 0 --prompt-logprobs 3");
  EXPECT_TRUE(j["tokens"].empty());
  ASSERT_EQ(j["prompt_logprobs"].size(), seq.size());
  EXPECT_TRUE(j["prompt_logprobs"][0].is_null());

  auto npy = flashseek::testing::read_npy(dir() + "/logits_prefill.npy");
  ASSERT_TRUE(npy.ok()) << npy.status().to_string();
  const auto ref = npy->f32();
  const size_t V = size_t(npy->shape[1]);
  ASSERT_EQ(npy->shape[0], int64_t(seq.size()));
  double worst = 0;
  for (size_t i = 1; i < seq.size(); ++i) {
    // Position i is predicted by the logits of position i - 1.
    const float* row = ref.data() + (i - 1) * V;
    double mx = -INFINITY, sum = 0;
    for (size_t v = 0; v < V; ++v) mx = std::max(mx, double(row[v]));
    for (size_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - mx);
    const double want = double(row[size_t(seq[i])]) - mx - std::log(sum);
    const auto& entries = j["prompt_logprobs"][i];
    bool found = false;
    for (const auto& e : entries) {
      if (e["id"] != seq[i]) continue;
      found = true;
      worst = std::max(worst, std::abs(e["logprob"].get<double>() - want));
    }
    EXPECT_TRUE(found) << "position " << i;
    // The reported top-1 is the reference's argmax (or within rounding of it).
    const int32_t top = entries[0]["id"].get<int32_t>();
    const float* best = std::max_element(row, row + V);
    EXPECT_NEAR(row[size_t(top)], *best, 1e-4) << "position " << i;
  }
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace flashseek::engine
