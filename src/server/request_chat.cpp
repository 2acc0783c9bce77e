// /v1/chat/completions fields: messages, tools / tool_choice, thinking / reasoning_effort and the
// chat form of logprobs. Messages are normalised (text parts joined) so the chat encoder sees
// plain strings; anything it could not render is rejected here with the message index.
#include <fmt/format.h>

#include <algorithm>

#include "core/json_limits.h"
#include "server/request.h"
#include "server/request_fields.h"

namespace flashseek::server {

using json = nlohmann::json;
using fields::MaybeError;
using fields::present;

ApiError too_large(std::string message, std::string param);

namespace {

// content: string | null | [{"type":"text","text":...}, ...] -> string (parts joined by "\n").
MaybeError normalise_content(json& msg, size_t i, const ParseLimits& limits) {
  const std::string param = fmt::format("messages[{}].content", i);
  auto it = msg.find("content");
  if (it == msg.end() || it->is_null() || it->is_string()) return std::nullopt;
  if (!it->is_array()) return bad_request(param + " must be a string or an array of parts", param);
  if (it->size() > limits.max_messages)
    return bad_request(fmt::format("{} has more than {} parts", param, limits.max_messages), param);
  std::string text;
  for (size_t p = 0; p < it->size(); ++p) {
    const json& part = (*it)[p];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return bad_request(fmt::format("{}[{}] must be an object with a 'type'", param, p), param);
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (type != "text")
      return bad_request(fmt::format("{}[{}]: content part type '{}' is not supported", param, p,
                                     type), param);
    if (!part.contains("text") || !part["text"].is_string())
      return bad_request(fmt::format("{}[{}].text must be a string", param, p), param);
    if (p) text += "\n";
    const std::string& t = part["text"].get_ref<const std::string&>();
    if (t.size() > limits.max_prompt_bytes - std::min(text.size(), limits.max_prompt_bytes))
      return too_large(fmt::format("{} has more than {} bytes", param, limits.max_prompt_bytes),
                       param);
    text += t;
  }
  *it = text;
  return std::nullopt;
}

MaybeError check_tool_calls(const json& msg, size_t i, const ParseLimits& limits) {
  const std::string param = fmt::format("messages[{}].tool_calls", i);
  const json& calls = msg["tool_calls"];
  if (!calls.is_array()) return bad_request(param + " must be an array", param);
  if (calls.size() > limits.max_tools)
    return bad_request(fmt::format("{} has more than {} entries", param, limits.max_tools), param);
  for (const json& call : calls) {
    if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
      return bad_request(param + " entries must be objects with a 'function'", param);
    const json& fn = call["function"];
    if (!fn.contains("name") || !fn["name"].is_string())
      return bad_request(param + ": function.name must be a string", param);
    if (!fn.contains("arguments") || !fn["arguments"].is_string())
      return bad_request(param + ": function.arguments must be a JSON string", param);
    // The arguments are JSON inside a string: bounded like the body before a tree is built.
    const std::string& text = fn["arguments"].get_ref<const std::string&>();
    JsonLimits jl;
    jl.max_depth = limits.max_json_depth;
    if (JsonScan scan = scan_json(text, jl); scan != JsonScan::kOk)
      return bad_request(param + ": function.arguments is " + describe(scan, jl), param);
    json args = json::parse(text, nullptr, false);
    if (args.is_discarded() || !args.is_object())
      return bad_request(param + ": function.arguments must encode a JSON object", param);
  }
  return std::nullopt;
}

// Bytes of the text fields that the chat template renders (before the template's own text).
size_t message_text_bytes(const json& msg) {
  size_t n = 0;
  for (const char* key : {"content", "reasoning_content", "name", "tool_call_id"}) {
    auto it = msg.find(key);
    if (it != msg.end() && it->is_string()) n += it->get_ref<const std::string&>().size();
  }
  auto calls = msg.find("tool_calls");
  if (calls != msg.end() && calls->is_array())
    for (const json& call : *calls)
      if (call.is_object() && call.contains("function") && call["function"].is_object())
        for (const char* key : {"name", "arguments"}) {
          auto it = call["function"].find(key);
          if (it != call["function"].end() && it->is_string())
            n += it->get_ref<const std::string&>().size();
        }
  return n;
}

MaybeError parse_messages(const json& body, const ParseLimits& limits, json& out) {
  if (!present(body, "messages")) return bad_request("'messages' is required", "messages");
  const json& messages = body["messages"];
  if (!messages.is_array() || messages.empty())
    return bad_request("'messages' must be a non-empty array", "messages");
  if (messages.size() > limits.max_messages)
    return bad_request(fmt::format("'messages' has {} entries, more than the limit of {}",
                                   messages.size(), limits.max_messages), "messages");
  out = messages;
  size_t text_bytes = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    json& msg = out[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!msg.is_object()) return bad_request(param + " must be an object", param);
    if (!msg.contains("role") || !msg["role"].is_string())
      return bad_request(param + ".role must be a string", param + ".role");
    const std::string role = msg["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer")
      return bad_request(fmt::format("{}.role '{}' is not one of system, user, assistant, tool, "
                                     "developer", param, role), param + ".role");
    FS_API_TRY(normalise_content(msg, i, limits));
    const bool has_calls = present(msg, "tool_calls");
    if (has_calls) FS_API_TRY(check_tool_calls(msg, i, limits));
    text_bytes += message_text_bytes(msg);
    if (text_bytes > limits.max_prompt_bytes)
      return too_large(fmt::format("the messages hold more than {} bytes of text",
                                   limits.max_prompt_bytes), "messages");
    const bool has_content = msg.contains("content") && msg["content"].is_string();
    if (!has_content && !(role == "assistant" && has_calls))
      return bad_request(param + ".content is required", param + ".content");
    if (present(msg, "reasoning_content") && !msg["reasoning_content"].is_string())
      return bad_request(param + ".reasoning_content must be a string",
                         param + ".reasoning_content");
    if (role == "tool" && present(msg, "tool_call_id") && !msg["tool_call_id"].is_string())
      return bad_request(param + ".tool_call_id must be a string", param + ".tool_call_id");
  }
  return std::nullopt;
}

MaybeError parse_tools(const json& body, const ParseLimits& limits, ChatOptions& chat) {
  if (present(body, "tools")) {
    const json& tools = body["tools"];
    if (!tools.is_array()) return bad_request("'tools' must be an array", "tools");
    if (tools.size() > limits.max_tools)
      return bad_request(fmt::format("'tools' has more than {} entries", limits.max_tools),
                         "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& t = tools[i];
      const std::string param = fmt::format("tools[{}]", i);
      if (!t.is_object() || !t.contains("function") || !t["function"].is_object())
        return bad_request(param + " must be an object with a 'function'", param);
      if (t.contains("type") && t["type"] != "function")
        return bad_request(param + ".type must be 'function'", param + ".type");
      const json& fn = t["function"];
      if (!fn.contains("name") || !fn["name"].is_string() ||
          fn["name"].get_ref<const std::string&>().empty())
        return bad_request(param + ".function.name must be a non-empty string", param);
      if (present(fn, "parameters") && !fn["parameters"].is_object())
        return bad_request(param + ".function.parameters must be an object", param);
    }
    if (!tools.empty()) chat.tools = tools;
  }
  if (present(body, "tool_choice")) {
    const json& tc = body["tool_choice"];
    const bool named = tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
                       tc["function"].contains("name") && tc["function"]["name"].is_string();
    if (!(tc == "none" || tc == "auto" || tc == "required" || named))
      return bad_request("'tool_choice' must be none, auto, required or a named function",
                         "tool_choice");
    chat.tool_choice = tc;
    // "none": the model is not told about the tools at all.
    if (tc == "none") chat.tools = nullptr;
  }
  return std::nullopt;
}

// thinking: {"type": "enabled"|"disabled"} or a bool; chat_template_kwargs.{thinking,
// enable_thinking}; reasoning_effort: low|medium|high|xhigh|max|none or 1-100 (spec v41 §7.5).
MaybeError parse_thinking(const json& body, const ParseLimits& limits, ChatOptions& chat) {
  std::optional<bool> thinking;
  if (present(body, "thinking")) {
    const json& t = body["thinking"];
    if (t.is_boolean()) {
      thinking = t.get<bool>();
    } else if (t.is_object() && t.contains("type") && (t["type"] == "enabled" ||
                                                       t["type"] == "disabled")) {
      thinking = t["type"] == "enabled";
    } else {
      return bad_request("'thinking' must be {\"type\": \"enabled\"|\"disabled\"}", "thinking");
    }
  }
  if (present(body, "chat_template_kwargs")) {
    const json& kw = body["chat_template_kwargs"];
    if (!kw.is_object())
      return bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const char* key : {"thinking", "enable_thinking"}) {
      bool v = false;
      if (auto err = fields::get_bool(kw, key, v)) return err;
      if (present(kw, key) && !thinking) thinking = v;
    }
  }
  if (present(body, "reasoning_effort")) {
    const json& e = body["reasoning_effort"];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      if (s == "none") {
        thinking = false;
      } else if (s == "low" || s == "medium" || s == "high" || s == "xhigh" || s == "max") {
        chat.reasoning_effort = s == "medium" ? "high" : s;
      } else {
        return bad_request("'reasoning_effort' must be none, low, medium, high, xhigh, max or "
                           "1-100", "reasoning_effort");
      }
    } else if (e.is_number_integer() && e.get<int64_t>() >= 1 && e.get<int64_t>() <= 100) {
      chat.reasoning_effort = std::to_string(e.get<int64_t>());
    } else {
      return bad_request("'reasoning_effort' must be none, low, medium, high, xhigh, max or 1-100",
                         "reasoning_effort");
    }
    if (!thinking && !chat.reasoning_effort.empty()) thinking = true;
  }
  chat.thinking = thinking.value_or(limits.default_thinking);
  return std::nullopt;
}

MaybeError parse_chat_logprobs(const json& body, const ParseLimits& limits, ParsedRequest& out) {
  bool logprobs = false;
  std::optional<int64_t> top;
  FS_API_TRY(fields::get_bool(body, "logprobs", logprobs));
  FS_API_TRY(fields::get_int(body, "top_logprobs", 0, limits.max_logprobs, top));
  if (top && !logprobs)
    return bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  if (logprobs) out.logprobs = top.value_or(0);
  return std::nullopt;
}

}  // namespace

MaybeError parse_chat_fields(const json& body, const ParseLimits& limits, ParsedRequest& out) {
  FS_API_TRY(parse_messages(body, limits, out.messages));
  FS_API_TRY(parse_tools(body, limits, out.chat));
  FS_API_TRY(parse_thinking(body, limits, out.chat));
  FS_API_TRY(parse_chat_logprobs(body, limits, out));
  if (present(body, "response_format")) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || rf.value("type", json()) != "text")
      return bad_request("only response_format {\"type\": \"text\"} is supported",
                         "response_format");
  }
  return std::nullopt;
}

}  // namespace flashseek::server
