// Byte-level BPE model (GPT-2 ByteLevel alphabet + ranked merges), as in HF tokenizers' `BPE`
// with no unk token, no byte fallback, no dropout and no subword prefixes/suffixes.
//
// Internally everything works on raw bytes: each byte of a pre-tokenized piece starts as the id
// of its ByteLevel character, then the lowest-rank adjacent pair is merged repeatedly (leftmost
// first on ties), exactly HF's `merge_word` order. Token strings from the vocab (ByteLevel
// alphabet) are converted to raw bytes once at load, for decoding.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace flashseek::tok {

// GPT-2 ByteLevel mapping: byte -> UTF-8 of its printable stand-in character (e.g. ' ' -> "Ġ").
const std::string& byte_to_unicode(uint8_t byte);
// Inverse mapping of a whole token string; nullopt if a character is outside the alphabet.
std::optional<std::string> unicode_to_bytes(std::string_view token);

class WordCache;  // thread-safe cache of piece -> ids (bpe.cpp)

class BpeModel {
 public:
  // `vocab`: (token string in the ByteLevel alphabet, id); `merges`: pairs in rank order.
  // Every merge's parts and concatenation must be in the vocab, and the vocab must hold all
  // 256 single-byte tokens (there is no unk/byte fallback to absorb a missing byte).
  static Result<BpeModel> create(const std::vector<std::pair<std::string, int32_t>>& vocab,
                                 const std::vector<std::pair<std::string, std::string>>& merges);

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of one pre-tokenized piece (raw bytes, any content).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  // Vocab lookups (ByteLevel-alphabet strings). -1 / empty optional when absent.
  int32_t token_to_id(std::string_view token) const;
  std::optional<std::string_view> id_to_token(int32_t id) const;
  // Raw bytes of a vocab token (what it decodes to); nullopt for ids outside the vocab.
  std::optional<std::string_view> id_to_bytes(int32_t id) const;

  int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }  // max id + 1
  size_t vocab_entries() const { return token_ids_.size(); }
  size_t merge_count() const { return merges_.size(); }

  // Word-cache statistics (for tests and the benchmark).
  size_t cache_size() const;
  void clear_cache() const;

 private:
  BpeModel();
  void merge_symbols(std::vector<int32_t>& ids) const;

  struct MergeTarget {
    int32_t rank;
    int32_t new_id;
  };
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_ids_;
  std::vector<std::string> tokens_;      // [id_limit] ByteLevel string ("" for holes)
  std::vector<std::string> bytes_;       // [id_limit] raw bytes
  std::vector<uint8_t> present_;         // [id_limit] 1 when the id is in the vocab
  std::unordered_map<uint64_t, MergeTarget> merges_;  // (left id << 32 | right id) -> target
  int32_t byte_ids_[256] = {};
  std::unique_ptr<WordCache> cache_;
};

}  // namespace flashseek::tok
