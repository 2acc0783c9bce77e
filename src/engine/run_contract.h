// The `flashseek run` contract (DESIGN.md §7): parsing prompt ids given on the command line and
// printing a GenerationResult as the JSON the oracles check:
//   {"prompt_logprobs": [null, [{"id":…,"logprob":…}, …], …],   one entry per prompt position
//    "tokens": [...],
//    "logprobs": [[{"id":…,"logprob":…}, …], …]}                 one entry per generated token
// Each per-position list is the top-K (highest first, lower id first on ties) followed by the
// actual (prompt) or chosen (generated) token when it is not among them, so its logprob is always
// present (K or K+1 entries, as vLLM reports). When K = 0 the corresponding key holds [].
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/request.h"

namespace flashseek::engine {

// "1,2,3" (commas and/or whitespace) or "@path" naming a file with a JSON array of ids, or a JSON
// object with a "prompt_ids" / "tokens" array. Errors name the bad item or file.
Result<std::vector<int32_t>> parse_token_ids(std::string_view text);

// Checks every id is in [0, vocab); the message names the first bad id and its position.
Status check_token_ids(const std::vector<int32_t>& ids, int64_t vocab, std::string_view what);

struct RunJsonOptions {
  bool prompt_logprobs = false;  // K > 0 was requested
  bool logprobs = false;
  int indent = -1;               // -1: one line
};
std::string run_result_json(const GenerationResult& result, const RunJsonOptions& options);

}  // namespace flashseek::engine
