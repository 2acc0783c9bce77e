// Draft picks and the lossless acceptance rule (v41 §5.6, Leviathan et al. / Chen et al.).
#include "engine/spec_accept.h"

#include <algorithm>
#include <cmath>

namespace flashseek::engine {

namespace {
// Distinct constants so the three streams never coincide with the sampler's own (seed, position).
uint64_t derive(uint64_t seed, uint64_t tag) { return mix64(seed ^ mix64(tag)); }

// Dense probabilities [V] of a sparse distribution (0 outside its support).
std::vector<double> dense(const SamplingDistribution& d, int64_t vocab) {
  std::vector<double> out(size_t(vocab), 0.0);
  for (size_t i = 0; i < d.ids.size(); ++i) out[size_t(d.ids[i])] += d.probs[i];
  return out;
}

double prob_of(const SamplingDistribution& d, int32_t token) {
  for (size_t i = 0; i < d.ids.size(); ++i)
    if (d.ids[i] == token) return d.probs[i];
  return 0.0;
}
}  // namespace

uint64_t spec_draft_seed(uint64_t seed) { return derive(seed, 0x5350454344524146ull); }
uint64_t spec_accept_seed(uint64_t seed) { return derive(seed, 0x5350454341434350ull); }
uint64_t spec_residual_seed(uint64_t seed) { return derive(seed, 0x5350454352455344ull); }

Result<DraftPick> pick_draft(std::span<const float> logits, const SamplingParams& params,
                             int64_t position) {
  DraftPick pick;
  if (params.greedy()) {
    FS_ASSIGN_OR_RETURN(pick.token, argmax_token(logits));
    return pick;
  }
  FS_ASSIGN_OR_RETURN(pick.q, sampling_distribution(logits, params));
  pick.token = draw_from(pick.q, counter_uniform(spec_draft_seed(params.seed), uint64_t(position)));
  return pick;
}

SamplingDistribution residual_distribution(const SamplingDistribution& p,
                                           const SamplingDistribution& q, int64_t vocab) {
  const std::vector<double> dp = dense(p, vocab), dq = dense(q, vocab);
  SamplingDistribution r;
  double total = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    const double d = dp[size_t(v)] - dq[size_t(v)];
    if (d > 0) {
      r.ids.push_back(int32_t(v));
      r.probs.push_back(d);
      total += d;
    }
  }
  if (total <= 0) return p;  // p == q: a rejection has probability 0; keep the draw well defined
  for (double& x : r.probs) x /= total;
  return r;
}

Result<SpecVerdict> accept_block(std::span<const int32_t> drafts,
                                 std::span<const SamplingDistribution> q,
                                 std::span<const float> target, int64_t vocab,
                                 const SamplingParams& params, int64_t first_position) {
  const size_t B = drafts.size(), V = size_t(vocab);
  if (target.size() != (B + 1) * V)
    return invalid_argument(
        "speculative: target logits hold {} values, expected {} rows x {} vocab", target.size(),
        B + 1, V);
  const bool greedy = params.greedy();
  if (!greedy && q.size() != B)
    return invalid_argument("speculative: {} draft distributions for {} drafts", q.size(), B);
  auto row = [&](size_t j) { return target.subspan(j * V, V); };
  SpecVerdict v;
  for (size_t i = 0; i < B; ++i) {
    const int64_t pos = first_position + int64_t(i);
    const int32_t y = drafts[i];
    if (y < 0 || size_t(y) >= V)
      return invalid_argument("speculative: draft token {} outside [0, {})", y, V);
    if (greedy) {
      FS_ASSIGN_OR_RETURN(int32_t t, sample_token(row(i), params, pos));
      if (t == y) {
        ++v.accepted;
        continue;
      }
      v.bonus = t;
      return v;
    }
    FS_ASSIGN_OR_RETURN(SamplingDistribution p, sampling_distribution(row(i), params));
    const double pq = prob_of(q[i], y);
    const double ratio = pq > 0 ? prob_of(p, y) / pq : 0.0;
    if (counter_uniform(spec_accept_seed(params.seed), uint64_t(pos)) < ratio) {
      ++v.accepted;
      continue;
    }
    const SamplingDistribution r = residual_distribution(p, q[i], vocab);
    v.bonus = draw_from(r, counter_uniform(spec_residual_seed(params.seed), uint64_t(pos)));
    return v;
  }
  FS_ASSIGN_OR_RETURN(v.bonus, sample_token(row(B), params, first_position + int64_t(B)));
  return v;
}

int64_t scripted_accepted(double mean_tokens, int64_t step) {
  // Integer thousandths keep the sequence exact (no floating floor at multiples of a).
  const int64_t a = std::llround((mean_tokens - 1.0) * 1000.0);
  return ((step + 1) * a) / 1000 - (step * a) / 1000;
}

Result<SpecVerdict> scripted_verdict(std::span<const int32_t> drafts, std::span<const float> target,
                                     int64_t vocab, const SamplingParams& params,
                                     int64_t first_position, int64_t accepted) {
  const size_t B = drafts.size(), V = size_t(vocab);
  if (target.size() != (B + 1) * V)
    return invalid_argument(
        "speculative: target logits hold {} values, expected {} rows x {} vocab", target.size(),
        B + 1, V);
  if (accepted < 0) return invalid_argument("speculative: scripted acceptance {} < 0", accepted);
  for (int32_t y : drafts)
    if (y < 0 || size_t(y) >= V)
      return invalid_argument("speculative: draft token {} outside [0, {})", y, V);
  SpecVerdict v;
  v.accepted = std::min<int64_t>(accepted, int64_t(B));
  FS_ASSIGN_OR_RETURN(v.bonus, sample_token(target.subspan(size_t(v.accepted) * V, V), params,
                                            first_position + v.accepted));
  return v;
}

}  // namespace flashseek::engine
