#include "core/json_limits.h"

#include <fmt/format.h>

namespace flashseek {

JsonScan scan_json(std::string_view text, const JsonLimits& limits) {
  size_t depth = 0;
  size_t values = 0;
  bool in_string = false;
  bool escaped = false;
  bool in_scalar = false;  // inside a number / literal (counted once)
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        in_scalar = false;
        ++values;  // object keys count too: they cost memory like values
        break;
      case '[':
      case '{':
        in_scalar = false;
        if (++depth > limits.max_depth) return JsonScan::kTooDeep;
        ++values;
        break;
      case ']':
      case '}':
        in_scalar = false;
        if (depth > 0) --depth;
        break;
      case ',':
      case ':':
      case ' ':
      case '\t':
      case '\r':
      case '\n':
        in_scalar = false;
        break;
      default:
        if (!in_scalar) ++values;
        in_scalar = true;
        break;
    }
    if (values > limits.max_values) return JsonScan::kTooManyValues;
  }
  return JsonScan::kOk;
}

std::string describe(JsonScan result, const JsonLimits& limits) {
  switch (result) {
    case JsonScan::kTooDeep:
      return fmt::format("JSON nested deeper than {} levels", limits.max_depth);
    case JsonScan::kTooManyValues:
      return fmt::format("JSON with more than {} values", limits.max_values);
    case JsonScan::kOk:
      break;
  }
  return "JSON within limits";
}

}  // namespace flashseek
