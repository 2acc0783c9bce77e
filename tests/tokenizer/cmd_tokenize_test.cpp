// `flashseek tokenize` end to end: runs the built binary ($FLASHSEEK_BIN overrides its path).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tok_test_util.h"
#include "tokenizer/tokenizer_ids.h"

namespace flashseek::tok {
namespace {

// Runs `flashseek tokenize ARGS`, capturing stdout and stderr together.
::flashseek::testing::CommandResult run_cli(const std::string& args) {
  return ::flashseek::testing::run_command("'" + ::flashseek::testing::flashseek_bin() +
                                           "' tokenize " + args);
}

std::string write_temp(const std::string& name, const std::string& content) {
  const auto path = std::filesystem::temp_directory_path() /
                    (name + "_" + std::to_string(static_cast<long>(::getpid())));
  std::ofstream(path, std::ios::binary) << content;
  return path.string();
}

class CmdTokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string bin = ::flashseek::testing::flashseek_bin();
    if (!std::filesystem::exists(bin)) FS_SKIP_UNLESS_CI("flashseek binary missing: " << bin);
    std::string why;
    if (testing::real_tokenizer(&why) == nullptr) FS_SKIP_UNLESS_CI("tokenizer data missing: " << why);
  }
};

TEST_F(CmdTokenize, EncodesSpecExamples) {
  auto r = run_cli("--text '你好推理<｜User｜>答案'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "30594 36101 128803 7624\n");
}

TEST_F(CmdTokenize, DecodesIdsInAnyListForm) {
  auto r = run_cli("--decode --text '30594,36101 128803'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "你好推理<｜User｜>\n");
  auto j = run_cli("--decode --json --text '[7624]'");
  ASSERT_EQ(j.exit_code, 0) << j.output;
  EXPECT_EQ(nlohmann::json::parse(j.output)["text"], "答案");
}

TEST_F(CmdTokenize, FileRoundTripThroughJson) {
  const std::string text = "int main() {\r\n\treturn 42;  // 你好 😀\n}\n";
  const std::string in = write_temp("fs_tok_in", text);
  auto enc = run_cli("--json --file '" + in + "'");
  ASSERT_EQ(enc.exit_code, 0) << enc.output;
  const auto ids = nlohmann::json::parse(enc.output)["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, testing::real_tokenizer(nullptr)->encode(text));
  const std::string ids_file = write_temp("fs_tok_ids", format_token_ids(ids, ","));
  auto dec = run_cli("--decode --json --file '" + ids_file + "'");
  ASSERT_EQ(dec.exit_code, 0) << dec.output;
  EXPECT_EQ(nlohmann::json::parse(dec.output)["text"], text);
  std::filesystem::remove(in);
  std::filesystem::remove(ids_file);
}

TEST_F(CmdTokenize, BadInputFailsWithMessage) {
  auto unknown = run_cli("--decode --text '1 129280'");
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.output.find("129280"), std::string::npos) << unknown.output;

  auto garbage = run_cli("--decode --text '1 abc'");
  EXPECT_NE(garbage.exit_code, 0);
  EXPECT_NE(garbage.output.find("abc"), std::string::npos) << garbage.output;

  auto missing = run_cli("--file /nonexistent/input.txt");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("/nonexistent/input.txt"), std::string::npos) << missing.output;

  const std::string bad = write_temp("fs_tok_bad", std::string("ok\xC3(", 4));
  auto utf8 = run_cli("--file '" + bad + "'");
  EXPECT_NE(utf8.exit_code, 0);
  EXPECT_NE(utf8.output.find("UTF-8"), std::string::npos) << utf8.output;
  std::filesystem::remove(bad);

  auto none = run_cli("");
  EXPECT_NE(none.exit_code, 0);

  auto bad_tok = run_cli("--tokenizer /nonexistent/dir --text hi");
  EXPECT_NE(bad_tok.exit_code, 0);
  EXPECT_NE(bad_tok.output.find("/nonexistent/dir"), std::string::npos) << bad_tok.output;
}

}  // namespace
}  // namespace flashseek::tok
