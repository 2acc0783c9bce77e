// `flashseek run` with text: --prompt goes through the tokenizer (same tokens as the ids that
// `flashseek tokenize` gives), text output decodes the generated ids, and a missing tokenizer is a
// clear error for --prompt but only a warning (ids printed) for text output.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace flashseek::engine {
namespace {

using flashseek::testing::flashseek_bin;
using flashseek::testing::run_command;

bool tokenizer_available() {
  if (const char* env = std::getenv("FLASHSEEK_TOKENIZER"); env && *env)
    return std::filesystem::exists(env);
  return std::filesystem::exists(flashseek::testing::source_dir() / "models" / "tokenizer" /
                                 "tokenizer.json");
}

// "1,2,3" from a JSON array of ids.
std::string id_list(const nlohmann::json& ids) {
  std::string out;
  for (const auto& t : ids) out += (out.empty() ? "" : ",") + std::to_string(t.get<int>());
  return out;
}

TEST(CliRunText, MissingTokenizer) {
  flashseek::testing::TempDir dir;
  const std::string ck = (dir.path() / "ck").string();
  auto made = run_command(flashseek_bin() + " make-tiny --config tiny-v41 --seed 2 --out " + ck);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string base =
      flashseek_bin() + " run --ckpt " + ck + " --tokenizer /nonexistent/tok.json ";
  auto r = run_command(base + "--prompt hello --json");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--prompt needs the tokenizer"), std::string::npos) << r.output;
  // Text output without a tokenizer prints the ids (stdout only), equal to the JSON tokens.
  auto text = run_command("(" + base + "--prompt-ids 4,5,6 --max-tokens 5 2>/dev/null)");
  auto json = run_command("(" + base + "--prompt-ids 4,5,6 --max-tokens 5 --json 2>/dev/null)");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(text.output, id_list(nlohmann::json::parse(json.output)["tokens"]) + "\n");
}

TEST(CliRunText, PromptTextEqualsTokenizedIds) {
  if (!tokenizer_available()) FS_SKIP_UNLESS_CI("no tokenizer.json (scripts/fetch_tokenizer.sh)");
  flashseek::testing::TempDir dir;
  const std::string ck = (dir.path() / "demo").string();
  // The demo config has the full vocabulary, so real text fits.
  auto made = run_command(flashseek_bin() + " make-tiny --config demo --seed 1 --out " + ck);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  auto tok =
      run_command("(" + flashseek_bin() + " tokenize --text 'Hello world' --json 2>/dev/null)");
  ASSERT_EQ(tok.exit_code, 0) << tok.output;
  const std::string ids = id_list(nlohmann::json::parse(tok.output)["ids"]);
  const std::string base = "(" + flashseek_bin() + " run --ckpt " + ck + " --max-tokens 4 ";
  auto a = run_command(base + "--prompt 'Hello world' --json 2>/dev/null)");
  auto b = run_command(base + "--prompt-ids " + ids + " --json 2>/dev/null)");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  // Text mode prints the decoded continuation: `tokenize --decode` of the same ids.
  const std::string gen = id_list(nlohmann::json::parse(b.output)["tokens"]);
  auto text = run_command(base + "--prompt-ids " + ids + " 2>/dev/null)");
  auto dec =
      run_command("(" + flashseek_bin() + " tokenize --decode --text " + gen + " 2>/dev/null)");
  ASSERT_EQ(text.exit_code, 0);
  ASSERT_EQ(dec.exit_code, 0);
  EXPECT_EQ(text.output, dec.output);
}

}  // namespace
}  // namespace flashseek::engine
