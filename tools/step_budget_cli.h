// The engine's per-step token budget as `run` and `serve` options: --prefill-chunk (prompt tokens
// of one sequence in one step) and --max-step-tokens (tokens of all sequences in one step, i.e. in
// one forward call; vLLM's name --max-num-batched-tokens is an alias). A long prompt is then
// prefilled in chunks between the decode steps of the other running sequences instead of stalling
// them (engine/batch_planner.h: decodes first, the rest of the budget to prompt chunks).
#pragma once
#include <cstdint>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "engine/batch_planner.h"

namespace flashseek::tools {

struct StepBudgetCli {
  int64_t prefill_chunk = 0;
  int64_t max_step_tokens = 0;
  CLI::Option* prefill_chunk_opt = nullptr;    // set by add_step_budget_options: given or not
  CLI::Option* max_step_tokens_opt = nullptr;
};

void add_step_budget_options(CLI::App* cmd, StepBudgetCli& o);

// The budget for an engine of `max_batch` slots. Defaults: the engine's (StepBudget{}) when
// neither flag is given (the step budget raised to max_batch if that is larger); --prefill-chunk N
// alone raises the step budget to fit a full chunk next to a decode of every other slot
// (N + max_batch - 1); --max-step-tokens M alone lets one prompt chunk take the whole step (N = M). Errors name
// the flags: a value < 1 or > 2^24, a chunk longer than an explicit step budget, or a step
// budget below max_batch (every running sequence must be able to decode in each step).
Result<engine::StepBudget> resolve_step_budget(const StepBudgetCli& o, int64_t max_batch);

}  // namespace flashseek::tools
