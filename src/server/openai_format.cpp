#include "server/openai_format.h"

#include <algorithm>

namespace flashseek::server {

using json = nlohmann::json;

json usage_json(const Usage& usage) {
  json u = {{"prompt_tokens", usage.prompt_tokens},
            {"completion_tokens", usage.completion_tokens},
            {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
  // flashseek extension (docs/speculative.md): only when the request ran speculative steps.
  if (usage.spec_steps > 0)
    u["speculative"] = {{"verify_steps", usage.spec_steps},
                        {"tokens", usage.spec_tokens},
                        {"mean_tokens_per_step", double(usage.spec_tokens) / double(usage.spec_steps)}};
  return u;
}

namespace {

json bytes_of(const std::string& s) {
  json out = json::array();
  for (unsigned char c : s) out.push_back(int(c));
  return out;
}

json chat_token_json(const TextCodec& codec, const TokenLogprob& t) {
  const std::string text = codec.token_text(t.id);
  return {{"token", text}, {"logprob", t.logprob}, {"bytes", bytes_of(text)}};
}

}  // namespace

json chat_logprobs_json(const TextCodec& codec, std::span<const PositionLogprobs> lps) {
  json content = json::array();
  for (const auto& lp : lps) {
    json entry = chat_token_json(codec, lp.chosen);
    json top = json::array();
    for (const auto& t : lp.top) top.push_back(chat_token_json(codec, t));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

json completion_logprobs_json(const TextCodec& codec, std::span<const int32_t> tokens,
                              std::span<const std::optional<PositionLogprobs>> lps,
                              int64_t first_offset) {
  json toks = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  int64_t offset = first_offset;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string text = codec.token_text(tokens[i]);
    toks.push_back(text);
    offsets.push_back(offset);
    offset += int64_t(text.size());
    if (i < lps.size() && lps[i]) {
      token_lps.push_back(lps[i]->chosen.logprob);
      json top = json::object();
      for (const auto& t : lps[i]->top) {
        const std::string key = codec.token_text(t.id);
        if (!top.contains(key)) top[key] = t.logprob;  // keys collide only for odd byte tokens
      }
      tops.push_back(std::move(top));
    } else {
      token_lps.push_back(nullptr);
      tops.push_back(nullptr);
    }
  }
  return {{"tokens", toks}, {"token_logprobs", token_lps}, {"top_logprobs", tops},
          {"text_offset", offsets}};
}

json prompt_logprobs_json(const TextCodec& codec, std::span<const int32_t> prompt,
                          std::span<const std::optional<PositionLogprobs>> lps) {
  json out = json::array();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i >= lps.size() || !lps[i]) {
      out.push_back(nullptr);
      continue;
    }
    const auto& lp = *lps[i];
    json pos = json::object();
    // rank of the actual token: 1 + how many top entries beat it (vLLM convention).
    int64_t rank = 1;
    for (const auto& t : lp.top)
      if (t.logprob > lp.chosen.logprob) rank++;
    pos[std::to_string(lp.chosen.id)] = {{"logprob", lp.chosen.logprob}, {"rank", rank},
                                         {"decoded_token", codec.token_text(lp.chosen.id)}};
    for (size_t r = 0; r < lp.top.size(); ++r) {
      const std::string key = std::to_string(lp.top[r].id);
      if (pos.contains(key)) continue;
      pos[key] = {{"logprob", lp.top[r].logprob}, {"rank", int64_t(r + 1)},
                  {"decoded_token", codec.token_text(lp.top[r].id)}};
    }
    out.push_back(std::move(pos));
  }
  return out;
}

json chat_delta_json(const ChatDelta& delta, bool first) {
  json d = json::object();
  if (first) d["role"] = "assistant";
  if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
  if (!delta.content.empty() || (first && delta.reasoning.empty() && delta.tool_calls.empty()))
    d["content"] = delta.content;
  if (!delta.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& tc : delta.tool_calls) {
      json c = {{"index", tc.index}};
      json fn = json::object();
      if (!tc.id.empty()) {
        c["id"] = tc.id;
        c["type"] = "function";
      }
      if (!tc.name.empty()) fn["name"] = tc.name;
      fn["arguments"] = tc.arguments;
      c["function"] = std::move(fn);
      calls.push_back(std::move(c));
    }
    d["tool_calls"] = std::move(calls);
  }
  return d;
}

json chat_chunk(const ResponseMeta& meta, json delta, const std::string& finish_reason,
                json logprobs) {
  json choice = {{"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)},
                 {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  return {{"id", meta.id}, {"object", "chat.completion.chunk"}, {"created", meta.created},
          {"model", meta.model}, {"choices", json::array({std::move(choice)})}};
}

void merge_tool_calls(json& calls, const std::vector<ToolCallDelta>& deltas) {
  if (!calls.is_array()) calls = json::array();
  for (const auto& tc : deltas) {
    while (calls.size() <= size_t(std::max(tc.index, 0)))
      calls.push_back({{"id", ""}, {"type", "function"},
                       {"function", {{"name", ""}, {"arguments", ""}}}});
    json& c = calls[size_t(std::max(tc.index, 0))];
    if (!tc.id.empty()) c["id"] = tc.id;
    if (!tc.name.empty()) c["function"]["name"] = tc.name;
    c["function"]["arguments"] =
        c["function"]["arguments"].get<std::string>() + tc.arguments;
  }
}

}  // namespace flashseek::server
