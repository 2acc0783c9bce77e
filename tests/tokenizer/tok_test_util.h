// Shared helpers for the tokenizer tests: the real V4.1 tokenizer (loaded once, skipped with a
// visible message when scripts/fetch_tokenizer.sh has not been run) and file paths.
#pragma once
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

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

// Skips the test (visibly) when models/tokenizer/tokenizer.json is absent.
#define FS_REQUIRE_REAL_TOKENIZER(var)                                                    \
  std::string _fs_why;                                                                    \
  const ::flashseek::tok::Tokenizer* var = ::flashseek::tok::testing::real_tokenizer(&_fs_why); \
  if (var == nullptr) GTEST_SKIP() << "tokenizer data missing (run scripts/fetch_tokenizer.sh): " << _fs_why
