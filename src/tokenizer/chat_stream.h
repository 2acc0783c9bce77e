// Streaming output parser (spec model-v41.md §7.6 item 5): fed decoded text pieces as they are
// generated, it returns OpenAI-style deltas. Text that may still turn out to be a delimiter is
// held back: a prefix of "</think>" in reasoning, a prefix of EOS or of "\n\n<｜DSML｜ calls" in
// content, "<" + a prefix of the parameter close tag inside a tool argument value, and an
// incomplete UTF-8 character anywhere (so every delta is valid UTF-8 when the input is).
//
// Invariant (tested at every split position): concatenating all deltas, those of finish()
// included, gives the reasoning_content, content and tool calls (id, name, arguments) of
// finish()'s result, which is parse_completion() of the whole text. After a format error the
// parser stops emitting; finish() then returns that error.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_dsml.h"
#include "tokenizer/chat_parser.h"

namespace flashseek::tok {

struct ChatDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  // Appends `other`, merging argument text of the same call into one entry.
  void append(const ChatDelta& other);
  // The "delta" object of a chat.completion.chunk: keys only for non-empty parts; a call's first
  // entry has {"index","id","type":"function","function":{"name","arguments"}}, later ones
  // {"index","function":{"arguments"}}.
  ChatJson to_openai_delta() const;
};

class ChatStreamParser {
 public:
  explicit ChatStreamParser(const ParseOptions& options);

  ChatDelta push(std::string_view piece);
  // For callers that decode with special tokens skipped: an empty piece for a known special id
  // (EOS, </think>, ｜DSML｜, …) is replaced by the token's text.
  ChatDelta push_token(int token_id, std::string_view piece);
  // Flushes held-back text into `tail` (if given) and returns the final parse of all text.
  Result<ParsedMessage> finish(ChatDelta* tail = nullptr);

  const std::string& text() const { return text_; }
  bool failed() const { return phase_ == Phase::kFailed; }

 private:
  enum class Phase { kReasoning, kContent, kCalls, kAfter, kFailed };
  void pump(bool at_end, ChatDelta& out);
  // Emits text_[emitted_, end) into `field`.
  void emit_text(size_t end, std::string& field);

  ParseOptions options_;
  std::string marker_;  // "\n\n<｜DSML｜ calls"
  std::string text_;
  Phase phase_;
  size_t emitted_ = 0;      // reasoning/content bytes consumed
  size_t block_start_ = 0;  // start of the tool-call block text in text_
  detail::DsmlCallsParser calls_;
};

}  // namespace flashseek::tok
