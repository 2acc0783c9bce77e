// The CLI contract shared by every command: --help works and exits 0, unknown commands and
// bad flags exit non-zero with a message.
#include <gtest/gtest.h>

#include "test_util.h"

namespace flashseek {
namespace {

using testing::flashseek_bin;
using testing::run_command;

TEST(Cli, TopLevelHelpListsCommands) {
  auto r = run_command(flashseek_bin() + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Subcommands"), std::string::npos) << r.output;
}

TEST(Cli, EveryCommandHasHelp) {
  auto top = run_command(flashseek_bin() + " --help");
  ASSERT_EQ(top.exit_code, 0) << top.output;
  // Every command of the CLI is listed in the top-level help and answers --help with exit 0
  // (a command missing from the help is a failure, not a command to skip).
  for (const char* cmd :
       {"inspect", "make-tiny", "tokenize", "run", "serve", "bench", "kv-bench", "snapshot-size"}) {
    EXPECT_NE(top.output.find(std::string("\n  ") + cmd + " "), std::string::npos)
        << cmd << " is not in the top-level help:\n" << top.output;
    auto r = run_command(flashseek_bin() + " " + cmd + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << cmd << ": " << r.output;
  }
}

TEST(Cli, UnknownCommandFails) {
  auto r = run_command(flashseek_bin() + " no-such-command");
  EXPECT_NE(r.exit_code, 0);
  auto r2 = run_command(flashseek_bin());
  EXPECT_NE(r2.exit_code, 0) << "no subcommand must be an error";
}

// --gpu-exact-linears takes "none" or role names; an unknown name is refused by every command
// that has it, naming the accepted ones.
TEST(Cli, ExactLinearRolesAreChecked) {
  for (const char* cmd : {"run", "serve", "bench"}) {
    auto bad = run_command(flashseek_bin() + " " + cmd + " --gpu-exact-linears draft,bogus 2>&1");
    EXPECT_NE(bad.exit_code, 0) << cmd << ": " << bad.output;
    EXPECT_NE(bad.output.find("unknown role 'bogus'"), std::string::npos) << cmd << ": " << bad.output;
    EXPECT_NE(bad.output.find("routed_experts"), std::string::npos) << cmd << ": " << bad.output;
    auto good = run_command(flashseek_bin() + " " + cmd + " --gpu-exact-linears draft,wq_a --help 2>&1");
    EXPECT_EQ(good.exit_code, 0) << cmd << ": " << good.output;
    auto empty = run_command(flashseek_bin() + " " + cmd + " --gpu-exact-linears '' 2>&1");
    EXPECT_NE(empty.output.find("unknown role ''"), std::string::npos) << cmd << ": " << empty.output;
  }
}

// --gpu-stack-qkv and --gpu-row-fusion take on | off on every command that has them; anything
// else is refused with the option named.
TEST(Cli, OnOffGpuOptionValuesAreChecked) {
  for (const std::string opt : {"--gpu-stack-qkv", "--gpu-row-fusion"}) {
    for (const char* cmd : {"run", "serve", "bench"}) {
      auto bad = run_command(flashseek_bin() + " " + cmd + " " + opt + " yes 2>&1");
      EXPECT_NE(bad.exit_code, 0) << cmd << " " << opt << ": " << bad.output;
      EXPECT_NE(bad.output.find(opt), std::string::npos) << cmd << ": " << bad.output;
      // Accepted values: whatever the command then lacks (a checkpoint), the option is not what it
      // complains about.
      for (const char* v : {"on", "off"}) {
        auto good = run_command(flashseek_bin() + " " + cmd + " " + opt + " " + v + " --ckpt /nonexistent 2>&1");
        EXPECT_EQ(good.output.find(opt), std::string::npos) << cmd << " " << opt << " " << v << ": " << good.output;
      }
    }
  }
}

}  // namespace
}  // namespace flashseek
