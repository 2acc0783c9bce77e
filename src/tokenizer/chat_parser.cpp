#include "tokenizer/chat_parser.h"

#include <cinttypes>
#include <cstdio>

#include "tokenizer/chat_dsml.h"

namespace flashseek::tok {
namespace {

using namespace chat_tokens;

// Earliest occurrence of `a` or `b` at or after `from`; `which` = 0 (a), 1 (b) or -1 (none).
size_t find_first(std::string_view text, size_t from, std::string_view a, std::string_view b,
                  int& which) {
  const size_t pa = text.find(a, from);
  const size_t pb = text.find(b, from);
  which = pa == std::string_view::npos && pb == std::string_view::npos ? -1 : (pa <= pb ? 0 : 1);
  return which < 0 ? std::string_view::npos : (which == 0 ? pa : pb);
}

Status check_no_specials(const std::string& field, const char* name) {
  for (std::string_view sp : {kBos, kEos, kThinkStart, kThinkEnd, kDsml}) {
    if (field.find(sp) != std::string::npos)
      return parse_error("model output: {} contains the special token {}", name, sp);
  }
  return {};
}

// Parses the tool-call block starting at `from` (just after the block-start marker) and what
// may follow it (EOS or nothing).
Status parse_calls(std::string_view text, size_t from, const ParseOptions& options,
                   ParsedMessage& msg) {
  detail::DsmlCallsParser calls(options.family, options.tool_call_id_seed);
  std::vector<ToolCallDelta> unused;
  const std::string_view block = text.substr(from);
  FS_RETURN_IF_ERROR(calls.advance(block, /*at_end=*/true, unused));
  msg.tool_calls = calls.calls();
  if (!calls.closed()) {
    if (options.strict) return parse_error("model output: tool-call block is not closed");
    msg.stop = ParseStop::kTruncated;
    return {};
  }
  const std::string_view rest = block.substr(calls.consumed());
  if (rest.empty()) {
    msg.stop = ParseStop::kEnd;
  } else if (rest == kEos) {
    msg.stop = ParseStop::kEos;
  } else {
    return parse_error("model output: unexpected text after the tool-call block: '{}'",
                       std::string(rest.substr(0, 64)));
  }
  return {};
}

}  // namespace

std::string make_tool_call_id(uint64_t seed, size_t index) {
  const uint64_t h = fnv1a64(std::to_string(seed) + ":" + std::to_string(index));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "call_%016" PRIx64, h);
  return buf;
}

ChatJson ParsedMessage::to_openai_message() const {
  ChatJson msg = {{"role", "assistant"}};
  msg["content"] = content.empty() && !tool_calls.empty() ? ChatJson(nullptr) : ChatJson(content);
  if (!reasoning_content.empty()) msg["reasoning_content"] = reasoning_content;
  if (!tool_calls.empty()) {
    ChatJson calls = ChatJson::array();
    for (const ToolCall& tc : tool_calls) {
      calls.push_back({{"id", tc.id},
                       {"type", "function"},
                       {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
    }
    msg["tool_calls"] = std::move(calls);
  }
  return msg;
}

Result<ParsedMessage> parse_completion(std::string_view text, const ParseOptions& options) {
  const std::string marker = dsml_tags(options.family).block_start_marker();
  ParsedMessage msg;
  size_t pos = 0;
  int which = -1;
  if (options.thinking_mode == ThinkingMode::kThinking) {
    const size_t p = find_first(text, 0, kThinkEnd, marker, which);
    if (which == 1) return parse_error("model output: tool calls inside the reasoning (before </think>)");
    if (which < 0) {
      if (options.strict) return parse_error("model output: missing </think>");
      msg.reasoning_content = std::string(text);
      msg.stop = ParseStop::kTruncated;
      FS_RETURN_IF_ERROR(check_no_specials(msg.reasoning_content, "reasoning_content"));
      return msg;
    }
    msg.reasoning_content = std::string(text.substr(0, p));
    pos = p + kThinkEnd.size();
  }
  const size_t p = find_first(text, pos, kEos, marker, which);
  msg.content = std::string(text.substr(pos, p == std::string_view::npos ? text.npos : p - pos));
  if (which == 0) {
    if (p + kEos.size() != text.size())
      return parse_error("model output: text after the end-of-sentence token");
    msg.stop = ParseStop::kEos;
  } else if (which == 1) {
    FS_RETURN_IF_ERROR(parse_calls(text, p + marker.size(), options, msg));
  } else {
    if (options.strict) return parse_error("model output: missing end-of-sentence token");
    msg.stop = ParseStop::kEnd;
  }
  FS_RETURN_IF_ERROR(check_no_specials(msg.reasoning_content, "reasoning_content"));
  FS_RETURN_IF_ERROR(check_no_specials(msg.content, "content"));
  return msg;
}

}  // namespace flashseek::tok
