#include "tokenizer/chat_encoder.h"

#include "tokenizer/chat_preprocess.h"

namespace flashseek::tok {
namespace {

using namespace chat_tokens;

// Python truthiness of an optional field (null, "", [], {}, false, 0 are all "absent").
bool truthy(const ChatJson& msg, const char* key) {
  auto it = msg.find(key);
  if (it == msg.end() || it->is_null()) return false;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_string() || it->is_array() || it->is_object()) return !it->empty();
  if (it->is_number_float()) return it->get<double>() != 0.0;
  if (it->is_number()) return it->get<int64_t>() != 0;
  return true;
}

std::string_view task_token(const std::string& task) {
  if (task == "action") return "<｜action｜>";
  if (task == "query") return "<｜query｜>";
  if (task == "authority") return "<｜authority｜>";
  if (task == "domain") return "<｜domain｜>";
  if (task == "title") return "<｜title｜>";
  return "<｜read_url｜>";
}

struct RenderContext {
  ChatFamily family;
  bool thinking;
  bool drop_thinking;
  int last_user;
  std::string first_message_prefix;  // effort text placed before message 0 ("" if none)
};

// "\n\n" + tools block, "\n\n" + response format: appended to system/developer content.
std::string tool_and_format_blocks(const ChatJson& msg, ChatFamily family) {
  std::string out;
  if (truthy(msg, "tools")) {
    std::string schemas;
    for (const ChatJson& tool : msg["tools"]) {
      if (!schemas.empty()) schemas += "\n";
      schemas += py_json_dumps(tool["function"]);
    }
    out += "\n\n" + render_tools_block(family, schemas);
  }
  if (truthy(msg, "response_format")) {
    out += "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";
    out += py_json_dumps(msg["response_format"]);
  }
  return out;
}

// One <DS parameter …> line per argument; strings raw with string="true", everything else as
// Python-style JSON with string="false".
Result<std::string> render_arguments(const ChatJson& function, ChatFamily family,
                                     const std::string& where) {
  const ChatJson raw = function.contains("arguments") ? function["arguments"] : ChatJson(nullptr);
  ChatJson args;
  if (raw.is_string()) {
    args = ChatJson::parse(raw.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (family == ChatFamily::kV4 && (args.is_discarded() || !args.is_object())) {
      args = ChatJson{{"arguments", raw}};  // V4 wraps what is not a JSON object
    } else if (args.is_discarded()) {
      return invalid_argument("{}.function.arguments: not valid JSON", where);
    }
  } else if (raw.is_object() || family == ChatFamily::kV41) {
    args = raw;
  } else {
    args = ChatJson{{"arguments", raw}};
  }
  if (!args.is_object())
    return invalid_argument("{}.function.arguments: must be a JSON object", where);
  const DsmlTags& tags = dsml_tags(family);
  std::string out;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!out.empty()) out += "\n";
    const bool is_str = it.value().is_string();
    out += "<" + std::string(kDsml) + tags.parameter + " name=\"" + it.key() + "\" string=\"" +
           (is_str ? "true" : "false") + "\">";
    out += is_str ? it.value().get<std::string>() : py_json_dumps(it.value());
    out += tags.parameter_close() + ">";
  }
  return out;
}

Result<std::string> render_tool_calls(const ChatJson& msg, ChatFamily family,
                                      const std::string& where) {
  const DsmlTags& tags = dsml_tags(family);
  std::string invokes;
  const ChatJson& calls = msg["tool_calls"];
  for (size_t j = 0; j < calls.size(); ++j) {
    const ChatJson& fn = calls[j]["function"];
    FS_ASSIGN_OR_RETURN(std::string params,
                        render_arguments(fn, family, where + ".tool_calls[" + std::to_string(j) + "]"));
    if (!invokes.empty()) invokes += "\n";
    invokes += tags.invoke_open() + " name=\"" + fn["name"].get<std::string>() + "\">\n" + params +
               "\n" + tags.invoke_close() + ">";
  }
  return "\n\n" + tags.block_open() + "\n" + invokes + "\n" + tags.block_close();
}

