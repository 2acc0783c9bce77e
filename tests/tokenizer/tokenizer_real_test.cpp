// Tests on the real DeepSeek vocabulary (models/tokenizer/tokenizer.json + the V4.1 table).
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "tokenizer/tok_test_util.h"
#include "tokenizer/tokenizer_utf8.h"

namespace flashseek::tok {
namespace {

using Ids = std::vector<int32_t>;

TEST(TokenizerReal, VocabularyCounts) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  EXPECT_EQ(tok->bpe().vocab_entries(), 128000u);
  EXPECT_EQ(tok->bpe().merge_count(), 127741u);
  EXPECT_EQ(tok->added_tokens().size(), 1283u);
  EXPECT_EQ(tok->vocab_size(), 129280);
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    ASSERT_TRUE(tok->is_valid_id(id)) << id;
  }
  EXPECT_FALSE(tok->is_valid_id(129280));
  EXPECT_FALSE(tok->is_valid_id(-1));
}

TEST(TokenizerReal, SpecExamples) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  EXPECT_EQ(tok->encode("你好"), Ids({30594}));
  EXPECT_EQ(tok->encode("推理"), Ids({36101}));
  EXPECT_EQ(tok->encode("答案"), Ids({7624}));
}

TEST(TokenizerReal, V41AddedTokens) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  EXPECT_EQ(tok->token_to_id("<｜begin▁of▁sentence｜>"), 0);
  EXPECT_EQ(tok->token_to_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(tok->token_to_id("<｜System｜>"), 128799);
  EXPECT_EQ(tok->token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(tok->token_to_id("<｜Assistant｜>"), 128804);
  EXPECT_EQ(tok->token_to_id("<think>"), 128821);
  EXPECT_EQ(tok->token_to_id("</think>"), 128822);
  EXPECT_EQ(tok->token_to_id("｜DSML｜"), 128825);
  EXPECT_EQ(tok->token_to_id("<｜deepseek_image｜>"), 129264);
  EXPECT_EQ(tok->token_to_id("<|place_holder_mm_span_0021|>"), 128847);
  EXPECT_EQ(tok->token_to_id("<|place_holder_mm_span_0436|>"), 129265);
  EXPECT_EQ(tok->token_to_id("<|place_holder_mm_span_0442|>"), 129279);
  EXPECT_FALSE(tok->token_to_id("<｜place▁holder▁no▁799｜>").has_value());  // V3 only
  EXPECT_EQ(tok->id_to_token(128799), "<｜System｜>");
}

TEST(TokenizerReal, ChatPromptUsesAddedTokensAndNoImplicitBos) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  const Ids ids = tok->encode("<｜begin▁of▁sentence｜><｜User｜>你好<｜Assistant｜></think>");
  EXPECT_EQ(ids, Ids({0, 128803, 30594, 128804, 128822}));
  const Ids plain = tok->encode("hello");
  ASSERT_FALSE(plain.empty());
  EXPECT_NE(plain.front(), 0);  // never adds BOS
  // "<think>" inside a word still matches as the added token (no word-boundary rule).
  const Ids mid = tok->encode("a<think>b");
  ASSERT_EQ(mid.size(), 3u);
  EXPECT_EQ(mid[1], 128821);
}

TEST(TokenizerReal, RoundTripMixedText) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  const std::string texts[] = {
      "Hello! 毕老师！1 + 1 = 2 ",
      "int main() {\r\n\treturn 0;\r\n}\n\n\n   ",
      "emoji 👩‍👩‍👧‍👦 🇯🇵 👍🏽 and ｜DSML｜ calls",
      "12345678901234567890.5e-10 ١٢٣ Ⅻ",
      "カタカナとひらがな、漢字。한국어 텍스트",
      std::string("nul\0byte", 8),
      "",
  };
  for (const auto& t : texts) {
    const Ids ids = tok->encode(t);
    EXPECT_EQ(tok->decode(ids), t) << t;
  }
}

TEST(TokenizerReal, DigitsSplitInGroupsOfThree) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  // \p{N}{1,3} isolates digit groups, so "1234567" is three pieces: 123 456 7.
  const Ids ids = tok->encode("1234567");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(tok->decode(Ids{ids[0]}), "123");
  EXPECT_EQ(tok->decode(Ids{ids[1]}), "456");
  EXPECT_EQ(tok->decode(Ids{ids[2]}), "7");
}

TEST(TokenizerReal, InvalidUtf8) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  const std::string bad = "ok\xC3(";
  auto checked = tok->encode_checked(bad);
  ASSERT_FALSE(checked.ok());
  EXPECT_NE(checked.status().message().find("byte offset 2"), std::string::npos)
      << checked.status().message();
  // The lenient encode repairs to U+FFFD first.
  EXPECT_EQ(tok->decode(tok->encode(bad)), "ok\xEF\xBF\xBD(");
}

TEST(TokenizerReal, DecodeCheckedRejectsUnknownIds) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  auto r = tok->decode_checked(Ids{30594, 129280});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("129280"), std::string::npos);
  EXPECT_EQ(tok->decode(Ids{30594, 129280, -5}), "你好");
}

}  // namespace
}  // namespace flashseek::tok

namespace flashseek::tok {
namespace {

// encode() is shared by server threads: concurrent calls (sharing the word cache and using
// per-thread PCRE2 state) must give the single-threaded answer.
TEST(TokenizerReal, ConcurrentEncodeMatchesSerial) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  std::string error;
  const auto docs = testing::load_corpus(&error);
  ASSERT_FALSE(docs.empty()) << error;
  std::vector<std::vector<int32_t>> serial;
  for (size_t d = 0; d < docs.size(); d += 5) serial.push_back(tok->encode(docs[d]));
  tok->bpe().clear_cache();
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks the documents in a different order.
      for (size_t k = 0; k < serial.size(); ++k) {
        const size_t i = (k * (2 * t + 1) + static_cast<size_t>(t) * 13) % serial.size();
        if (tok->encode(docs[i * 5]) != serial[i]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace flashseek::tok
