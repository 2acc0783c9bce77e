#include "tokenizer/chat_stream.h"

namespace flashseek::tok {

using namespace chat_tokens;

void ChatDelta::append(const ChatDelta& other) {
  reasoning_content += other.reasoning_content;
  content += other.content;
  for (const ToolCallDelta& d : other.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == d.index && d.id.empty()) {
      tool_calls.back().arguments += d.arguments;
    } else {
      tool_calls.push_back(d);
    }
  }
}

ChatJson ChatDelta::to_openai_delta() const {
  ChatJson delta = ChatJson::object();
  if (!reasoning_content.empty()) delta["reasoning_content"] = reasoning_content;
  if (!content.empty()) delta["content"] = content;
  if (!tool_calls.empty()) {
    ChatJson calls = ChatJson::array();
    for (const ToolCallDelta& d : tool_calls) {
      ChatJson c = {{"index", d.index}};
      ChatJson fn = ChatJson::object();
      if (!d.id.empty()) {
        c["id"] = d.id;
        c["type"] = "function";
        fn["name"] = d.name;
      }
      fn["arguments"] = d.arguments;
      c["function"] = std::move(fn);
      calls.push_back(std::move(c));
    }
    delta["tool_calls"] = std::move(calls);
  }
  return delta;
}

ChatStreamParser::ChatStreamParser(const ParseOptions& options)
    : options_(options),
      marker_(dsml_tags(options.family).block_start_marker()),
      phase_(options.thinking_mode == ThinkingMode::kThinking ? Phase::kReasoning
                                                               : Phase::kContent),
      calls_(options.family, options.tool_call_id_seed) {}

void ChatStreamParser::emit_text(size_t end, std::string& field) {
  if (end > emitted_) field.append(text_, emitted_, end - emitted_);
  emitted_ = std::max(emitted_, end);
}

void ChatStreamParser::pump(bool at_end, ChatDelta& out) {
  for (;;) {
    if (phase_ == Phase::kReasoning || phase_ == Phase::kContent) {
      const bool reasoning = phase_ == Phase::kReasoning;
      const std::string_view stop = reasoning ? kThinkEnd : kEos;
      std::string& field = reasoning ? out.reasoning_content : out.content;
      const size_t ps = text_.find(stop, emitted_);
      const size_t pm = text_.find(marker_, emitted_);
      if (ps != std::string::npos && ps <= pm) {
        emit_text(ps, field);
        emitted_ = ps + stop.size();
        phase_ = reasoning ? Phase::kContent : Phase::kAfter;
        continue;
      }
      if (pm != std::string::npos) {
        if (reasoning) {  // tool calls may not start inside reasoning: a format error
          phase_ = Phase::kFailed;
          return;
        }
        emit_text(pm, field);
        block_start_ = pm + marker_.size();
        phase_ = Phase::kCalls;
        continue;
      }
      size_t end = text_.size();
      if (!at_end) {
        end = detail::held_back_start(text_, emitted_, {stop, marker_});
        end = detail::utf8_safe_end(text_, emitted_, end);
      }
      emit_text(end, field);
      return;
    }
    if (phase_ == Phase::kCalls) {
      const std::string_view block = std::string_view(text_).substr(block_start_);
      if (!calls_.advance(block, at_end, out.tool_calls).ok()) {
        phase_ = Phase::kFailed;
      } else if (calls_.closed()) {
        phase_ = Phase::kAfter;
      }
    }
    return;  // kAfter / kFailed emit nothing more
  }
}

ChatDelta ChatStreamParser::push(std::string_view piece) {
  text_.append(piece);
  ChatDelta out;
  pump(/*at_end=*/false, out);
  return out;
}

ChatDelta ChatStreamParser::push_token(int token_id, std::string_view piece) {
  if (piece.empty()) {
    switch (token_id) {
      case kBosId: piece = kBos; break;
      case kEosId: piece = kEos; break;
      case kThinkStartId: piece = kThinkStart; break;
      case kThinkEndId: piece = kThinkEnd; break;
      case kDsmlId: piece = kDsml; break;
      default: break;
    }
  }
  return push(piece);
}

Result<ParsedMessage> ChatStreamParser::finish(ChatDelta* tail) {
  ChatDelta out;
  pump(/*at_end=*/true, out);
  if (tail != nullptr) *tail = std::move(out);
  return parse_completion(text_, options_);
}

}  // namespace flashseek::tok
