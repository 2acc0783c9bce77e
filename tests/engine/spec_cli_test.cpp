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

// --spec-script-accept (benchmark only, changes the output): refused without
// --allow-scripted-output, with speculation off, for a model without a draft and for values that
// are not a number of tokens per step in [1, block + 1] (tiny-v41: block 3 → at most 4); each
// refusal exits non-zero with a message naming the flag.
TEST_F(SpecCli, ScriptedAcceptIsRefusedUnlessAskedForAndForBadValues) {
  const std::string base = flashseek_bin() + " run --ckpt " + ckpt("tiny-v41") +
                           " --prompt-ids 1,2,3 --max-tokens 8 --ignore-eos --json";
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--spec-script-accept 2", "add --allow-scripted-output"},
      {"--allow-scripted-output", "--allow-scripted-output without --spec-script-accept"},
      {"--spec-script-accept 2 --allow-scripted-output --speculative off", "needs --speculative on or auto"},
      {"--spec-script-accept abc --allow-scripted-output", "'abc' is not a number"},
      {"--spec-script-accept 2x --allow-scripted-output", "'2x' is not a number"},
      {"--spec-script-accept 0.5 --allow-scripted-output", "'0.5' is not a number"},
      {"--spec-script-accept -3 --allow-scripted-output", "'-3' is not a number"},
      {"--spec-script-accept nan --allow-scripted-output", "'nan' is not a number"},
      {"--spec-script-accept inf --allow-scripted-output", "'inf' is not a number"},
      {"--spec-script-accept 4.5 --allow-scripted-output", "at most 4 tokens per step"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    auto r = run_command(base + " " + c.flags);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("\"tokens\""), std::string::npos) << "no result printed: " << r.output;
  }
  auto nodraft = run_command(flashseek_bin() + " run --ckpt " + ckpt("no-draft-tiny-v41") +
                             " --prompt-ids 1,2,3 --max-tokens 8 --json --spec-script-accept 2 "
                             "--allow-scripted-output");
  EXPECT_NE(nodraft.exit_code, 0) << nodraft.output;
  EXPECT_NE(nodraft.output.find("has no draft"), std::string::npos) << nodraft.output;
}

// With the flag: a warning says the output is not the model's, and the run's stats line shows
// the scripted mean exactly (41 tokens = the prefill's + 16 verifications alternating 1 and 2
// accepted drafts: 2.5 tokens per step); mean 1 (every draft rejected) is plain greedy decoding.
TEST_F(SpecCli, ScriptedAcceptRunsAtTheScriptedMean) {
  const std::string args = "--ckpt " + ckpt("tiny-v41") +
                           " --prompt-ids 9,8,7,6,5 --max-tokens 41 --ignore-eos --json";
  auto r = run_command(flashseek_bin() + " run " + args +
                       " --speculative on --spec-script-accept 2.5 --allow-scripted-output");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("BENCHMARK MODE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("speculative: on, 16 verify steps (0 probes), 2.500 tokens/step, "
                          "accepted per draft position 16/8/0"),
            std::string::npos)
      << r.output;
  auto off = run_stdout(args + " --speculative off");
  auto one = run_stdout(args + " --speculative on --spec-script-accept 1 --allow-scripted-output");
  ASSERT_EQ(off.exit_code, 0) << off.output;
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(off.output.find("\"tokens\""), std::string::npos) << off.output;
  EXPECT_EQ(one.output, off.output);
}

}  // namespace
}  // namespace flashseek::engine