std::string render_user(const ChatJson& msg) {
  if (!truthy(msg, "content_blocks")) return std::string(kUser) + string_field(msg, "content");
  std::string out(kUser);
  bool first = true;
  for (const ChatJson& b : msg["content_blocks"]) {
    if (!first) out += "\n\n";
    first = false;
    const std::string type = string_field(b, "type");
    if (type == "text") {
      out += string_field(b, "text");
    } else if (type == "tool_result") {
      std::string body;
      if (b.contains("content") && b["content"].is_array()) {
        bool first_part = true;
        for (const ChatJson& p : b["content"]) {
          if (!first_part) body += "\n\n";
          first_part = false;
          const std::string ptype = string_field(p, "type");
          body += ptype == "text" ? string_field(p, "text") : "[Unsupported " + ptype + "]";
        }
      } else if (b.contains("content") && !b["content"].is_string()) {
        body = py_json_dumps(b["content"]);
      } else {
        body = string_field(b, "content");
      }
      out += "<tool_result>" + body + "</tool_result>";
    } else {
      out += "[Unsupported " + type + "]";
    }
  }
  return out;
}

Status render_assistant(const ChatJson& msgs, int i, const RenderContext& ctx, std::string& out) {
  const ChatJson& msg = msgs[static_cast<size_t>(i)];
  const std::string where = "messages[" + std::to_string(i) + "]";
  std::string calls;
  if (truthy(msg, "tool_calls")) {
    FS_ASSIGN_OR_RETURN(calls, render_tool_calls(msg, ctx.family, where));
  }
  // A turn answering a quick-instruction task has no thinking part (§7.7).
  const bool prev_has_task = i > 0 && truthy(msgs[static_cast<size_t>(i - 1)], "task");
  if (ctx.thinking && !prev_has_task && (!ctx.drop_thinking || i > ctx.last_user))
    out += string_field(msg, "reasoning_content") + std::string(kThinkEnd);
  out += string_field(msg, "content") + calls;
  if (!truthy(msg, "wo_eos")) out += kEos;
  return {};
}

// Assistant header after message i when the next message is generated or is an assistant turn.
void render_transition(const ChatJson& msgs, int i, const RenderContext& ctx, std::string& out) {
  const size_t n = msgs.size();
  if (static_cast<size_t>(i) + 1 < n) {
    const std::string next = string_field(msgs[static_cast<size_t>(i) + 1], "role");
    if (next != "assistant" && next != "latest_reminder") return;
  }
  const ChatJson& msg = msgs[static_cast<size_t>(i)];
  const std::string role = string_field(msg, "role");
  if (truthy(msg, "task")) {
    const std::string task = string_field(msg, "task");
    if (task != "action") {
      out += task_token(task);
    } else {
      out += std::string(kAssistant) + std::string(ctx.thinking ? kThinkStart : kThinkEnd) +
             std::string(task_token(task));
    }
  } else if (role == "user" || role == "developer" ||
             (ctx.family == ChatFamily::kV41 && role == "system" && i > 0)) {
    const bool open_thinking = ctx.thinking && (!ctx.drop_thinking || i >= ctx.last_user);
    out += std::string(kAssistant) + std::string(open_thinking ? kThinkStart : kThinkEnd);
  }
}

Status render_message(const ChatJson& msgs, int i, const RenderContext& ctx, std::string& out) {
  const ChatJson& msg = msgs[static_cast<size_t>(i)];
  const std::string role = string_field(msg, "role");
  if (i == 0) {
    // V4.1 hosts the effort line (and a leading system message) behind <｜System｜>.
    if (ctx.family == ChatFamily::kV41 && (!ctx.first_message_prefix.empty() || role == "system"))
      out += kSystem;
    out += ctx.first_message_prefix;
  }
  if (role == "system") {
    if (ctx.family == ChatFamily::kV41 && i > 0) out += kSystem;
    out += string_field(msg, "content") + tool_and_format_blocks(msg, ctx.family);
  } else if (role == "developer") {
    const std::string content = string_field(msg, "content");
    if (content.empty())
      return invalid_argument("messages[{}].content: a developer message needs non-empty content", i);
    out += std::string(kUser) + content + tool_and_format_blocks(msg, ctx.family);
  } else if (role == "user") {
    out += render_user(msg);
  } else if (role == "latest_reminder") {
    out += std::string(kLatestReminder) + string_field(msg, "content");
  } else if (role == "assistant") {
    FS_RETURN_IF_ERROR(render_assistant(msgs, i, ctx, out));
  } else {
    return internal_error("messages[{}]: role '{}' survived pre-processing", i, role);
  }
  render_transition(msgs, i, ctx, out);
  return {};
}

