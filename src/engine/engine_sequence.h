// Internal: the engine's record of one request (shared by engine.cpp and engine_step.cpp).
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec_policy.h"

namespace flashseek::engine {

struct Engine::Sequence {
  Request req;
  std::shared_ptr<EventStream> stream;
  std::unique_ptr<forward::SequenceState> state;  // set at admission
  int64_t prompt_done = 0;             // prompt tokens already in `state`
  std::vector<int32_t> generated;      // sampled tokens; the last one is fed at the next step
  std::vector<std::optional<PositionLogprobs>> prompt_lp;  // [P] when prompt_logprobs >= 0
  bool prompt_lp_sent = false;
  bool in_flight = false;  // inside the current forward call: its state must not be freed yet
  bool done = false;       // final event sent; dropped at the next opportunity
  // Speculative block verified in the current step (spec_step.cpp): [1 + B] tokens x0, y_1 … y_B
  // and, for sampling requests, the distributions q_i the drafts were drawn from. Empty: a plain
  // decode step.
  std::vector<int32_t> verify_tokens;
  std::vector<SamplingDistribution> verify_q;
  int64_t spec_steps = 0, spec_tokens = 0;  // verification steps run and tokens they emitted
  // The speculation policy of this sequence (spec_policy.h); set at admission when the engine
  // speculates. `spec_logged`: the policy state last written to the log (-1: none yet).
  std::optional<SpecPolicy> policy;
  int spec_logged = -1;
  int64_t spec_drafts = 0;  // drafts verified at its latest decode step (0: a plain decode)

  int64_t prompt_len() const { return int64_t(req.prompt.size()); }
  int64_t pending_prompt() const { return prompt_len() - prompt_done; }
};

}  // namespace flashseek::engine
