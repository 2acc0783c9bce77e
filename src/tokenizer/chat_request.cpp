#include "tokenizer/chat_request.h"

#include <optional>

namespace flashseek::tok {
namespace {

// Explicit on/off from `thinking` or chat_template_kwargs; nullopt if the request is silent.
Result<std::optional<bool>> explicit_thinking(const ChatJson& request) {
  if (auto it = request.find("thinking"); it != request.end() && !it->is_null()) {
    if (it->is_boolean()) return std::optional<bool>(it->get<bool>());
    if (it->is_object() && it->contains("type") && (*it)["type"].is_string()) {
      const std::string type = (*it)["type"].get<std::string>();
      if (type == "enabled") return std::optional<bool>(true);
      if (type == "disabled") return std::optional<bool>(false);
    }
    return invalid_argument("thinking: expected {{\"type\": \"enabled\"|\"disabled\"}} or a bool");
  }
  if (auto it = request.find("chat_template_kwargs"); it != request.end() && it->is_object()) {
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (auto k = it->find(key); k != it->end() && !k->is_null()) {
        if (!k->is_boolean())
          return invalid_argument("chat_template_kwargs.{}: expected a bool", key);
        return std::optional<bool>(k->get<bool>());
      }
    }
  }
  return std::optional<bool>();
}

ChatJson requested_effort(const ChatJson& request) {
  if (auto it = request.find("reasoning_effort"); it != request.end() && !it->is_null()) return *it;
  if (auto it = request.find("chat_template_kwargs"); it != request.end() && it->is_object()) {
    if (auto k = it->find("reasoning_effort"); k != it->end()) return *k;
  }
  return nullptr;
}

// Request-level tools / response_format to attach to the system message (null if none).
Result<ChatJson> system_extras(const ChatJson& request) {
  ChatJson extras = ChatJson::object();
  const bool tools_off = request.contains("tool_choice") && request["tool_choice"] == "none";
  if (auto it = request.find("tools"); it != request.end() && !it->is_null() && !tools_off) {
    if (!it->is_array()) return invalid_argument("tools: expected a list");
    if (!it->empty()) extras["tools"] = *it;
  }
  if (auto it = request.find("response_format"); it != request.end() && !it->is_null()) {
    if (!it->is_object()) return invalid_argument("response_format: expected an object");
    if (!(it->contains("type") && (*it)["type"] == "text")) extras["response_format"] = *it;
  }
  return extras;
}

}  // namespace

Result<ChatRequestEncoding> encode_chat_request(const ChatJson& request,
                                                const ChatRequestOptions& options) {
  if (!request.is_object()) return invalid_argument("request: expected a JSON object");
  auto mit = request.find("messages");
  if (mit == request.end() || !mit->is_array() || mit->empty())
    return invalid_argument("messages: expected a non-empty list");
  FS_ASSIGN_OR_RETURN(std::optional<bool> thinking, explicit_thinking(request));
  ChatJson effort = requested_effort(request);
  if (effort == "none") {
    if (thinking.value_or(false))
      return invalid_argument("reasoning_effort \"none\" contradicts thinking enabled");
    thinking = false;
    effort = nullptr;
  }
  FS_ASSIGN_OR_RETURN(ChatJson extras, system_extras(request));
  ChatJson messages = *mit;
  if (!extras.empty()) {
    if (string_field(messages[0], "role") != "system")
      messages.insert(messages.begin(), ChatJson{{"role", "system"}, {"content", ""}});
    for (auto it = extras.begin(); it != extras.end(); ++it) messages[0][it.key()] = it.value();
  }
  ChatRequestEncoding out;
  out.chat_options.family = options.family;
  out.chat_options.thinking_mode =
      thinking.value_or(options.thinking_by_default) ? ThinkingMode::kThinking : ThinkingMode::kChat;
  out.chat_options.reasoning_effort = effort;
  out.chat_options.effort_table = options.effort_table;
  FS_ASSIGN_OR_RETURN(out.encoded, encode_messages(messages, out.chat_options));
  out.parse_options.family = options.family;
  out.parse_options.thinking_mode = out.chat_options.thinking_mode;
  return out;
}

}  // namespace flashseek::tok
