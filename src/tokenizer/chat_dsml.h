// Incremental parser of one DSML tool-call block (the text after "\n\n<｜DSML｜ calls"), shared
// by the one-shot and the streaming output parsers. It is fed the whole block text seen so far
// (a growing buffer) and consumes what is decidable, emitting tool-call deltas; the deltas do
// not depend on how the text was split. Grammar, V4.1 tags (spec §7.6 item 3):
//   ">\n" ( "<｜DSML｜ invoke" ws 'name="N">\n' PARAM* "</｜DSML｜ invoke" ">\n" )* "</｜DSML｜ calls>"
//   PARAM = "<｜DSML｜ parameter" ' name="K" string="true|false">' VALUE "</｜DSML｜ parameter" ">\n"
#pragma once
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/chat_parser.h"

namespace flashseek::tok {

// Part of one tool call in a streamed delta (OpenAI chunk layout): the first delta of a call
// carries id and name, later ones only argument text to append.
struct ToolCallDelta {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

namespace detail {

class DsmlCallsParser {
 public:
  DsmlCallsParser(ChatFamily family, uint64_t id_seed);

  // `block` = all text after the block-start marker seen so far (must extend the previous
  // call's text). `at_end`: no more text will come; pending value bytes are flushed and an
  // unfinished structure marks the parse truncated. Appends deltas to `out`.
  Status advance(std::string_view block, bool at_end, std::vector<ToolCallDelta>& out);

  bool closed() const { return state_ == State::kClosed; }
  bool truncated() const { return truncated_; }
  size_t consumed() const { return pos_; }  // bytes of `block` consumed
  // Calls so far; the last one may be unfinished while not closed().
  const std::vector<ToolCall>& calls() const { return calls_; }

 private:
  enum class State { kOpen, kBetween, kHeader, kTag, kParamHeader, kValue, kParamEnd, kInvokeEnd,
                     kClosed };
  enum class Match { kYes, kNeedMore, kNo };

  Match match_literal(std::string_view block, std::string_view lit) const;
  Status step_literal(std::string_view block, bool at_end, std::vector<ToolCallDelta>& out,
                      bool& progressed);
  Status step_header(std::string_view block, bool at_end, std::vector<ToolCallDelta>& out,
                     bool& progressed);
  Status step_param_header(std::string_view block, bool at_end, std::vector<ToolCallDelta>& out,
                           bool& progressed);
  Status step_value(std::string_view block, bool at_end, std::vector<ToolCallDelta>& out,
                    bool& progressed);
  void emit_args(std::string text, std::vector<ToolCallDelta>& out);
  Status error(std::string_view what) const;

  ChatFamily family_;
  uint64_t id_seed_;
  std::string invoke_open_, invoke_close_, param_open_, param_stop_, block_close_;
  State state_ = State::kOpen;
  size_t pos_ = 0;           // consumed bytes
  size_t value_emitted_ = 0;  // kValue: bytes of the value already emitted (from pos_)
  bool value_is_string_ = false;
  bool truncated_ = false;
  size_t params_in_call_ = 0;
  std::set<std::string> param_names_;
  std::vector<ToolCall> calls_;
};

// Start of the longest suffix of text[from:] that is a proper prefix of one of `stops`
// (text.size() if none): bytes from there on may still become a stop string.
size_t held_back_start(std::string_view text, size_t from, std::initializer_list<std::string_view> stops);
// Moves `end` back so that text[..end) does not end inside a UTF-8 multi-byte sequence.
size_t utf8_safe_end(std::string_view text, size_t begin, size_t end);

}  // namespace detail
}  // namespace flashseek::tok
