// flashseek run --speculative: greedy output is identical on, off and auto (the default) on
// tiny-v41 (DSpark) and tiny-v4 (MTP); `on` fails for a checkpoint without draft tensors, which
// loads with one warning otherwise; the stats line reports the policy and its costs.
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
    // Configs that declare the draft (V4.1 DSpark, V4 MTP), written without its tensors.
    for (const char* c : {"tiny-v41", "tiny-v4"}) {
      auto r = run_command(flashseek_bin() + " make-tiny --config " + c + " --seed 2 --no-draft --out " +
                           ckpt(std::string("no-draft-") + c));
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

// V4.1 (DSpark, 3 drafts per block) and V4 (MTP, 1 draft).
TEST_F(SpecCli, GreedyOutputIsTheSameOnOffAndAuto) {
  for (const char* c : {"tiny-v41", "tiny-v4"}) {
    SCOPED_TRACE(c);
    const std::string args = "--ckpt " + ckpt(c) +
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
    // The stats line (stderr) names the mode, the policy's decisions and the measured costs.
    auto with_stats = run_command(flashseek_bin() + " run " + args + " --speculative on");
    EXPECT_NE(with_stats.output.find("speculative: on, "), std::string::npos) << with_stats.output;
    EXPECT_NE(with_stats.output.find("costs: step x1 "), std::string::npos) << with_stats.output;
    auto auto_stats = run_command(flashseek_bin() + " run " + args);
    EXPECT_NE(auto_stats.output.find("speculative: auto, "), std::string::npos) << auto_stats.output;
    EXPECT_NE(auto_stats.output.find("plain steps"), std::string::npos) << auto_stats.output;
    auto plain_stats = run_command(flashseek_bin() + " run " + args + " --speculative off");
    EXPECT_EQ(plain_stats.output.find("speculative: "), std::string::npos) << plain_stats.output;
  }
}

TEST_F(SpecCli, OnWithoutADraftIsAnError) {
  const std::string args = "--ckpt " + ckpt("no-draft-tiny-v41") + " --prompt-ids 1,2 --max-tokens 4 --json";
  auto on = run_command(flashseek_bin() + " run " + args + " --speculative on");
  EXPECT_NE(on.exit_code, 0);
  EXPECT_NE(on.output.find("no draft"), std::string::npos) << on.output;
  EXPECT_EQ(run_command(flashseek_bin() + " run " + args).exit_code, 0)
      << "auto falls back to plain";
}

// A checkpoint whose config declares the draft but ships none of its tensors loads (one
// warning on stderr; stdout stays the JSON result) and gives the same greedy tokens as the full
// checkpoint with speculation off.
TEST_F(SpecCli, DraftlessCheckpointLoadsWithOneWarning) {
  for (const std::string c : {"tiny-v41", "tiny-v4"}) {
    SCOPED_TRACE(c);
    const std::string args = " --prompt-ids 9,8,7 --max-tokens 12 --ignore-eos --json";
    auto full = run_stdout("--ckpt " + ckpt(c) + args + " --speculative off");
    auto bare = run_stdout("--ckpt " + ckpt("no-draft-" + c) + args);
    ASSERT_EQ(full.exit_code, 0) << full.output;
    ASSERT_EQ(bare.exit_code, 0) << bare.output;
    EXPECT_NE(full.output.find("\"tokens\""), std::string::npos) << full.output;
    EXPECT_EQ(bare.output, full.output);
    auto logged = run_command(flashseek_bin() + " run --ckpt " + ckpt("no-draft-" + c) + args);
    size_t warnings = 0;
    for (size_t at = logged.output.find("[warning]"); at != std::string::npos;
         at = logged.output.find("[warning]", at + 1))
      ++warnings;
    EXPECT_EQ(warnings, 1u) << logged.output;
    EXPECT_NE(logged.output.find("no mtp.* tensors"), std::string::npos) << logged.output;
    EXPECT_EQ(logged.output.find("speculative: "), std::string::npos) << "speculation off: " << logged.output;
  }
}

}  // namespace
}  // namespace flashseek::engine
