#include "tokenizer/chat_format.h"

#include <fmt/format.h>

namespace flashseek::tok {
namespace {

// Verbatim copies of data/chat/*.txt (tests/tokenizer/chat_format_test.cpp checks that they are
// byte-identical to the data files). Compiled in so that the binary needs no data directory.
constexpr std::string_view kToolsTemplateV41 = R"tpl(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml_token}{tc_block_name}>" block like the following:

<{dsml_token}{tc_block_name}>
<{dsml_token}{tool_call_tag_name} name="$TOOL_NAME">
<{dsml_token}{tool_parameter_tag_name} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml_token}{tool_parameter_tag_name}>
...
</{dsml_token}{tool_call_tag_name}>
<{dsml_token}{tool_call_tag_name} name="$TOOL_NAME2">
...
</{dsml_token}{tool_call_tag_name}>
</{dsml_token}{tc_block_name}>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {thinking_start_token}), you MUST output your complete reasoning inside {thinking_start_token}...{thinking_end_token} BEFORE any tool calls or final response.

Otherwise, output directly after {thinking_end_token} with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)tpl";

constexpr std::string_view kToolsTemplateV4 = R"tpl(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml_token}tool_calls>" block like the following:

<{dsml_token}tool_calls>
<{dsml_token}invoke name="$TOOL_NAME">
<{dsml_token}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml_token}parameter>
...
</{dsml_token}invoke>
<{dsml_token}invoke name="$TOOL_NAME2">
...
</{dsml_token}invoke>
</{dsml_token}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {thinking_start_token}), you MUST output your complete reasoning inside {thinking_start_token}...{thinking_end_token} BEFORE any tool calls or final response.

Otherwise, output directly after {thinking_end_token} with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)tpl";

constexpr std::string_view kMaxEffortV4 = R"tpl(Reasoning Effort: Absolute maximum with no shortcuts permitted.
You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial scenarios.
Explicitly write out your entire deliberation process, documenting every intermediate step, considered alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.

)tpl";

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
}

}  // namespace

const char* chat_family_name(ChatFamily family) {
  return family == ChatFamily::kV4 ? "v4" : "v4.1";
}

const char* thinking_mode_name(ThinkingMode mode) {
  return mode == ThinkingMode::kChat ? "chat" : "thinking";
}

std::string DsmlTags::block_open() const { return fmt::format("<{}{}>", chat_tokens::kDsml, block); }
std::string DsmlTags::block_close() const { return fmt::format("</{}{}>", chat_tokens::kDsml, block); }
std::string DsmlTags::block_start_marker() const {
  return fmt::format("\n\n<{}{}", chat_tokens::kDsml, block);
}
std::string DsmlTags::invoke_open() const { return fmt::format("<{}{}", chat_tokens::kDsml, invoke); }
std::string DsmlTags::invoke_close() const { return fmt::format("</{}{}", chat_tokens::kDsml, invoke); }
std::string DsmlTags::parameter_open() const {
  return fmt::format("<{}{}", chat_tokens::kDsml, parameter);
}
std::string DsmlTags::parameter_close() const {
  return fmt::format("</{}{}", chat_tokens::kDsml, parameter);
}

const DsmlTags& dsml_tags(ChatFamily family) {
  static const DsmlTags kV41{" calls", " invoke", " parameter"};
  static const DsmlTags kV4{"tool_calls", "invoke", "parameter"};
  return family == ChatFamily::kV4 ? kV4 : kV41;
}

std::string_view tools_template(ChatFamily family) {
  return family == ChatFamily::kV4 ? kToolsTemplateV4 : kToolsTemplateV41;
}

std::string_view v4_max_effort_text() { return kMaxEffortV4; }

std::string v41_effort_line(int budget) {
  return fmt::format(
      "Reasoning Effort: {} (range 1-100, the higher the value, the more thorough the "
      "reasoning)\n\n",
      budget);
}

std::string render_tools_block(ChatFamily family, std::string_view tool_schemas) {
  const DsmlTags& tags = dsml_tags(family);
  std::string out(tools_template(family));
  // Fill {tool_schemas} last so that braces inside the schemas are never treated as
  // placeholders (Python's str.format substitutes in one pass, with the same effect).
  replace_all(out, "{dsml_token}", chat_tokens::kDsml);
  replace_all(out, "{tc_block_name}", tags.block);
  replace_all(out, "{tool_call_tag_name}", tags.invoke);
  replace_all(out, "{tool_parameter_tag_name}", tags.parameter);
  replace_all(out, "{thinking_start_token}", chat_tokens::kThinkStart);
  replace_all(out, "{thinking_end_token}", chat_tokens::kThinkEnd);
  const size_t pos = out.find("{tool_schemas}");
  if (pos != std::string::npos) out.replace(pos, 14, tool_schemas);
  return out;
}

}  // namespace flashseek::tok
