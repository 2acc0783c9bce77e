// flashseek run --speculative: greedy output is identical on, off and auto (the default) on a
// tiny-v41 checkpoint with draft weights; `on` fails for a checkpoint without a draft (tiny-v4);
// the stats line reports the verify steps.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace flashseek::engine {
namespace {

using flashseek::testing::flashseek_bin;
using flashseek::testing::run_command;

class SpecCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new flashseek::testing::TempDir();
    for (const char* c : {"tiny-v41", "tiny-v4"}) {
      auto r =
          run_command(flashseek_bin() + " make-tiny --config " + c + " --seed 2 --out " + ckpt(c));
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string ckpt(const std::string& c) { return (dir_->path() / c).string(); }
  // stdout only (the stats line goes to stderr).
  static flashseek::testing::CommandResult run_stdout(const std::string& args) {
    return run_command("(" + flashseek_bin() + " run " + args + " 2>/dev/null)");
  }
  static flashseek::testing::TempDir* dir_;
};
flashseek::testing::TempDir* SpecCli::dir_ = nullptr;

TEST_F(SpecCli, GreedyOutputIsTheSameOnOffAndAuto) {
  const std::string args =
      "--ckpt " + ckpt("tiny-v41") +
      " --prompt-ids 9,8,7,6,5 --max-tokens 60 --ignore-eos --logprobs 2 --json";
  auto off = run_stdout(args + " --speculative off");
  auto on = run_stdout(args + " --speculative on");
  auto def = run_stdout(args);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  ASSERT_EQ(on.exit_code, 0) << on.output;
  ASSERT_EQ(def.exit_code, 0) << def.output;
  // Equal outputs only mean something when there is output: each run printed the JSON of 60
  // tokens (--ignore-eos) with their logprobs.
  for (const auto* r : {&off, &on, &def}) {
    const auto j = nlohmann::json::parse(r->output, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << "not JSON: " << r->output;
    ASSERT_TRUE(j.contains("tokens") && j["tokens"].is_array()) << r->output;
    EXPECT_EQ(j["tokens"].size(), 60u) << r->output;
    ASSERT_TRUE(j.contains("logprobs") && j["logprobs"].is_array()) << r->output;
    EXPECT_EQ(j["logprobs"].size(), 60u) << r->output;
  }
  EXPECT_EQ(on.output, off.output);
  EXPECT_EQ(def.output, off.output);
  auto with_stats = run_command(flashseek_bin() + " run " + args + " --speculative on");
  EXPECT_NE(with_stats.output.find("speculative: "), std::string::npos) << with_stats.output;
  auto plain_stats = run_command(flashseek_bin() + " run " + args + " --speculative off");
  EXPECT_EQ(plain_stats.output.find("speculative: "), std::string::npos) << plain_stats.output;
}

TEST_F(SpecCli, OnWithoutADraftIsAnError) {
  const std::string args = "--ckpt " + ckpt("tiny-v4") + " --prompt-ids 1,2 --max-tokens 4 --json";
  auto on = run_command(flashseek_bin() + " run " + args + " --speculative on");
  EXPECT_NE(on.exit_code, 0);
  EXPECT_NE(on.output.find("no DSpark draft"), std::string::npos) << on.output;
  EXPECT_EQ(run_command(flashseek_bin() + " run " + args).exit_code, 0)
      << "auto falls back to plain";
}

}  // namespace
}  // namespace flashseek::engine
