// Building OpenAI response objects (chat.completion, chat.completion.chunk, text_completion)
// from generation steps. Pure functions of their inputs; no I/O.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/backend.h"
#include "server/generation.h"
#include "server/text_port.h"

namespace flashseek::server {

struct ResponseMeta {
  std::string id;       // "chatcmpl-..." / "cmpl-..."
  std::string model;
  int64_t created = 0;  // unix seconds
};

nlohmann::json usage_json(const Usage& usage);

// {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}
nlohmann::json chat_logprobs_json(const TextCodec& codec, std::span<const PositionLogprobs> lps);

// Completions form: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; entries of
// `lps` may be empty (the first prompt token when echoing) and become nulls.
nlohmann::json completion_logprobs_json(const TextCodec& codec, std::span<const int32_t> tokens,
                                        std::span<const std::optional<PositionLogprobs>> lps,
                                        int64_t first_offset);

// vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]
nlohmann::json prompt_logprobs_json(const TextCodec& codec, std::span<const int32_t> prompt,
                                    std::span<const std::optional<PositionLogprobs>> lps);

// The delta object of one streamed chat chunk ("role" only on the first one).
nlohmann::json chat_delta_json(const ChatDelta& delta, bool first);

nlohmann::json chat_chunk(const ResponseMeta& meta, nlohmann::json delta,
                          const std::string& finish_reason, nlohmann::json logprobs);

// Accumulates streamed tool-call deltas into complete OpenAI tool_calls entries.
void merge_tool_calls(nlohmann::json& calls, const std::vector<ToolCallDelta>& deltas);

}  // namespace flashseek::server
