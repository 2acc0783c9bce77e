// The ports between the HTTP layer and text handling: token ids <-> text (the BPE tokenizer) and
// chat messages -> prompt / generated text -> reasoning, content, tool calls (the chat encoder
// and output parser). Adapters to the real tokenizer live in tokenizer_adapter.h; tests use
// small fakes.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace flashseek::server {

// Turns a token stream into text pieces; holds back bytes of an incomplete UTF-8 sequence.
class StreamDecoder {
 public:
  virtual ~StreamDecoder() = default;
  virtual std::string push(int32_t token) = 0;
  virtual std::string flush() = 0;  // whatever is still held back (may be invalid UTF-8)
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // Added/special tokens written as text are matched as such; no BOS is added.
  virtual Result<std::vector<int32_t>> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual std::string token_text(int32_t id) const = 0;  // one token's text (may be partial UTF-8)
  virtual std::unique_ptr<StreamDecoder> stream_decoder() const = 0;
};

struct ChatOptions {
  bool thinking = false;         // thinking mode (prompt ends with <think>)
  std::string reasoning_effort;  // "" (default), "low", "high", "max", or a number 1-100
  nlohmann::json tools;          // null or the OpenAI tools array
  nlohmann::json tool_choice;    // null, "auto", "none", "required" or {"type":"function",...}
  // The request body as received: encoders that must keep the client's key order (tool schemas
  // are rendered as JSON text) re-read it instead of `messages` / `tools`.
  std::string raw_request;
};

struct ToolCallDelta {
  int index = 0;           // position among the response's tool calls
  std::string id;          // set on the first delta of a call
  std::string name;        // set on the first delta of a call
  std::string arguments;   // fragment of the JSON arguments
};

struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Splits generated text into reasoning / content / tool calls as it streams.
class OutputParser {
 public:
  virtual ~OutputParser() = default;
  virtual Result<ChatDelta> push(std::string_view text) = 0;
  // End of generation: releases held-back text and checks that tool calls are complete.
  virtual Result<ChatDelta> finish() = 0;
};

class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  // OpenAI `messages` -> prompt text (with BOS). Errors name the offending message/field. May
  // correct `options.thinking` when the encoder decides the mode from fields of its own.
  virtual Result<std::string> render(const nlohmann::json& messages,
                                     ChatOptions& options) const = 0;
  virtual std::unique_ptr<OutputParser> parser(const ChatOptions& options) const = 0;
};

}  // namespace flashseek::server
