// UTF-8 repair (Unicode §3.9 maximal subparts) and the streaming detokenizer.
#include <random>

#include <gtest/gtest.h>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tok_test_util.h"
#include "tokenizer/tokenizer_utf8.h"

namespace flashseek::tok {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, StepClassification) {
  EXPECT_EQ(utf8_step("a").kind, Utf8Kind::kValid);
  EXPECT_EQ(utf8_step("\xE4\xBD\xA0").length, 3u);
  EXPECT_EQ(utf8_step("\xE4\xBD").kind, Utf8Kind::kIncomplete);
  EXPECT_EQ(utf8_step("\xC0\x80").kind, Utf8Kind::kInvalid);      // overlong lead
  EXPECT_EQ(utf8_step("\xED\xA0\x80").kind, Utf8Kind::kInvalid);  // surrogate
  EXPECT_EQ(utf8_step("\xED\xA0\x80").length, 1u);
  EXPECT_EQ(utf8_step("\xF4\x90\x80\x80").kind, Utf8Kind::kInvalid);  // > U+10FFFF
  EXPECT_EQ(utf8_step("\xF0\x9F\x98").kind, Utf8Kind::kIncomplete);
  EXPECT_EQ(utf8_step("\xF0\x9F\x98x").kind, Utf8Kind::kInvalid);
  EXPECT_EQ(utf8_step("\xF0\x9F\x98x").length, 3u);
  EXPECT_EQ(utf8_step("\x80").kind, Utf8Kind::kInvalid);
}

TEST(Utf8, LossyFollowsUnicodeTable3_8) {
  // The example of Unicode 15 §3.9 (Table 3-8): 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  EXPECT_EQ(utf8_lossy(in), "a" + kFFFD + kFFFD + kFFFD + "b" + kFFFD + "c" + kFFFD + kFFFD + "d");
  EXPECT_EQ(utf8_first_invalid(in), 1u);
  EXPECT_FALSE(utf8_first_invalid("héllo 你好 😀").has_value());
  EXPECT_EQ(utf8_lossy("ab\xE4\xBD"), "ab" + kFFFD);  // truncated tail is one subpart
}

TEST(Utf8, ChunkedLossyEqualsWholeLossy) {
  std::mt19937 rng(7);
  const std::string pieces[] = {"a", "\xE4", "\xBD", "\xA0", "\xF0\x9F", "\x98\x80", "\xC3",
                                "\xA9", "\x80", "\xFF", "\xED\xA0", "z"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string all;
    std::vector<std::string> chunks;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 23); k < n; ++k) {
      chunks.push_back(pieces[rng() % std::size(pieces)]);
      all += chunks.back();
    }
    std::string out, pending;
    for (const auto& c : chunks) {
      pending += c;
      std::string part;
      pending.erase(0, utf8_lossy_append(pending, false, part));
      EXPECT_TRUE(utf8_is_valid(part));
      out += part;
    }
    utf8_lossy_append(pending, true, out);
    ASSERT_EQ(out, utf8_lossy(all)) << "trial " << trial;
  }
}

TEST(Utf8, EncodeCodePoints) {
  EXPECT_EQ(utf8_encode(0x41), "A");
  EXPECT_EQ(utf8_encode(0xE9), "\xC3\xA9");
  EXPECT_EQ(utf8_encode(0x4F60), "\xE4\xBD\xA0");
  EXPECT_EQ(utf8_encode(0x1F600), "\xF0\x9F\x98\x80");
}

TEST(IncrementalDetokenizer, StreamEqualsDecodeOnRandomIds) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  std::mt19937 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 30); k < n; ++k) {
      // Mostly byte tokens (ids 3..258 hold the 256 ByteLevel chars) to split characters.
      ids.push_back(rng() % 3 == 0 ? static_cast<int32_t>(rng() % 129280)
                                   : static_cast<int32_t>(3 + rng() % 256));
    }
    IncrementalDetokenizer detok(*tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = detok.feed(id);
      ASSERT_TRUE(utf8_is_valid(part));
      EXPECT_LE(detok.pending_bytes(), 3u);
      streamed += part;
    }
    streamed += detok.flush();
    EXPECT_EQ(detok.pending_bytes(), 0u);
    ASSERT_EQ(streamed, tok->decode(ids)) << "trial " << trial;
  }
}

TEST(IncrementalDetokenizer, HoldsBackSplitCharacterUntilComplete) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  // "😀" is F0 9F 98 80; feed it as four single-byte tokens.
  std::vector<int32_t> ids;
  for (unsigned char b : std::string("\xF0\x9F\x98\x80")) {
    ids.push_back(*tok->token_to_id(byte_to_unicode(b)));
  }
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.feed(ids[0]), "");
  EXPECT_EQ(detok.feed(ids[1]), "");
  EXPECT_EQ(detok.feed(ids[2]), "");
  EXPECT_EQ(detok.feed(ids[3]), "😀");
  EXPECT_EQ(detok.flush(), "");
  // An incomplete character at the end becomes U+FFFD on flush.
  EXPECT_EQ(detok.feed(ids[0]), "");
  EXPECT_EQ(detok.flush(), kFFFD);
  // Unknown ids produce nothing.
  EXPECT_EQ(detok.feed(-1), "");
  EXPECT_EQ(detok.feed(1 << 30), "");
}

TEST(IncrementalDetokenizer, StreamsCorpusDocumentsExactly) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  std::string error;
  const auto docs = testing::load_corpus(&error);
  ASSERT_FALSE(docs.empty()) << error;
  for (size_t d = 0; d < docs.size(); d += 7) {
    IncrementalDetokenizer detok(*tok);
    std::string out;
    for (int32_t id : tok->encode(docs[d])) out += detok.feed(id);
    out += detok.flush();
    ASSERT_EQ(out, docs[d]) << "doc " << d;
  }
}

}  // namespace
}  // namespace flashseek::tok
