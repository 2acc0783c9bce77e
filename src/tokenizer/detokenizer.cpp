#include "tokenizer/detokenizer.h"

#include "tokenizer/tokenizer_utf8.h"

namespace flashseek::tok {

std::string IncrementalDetokenizer::feed(int32_t id) {
  auto bytes = tokenizer_->token_bytes(id);
  if (!bytes || bytes->empty()) return {};
  pending_.append(*bytes);
  std::string out;
  const size_t used = utf8_lossy_append(pending_, /*final=*/false, out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out;
  utf8_lossy_append(pending_, /*final=*/true, out);
  pending_.clear();
  return out;
}

}  // namespace flashseek::tok
