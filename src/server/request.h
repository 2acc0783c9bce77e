// OpenAI request bodies (/v1/chat/completions, /v1/completions) parsed and validated into one
// plain struct. Every wrong type or out-of-range value becomes a 400 naming the field; nothing
// here touches the tokenizer or the engine.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/text_port.h"

namespace flashseek::server {

enum class Endpoint { kChat, kCompletions };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  bool stream = false;
  bool include_usage = false;        // stream_options.include_usage
  std::string user;

  // chat
  nlohmann::json messages;           // validated; text parts joined into strings
  ChatOptions chat;

  // completions: exactly one of prompt_text / prompt_ids
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_ids;
  bool echo = false;

  // sampling
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_ids;
  bool ignore_eos = false;
  int64_t logprobs = -1;              // -1: off; K: chosen + top-K
  int64_t prompt_logprobs = -1;
  bool return_token_ids = false;      // vLLM extension: generated ids in each choice
};

struct ParseLimits {
  int64_t vocab_size = 0;             // token ids must be in [0, vocab_size)
  bool default_thinking = false;      // thinking mode when the request does not say
  int64_t max_logprobs = 20;
  size_t max_stops = 16;
  size_t max_stop_bytes = 1024;            // one stop string
  size_t max_json_depth = 64;              // JSON inside strings (tool-call arguments)
  size_t max_messages = 2048;              // messages, and content parts of one message
  size_t max_tools = 256;                  // tools, and tool calls of one message
  size_t max_prompt_bytes = 8u << 20;      // prompt text / all message text (413 beyond)
  size_t max_prompt_ids = size_t(1) << 24; // token-id prompts (the context length)
};

// `body` is the parsed JSON; returns an error naming the field, or nullopt on success.
std::optional<ApiError> parse_request(const nlohmann::json& body, Endpoint endpoint,
                                      const ParseLimits& limits, ParsedRequest& out);

}  // namespace flashseek::server
