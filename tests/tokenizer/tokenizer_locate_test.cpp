// Default locations of the tokenizer files: explicit path (file or directory) > env > repo.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tokenizer_locate.h"

namespace flashseek::tok {
namespace {

// Sets an environment variable for the lifetime of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(TokenizerLocate, ExplicitFileOrDirectory) {
  ::flashseek::testing::TempDir dir;
  const auto file = dir.path() / "tokenizer.json";
  std::ofstream(file) << "{}";
  EXPECT_EQ(*find_tokenizer_json(file.string()), file.string());
  EXPECT_EQ(*find_tokenizer_json(dir.path().string()), file.string());
  auto missing = find_tokenizer_json((dir.path() / "nope.json").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.json"), std::string::npos);
}

TEST(TokenizerLocate, EnvironmentVariableWinsOverRepoDefault) {
  ::flashseek::testing::TempDir dir;
  const auto file = dir.path() / "tokenizer.json";
  std::ofstream(file) << "{}";
  {
    ScopedEnv env("FLASHSEEK_TOKENIZER", dir.path().string());
    EXPECT_EQ(*find_tokenizer_json(), file.string());
  }
  {
    ScopedEnv env("FLASHSEEK_TOKENIZER", (dir.path() / "missing").string());
    auto r = find_tokenizer_json();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("FLASHSEEK_TOKENIZER"), std::string::npos);
  }
}

TEST(TokenizerLocate, AddedTokensNextToTokenizerThenRepoData) {
  ::flashseek::testing::TempDir dir;
  const auto json = dir.path() / "tokenizer.json";
  // Without a local copy the committed table of the repository is found.
  auto repo = find_v41_added_tokens("", json.string());
  ASSERT_TRUE(repo.ok()) << repo.status().to_string();
  EXPECT_NE(repo->find("data/tokenizer/v41_added_tokens.json"), std::string::npos);
  // A table next to the tokenizer.json takes precedence.
  const auto local = dir.path() / "v41_added_tokens.json";
  std::ofstream(local) << "{}";
  EXPECT_EQ(*find_v41_added_tokens("", json.string()), local.string());
  EXPECT_FALSE(find_v41_added_tokens("/nonexistent/table.json", json.string()).ok());
}

}  // namespace
}  // namespace flashseek::tok
