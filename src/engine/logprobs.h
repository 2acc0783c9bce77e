// Log-probabilities reported to clients: log_softmax of the RAW logits (no temperature or
// filtering; what OpenAI-style APIs and the oracle fixtures report), top-K plus the token that was
// actually chosen (generated) or present (prompt).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace flashseek::engine {

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
};

struct PositionLogprobs {
  TokenLogprob chosen;              // the sampled (or actual prompt) token
  std::vector<TokenLogprob> top;    // [K] highest first, lowest id first on ties
};

// log(sum(exp(logits))) with double accumulation; -inf entries contribute nothing.
// Error if no entry is finite.
Result<double> log_sum_exp(std::span<const float> logits);

// Top-K (K clamped to the vocab) of log_softmax(logits) and the logprob of `chosen`.
Result<PositionLogprobs> position_logprobs(std::span<const float> logits, int32_t chosen,
                                           int64_t top_k);

}  // namespace flashseek::engine
