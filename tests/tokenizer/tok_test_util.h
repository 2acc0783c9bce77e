// Shared helpers for the tokenizer tests: the real V4.1 tokenizer (loaded once, skipped with a
// visible message when scripts/fetch_tokenizer.sh has not been run, a failure under CI=true) and
// file paths.
#pragma once
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "test_util.h"  // FS_SKIP_UNLESS_CI
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_locate.h"

namespace flashseek::tok::testing {

inline std::string source_path(const std::string& rel) {
  return std::string(FLASHSEEK_SOURCE_DIR) + "/" + rel;
}

// nullptr (and the reason in *why) when the tokenizer files are missing.
inline const Tokenizer* real_tokenizer(std::string* why) {
  static std::unique_ptr<Tokenizer> tok;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    auto r = load_v41_tokenizer(source_path("models/tokenizer/tokenizer.json"),
                                source_path("data/tokenizer/v41_added_tokens.json"));
    if (r.ok()) {
      tok = std::make_unique<Tokenizer>(std::move(r).value());
    } else {
      error = r.status().to_string();
    }
  }
  if (why) *why = error;
  return tok.get();
}

// A small tokenizer.json in the DeepSeek layout: the 256 ByteLevel byte tokens (ids 0..255 in
// byte order), then one token per merge (ids 256..), the DeepSeek pre-tokenizer, and
// `added` as its added_tokens. Merges are raw-byte pairs, converted to the ByteLevel alphabet.
inline nlohmann::json tiny_tokenizer_json(
    const std::vector<std::pair<std::string, std::string>>& byte_merges,
    const nlohmann::json& added = nlohmann::json::array()) {
  auto level = [](const std::string& raw) {
    std::string s;
    for (unsigned char c : raw) s += byte_to_unicode(c);
    return s;
  };
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_unicode(static_cast<uint8_t>(b))] = b;
  nlohmann::json merges = nlohmann::json::array();
  int next_id = 256;
  for (const auto& [l, r] : byte_merges) {
    merges.push_back(level(l) + " " + level(r));
    if (!vocab.contains(level(l + r))) vocab[level(l + r)] = next_id++;
  }
  nlohmann::json pre = nlohmann::json::array();
  for (const auto& p : PreTokenizer::deepseek_patterns()) {
    pre.push_back({{"type", "Split"}, {"pattern", {{"Regex", p}}}, {"behavior", "Isolated"},
                   {"invert", false}});
  }
  pre.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                 {"use_regex", false}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}}},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", pre}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
            {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}}}};
}

// The committed parity corpus: one JSON string (a document) per line. Empty on failure.
inline std::vector<std::string> load_corpus(std::string* error) {
  const std::string path = source_path("tests/tokenizer/corpus/corpus.jsonl");
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> docs;
  if (!in) {
    *error = "cannot open " + path;
    return docs;
  }
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    docs.push_back(nlohmann::json::parse(line).get<std::string>());
  }
  return docs;
}

}  // namespace flashseek::tok::testing

// Skips the test (visibly) when models/tokenizer/tokenizer.json is absent; fails it under CI=true.
#define FS_REQUIRE_REAL_TOKENIZER(var)                                                    \
  std::string _fs_why;                                                                    \
  const ::flashseek::tok::Tokenizer* var = ::flashseek::tok::testing::real_tokenizer(&_fs_why); \
  if (var == nullptr) FS_SKIP_UNLESS_CI("tokenizer data missing (run scripts/fetch_tokenizer.sh): " << _fs_why)
