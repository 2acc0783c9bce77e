// Added (special) tokens: strings that are matched verbatim in the input before any BPE, and
// always map to one id. Matching is leftmost-longest over all added strings (spec §7.1), done
// with a byte trie.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace flashseek::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
};

// Parses a JSON array of {"id": int, "content": str, ...} objects (extra keys are ignored, so
// the `added_tokens` array of an HF tokenizer.json works too). `where` names the source in
// error messages.
Result<std::vector<AddedToken>> parse_added_tokens(const nlohmann::json& array,
                                                   const std::string& where);

// Loads data/tokenizer/v41_added_tokens.json-style files ({"added_tokens": [...]}) or an HF
// tokenizer.json (its "added_tokens" key).
Result<std::vector<AddedToken>> load_added_tokens_file(const std::string& path);

class AddedTokenMatcher {
 public:
  struct Match {
    size_t pos;  // byte offset in the searched text
    size_t len;  // byte length of the matched token string
    int32_t id;
  };

  // Rejects empty strings, duplicate ids and duplicate strings.
  static Result<AddedTokenMatcher> create(std::vector<AddedToken> tokens);
  AddedTokenMatcher() = default;

  // Leftmost match starting at or after `from`; among matches at that position the longest.
  std::optional<Match> find(std::string_view text, size_t from) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  std::optional<int32_t> id_of(std::string_view content) const;
  const AddedToken* by_id(int32_t id) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node index), sorted by byte
    int32_t token = -1;                                  // index into tokens_, -1 if none
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<AddedToken> tokens_;  // sorted by id
  std::vector<Node> nodes_;         // nodes_[0] is the root
  bool first_byte_[256] = {};       // bytes that can start a token (fast skip)
};

}  // namespace flashseek::tok
