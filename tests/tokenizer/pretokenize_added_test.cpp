// The DeepSeek pre-tokenizer regexes and the added-token matcher.
#include <random>

#include <gtest/gtest.h>

#include "tokenizer/added_tokens.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tok_test_util.h"

namespace flashseek::tok {
namespace {

using Pieces = std::vector<std::string>;

Pieces split(const PreTokenizer& pt, std::string_view text) {
  std::vector<std::string_view> views;
  EXPECT_TRUE(pt.split(text, views).ok());
  return Pieces(views.begin(), views.end());
}

TEST(PreTokenizer, DeepSeekSplits) {
  auto pt = PreTokenizer::create(PreTokenizer::deepseek_patterns());
  ASSERT_TRUE(pt.ok()) << pt.status().to_string();
  EXPECT_EQ(split(*pt, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(split(*pt, "1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(split(*pt, "abc123def"), (Pieces{"abc", "123", "def"}));
  EXPECT_EQ(split(*pt, "你好世界hello"), (Pieces{"你好世界", "hello"}));
  EXPECT_EQ(split(*pt, "カタカナ한국어"), (Pieces{"カタカナ", "한국어"}));  // Hangul: \p{L}
  EXPECT_EQ(split(*pt, "don't"), (Pieces{"don", "'t"}));
  EXPECT_EQ(split(*pt, "a.b"), (Pieces{"a", ".b"}));
  EXPECT_EQ(split(*pt, "x  \n\n  y"), (Pieces{"x", "  \n\n", " ", " y"}));
  EXPECT_EQ(split(*pt, "end!!\r\n"), (Pieces{"end", "!!\r\n"}));
  EXPECT_EQ(split(*pt, "a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(split(*pt, "tail   "), (Pieces{"tail", "   "}));
  EXPECT_TRUE(split(*pt, "").empty());
}

TEST(PreTokenizer, PiecesCoverRandomTextExactly) {
  auto pt = PreTokenizer::create(PreTokenizer::deepseek_patterns());
  ASSERT_TRUE(pt.ok());
  std::mt19937 rng(5);
  const std::string atoms[] = {"a", "Z", "7", " ", "\t", "\n", "\r\n", "你", "カ", "é", "😀",
                               "!", "'", "\xC2\xA0", "\xE3\x80\x80", "\xCC\x81", "١"};
  for (int trial = 0; trial < 400; ++trial) {
    std::string text;
    for (int k = 0, n = static_cast<int>(rng() % 41); k < n; ++k) text += atoms[rng() % std::size(atoms)];
    std::vector<std::string_view> views;
    ASSERT_TRUE(pt->split(text, views).ok());
    std::string joined;
    for (auto v : views) {
      EXPECT_FALSE(v.empty());
      joined += v;
    }
    ASSERT_EQ(joined, text);
  }
}

TEST(PreTokenizer, BadPatternNamesIt) {
  auto pt = PreTokenizer::create({"ok+", "([unclosed"});
  ASSERT_FALSE(pt.ok());
  EXPECT_NE(pt.status().message().find("pattern 1"), std::string::npos) << pt.status().message();
}

TEST(AddedTokenMatcher, LeftmostThenLongest) {
  auto m = AddedTokenMatcher::create({{10, "<a>"}, {11, "<a>b"}, {12, "a>b"}, {13, "x"}});
  ASSERT_TRUE(m.ok());
  auto hit = m->find("zz<a>bc", 0);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->pos, 2u);   // "<a>b" at 2 wins over "a>b" at 3 (leftmost)
  EXPECT_EQ(hit->len, 4u);   // and over "<a>" (longest)
  EXPECT_EQ(hit->id, 11);
  EXPECT_FALSE(m->find("<a", 0).has_value());
  EXPECT_EQ(m->find("<a>x", 1)->id, 13);
  EXPECT_EQ(m->id_of("<a>"), 10);
  EXPECT_FALSE(m->id_of("<a").has_value());
  EXPECT_EQ(m->by_id(12)->content, "a>b");
  EXPECT_EQ(m->by_id(14), nullptr);
}

TEST(AddedTokenMatcher, MatchesNaiveSearchOnRandomText) {
  std::vector<AddedToken> toks = {{1, "ab"}, {2, "abc"}, {3, "bca"}, {4, "c"}, {5, "cab"}};
  auto m = AddedTokenMatcher::create(toks);
  ASSERT_TRUE(m.ok());
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    for (int k = 0, n = static_cast<int>(rng() % 15); k < n; ++k) text += "abcd"[rng() % 4];
    // Naive: first position with any match, longest there.
    std::optional<AddedTokenMatcher::Match> want;
    for (size_t p = 0; p < text.size() && !want; ++p) {
      for (const auto& t : toks) {
        if (text.compare(p, t.content.size(), t.content) == 0 && (!want || t.content.size() > want->len)) {
          want = AddedTokenMatcher::Match{p, t.content.size(), t.id};
        }
      }
    }
    auto got = m->find(text, 0);
    ASSERT_EQ(got.has_value(), want.has_value()) << text;
    if (got) {
      EXPECT_EQ(got->pos, want->pos) << text;
      EXPECT_EQ(got->id, want->id) << text;
    }
  }
}

TEST(AddedTokenMatcher, RejectsBadTables) {
  EXPECT_FALSE(AddedTokenMatcher::create({{1, ""}}).ok());
  EXPECT_FALSE(AddedTokenMatcher::create({{1, "a"}, {1, "b"}}).ok());
  EXPECT_FALSE(AddedTokenMatcher::create({{1, "a"}, {2, "a"}}).ok());
  EXPECT_FALSE(AddedTokenMatcher::create({{1, "\xC3"}}).ok());
}

TEST(AddedTokens, V41TableFileIsCompleteAndContiguous) {
  auto toks = load_added_tokens_file(testing::source_path("data/tokenizer/v41_added_tokens.json"));
  ASSERT_TRUE(toks.ok()) << toks.status().to_string();
  ASSERT_EQ(toks->size(), 1283u);
  std::vector<int32_t> ids;
  for (const auto& t : *toks) ids.push_back(t.id);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids[2], 2);
  for (size_t i = 3; i < ids.size(); ++i) ASSERT_EQ(ids[i], 128000 + static_cast<int32_t>(i - 3));
  auto m = AddedTokenMatcher::create(*toks);  // unique strings and ids
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->id_of("<｜System｜>"), 128799);
  EXPECT_EQ(m->id_of("<|place_holder_mm_span_0435|>"), 129261);
}

TEST(AddedTokens, FileErrorsNameTheFile) {
  auto r = load_added_tokens_file("/nonexistent/v41.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/nonexistent/v41.json"), std::string::npos);
  auto bad = parse_added_tokens(nlohmann::json::parse(R"([{"id": "x", "content": "a"}])"), "t.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.json"), std::string::npos);
}

}  // namespace
}  // namespace flashseek::tok
