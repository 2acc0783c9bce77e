#include "tools/step_budget_cli.h"

#include <algorithm>

namespace flashseek::tools {
namespace {

// Far above any useful chunk, low enough that chunk + max_batch cannot overflow.
constexpr int64_t kMaxTokens = int64_t(1) << 24;

Status check_range(const char* flag, int64_t v) {
  if (v < 1 || v > kMaxTokens)
    return invalid_argument("{} must be in [1, {}] (got {})", flag, kMaxTokens, v);
  return {};
}

}  // namespace

void add_step_budget_options(CLI::App* cmd, StepBudgetCli& o) {
  const engine::StepBudget d;
  o.prefill_chunk_opt = cmd->add_option(
      "--prefill-chunk", o.prefill_chunk,
      fmt::format("prompt tokens of one sequence per engine step (chunked prefill; default {}, or "
                  "--max-step-tokens when only that is given)",
                  d.max_prefill_chunk));
  o.max_step_tokens_opt = cmd->add_option(
      "--max-step-tokens,--max-num-batched-tokens", o.max_step_tokens,
      fmt::format("tokens of all sequences per engine step: decode steps first, prompt chunks get "
                  "the rest (default {}, raised to fit --prefill-chunk and --max-batch)",
                  d.max_step_tokens));
}

Result<engine::StepBudget> resolve_step_budget(const StepBudgetCli& o, int64_t max_batch) {
  const bool chunk_given = o.prefill_chunk_opt && o.prefill_chunk_opt->count() > 0;
  const bool step_given = o.max_step_tokens_opt && o.max_step_tokens_opt->count() > 0;
  if (chunk_given) FS_RETURN_IF_ERROR(check_range("--prefill-chunk", o.prefill_chunk));
  if (step_given) FS_RETURN_IF_ERROR(check_range("--max-step-tokens", o.max_step_tokens));
  engine::StepBudget b;  // the engine's defaults
  if (step_given) {
    b.max_step_tokens = o.max_step_tokens;
    b.max_prefill_chunk = chunk_given ? o.prefill_chunk : o.max_step_tokens;
    if (chunk_given && o.prefill_chunk > o.max_step_tokens)
      return invalid_argument(
          "--prefill-chunk ({}) is larger than --max-step-tokens ({}): a prompt chunk must fit in "
          "one step",
          o.prefill_chunk, o.max_step_tokens);
    if (o.max_step_tokens < max_batch)
      return invalid_argument(
          "--max-step-tokens ({}) must be >= --max-batch ({}) so every running sequence can "
          "decode in each step",
          o.max_step_tokens, max_batch);
  } else if (chunk_given) {
    b.max_prefill_chunk = o.prefill_chunk;
    b.max_step_tokens = std::max(b.max_step_tokens, o.prefill_chunk + max_batch - 1);
  } else {
    b.max_step_tokens = std::max(b.max_step_tokens, max_batch);
  }
  FS_RETURN_IF_ERROR(engine::validate_budget(b));
  return b;
}

}  // namespace flashseek::tools
