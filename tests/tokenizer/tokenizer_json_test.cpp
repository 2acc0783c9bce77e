// Tokenizer construction from tokenizer.json (synthetic files): end-to-end encode/decode and
// clear errors for configurations we do not implement.
#include <gtest/gtest.h>

#include "tokenizer/tok_test_util.h"
#include "tokenizer/tokenizer_ids.h"

namespace flashseek::tok {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

json tiny_with_added() {
  return testing::tiny_tokenizer_json(
      {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}},
      json::array({{{"id", 300}, {"content", "<think>"}}, {{"id", 301}, {"content", "<th"}}}));
}

TEST(TokenizerJson, TinyEndToEnd) {
  auto tok = Tokenizer::from_json(tiny_with_added(), "tiny");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  // ids: 256 he, 257 ll, 258 hell, 259 hello, 260 " w"
  EXPECT_EQ(tok->encode("hello"), Ids({259}));
  EXPECT_EQ(tok->encode("hello world"), Ids({259, 260, 'o', 'r', 'l', 'd'}));
  EXPECT_EQ(tok->encode("<think>hello<th"), Ids({300, 259, 301}));
  EXPECT_EQ(tok->decode(Ids{300, 259, 301}), "<think>hello<th");
  EXPECT_EQ(tok->vocab_size(), 302);
  EXPECT_FALSE(tok->is_valid_id(270));  // a hole between the vocab and the added ids
  EXPECT_EQ(tok->token_to_id("<th"), 301);
  EXPECT_EQ(tok->token_to_id("Ġw"), 260);
  EXPECT_EQ(tok->id_to_token(260), "Ġw");
  EXPECT_EQ(tok->token_bytes(260), " w");
}

TEST(TokenizerJson, AddedOverrideReplacesFileTable) {
  std::vector<AddedToken> v41 = {{400, "<｜System｜>"}};
  auto tok = Tokenizer::from_json(tiny_with_added(), "tiny", &v41);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->encode("<｜System｜>"), Ids({400}));
  EXPECT_FALSE(tok->token_to_id("<think>").has_value());
  EXPECT_EQ(tok->added_tokens().size(), 1u);
}

TEST(TokenizerJson, UnsupportedConfigsAreRejected) {
  auto expect_error = [](json j, const std::string& needle) {
    auto tok = Tokenizer::from_json(j, "t.json");
    ASSERT_FALSE(tok.ok()) << needle;
    EXPECT_NE(tok.status().message().find(needle), std::string::npos) << tok.status().message();
    EXPECT_NE(tok.status().message().find("t.json"), std::string::npos);
  };
  json j = tiny_with_added();
  j["normalizer"] = {{"type", "NFC"}};
  expect_error(j, "normalizer");
  j = tiny_with_added();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "WordPiece");
  j = tiny_with_added();
  j["model"]["byte_fallback"] = true;
  expect_error(j, "byte_fallback");
  j = tiny_with_added();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious";
  expect_error(j, "Isolated");
  j = tiny_with_added();
  j["pre_tokenizer"]["pretokenizers"].erase(3);
  expect_error(j, "ByteLevel");
  j = tiny_with_added();
  j["model"]["merges"].push_back("a b c");
  expect_error(j, "merges[5]");
  j = tiny_with_added();
  j["model"].erase("vocab");
  expect_error(j, "vocab");
  j = tiny_with_added();
  j["added_tokens"].push_back({{"id", 5}, {"content", "<five>"}});  // id 5 is a byte token
  expect_error(j, "conflicts");
  j = tiny_with_added();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "decoder");
}

TEST(TokenizerJson, LoadNamesMissingFile) {
  auto tok = Tokenizer::load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find("/nonexistent/tokenizer.json"), std::string::npos);
}

TEST(TokenIds, ParseAndFormat) {
  EXPECT_EQ(*parse_token_ids("1 2 3"), Ids({1, 2, 3}));
  EXPECT_EQ(*parse_token_ids("1,2,3"), Ids({1, 2, 3}));
  EXPECT_EQ(*parse_token_ids(" [1, 2,\n3] \n"), Ids({1, 2, 3}));
  EXPECT_EQ(*parse_token_ids(""), Ids{});
  EXPECT_EQ(*parse_token_ids("-4"), Ids({-4}));
  EXPECT_FALSE(parse_token_ids("1 x 3").ok());
  EXPECT_FALSE(parse_token_ids("1.5").ok());
  EXPECT_FALSE(parse_token_ids("[1, 2").ok());
  EXPECT_FALSE(parse_token_ids("99999999999").ok());
  EXPECT_EQ(format_token_ids(Ids{1, 2, 3}), "1 2 3");
  EXPECT_EQ(format_token_ids(Ids{1, 2, 3}, ","), "1,2,3");
  EXPECT_EQ(format_token_ids(Ids{}), "");
}

}  // namespace
}  // namespace flashseek::tok
