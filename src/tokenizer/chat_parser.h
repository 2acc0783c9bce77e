// Parsing generated text into reasoning_content / content / tool_calls (spec model-v41.md §7.6),
// one shot. The streaming variant (chat_stream.h) emits deltas whose concatenation equals this
// result; its finish() returns exactly parse_completion() of the whole text.
//
// Text is decoded with special tokens kept. Layout, V4.1 (V4: "<｜DSML｜tool_calls>", no space):
//   [reasoning "</think>"]  content  ["\n\n<｜DSML｜ calls>\n" invokes "</｜DSML｜ calls>"]  [EOS]
// where the reasoning part exists in thinking mode (the prompt ended with "<think>").
//
// Tool-call ids are deterministic: "call_" + 16 hex digits of FNV-1a-64 over
// "<seed>:<index>" (ParseOptions::tool_call_id_seed, call index in the message). Pass a
// per-request seed to get ids that differ between requests.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/chat_json.h"

namespace flashseek::tok {

struct ToolCall {
  std::string id;
  std::string name;
  // JSON object text built like the reference: "{" + join(", ", json(k) + ": " + v) + "}" where
  // v is json(value) for string="true" and the raw value text otherwise. Not re-validated: a
  // model can write invalid JSON in a string="false" value.
  std::string arguments;
  bool operator==(const ToolCall&) const = default;
};

// How the text ended.
enum class ParseStop {
  kEos,        // EOS string seen (and nothing after it)
  kEnd,        // text ended cleanly without EOS (EOS stripped by the caller, or after tool calls)
  kTruncated,  // text ended inside reasoning or inside the tool-call block (e.g. max_tokens)
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  // A call cut off by truncation is kept (its header was complete) with the arguments text
  // written so far, which is then not closed JSON.
  std::vector<ToolCall> tool_calls;
  ParseStop stop = ParseStop::kEnd;

  // {"role":"assistant","content":…,"reasoning_content":…,"tool_calls":[{"id","type":"function",
  //  "function":{"name","arguments"}}]}; content is null when empty and tool calls exist.
  ChatJson to_openai_message() const;
  bool operator==(const ParsedMessage&) const = default;
};

struct ParseOptions {
  ChatFamily family = ChatFamily::kV41;
  ThinkingMode thinking_mode = ThinkingMode::kChat;
  // Reference rules: "</think>" mandatory in thinking mode, EOS mandatory after plain content,
  // tool-call block must be closed. Lenient (false) accepts truncated text and missing EOS.
  bool strict = false;
  uint64_t tool_call_id_seed = 0;
};

std::string make_tool_call_id(uint64_t seed, size_t index);

// Errors (kParseError): tool calls inside reasoning, malformed DSML, duplicate parameter names,
// text after EOS or after the tool-call block, BOS/EOS/<think>/</think>/｜DSML｜ inside content
// or reasoning, and in strict mode any truncation.
Result<ParsedMessage> parse_completion(std::string_view text, const ParseOptions& options);

}  // namespace flashseek::tok
