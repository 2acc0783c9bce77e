// Finding the tokenizer files. The tokenizer.json is not committed (scripts/fetch_tokenizer.sh
// puts it in models/tokenizer/); the V4.1 added-token table is committed in data/tokenizer/.
#pragma once
#include <string>
#include <string_view>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace flashseek::tok {

inline constexpr std::string_view kTokenizerEnv = "FLASHSEEK_TOKENIZER";
inline constexpr std::string_view kAddedTokensEnv = "FLASHSEEK_ADDED_TOKENS";

// tokenizer.json, first hit of: `explicit_path` (a file, or a directory holding tokenizer.json),
// env FLASHSEEK_TOKENIZER (same forms), models/tokenizer/tokenizer.json under the repository
// root guessed from the executable (<exe dir>/.. and <exe dir>/../..), then under
// FLASHSEEK_SOURCE_DIR. The error lists every place tried.
Result<std::string> find_tokenizer_json(std::string_view explicit_path = {});

// V4.1 added-token table, first hit of: `explicit_path`, env FLASHSEEK_ADDED_TOKENS,
// v41_added_tokens.json next to `tokenizer_json`, data/tokenizer/v41_added_tokens.json under
// the repository root (executable-relative, then FLASHSEEK_SOURCE_DIR).
Result<std::string> find_v41_added_tokens(std::string_view explicit_path,
                                          const std::string& tokenizer_json);

// The V4.1 tokenizer: find_tokenizer_json + find_v41_added_tokens + Tokenizer::load.
Result<Tokenizer> load_v41_tokenizer(std::string_view tokenizer_path = {},
                                     std::string_view added_tokens_path = {});

}  // namespace flashseek::tok
