// An HTTP request body of /v1/chat/completions or /v1/completions, through what the server does
// before the engine sees it (server/api_handlers.cpp validate + the tokenizer adapter): the JSON
// bounds scan, the parse, the OpenAI field validation for both endpoints and, for a valid chat
// request, the V4.1 and V4 chat encoders and the tokenizer. A refusal must be a 4xx error object
// with a message; an accepted prompt must tokenise and decode back to its own text.
#include <nlohmann/json.hpp>

#include "core/json_limits.h"
#include "fuzz/targets.h"
#include "server/request.h"
#include "tokenizer/chat_request.h"
#include "tokenizer/tokenizer.h"

namespace flashseek::fuzz {

namespace {

// Prompts up to this size are tokenised (BPE of megabytes per input would slow the campaign
// without reaching new code).
constexpr size_t kMaxTokenised = 1 << 16;

void check_round_trip(const std::string& prompt) {
  if (prompt.size() > kMaxTokenised) return;
  const auto ids = v41_tokenizer().encode(prompt);
  FUZZ_CHECK(v41_tokenizer().decode(ids) == prompt, "decode(encode(prompt)) differs from the prompt");
}

}  // namespace

bool run_request(std::span<const uint8_t> d) {
  const std::string body(as_text(d));
  JsonLimits jl;  // the server's defaults
  if (scan_json(body, jl) != JsonScan::kOk) return false;
  const nlohmann::json parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_discarded()) return false;
  server::ParseLimits limits;
  limits.vocab_size = 129280;
  limits.max_prompt_ids = 1 << 20;
  bool accepted = false;
  for (auto endpoint : {server::Endpoint::kChat, server::Endpoint::kCompletions}) {
    server::ParsedRequest req;
    if (auto err = server::parse_request(parsed, endpoint, limits, req)) {
      FUZZ_CHECK(err->http_status >= 400 && err->http_status < 500,
                 "parse_request answered HTTP " + std::to_string(err->http_status));
      FUZZ_CHECK(!err->message.empty(), "an error without a message");
      (void)err->body();
      continue;
    }
    accepted = true;
    if (endpoint == server::Endpoint::kCompletions) {
      if (req.prompt_text) check_round_trip(*req.prompt_text);
      if (req.prompt_ids)
        for (int32_t id : *req.prompt_ids) FUZZ_CHECK(id >= 0 && id < limits.vocab_size, "prompt id out of range");
      continue;
    }
    const tok::ChatJson chat = tok::ChatJson::parse(body, nullptr, false);
    FUZZ_CHECK(!chat.is_discarded() && chat.is_object(), "valid body does not re-read as ChatJson");
    for (auto family : {tok::ChatFamily::kV41, tok::ChatFamily::kV4}) {
      tok::ChatRequestOptions o;
      o.family = family;
      o.thinking_by_default = req.model.size() % 2 == 1;  // both defaults over the corpus
      auto enc = tok::encode_chat_request(chat, o);
      if (enc.ok()) check_round_trip(enc->encoded.prompt);
    }
  }
  return accepted;
}

std::vector<Bytes> seeds_request() {
  return {
      to_bytes(R"({"model":"m","messages":[{"role":"user","content":"Hello, 世界"}]})"),
      to_bytes(R"({"model":"m","stream":true,"max_tokens":16,"temperature":0.7,"top_p":0.9,"stop":["\n\n","END"],)"
               R"("messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"hi"}]}]})"),
      to_bytes(R"({"model":"m","thinking":{"type":"enabled"},"reasoning_effort":"high","messages":[)"
               R"({"role":"user","content":"Weather?"},)"
               R"({"role":"assistant","content":null,"reasoning_content":"look it up","tool_calls":[{"id":"call_1","type":"function",)"
               R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"days\":2}"}}]},)"
               R"({"role":"tool","tool_call_id":"call_1","content":"sunny"}],)"
               R"("tools":[{"type":"function","function":{"name":"get_weather","description":"d",)"
               R"("parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}}],)"
               R"("tool_choice":"auto","response_format":{"type":"text"}})"),
      to_bytes(R"({"model":"m","prompt":"Once upon a time","max_tokens":8,"logprobs":3,"echo":true})"),
      to_bytes(R"({"model":"m","prompt":[1,2,3,4],"max_tokens":4,"return_token_ids":true,"seed":42})"),
      to_bytes(R"({"model":"m","chat_template_kwargs":{"enable_thinking":true},"messages":[{"role":"user","content":"<｜end▁of▁sentence｜>"}],"logprobs":true,"top_logprobs":5})"),
  };
}

}  // namespace flashseek::fuzz
