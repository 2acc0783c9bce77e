// BpeModel on synthetic vocabularies: merge order (rank first, leftmost on ties) checked
// against a naive O(n^2) re-implementation on random words, byte table, load errors.
#include <random>
#include <set>

#include <gtest/gtest.h>

#include "tokenizer/bpe.h"
#include "tokenizer/tok_test_util.h"

namespace flashseek::tok {
namespace {

using Ids = std::vector<int32_t>;

struct Synthetic {
  std::vector<std::pair<std::string, int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // ByteLevel strings
  std::vector<std::pair<std::string, std::string>> raw;     // raw bytes
};

std::string level(const std::string& raw) {
  std::string s;
  for (unsigned char c : raw) s += byte_to_unicode(c);
  return s;
}

Synthetic make_synthetic(const std::vector<std::pair<std::string, std::string>>& raw_merges) {
  Synthetic s;
  s.raw = raw_merges;
  std::set<std::string> have;
  for (int b = 0; b < 256; ++b) {
    s.vocab.emplace_back(byte_to_unicode(static_cast<uint8_t>(b)), b);
    have.insert(std::string(1, static_cast<char>(b)));
  }
  for (const auto& [l, r] : raw_merges) {
    s.merges.emplace_back(level(l), level(r));
    if (have.insert(l + r).second) s.vocab.emplace_back(level(l + r), static_cast<int32_t>(s.vocab.size()));
  }
  return s;
}

// Naive BPE: repeatedly merge the adjacent pair of lowest rank, leftmost among equals.
std::vector<std::string> naive_bpe(const std::string& word,
                                   const std::vector<std::pair<std::string, std::string>>& raw) {
  std::vector<std::string> sym;
  for (char c : word) sym.emplace_back(1, c);
  while (true) {
    size_t best_rank = raw.size(), best_pos = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      for (size_t r = 0; r < best_rank; ++r) {
        if (raw[r].first == sym[i] && raw[r].second == sym[i + 1]) {
          best_rank = r;
          best_pos = i;
          break;
        }
      }
    }
    if (best_rank == raw.size()) return sym;
    sym[best_pos] += sym[best_pos + 1];
    sym.erase(sym.begin() + static_cast<long>(best_pos) + 1);
  }
}

TEST(ByteLevel, TableIsABijectionOntoPrintableChars) {
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    const std::string& u = byte_to_unicode(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(u).second) << b;
    EXPECT_EQ(unicode_to_bytes(u), std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(byte_to_unicode(' '), "Ġ");
  EXPECT_EQ(byte_to_unicode('\n'), "Ċ");
  EXPECT_EQ(byte_to_unicode('a'), "a");
  EXPECT_EQ(unicode_to_bytes("Ġhello"), " hello");
  EXPECT_FALSE(unicode_to_bytes("<｜User｜>").has_value());  // ｜ is outside the alphabet
}

TEST(BpeModel, RankOrderAndLeftmostTies) {
  auto s = make_synthetic({{"b", "c"}, {"a", "b"}, {"a", "a"}, {"a", "bc"}});
  auto m = BpeModel::create(s.vocab, s.merges);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  auto encode = [&](const std::string& w) {
    Ids out;
    m->encode_piece(w, out);
    std::vector<std::string> toks;
    for (int32_t id : out) toks.emplace_back(*m->id_to_bytes(id));
    return toks;
  };
  // (b,c) has the lower rank, so "abc" -> a + bc -> abc via (a, bc).
  EXPECT_EQ(encode("abc"), (std::vector<std::string>{"abc"}));
  EXPECT_EQ(encode("ab"), (std::vector<std::string>{"ab"}));
  // Equal rank: leftmost first, so "aaa" -> aa + a.
  EXPECT_EQ(encode("aaa"), (std::vector<std::string>{"aa", "a"}));
  EXPECT_EQ(encode("x"), (std::vector<std::string>{"x"}));
  EXPECT_TRUE(encode("").empty());
}

TEST(BpeModel, MatchesNaiveReferenceOnRandomWords) {
  std::mt19937 rng(1234);
  const std::string alphabet = "abcd \xC3\xA9";  // includes a multi-byte char's bytes
  for (int trial = 0; trial < 20; ++trial) {
    // Random merges built bottom-up so every part exists.
    std::vector<std::string> units;
    for (char c : alphabet) units.emplace_back(1, c);
    std::vector<std::pair<std::string, std::string>> raw;
    std::set<std::pair<std::string, std::string>> used;
    for (int k = 0; k < 40; ++k) {
      const auto& l = units[rng() % units.size()];
      const auto& r = units[rng() % units.size()];
      if (l.size() + r.size() > 6 || !used.insert({l, r}).second) continue;
      raw.emplace_back(l, r);
      units.push_back(l + r);
    }
    auto s = make_synthetic(raw);
    auto m = BpeModel::create(s.vocab, s.merges);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    for (int w = 0; w < 200; ++w) {
      std::string word;
      const int len = 1 + static_cast<int>(rng() % 37);  // odd sizes, up to 37 bytes
      for (int i = 0; i < len; ++i) word += alphabet[rng() % alphabet.size()];
      Ids ids;
      m->encode_piece(word, ids);
      std::vector<std::string> got;
      for (int32_t id : ids) got.emplace_back(*m->id_to_bytes(id));
      ASSERT_EQ(got, naive_bpe(word, raw)) << "trial " << trial << " word '" << word << "'";
    }
    // A second pass hits the word cache and must give the same answer.
    EXPECT_GT(m->cache_size(), 0u);
  }
}

TEST(BpeModel, LongPieceUsesHeapPathCorrectly) {
  auto s = make_synthetic({{" ", " "}, {"  ", "  "}, {"    ", "    "}});
  auto m = BpeModel::create(s.vocab, s.merges);
  ASSERT_TRUE(m.ok());
  const std::string spaces(1001, ' ');
  Ids ids;
  m->encode_piece(spaces, ids);
  // 1001 = 125 * 8 + 1
  ASSERT_EQ(ids.size(), 126u);
  EXPECT_EQ(*m->id_to_bytes(ids[0]), std::string(8, ' '));
  EXPECT_EQ(*m->id_to_bytes(ids.back()), " ");
}

TEST(BpeModel, LoadErrors) {
  auto s = make_synthetic({{"a", "b"}});
  auto missing_byte = s.vocab;
  missing_byte.erase(missing_byte.begin() + 'z');
  auto r1 = BpeModel::create(missing_byte, s.merges);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("0x7A"), std::string::npos) << r1.status().message();

  auto bad_merge = s.merges;
  bad_merge.emplace_back("q", "zz");
  auto r2 = BpeModel::create(s.vocab, bad_merge);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("merges[1]"), std::string::npos) << r2.status().message();

  auto dup_id = s.vocab;
  dup_id.emplace_back("zzz", 5);
  EXPECT_FALSE(BpeModel::create(dup_id, s.merges).ok());
  auto neg = s.vocab;
  neg.emplace_back("neg", -3);
  EXPECT_FALSE(BpeModel::create(neg, s.merges).ok());
}

}  // namespace
}  // namespace flashseek::tok
