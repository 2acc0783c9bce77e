#include "server/tokenizer_adapter.h"

#include "tokenizer/chat_stream.h"
#include "tokenizer/detokenizer.h"

namespace flashseek::server {

Result<std::vector<int32_t>> TokenizerCodec::encode(std::string_view text) const {
  return tok_.encode_checked(text);
}

std::string TokenizerCodec::decode(std::span<const int32_t> ids) const { return tok_.decode(ids); }

std::string TokenizerCodec::token_text(int32_t id) const {
  auto bytes = tok_.token_bytes(id);
  return bytes ? std::string(*bytes) : std::string();
}

namespace {

class Detok : public StreamDecoder {
 public:
  explicit Detok(const tok::Tokenizer& t) : d_(t) {}
  std::string push(int32_t token) override { return d_.feed(token); }
  std::string flush() override { return d_.flush(); }

 private:
  tok::IncrementalDetokenizer d_;
};

class StreamParser : public OutputParser {
 public:
  explicit StreamParser(const tok::ParseOptions& o) : p_(o) {}
  Result<ChatDelta> push(std::string_view text) override {
    tok::ChatDelta d = p_.push(text);
    if (p_.failed()) {
      auto st = p_.finish();
      return st.ok() ? Status(StatusCode::kParseError, "model output is not well-formed")
                     : st.status();
    }
    return convert(d);
  }
  Result<ChatDelta> finish() override {
    tok::ChatDelta tail;
    auto parsed = p_.finish(&tail);
    if (!parsed.ok()) return parsed.status();
    return convert(tail);
  }

 private:
  static ChatDelta convert(const tok::ChatDelta& d) {
    ChatDelta out;
    out.reasoning = d.reasoning_content;
    out.content = d.content;
    for (const auto& tc : d.tool_calls)
      out.tool_calls.push_back({int(tc.index), tc.id, tc.name, tc.arguments});
    return out;
  }
  tok::ChatStreamParser p_;
};

}  // namespace

std::unique_ptr<StreamDecoder> TokenizerCodec::stream_decoder() const {
  return std::make_unique<Detok>(tok_);
}

Result<std::string> DeepSeekChat::render(const nlohmann::json& messages,
                                         ChatOptions& options) const {
  // Re-read the body with key order kept: tool schemas are rendered as JSON text.
  tok::ChatJson request;
  if (!options.raw_request.empty()) {
    request = tok::ChatJson::parse(options.raw_request, nullptr, false);
    if (request.is_discarded() || !request.is_object())
      return invalid_argument("request body: not a JSON object");
  } else {
    request = tok::to_chat_json({{"messages", messages},
                                 {"thinking", {{"type", options.thinking ? "enabled"
                                                                         : "disabled"}}}});
    if (options.tools.is_array()) request["tools"] = tok::to_chat_json(options.tools);
  }
  FS_ASSIGN_OR_RETURN(auto enc, tok::encode_chat_request(request, options_));
  options.thinking = enc.chat_options.thinking_mode == tok::ThinkingMode::kThinking;
  return std::move(enc.encoded.prompt);
}

std::unique_ptr<OutputParser> DeepSeekChat::parser(const ChatOptions& options) const {
  tok::ParseOptions po;
  po.family = options_.family;
  po.thinking_mode = options.thinking ? tok::ThinkingMode::kThinking : tok::ThinkingMode::kChat;
  po.strict = false;  // max_tokens may cut the text anywhere
  po.tool_call_id_seed = call_seed_.fetch_add(0x9e3779b97f4a7c15ull);
  return std::make_unique<StreamParser>(po);
}

}  // namespace flashseek::server
