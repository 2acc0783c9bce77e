// Message normalisation before rendering (internal to the chat encoder): validation, image
// blocks -> placeholders, tool messages merged into user messages, tool results re-ordered,
// history reasoning dropped. Mirrors the pre-processing steps of spec model-v41.md §7.3.
#pragma once
#include "core/status.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/chat_json.h"

namespace flashseek::tok::detail {

// Checks roles and field types; returns a deep copy with list contents resolved: V4.1 image
// parts become text blocks holding the placeholder (their records appended to `images`) and
// `content_blocks` is set; V4 joins the text parts and rejects images.
Result<ChatJson> normalize_messages(const ChatJson& messages, ChatFamily family, ChatJson& images);

// Tool messages become {"type":"tool_result"} blocks of user messages; consecutive user/tool
// messages merge into one (unless the earlier carries a task).
ChatJson merge_tool_messages(const ChatJson& messages, ChatFamily family);

// Re-orders tool_result blocks of each user message to the preceding assistant's call order.
void sort_tool_results(ChatJson& messages);

// Index of the last user/developer message (V4.1: or system at index > 0); -1 if none.
int find_last_user_index(const ChatJson& messages, ChatFamily family);

// Thinking mode with drop_thinking: strips reasoning_content of assistant turns before the last
// user message and deletes developer messages there.
ChatJson drop_history_thinking(const ChatJson& messages, ChatFamily family);

}  // namespace flashseek::tok::detail
