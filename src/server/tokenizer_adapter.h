// The text ports backed by the real DeepSeek tokenizer, chat encoder and streaming output
// parser (src/tokenizer).
#pragma once
#include <atomic>

#include "server/text_port.h"
#include "tokenizer/chat_request.h"
#include "tokenizer/tokenizer.h"

namespace flashseek::server {

class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(const tok::Tokenizer& tokenizer) : tok_(tokenizer) {}
  // Invalid UTF-8 is rejected (400 naming the byte offset), not repaired.
  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_text(int32_t id) const override;
  std::unique_ptr<StreamDecoder> stream_decoder() const override;

 private:
  const tok::Tokenizer& tok_;
};

class DeepSeekChat : public ChatFormat {
 public:
  explicit DeepSeekChat(tok::ChatRequestOptions options) : options_(std::move(options)) {}
  Result<std::string> render(const nlohmann::json& messages, ChatOptions& options) const override;
  std::unique_ptr<OutputParser> parser(const ChatOptions& options) const override;

 private:
  tok::ChatRequestOptions options_;
  mutable std::atomic<uint64_t> call_seed_{0x5eed};
};

}  // namespace flashseek::server
