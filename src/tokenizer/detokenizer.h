// Streaming detokenizer: feed generated ids one at a time and get back only complete UTF-8
// text, so a multi-byte character split across tokens is never sent half-way to a client.
// Invariant (tested): concat(feed(ids[0..n))) + flush() == Tokenizer::decode(ids).
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace flashseek::tok {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer) : tokenizer_(&tokenizer) {}

  // Text that became complete with `id` (often empty, e.g. inside a multi-byte character).
  // Bytes that can never become valid are emitted as U+FFFD right away. Unknown ids are
  // ignored (they decode to nothing, as in Tokenizer::decode).
  std::string feed(int32_t id);
  // Emits what is still held back (an incomplete character becomes U+FFFD) and resets.
  std::string flush();
  // Drops held-back bytes without emitting them.
  void reset() { pending_.clear(); }

  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  std::string pending_;  // at most 3 bytes: an incomplete UTF-8 sequence
};

}  // namespace flashseek::tok
