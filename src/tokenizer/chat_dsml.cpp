#include "tokenizer/chat_dsml.h"

#include <algorithm>

namespace flashseek::tok::detail {
namespace {

constexpr std::string_view kLineEnd = ">\n";
constexpr std::string_view kNameAttr = " name=\"";
constexpr std::string_view kStringTrue = "\" string=\"true\">";
constexpr std::string_view kStringFalse = "\" string=\"false\">";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

size_t held_back_start(std::string_view text, size_t from,
                       std::initializer_list<std::string_view> stops) {
  size_t longest = 0;
  for (auto s : stops) longest = std::max(longest, s.size());
  size_t i = text.size() >= longest ? text.size() - longest + 1 : 0;
  for (i = std::max(i, from); i < text.size(); ++i) {
    const std::string_view suffix = text.substr(i);
    for (auto s : stops) {
      if (suffix.size() < s.size() && s.substr(0, suffix.size()) == suffix) return i;
    }
  }
  return text.size();
}

size_t utf8_safe_end(std::string_view text, size_t begin, size_t end) {
  for (size_t k = 1; k <= 4 && end >= begin + k; ++k) {
    const auto c = static_cast<unsigned char>(text[end - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > k ? end - k : end;
  }
  return end;
}

DsmlCallsParser::DsmlCallsParser(ChatFamily family, uint64_t id_seed)
    : family_(family), id_seed_(id_seed) {
  const DsmlTags& tags = dsml_tags(family);
  invoke_open_ = tags.invoke_open();
  invoke_close_ = tags.invoke_close();
  param_open_ = tags.parameter_open();
  // The reference ends a value at "/｜DSML｜ parameter" and then requires the "<" before it.
  param_stop_ = "/" + std::string(chat_tokens::kDsml) + tags.parameter;
  block_close_ = tags.block_close();
}

Status DsmlCallsParser::error(std::string_view what) const {
  return parse_error("{} tool-call block: {} (at byte {} of the block)", chat_family_name(family_),
                     what, pos_);
}

DsmlCallsParser::Match DsmlCallsParser::match_literal(std::string_view block,
                                                      std::string_view lit) const {
  const std::string_view rest = block.substr(pos_);
  if (rest.substr(0, lit.size()) == lit) return Match::kYes;
  if (rest.size() < lit.size() && lit.substr(0, rest.size()) == rest) return Match::kNeedMore;
  return Match::kNo;
}

void DsmlCallsParser::emit_args(std::string text, std::vector<ToolCallDelta>& out) {
  const size_t index = calls_.size() - 1;
  calls_.back().arguments += text;
  if (out.empty() || out.back().index != index) out.push_back(ToolCallDelta{index, "", "", ""});
  out.back().arguments += text;
}

// States whose next input is one of a few fixed tags.
Status DsmlCallsParser::step_literal(std::string_view block, bool at_end,
                                     std::vector<ToolCallDelta>& out, bool& progressed) {
  struct Alt {
    std::string_view lit;
    State next;
  };
  std::vector<Alt> alts;
  const char* expected = "";
  switch (state_) {
    case State::kOpen: alts = {{kLineEnd, State::kBetween}}; expected = "'>\\n' after the block tag"; break;
    case State::kBetween:
      alts = {{invoke_open_, State::kHeader}, {block_close_, State::kClosed}};
      expected = "an invoke tag or the block close tag";
      break;
    case State::kTag:
      alts = {{param_open_, State::kParamHeader}, {invoke_close_, State::kInvokeEnd}};
      expected = "a parameter tag or the invoke close tag";
      break;
    case State::kParamEnd: alts = {{kLineEnd, State::kTag}}; expected = "'>\\n' after a parameter"; break;
    case State::kInvokeEnd: alts = {{kLineEnd, State::kBetween}}; expected = "'>\\n' after an invoke"; break;
    default: return internal_error("DsmlCallsParser: bad literal state");
  }
  bool need_more = false;
  for (const Alt& alt : alts) {
    const Match m = match_literal(block, alt.lit);
    if (m == Match::kYes) {
      pos_ += alt.lit.size();
      if (alt.next == State::kInvokeEnd) emit_args(params_in_call_ == 0 ? "{}" : "}", out);
      state_ = alt.next;
      progressed = true;
      return {};
    }
    need_more = need_more || m == Match::kNeedMore;
  }
  if (need_more) return {};  // wait for more text (or truncated at the end)
  return error(std::string("expected ") + expected);
}

Status DsmlCallsParser::step_header(std::string_view block, bool at_end,
                                    std::vector<ToolCallDelta>& out, bool& progressed) {
  const size_t a = block.find(param_open_, pos_);
  const size_t b = block.find(invoke_close_, pos_);
  const size_t p = std::min(a, b);
  if (p == std::string_view::npos) return {};
  std::string_view header = block.substr(pos_, p - pos_);
  size_t i = 0;
  while (i < header.size() && is_space(header[i])) ++i;
  header.remove_prefix(i);
  // ' name="N">\n' (Python's `$` also accepts one extra "\n": an invoke without parameters).
  size_t cut = 0;
  if (header.size() >= 4 && header.substr(header.size() - 4) == "\">\n\n") cut = 4;
  else if (header.size() >= 3 && header.substr(header.size() - 3) == "\">\n") cut = 3;
  if (header.substr(0, 6) != "name=\"" || cut == 0 || header.size() < 6 + cut)
    return error("malformed invoke header '" + std::string(header) + "'");
  ToolCall call{make_tool_call_id(id_seed_, calls_.size()),
                std::string(header.substr(6, header.size() - 6 - cut)), ""};
  out.push_back(ToolCallDelta{calls_.size(), call.id, call.name, ""});
  calls_.push_back(std::move(call));
  params_in_call_ = 0;
  param_names_.clear();
  pos_ = p;
  state_ = State::kTag;
  progressed = true;
  return {};
}

Status DsmlCallsParser::step_param_header(std::string_view block, bool at_end,
                                          std::vector<ToolCallDelta>& out, bool& progressed) {
  const Match m = match_literal(block, kNameAttr);
  if (m == Match::kNeedMore) return {};
  if (m == Match::kNo) return error("expected ' name=\"' after the parameter tag");
  const size_t from = pos_ + kNameAttr.size();
  const size_t t_true = block.find(kStringTrue, from);
  const size_t t_false = block.find(kStringFalse, from);
  const size_t t = std::min(t_true, t_false);
  const size_t stop = block.find(param_stop_, from);
  if (stop != std::string_view::npos && stop < t)
    return error("parameter without ' string=\"true|false\">'");
  if (t == std::string_view::npos) return {};
  const std::string name(block.substr(from, t - from));
  if (!param_names_.insert(name).second) return error("duplicate parameter name '" + name + "'");
  value_is_string_ = t == t_true;
  emit_args(std::string(params_in_call_ == 0 ? "{" : ", ") + "\"" + json_escape_body(name) +
                "\": " + (value_is_string_ ? "\"" : ""),
            out);
  ++params_in_call_;
  pos_ = t + (value_is_string_ ? kStringTrue.size() : kStringFalse.size());
  value_emitted_ = 0;
  state_ = State::kValue;
  progressed = true;
  return {};
}

Status DsmlCallsParser::step_value(std::string_view block, bool at_end,
                                   std::vector<ToolCallDelta>& out, bool& progressed) {
  const size_t start = pos_ + value_emitted_;
  auto emit_value = [&](size_t end) {
    if (end <= start) return;
    const std::string_view piece = block.substr(start, end - start);
    emit_args(value_is_string_ ? json_escape_body(piece) : std::string(piece), out);
    value_emitted_ += end - start;
  };
  const size_t q = block.find(param_stop_, start);
  if (q != std::string_view::npos) {
    if (q == pos_ || block[q - 1] != '<') return error("parameter value not closed by '<' + close tag");
    emit_value(q - 1);
    if (value_is_string_) emit_args("\"", out);
    pos_ = q + param_stop_.size();
    state_ = State::kParamEnd;
    progressed = true;
    return {};
  }
  if (at_end) {
    emit_value(block.size());  // truncated inside the value: everything written so far
    return {};
  }
  // Hold back a possible "<" + prefix of the close tag and an incomplete UTF-8 character.
  size_t end = held_back_start(block, start, {param_stop_});
  end = end > start ? end - 1 : start;
  emit_value(utf8_safe_end(block, start, end));
  return {};
}

Status DsmlCallsParser::advance(std::string_view block, bool at_end,
                                std::vector<ToolCallDelta>& out) {
  for (;;) {
    bool progressed = false;
    switch (state_) {
      case State::kClosed: return {};
      case State::kHeader: FS_RETURN_IF_ERROR(step_header(block, at_end, out, progressed)); break;
      case State::kParamHeader:
        FS_RETURN_IF_ERROR(step_param_header(block, at_end, out, progressed));
        break;
      case State::kValue: FS_RETURN_IF_ERROR(step_value(block, at_end, out, progressed)); break;
      default: FS_RETURN_IF_ERROR(step_literal(block, at_end, out, progressed)); break;
    }
    if (!progressed) break;
  }
  if (at_end && state_ != State::kClosed) truncated_ = true;
  return {};
}

}  // namespace flashseek::tok::detail
