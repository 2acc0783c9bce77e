// Parsing and printing lists of token ids for CLIs and tests: "1 2 3", "1,2,3", "[1, 2, 3]"
// (any mix of whitespace, commas and one pair of enclosing brackets).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace flashseek::tok {

// Fails with kInvalidArgument naming the offending item and its position.
Result<std::vector<int32_t>> parse_token_ids(std::string_view text);

// "1 2 3" (separator " ") or "1,2,3" (separator ",").
std::string format_token_ids(std::span<const int32_t> ids, std::string_view separator = " ");

}  // namespace flashseek::tok
