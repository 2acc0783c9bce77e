// Plans one scheduler step: which running sequences get how many tokens in the next ragged batch.
// A pure function of the sequences' needs and the budgets, so the policy is unit-tested without a
// model or threads.
//
// Policy: every decoding sequence gets its one token first (decode latency is what users feel, and
// a decode step costs one token of budget); the remaining token budget goes to prompt chunks in
// admission order (first come, first served), each chunk capped at max_prefill_chunk.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace flashseek::engine {

struct StepBudget {
  int64_t max_step_tokens = 256;    // total tokens in one forward call (prefill + decode)
  int64_t max_prefill_chunk = 256;  // prompt tokens of one sequence in one step
};
Status validate_budget(const StepBudget& budget);

struct SequenceNeed {
  int64_t pending_prompt = 0;  // prompt tokens not yet in the state (0: decoding)
  bool ready = true;           // false: skip this step (e.g. cancelled while waiting)
};

struct PlannedItem {
  size_t sequence = 0;  // index into the needs span
  int64_t n_tokens = 0; // >= 1
  bool prefill = false;
};

// Items in the order of `needs` (admission order) so batch composition is stable.
std::vector<PlannedItem> plan_step(std::span<const SequenceNeed> needs, const StepBudget& budget);

}  // namespace flashseek::engine
