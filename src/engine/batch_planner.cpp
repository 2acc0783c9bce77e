#include "engine/batch_planner.h"

#include <algorithm>

namespace flashseek::engine {

Status validate_budget(const StepBudget& b) {
  if (b.max_step_tokens < 1)
    return invalid_argument("engine: max_step_tokens must be >= 1 (got {})", b.max_step_tokens);
  if (b.max_prefill_chunk < 1)
    return invalid_argument("engine: max_prefill_chunk must be >= 1 (got {})",
                            b.max_prefill_chunk);
  return {};
}

std::vector<PlannedItem> plan_step(std::span<const SequenceNeed> needs, const StepBudget& budget) {
  std::vector<int64_t> granted(needs.size(), 0);
  int64_t left = budget.max_step_tokens;
  for (size_t i = 0; i < needs.size() && left > 0; ++i) {
    if (needs[i].ready && needs[i].pending_prompt == 0) {
      granted[i] = 1;
      --left;
    }
  }
  for (size_t i = 0; i < needs.size() && left > 0; ++i) {
    if (!needs[i].ready || needs[i].pending_prompt == 0) continue;
    granted[i] = std::min({needs[i].pending_prompt, budget.max_prefill_chunk, left});
    left -= granted[i];
  }
  std::vector<PlannedItem> plan;
  for (size_t i = 0; i < needs.size(); ++i)
    if (granted[i] > 0) plan.push_back({i, granted[i], needs[i].pending_prompt > 0});
  return plan;
}

}  // namespace flashseek::engine
