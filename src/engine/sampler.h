// Token sampling from one row of logits: greedy, temperature, top-k, top-p (nucleus), min-p.
//
// Order of the transforms (documented in docs/engine.md): temperature, then top-k on the scaled
// logits, then softmax over the survivors, then top-p on that distribution, then min-p, then a
// draw by inverse CDF with u = counter_uniform(seed, position). Ties are always broken towards
// the lower token id, so the result is a pure function of (logits, params, position).
// The rule itself lives once in ops/sample.h (ops/cpu/sample.cpp), which is also the CPU twin of
// the device sampler; these are the engine's entry points on SamplingParams.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/sampling_params.h"
#include "ops/sample.h"

namespace flashseek::engine {

// Index of the largest finite logit (lowest id on ties); error if no logit is finite.
Result<int32_t> argmax_token(std::span<const float> logits);

// The distribution the sampler draws from: candidate ids (in draw order) and their probabilities
// (normalised to sum 1). Exposed so tests can check support and frequencies exactly.
using SamplingDistribution = ops::SampleDistribution;
Result<SamplingDistribution> sampling_distribution(std::span<const float> logits,
                                                   const SamplingParams& params);

// The op-level spec of `params` for the token at `position` (u = counter_uniform(seed, position)).
ops::SampleSpec sample_spec(const SamplingParams& params, int64_t position);

// Samples one token. `position` is the sequence position the sampled token will occupy; it keys
// the random draw together with params.seed.
Result<int32_t> sample_token(std::span<const float> logits, const SamplingParams& params,
                             int64_t position);

// Same, reusing a precomputed distribution (for tests drawing many samples).
int32_t draw_from(const SamplingDistribution& dist, double u);

}  // namespace flashseek::engine
