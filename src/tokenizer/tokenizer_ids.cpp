#include "tokenizer/tokenizer_ids.h"

#include <charconv>

namespace flashseek::tok {
namespace {

bool is_separator(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',';
}

}  // namespace

Result<std::vector<int32_t>> parse_token_ids(std::string_view text) {
  // Strip surrounding whitespace and one pair of brackets.
  auto trim = [](std::string_view s) {
    while (!s.empty() && is_separator(s.front()) && s.front() != ',') s.remove_prefix(1);
    while (!s.empty() && is_separator(s.back()) && s.back() != ',') s.remove_suffix(1);
    return s;
  };
  text = trim(text);
  if (!text.empty() && text.front() == '[') {
    if (text.back() != ']') return invalid_argument("token ids: '[' without a closing ']'");
    text = trim(text.substr(1, text.size() - 2));
  }
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    if (is_separator(text[pos])) {
      ++pos;
      continue;
    }
    size_t end = pos;
    while (end < text.size() && !is_separator(text[end])) ++end;
    const std::string_view item = text.substr(pos, end - pos);
    int64_t value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec != std::errc() || ptr != item.data() + item.size() || value < INT32_MIN ||
        value > INT32_MAX) {
      return invalid_argument("token ids: item {} '{}' is not an integer id", ids.size(),
                              std::string(item.substr(0, 40)));
    }
    ids.push_back(static_cast<int32_t>(value));
    pos = end;
  }
  return ids;
}

std::string format_token_ids(std::span<const int32_t> ids, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += separator;
    out += std::to_string(ids[i]);
  }
  return out;
}

}  // namespace flashseek::tok
