// DSpark speculative decoding, the engine side (v41 §5.4–5.6): drawing a block of drafts from the
// draft's per-position distributions and deciding how many of them the target accepts.
//
// Randomness is counter-based like the sampler's (sampling_params.h): every draw is a pure
// function of (request seed, stream, position), so a speculative request's tokens do not depend
// on the batch. Three streams are used: the draft draws, the accept coins and the residual draws;
// the bonus token after a fully accepted block is an ordinary sample_token() draw.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"
#include "engine/sampling_params.h"

namespace flashseek::engine {

// Seeds of the three extra random streams, derived from the request seed.
uint64_t spec_draft_seed(uint64_t seed);
uint64_t spec_accept_seed(uint64_t seed);
uint64_t spec_residual_seed(uint64_t seed);

// One draft token and the exact distribution it was drawn from (after the request's sampling
// transform); for greedy requests `q` is empty (the draft is the argmax).
struct DraftPick {
  int32_t token = 0;
  SamplingDistribution q;
};

// Picks draft token at `position` from the draft's logits [V]: argmax for greedy params, else a
// draw from sampling_distribution(logits, params) keyed by (spec_draft_seed, position).
Result<DraftPick> pick_draft(std::span<const float> logits, const SamplingParams& params,
                             int64_t position);

struct SpecVerdict {
  int64_t accepted = 0;  // n: drafts y_1 … y_n accepted
  int32_t bonus = 0;     // z: the target's token after them
};

// The acceptance rule of v41 §5.6 for one verified block.
//   drafts:  [B] y_1 … y_B, and their picks' distributions in `q` ([B], ignored when greedy)
//   target:  [B+1, V] target logits; row j is the distribution for the token after y_j (row 0:
//            after the anchor x0)
//   first_position: the position y_1 occupies (y_i sits at first_position + i − 1).
// Greedy: y_i is accepted while it equals the target's sample_token(); z = sample_token(row n).
// Sampling: accept y_i with probability min(1, p_i(y_i)/q_i(y_i)); on the first rejection draw z
// from normalise(max(p_i − q_i, 0)); after B acceptances z = sample_token(row B).
Result<SpecVerdict> accept_block(std::span<const int32_t> drafts,
                                 std::span<const SamplingDistribution> q,
                                 std::span<const float> target, int64_t vocab,
                                 const SamplingParams& params, int64_t first_position);

// Benchmark-only scripted acceptance (EngineOptions::spec_script_accept): the number of drafts
// the `step`-th (0-based) verification of a sequence accepts so that the tokens per verification
// (accepted drafts + bonus) average `mean_tokens`. With a = mean_tokens − 1 rounded to
// thousandths, step s accepts floor((s+1)·a) − floor(s·a) (each step floor(a) or ceil(a)), so
// the first S steps accept floor(S·a) drafts in all. The caller caps it at the drafts verified.
// mean_tokens must be finite and >= 1 (checked by the engine).
int64_t scripted_accepted(double mean_tokens, int64_t step);

// The verdict of a scripted step: drafts y_1 … y_n accepted whatever the target says
// (n = min(accepted, B)), and the bonus z = sample_token(row n) at its position, the target's own
// token after them. Output is therefore not the model's; only the cost of a step is real.
Result<SpecVerdict> scripted_verdict(std::span<const int32_t> drafts, std::span<const float> target,
                                     int64_t vocab, const SamplingParams& params,
                                     int64_t first_position, int64_t accepted);

// The residual distribution normalise(max(p − q, 0)) over ascending token ids; falls back to p
// when the difference has no mass (p == q up to rounding). Exposed for tests.
SamplingDistribution residual_distribution(const SamplingDistribution& p,
                                           const SamplingDistribution& q, int64_t vocab);

}  // namespace flashseek::engine
