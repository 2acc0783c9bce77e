// Chat prompt encoder for DeepSeek-V4.1 (and the V4 backbone's format behind a family switch):
// OpenAI-style messages -> prompt TEXT (spec model-v41.md §7.3-§7.7). The text starts with the
// BOS string once; tokenise it with added-token matching and no implicit BOS (spec §7.1).
//
// Message fields understood (per message, all optional except role):
//   role               system | developer | user | assistant | tool | latest_reminder
//   content            string, null, or a list of parts {type:text,text} / {type:image_url,...}
//                      / {type:image,...} (V4.1 only); other part types render "[Unsupported T]"
//   reasoning_content  assistant reasoning (string)
//   tool_calls         assistant: [{id, type, function:{name, arguments}}], arguments a JSON
//                      object or a string holding one
//   tool_call_id       tool: id of the call this result answers
//   tools              system/developer: OpenAI tool list [{type:function, function:{...}}]
//   response_format    system/developer: any JSON, rendered after "## Response Format:"
//   task               user/developer: action|query|authority|domain|title|read_url (§7.7)
//   wo_eos             assistant: true -> no EOS after the message (prefix continuation)
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/chat_json.h"

namespace flashseek::tok {

// V4.1 named reasoning efforts. The release ships its table in `encoding/`; the defaults below
// are SGLang's vendored copy (spec §7.3, §9.3). Load the checkpoint's own with `from_json`.
struct EffortTable {
  std::vector<std::pair<std::string, int>> named = {
      {"low", 25}, {"high", 50}, {"xhigh", 75}, {"max", 100}};
  std::string default_name = "high";

  // {"low": 25, "high": 50, ..., "default": "high"}: every value an int in [1, 100];
  // "default" (optional) must name an entry.
  static Result<EffortTable> from_json(const ChatJson& table);
  // Budget for an int 1..100 or a name; error names the accepted values.
  Result<int> resolve(const ChatJson& effort) const;
};

struct ChatOptions {
  ChatFamily family = ChatFamily::kV41;
  ThinkingMode thinking_mode = ThinkingMode::kChat;
  // Drop reasoning of turns before the last user message (forced off when any message has tools).
  bool drop_thinking = true;
  // null = default; V4.1: int 1..100 or a name of `effort_table`; V4: "high" or "max".
  ChatJson reasoning_effort = nullptr;
  bool add_bos = true;
  EffortTable effort_table;
};

struct EncodedChat {
  std::string prompt;
  // One record per image placeholder, in prompt order: {"type":"image","url"|"source"|"data":…}.
  ChatJson images = ChatJson::array();
};

// Renders `messages` (a JSON array). Invalid input (unknown role, bad tool call arguments,
// literal image placeholder in text, bad effort, ...) returns kInvalidArgument naming the
// message index and field.
Result<EncodedChat> encode_messages(const ChatJson& messages, const ChatOptions& options);

}  // namespace flashseek::tok
