#include "tokenizer/tokenizer.h"

#include "tokenizer/tokenizer_utf8.h"

namespace flashseek::tok {

Tokenizer::Tokenizer(BpeModel bpe, PreTokenizer pre, AddedTokenMatcher added)
    : bpe_(std::move(bpe)), pre_(std::move(pre)), added_(std::move(added)) {
  build_id_tables();
}

void Tokenizer::build_id_tables() {
  vocab_size_ = bpe_.id_limit();
  for (const AddedToken& t : added_.tokens()) vocab_size_ = std::max(vocab_size_, t.id + 1);
  offsets_.assign(static_cast<size_t>(vocab_size_) + 1, 0);
  valid_.assign(static_cast<size_t>(vocab_size_), 0);
  all_bytes_.clear();
  for (int32_t id = 0; id < vocab_size_; ++id) {
    offsets_[id] = static_cast<uint32_t>(all_bytes_.size());
    if (const AddedToken* t = added_.by_id(id)) {
      all_bytes_ += t->content;  // added tokens decode to their own text
      valid_[id] = 1;
    } else if (auto bytes = bpe_.id_to_bytes(id)) {
      all_bytes_ += *bytes;
      valid_[id] = 1;
    }
  }
  offsets_[vocab_size_] = static_cast<uint32_t>(all_bytes_.size());
}

bool Tokenizer::is_valid_id(int32_t id) const {
  return id >= 0 && id < vocab_size_ && valid_[id];
}

std::optional<std::string_view> Tokenizer::token_bytes(int32_t id) const {
  if (!is_valid_id(id)) return std::nullopt;
  return std::string_view(all_bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
}

Status Tokenizer::encode_valid(std::string_view text, bool strict,
                               std::vector<int32_t>& out) const {
  std::vector<std::string_view> pieces;
  auto encode_gap = [&](std::string_view gap) -> Status {
    if (gap.empty()) return Status::ok_status();
    pieces.clear();
    Status st = pre_.split(gap, pieces);
    if (!st.ok()) {
      if (strict) return st;
      // Only a PCRE2 resource limit gets here; keep going with the gap as one piece.
      pieces.assign(1, gap);
    }
    for (std::string_view piece : pieces) bpe_.encode_piece(piece, out);
    return Status::ok_status();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    auto match = added_.find(text, pos);
    const size_t gap_end = match ? match->pos : text.size();
    FS_RETURN_IF_ERROR(encode_gap(text.substr(pos, gap_end - pos)));
    if (!match) break;
    out.push_back(match->id);
    pos = match->pos + match->len;
  }
  return Status::ok_status();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (utf8_is_valid(text)) {
    (void)encode_valid(text, /*strict=*/false, out);
  } else {
    const std::string repaired = utf8_lossy(text);
    (void)encode_valid(repaired, /*strict=*/false, out);
  }
  return out;
}

Result<std::vector<int32_t>> Tokenizer::encode_checked(std::string_view text) const {
  if (auto bad = utf8_first_invalid(text)) {
    return invalid_argument("text is not valid UTF-8 at byte offset {} (byte 0x{:02X})", *bad,
                            static_cast<unsigned char>(text[*bad]));
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  FS_RETURN_IF_ERROR(encode_valid(text, /*strict=*/true, out));
  return out;
}

std::string Tokenizer::decode_bytes(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (auto b = token_bytes(id)) out += *b;
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  return utf8_lossy(decode_bytes(ids));
}

Result<std::string> Tokenizer::decode_checked(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!is_valid_id(ids[i])) {
      return out_of_range("token id {} at position {} is not in the vocabulary (size {})", ids[i],
                          i, vocab_size_);
    }
  }
  return decode(ids);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.id_of(token)) return id;
  const int32_t id = bpe_.token_to_id(token);
  if (id < 0) return std::nullopt;
  return id;
}

std::optional<std::string_view> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* t = added_.by_id(id)) return std::string_view(t->content);
  return bpe_.id_to_token(id);
}

}  // namespace flashseek::tok
