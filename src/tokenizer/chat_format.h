// Fixed strings and token ids of the DeepSeek-V4 / V4.1 chat format (spec model-v41.md §7.2-§7.3;
// V4 differences from the official V4 encoder). Everything the encoder and parsers emit or match
// is defined here once.
#pragma once
#include <string>
#include <string_view>

namespace flashseek::tok {

// Which chat encoder to follow. V4.1 adds the <｜System｜> token, a numeric reasoning effort,
// image placeholders and DSML tag names with a leading space.
enum class ChatFamily { kV4, kV41 };
enum class ThinkingMode { kChat, kThinking };

const char* chat_family_name(ChatFamily family);
const char* thinking_mode_name(ThinkingMode mode);

namespace chat_tokens {
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";  // V4.1 only
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kImage = "<｜deepseek_image｜>";  // V4.1 image placeholder

// Token ids from the V4.1 added-token table (spec §7.2); the same ids hold for V4.
inline constexpr int kBosId = 0;
inline constexpr int kEosId = 1;
inline constexpr int kSystemId = 128799;
inline constexpr int kUserId = 128803;
inline constexpr int kAssistantId = 128804;
inline constexpr int kThinkStartId = 128821;
inline constexpr int kThinkEndId = 128822;
inline constexpr int kDsmlId = 128825;
inline constexpr int kLatestReminderId = 128828;
inline constexpr int kImageId = 129264;
}  // namespace chat_tokens

// Tag spellings of the DSML tool-call markup. V4.1: "<｜DSML｜ calls>", "<｜DSML｜ invoke ...>",
// "<｜DSML｜ parameter ...>"; V4: "<｜DSML｜tool_calls>", "<｜DSML｜invoke ...>", "<｜DSML｜parameter ...>".
struct DsmlTags {
  std::string block;      // " calls" | "tool_calls"
  std::string invoke;     // " invoke" | "invoke"
  std::string parameter;  // " parameter" | "parameter"

  std::string block_open() const;        // "<｜DSML｜ calls>"
  std::string block_close() const;       // "</｜DSML｜ calls>"
  std::string block_start_marker() const;  // "\n\n<｜DSML｜ calls": ends content in model output
  std::string invoke_open() const;       // "<｜DSML｜ invoke"
  std::string invoke_close() const;      // "</｜DSML｜ invoke"
  std::string parameter_open() const;    // "<｜DSML｜ parameter"
  std::string parameter_close() const;   // "</｜DSML｜ parameter"
};
const DsmlTags& dsml_tags(ChatFamily family);

// The release's TOOLS_TEMPLATE text (verbatim copy in data/chat/tools_template_v4{,1}.txt),
// with Python str.format placeholders {dsml_token}, {tool_schemas}, ...
std::string_view tools_template(ChatFamily family);
// V4 "max" reasoning-effort paragraph (data/chat/reasoning_effort_max_v4.txt).
std::string_view v4_max_effort_text();

// "Reasoning Effort: {budget} (range 1-100, ...)\n\n" (V4.1).
std::string v41_effort_line(int budget);

// Fills the placeholders of tools_template(family) with the family's tags and the tool schemas
// (already serialised, one JSON per line).
std::string render_tools_block(ChatFamily family, std::string_view tool_schemas);

}  // namespace flashseek::tok