// Effort text placed before message 0: V4.1 numeric line, V4 "max" paragraph.
Result<std::string> effort_prefix(const ChatOptions& options) {
  const bool thinking = options.thinking_mode == ThinkingMode::kThinking;
  if (options.family == ChatFamily::kV41) {
    FS_ASSIGN_OR_RETURN(int budget, options.effort_table.resolve(options.reasoning_effort));
    return thinking ? v41_effort_line(budget) : std::string();
  }
  const ChatJson& e = options.reasoning_effort;
  if (!e.is_null() && !(e.is_string() && (e == "high" || e == "max")))
    return invalid_argument("reasoning_effort: V4 accepts only \"high\" or \"max\", got {}", e.dump());
  return thinking && e == "max" ? std::string(v4_max_effort_text()) : std::string();
}

}  // namespace

Result<EffortTable> EffortTable::from_json(const ChatJson& table) {
  if (!table.is_object()) return invalid_argument("reasoning effort table: expected a JSON object");
  EffortTable out;
  out.named.clear();
  std::string default_name;
  for (auto it = table.begin(); it != table.end(); ++it) {
    if (it.key() == "default") {
      if (!it.value().is_string())
        return invalid_argument("reasoning effort table: \"default\" must be a string");
      default_name = it.value().get<std::string>();
      continue;
    }
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 1 ||
        it.value().get<int64_t>() > 100)
      return invalid_argument("reasoning effort table: \"{}\" must be an integer in [1, 100]",
                              it.key());
    out.named.emplace_back(it.key(), static_cast<int>(it.value().get<int64_t>()));
  }
  if (out.named.empty()) return invalid_argument("reasoning effort table: no named efforts");
  out.default_name = default_name.empty() ? out.named.front().first : default_name;
  for (const auto& [name, budget] : out.named) {
    if (name == out.default_name) return out;
  }
  return invalid_argument("reasoning effort table: default \"{}\" is not a named effort",
                          out.default_name);
}

Result<int> EffortTable::resolve(const ChatJson& effort) const {
  const ChatJson e = effort.is_null() ? ChatJson(default_name) : effort;
  if (e.is_number_integer()) {
    const int64_t v = e.get<int64_t>();
    if (v >= 1 && v <= 100 && !(e.is_number_unsigned() && e.get<uint64_t>() > 100))
      return static_cast<int>(v);
  } else if (e.is_string()) {
    for (const auto& [name, budget] : named) {
      if (name == e.get<std::string>()) return budget;
    }
  }
  std::string names;
  for (const auto& [name, budget] : named) names += (names.empty() ? "" : ", ") + name;
  return invalid_argument("reasoning_effort: {} is not an integer in [1, 100] or one of {}",
                          e.dump(), names);
}

Result<EncodedChat> encode_messages(const ChatJson& messages, const ChatOptions& options) {
  FS_ASSIGN_OR_RETURN(std::string prefix, effort_prefix(options));
  EncodedChat result;
  FS_ASSIGN_OR_RETURN(ChatJson msgs, detail::normalize_messages(messages, options.family,
                                                                result.images));
  msgs = detail::merge_tool_messages(msgs, options.family);
  detail::sort_tool_results(msgs);
  RenderContext ctx{options.family, options.thinking_mode == ThinkingMode::kThinking,
                    options.drop_thinking, -1, std::move(prefix)};
  for (const ChatJson& m : msgs) {
    if (truthy(m, "tools")) ctx.drop_thinking = false;  // tool use keeps all reasoning
  }
  if (ctx.thinking && ctx.drop_thinking) msgs = detail::drop_history_thinking(msgs, options.family);
  ctx.last_user = detail::find_last_user_index(msgs, options.family);
  if (options.add_bos) result.prompt += kBos;
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    FS_RETURN_IF_ERROR(render_message(msgs, i, ctx, result.prompt));
  }
  return result;
}

}  // namespace flashseek::tok
