// DeepSeek byte-level BPE tokenizer (V3 vocab/merges/regex, V4.1 added tokens; spec
// model-v41.md §7.1-7.2). Loaded from an HF tokenizer.json; the added-token table can be
// replaced by the V4.1 one (data/tokenizer/v41_added_tokens.json).
//
// encode(): split the text on added-token strings first (leftmost-longest), then pre-tokenize and
// BPE the gaps. BOS is never added implicitly: the chat encoder writes it as text.
// decode(): concatenates token bytes (added tokens are kept as their text) and repairs invalid
// UTF-8 with U+FFFD, as HF's decode with skip_special_tokens=false.
// All const methods are thread-safe (the word cache is internally locked).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"

namespace flashseek::tok {

struct TokenizerOptions {
  // JSON file whose "added_tokens" replace the tokenizer.json's own table (the V4.1 table lives
  // in data/tokenizer/v41_added_tokens.json). Empty: keep the file's table.
  std::string added_tokens_path;
};

class Tokenizer {
 public:
  static Result<Tokenizer> load(const std::string& tokenizer_json_path,
                                const TokenizerOptions& options = {});
  // `where` names the source in error messages; `added_override` replaces j["added_tokens"].
  static Result<Tokenizer> from_json(const nlohmann::json& j, const std::string& where,
                                     const std::vector<AddedToken>* added_override = nullptr);

  // Token ids of `text`. Invalid UTF-8 is first repaired (U+FFFD per ill-formed subsequence);
  // use encode_checked to reject it instead.
  std::vector<int32_t> encode(std::string_view text) const;
  // Fails with kInvalidArgument (naming the byte offset) on invalid UTF-8.
  Result<std::vector<int32_t>> encode_checked(std::string_view text) const;

  // Text of `ids`, added tokens included; invalid UTF-8 (a sequence cut between tokens) becomes
  // U+FFFD. Ids outside the vocabulary are skipped; use decode_checked to reject them.
  std::string decode(std::span<const int32_t> ids) const;
  Result<std::string> decode_checked(std::span<const int32_t> ids) const;
  // Raw concatenated bytes (no UTF-8 repair), unknown ids skipped.
  std::string decode_bytes(std::span<const int32_t> ids) const;

  // Vocab or added-token string -> id (added tokens first). nullopt when unknown.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Id -> token string as stored (ByteLevel alphabet for BPE tokens, text for added tokens).
  // The view lives as long as the Tokenizer.
  std::optional<std::string_view> id_to_token(int32_t id) const;
  // Id -> the bytes it decodes to; nullopt when unknown. Lives as long as the Tokenizer.
  std::optional<std::string_view> token_bytes(int32_t id) const;

  int32_t vocab_size() const { return vocab_size_; }  // max id + 1 (129280 for V4.1)
  bool is_valid_id(int32_t id) const;
  bool is_added_token(int32_t id) const { return added_.by_id(id) != nullptr; }
  const std::vector<AddedToken>& added_tokens() const { return added_.tokens(); }
  const BpeModel& bpe() const { return bpe_; }
  const PreTokenizer& pre_tokenizer() const { return pre_; }

 private:
  Tokenizer(BpeModel bpe, PreTokenizer pre, AddedTokenMatcher added);
  Status encode_valid(std::string_view text, bool strict, std::vector<int32_t>& out) const;
  void build_id_tables();

  BpeModel bpe_;
  PreTokenizer pre_;
  AddedTokenMatcher added_;
  int32_t vocab_size_ = 0;
  // Decoded bytes of every id packed in one string (robust to copies/moves of the Tokenizer):
  // token `id` is all_bytes_[offsets_[id], offsets_[id + 1]).
  std::string all_bytes_;
  std::vector<uint32_t> offsets_;  // [vocab_size + 1]
  std::vector<uint8_t> valid_;     // [vocab_size]
};

}  // namespace flashseek::tok
