#include "tokenizer/chat_preprocess.h"

#include <algorithm>
#include <map>
#include <string_view>

namespace flashseek::tok::detail {
namespace {

bool is_known_role(std::string_view role) {
  return role == "system" || role == "developer" || role == "user" || role == "assistant" ||
         role == "tool" || role == "latest_reminder";
}

bool is_known_task(std::string_view task) {
  return task == "action" || task == "query" || task == "authority" || task == "domain" ||
         task == "title" || task == "read_url";
}

std::string role_of(const ChatJson& msg) {
  auto it = msg.find("role");
  return it != msg.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool has_non_null(const ChatJson& msg, const char* key) {
  auto it = msg.find(key);
  return it != msg.end() && !it->is_null();
}


// {"type":"image_url","image_url":{"url":…}} / {"type":"image",source|url|data} -> record.
Result<ChatJson> image_record(const ChatJson& block, const std::string& where) {
  ChatJson record = {{"type", "image"}};
  if (block["type"] == "image_url") {
    auto it = block.find("image_url");
    if (it != block.end() && it->is_string()) {
      record["url"] = *it;
    } else if (it != block.end() && it->is_object()) {
      record["url"] = string_field(*it, "url");
    }
  } else {
    for (const char* key : {"source", "url", "data"}) {
      if (block.contains(key)) record[key] = block[key];
    }
  }
  for (const char* key : {"source", "url", "data"}) {
    auto it = record.find(key);
    if (it != record.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      return record;
  }
  return invalid_argument("{}: image block has no url, source or data", where);
}

// V4.1: image parts -> placeholder text blocks (recursing into tool_result lists); text parts
// must not contain the placeholder literally.
Result<ChatJson> process_blocks(const ChatJson& blocks, const std::string& where, ChatJson& images) {
  ChatJson out = ChatJson::array();
  for (size_t j = 0; j < blocks.size(); ++j) {
    const ChatJson& b = blocks[j];
    const std::string bw = where + "[" + std::to_string(j) + "]";
    if (!b.is_object() || !b.contains("type") || !b["type"].is_string())
      return invalid_argument("{}: expected a content part object with a string \"type\"", bw);
    const std::string type = b["type"].get<std::string>();
    if (type == "image" || type == "image_url") {
      FS_ASSIGN_OR_RETURN(ChatJson record, image_record(b, bw));
      images.push_back(std::move(record));
      out.push_back({{"type", "text"}, {"text", chat_tokens::kImage}});
    } else if (type == "tool_result" && b.contains("content") && b["content"].is_array()) {
      ChatJson nb = b;
      FS_ASSIGN_OR_RETURN(nb["content"], process_blocks(b["content"], bw + ".content", images));
      out.push_back(std::move(nb));
    } else if (type == "text") {
      if (string_field(b, "text").find(chat_tokens::kImage) != std::string::npos)
        return invalid_argument("{}.text: contains the image placeholder {}; send images as image parts",
                                bw, chat_tokens::kImage);
      out.push_back(b);
    } else {
      out.push_back(b);
    }
  }
  return out;
}

std::string join_text_blocks(const ChatJson& blocks) {
  std::string out;
  bool first = true;
  for (const auto& b : blocks) {
    if (string_field(b, "type") != "text") continue;
    if (!first) out += "\n\n";
    first = false;
    out += string_field(b, "text");
  }
  return out;
}

Status check_fields(const ChatJson& msg, const std::string& where) {
  if (auto it = msg.find("content");
      it != msg.end() && !it->is_string() && !it->is_null() && !it->is_array())
    return invalid_argument("{}.content: expected a string, a list of parts or null", where);
  if (auto it = msg.find("reasoning_content"); it != msg.end() && !it->is_string() && !it->is_null())
    return invalid_argument("{}.reasoning_content: expected a string", where);
  if (has_non_null(msg, "tool_calls")) {
    const ChatJson& calls = msg["tool_calls"];
    if (!calls.is_array()) return invalid_argument("{}.tool_calls: expected a list", where);
    for (size_t j = 0; j < calls.size(); ++j) {
      const ChatJson& c = calls[j];
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object() ||
          !c["function"].contains("name") || !c["function"]["name"].is_string())
        return invalid_argument("{}.tool_calls[{}]: expected {{\"function\": {{\"name\": string, "
                                "\"arguments\": …}}}}", where, j);
    }
  }
  if (has_non_null(msg, "tools")) {
    const ChatJson& tools = msg["tools"];
    if (!tools.is_array()) return invalid_argument("{}.tools: expected a list", where);
    for (size_t j = 0; j < tools.size(); ++j) {
      if (!tools[j].is_object() || !tools[j].contains("function") || !tools[j]["function"].is_object())
        return invalid_argument("{}.tools[{}]: expected {{\"type\": \"function\", \"function\": {{…}}}}",
                                where, j);
    }
  }
  if (has_non_null(msg, "task")) {
    const ChatJson& task = msg["task"];
    if (!task.is_string() || !is_known_task(task.get<std::string>()))
      return invalid_argument("{}.task: expected one of action, query, authority, domain, title, "
                              "read_url", where);
  }
  return {};
}

}  // namespace

Result<ChatJson> normalize_messages(const ChatJson& messages, ChatFamily family, ChatJson& images) {
  if (!messages.is_array()) return invalid_argument("messages: expected a JSON array");
  ChatJson out = ChatJson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!messages[i].is_object()) return invalid_argument("{}: expected an object", where);
    ChatJson msg = messages[i];
    const std::string role = role_of(msg);
    if (!is_known_role(role))
      return invalid_argument("{}.role: unknown role '{}' (expected system, developer, user, "
                              "assistant, tool or latest_reminder)", where,
                              msg.contains("role") ? msg["role"].dump() : std::string("<missing>"));
    FS_RETURN_IF_ERROR(check_fields(msg, where));
    if (family == ChatFamily::kV41) {
      for (const char* key : {"content", "reasoning_content"}) {
        if (msg.contains(key) && msg[key].is_string() &&
            msg[key].get<std::string>().find(chat_tokens::kImage) != std::string::npos)
          return invalid_argument("{}.{}: contains the image placeholder {}; send images as image "
                                  "parts", where, key, chat_tokens::kImage);
      }
      if (msg.contains("content") && msg["content"].is_array() && !msg.contains("content_blocks"))
        msg["content_blocks"] = msg["content"];
      if (has_non_null(msg, "content_blocks")) {
        if (!msg["content_blocks"].is_array())
          return invalid_argument("{}.content_blocks: expected a list", where);
        FS_ASSIGN_OR_RETURN(msg["content_blocks"],
                            process_blocks(msg["content_blocks"], where + ".content", images));
        if (!msg.contains("content") || !msg["content"].is_string())
          msg["content"] = join_text_blocks(msg["content_blocks"]);
      }
    } else if (msg.contains("content") && msg["content"].is_array()) {
      const ChatJson& parts = msg["content"];
      for (size_t j = 0; j < parts.size(); ++j) {
        if (!parts[j].is_object() || !parts[j].contains("type") || !parts[j]["type"].is_string())
          return invalid_argument("{}.content[{}]: expected a part with a string \"type\"", where, j);
        const std::string type = parts[j]["type"].get<std::string>();
        if (type == "image" || type == "image_url")
          return invalid_argument("{}.content[{}]: the V4 chat format has no image input", where, j);
      }
      msg["content"] = join_text_blocks(parts);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

ChatJson merge_tool_messages(const ChatJson& messages, ChatFamily family) {
  ChatJson merged = ChatJson::array();
  auto mergeable_user = [&](bool check_task) {
    if (merged.empty()) return false;
    const ChatJson& last = merged.back();
    if (role_of(last) != "user" || !last.contains("content_blocks")) return false;
    return !check_task || !has_non_null(last, "task");
  };
  for (const ChatJson& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "tool") {
      ChatJson block = {{"type", "tool_result"},
                        {"tool_use_id", string_field(msg, "tool_call_id")},
                        {"content", msg.contains("content") && !msg["content"].is_null()
                                        ? msg["content"] : ChatJson("")}};
      if (mergeable_user(false)) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back({{"role", "user"}, {"content_blocks", ChatJson::array({block})}});
      }
    } else if (role == "user") {
      ChatJson blocks = ChatJson::array();
      if (family == ChatFamily::kV41 && has_non_null(msg, "content_blocks")) {
        blocks = msg["content_blocks"];
      } else {
        blocks.push_back({{"type", "text"}, {"text", string_field(msg, "content")}});
      }
      if (mergeable_user(true)) {
        for (auto& b : blocks) merged.back()["content_blocks"].push_back(std::move(b));
      } else if (family == ChatFamily::kV41) {
        ChatJson m = msg;  // keeps every message-level field
        m["content_blocks"] = std::move(blocks);
        merged.push_back(std::move(m));
      } else {
        ChatJson m = {{"role", "user"}, {"content", string_field(msg, "content")},
                      {"content_blocks", std::move(blocks)}};
        for (const char* key : {"task", "wo_eos", "mask"}) {
          if (msg.contains(key)) m[key] = msg[key];
        }
        merged.push_back(std::move(m));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

void sort_tool_results(ChatJson& messages) {
  std::map<std::string, int> order;
  for (ChatJson& msg : messages) {
    const std::string role = role_of(msg);
    if (role == "assistant" && has_non_null(msg, "tool_calls") && !msg["tool_calls"].empty()) {
      order.clear();
      int idx = 0;
      for (const ChatJson& tc : msg["tool_calls"]) {
        std::string id = string_field(tc, "id");
        if (id.empty() && tc.contains("function")) id = string_field(tc["function"], "id");
        if (!id.empty()) order[id] = idx;
        ++idx;
      }
    } else if (role == "user" && has_non_null(msg, "content_blocks")) {
      ChatJson& blocks = msg["content_blocks"];
      std::vector<ChatJson> results;
      for (const auto& b : blocks) {
        if (string_field(b, "type") == "tool_result") results.push_back(b);
      }
      if (results.size() <= 1 || order.empty()) continue;
      // Unknown ids sort as call 0, like the reference; the sort is stable.
      std::stable_sort(results.begin(), results.end(), [&](const ChatJson& a, const ChatJson& b) {
        auto key = [&](const ChatJson& r) {
          auto it = order.find(string_field(r, "tool_use_id"));
          return it == order.end() ? 0 : it->second;
        };
        return key(a) < key(b);
      });
      size_t k = 0;
      for (auto& b : blocks) {
        if (string_field(b, "type") == "tool_result") b = results[k++];
      }
    }
  }
}

int find_last_user_index(const ChatJson& messages, ChatFamily family) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    const std::string role = role_of(messages[static_cast<size_t>(i)]);
    if (role == "user" || role == "developer") return i;
    if (family == ChatFamily::kV41 && role == "system" && i > 0) return i;
  }
  return -1;
}

ChatJson drop_history_thinking(const ChatJson& messages, ChatFamily family) {
  const int last_user = find_last_user_index(messages, family);
  ChatJson out = ChatJson::array();
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    const ChatJson& msg = messages[static_cast<size_t>(i)];
    const std::string role = role_of(msg);
    if (role == "user" || role == "system" || role == "tool" || role == "latest_reminder" ||
        i >= last_user) {
      out.push_back(msg);
    } else if (role == "assistant") {
      ChatJson m = msg;
      m.erase("reasoning_content");
      out.push_back(std::move(m));
    }
    // developer messages before the last user message are deleted (spec §7.3 step 4)
  }
  return out;
}

}  // namespace flashseek::tok::detail
