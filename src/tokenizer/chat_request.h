// OpenAI chat-completions request -> prompt text and parser options (spec model-v41.md §7.5).
// The server passes the request body (parsed as ChatJson to keep key order) through.
//
// Fields read: messages; thinking ({"type":"enabled"|"disabled"} or bool);
// chat_template_kwargs {thinking | enable_thinking (bool), reasoning_effort}; reasoning_effort
// (int 1-100 | name | "none" = chat mode); tools + tool_choice ("none" leaves the tools out of
// the prompt); response_format (anything but {"type":"text"} is rendered).
// Request tools / response_format go to the first message if it is a system message, otherwise
// into a new empty system message inserted at index 0 (renders <｜System｜> + "\n\n## Tools…").
#pragma once
#include "core/status.h"
#include "tokenizer/chat_encoder.h"
#include "tokenizer/chat_parser.h"

namespace flashseek::tok {

struct ChatRequestOptions {
  ChatFamily family = ChatFamily::kV41;
  // Deployment choice when the request says nothing (spec §7.5; the release tests default to chat).
  bool thinking_by_default = false;
  EffortTable effort_table;
};

struct ChatRequestEncoding {
  EncodedChat encoded;
  ChatOptions chat_options;  // what encode_messages was called with
  // Ready for parse_completion / ChatStreamParser (set tool_call_id_seed per request).
  ParseOptions parse_options;
};

Result<ChatRequestEncoding> encode_chat_request(const ChatJson& request,
                                                const ChatRequestOptions& options);

}  // namespace flashseek::tok
