#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace flashseek::engine {

Status validate_sampling(const SamplingParams& p) {
  if (!std::isfinite(p.temperature))
    return invalid_argument("sampling: temperature must be finite (got {})", p.temperature);
  if (!(p.top_p > 0.0 && p.top_p <= 1.0))
    return invalid_argument("sampling: top_p must be in (0, 1] (got {})", p.top_p);
  if (!(p.min_p >= 0.0 && p.min_p <= 1.0))
    return invalid_argument("sampling: min_p must be in [0, 1] (got {})", p.min_p);
  return {};
}

Result<int32_t> argmax_token(std::span<const float> logits) {
  int64_t best = -1;
  for (size_t v = 0; v < logits.size(); ++v) {
    if (!std::isfinite(logits[v])) continue;
    if (best < 0 || logits[v] > logits[size_t(best)]) best = int64_t(v);
  }
  if (best < 0)
    return invalid_argument("sampling: no finite logit in a row of {} values", logits.size());
  return int32_t(best);
}

namespace {

// Softmax of logits[ids] / temperature, in the order of `ids` (double accumulation).
std::vector<double> scaled_softmax(std::span<const float> logits, const std::vector<int32_t>& ids,
                                   double inv_t) {
  double mx = -INFINITY;
  for (int32_t id : ids) mx = std::max(mx, double(logits[size_t(id)]) * inv_t);
  std::vector<double> probs(ids.size());
  double sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    probs[i] = std::exp(double(logits[size_t(ids[i])]) * inv_t - mx);
    sum += probs[i];
  }
  for (double& p : probs) p /= sum;
  return probs;
}

// Keeps the entries i with keep(i), preserving order.
template <typename Keep>
void filter(SamplingDistribution& d, Keep keep) {
  size_t n = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    if (!keep(i)) continue;
    d.ids[n] = d.ids[i];
    d.probs[n] = d.probs[i];
    ++n;
  }
  d.ids.resize(n);
  d.probs.resize(n);
}

void renormalise(SamplingDistribution& d) {
  double sum = 0;
  for (double p : d.probs) sum += p;
  for (double& p : d.probs) p /= sum;
}

}  // namespace

namespace {

// Keeps the shortest highest-logit prefix of `d` whose mass reaches top_p, sorted descending
// (lower id first on equal logits). Only a growing head is selected (nth_element) and sorted until
// it holds the mass, and candidates are sorted as flat records rather than through indices: a full
// indirect sort of a 129k vocabulary costs ~50 ms per token. The result equals a full sort because
// the order is strict and total.
void apply_top_p(SamplingDistribution& d, std::span<const float> logits, double top_p) {
  struct Cand {
    float logit;
    int32_t id;
    double prob;
  };
  std::vector<Cand> c(d.ids.size());
  for (size_t i = 0; i < c.size(); ++i) c[i] = {logits[size_t(d.ids[i])], d.ids[i], d.probs[i]};
  auto higher = [](const Cand& a, const Cand& b) {
    return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
  };
  size_t k = std::min<size_t>(c.size(), 256);
  size_t n = 0;
  while (true) {
    if (k < c.size()) std::nth_element(c.begin(), c.begin() + ptrdiff_t(k), c.end(), higher);
    std::sort(c.begin(), c.begin() + ptrdiff_t(k), higher);
    double cum = 0;
    n = 0;
    while (n < k && cum < top_p) cum += c[n++].prob;
    if (cum >= top_p || k == c.size()) break;
    k = std::min(c.size(), k * 8);
  }
  d.ids.resize(n);
  d.probs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.ids[i] = c[i].id;
    d.probs[i] = c[i].prob;
  }
}

}  // namespace

Result<SamplingDistribution> sampling_distribution(std::span<const float> logits,
                                                   const SamplingParams& params) {
  if (Status st = validate_sampling(params); !st.ok()) return st;
  if (logits.empty()) return invalid_argument("sampling: empty logits row");
  SamplingDistribution d;
  if (params.greedy()) {
    FS_ASSIGN_OR_RETURN(int32_t best, argmax_token(logits));
    d.ids = {best};
    d.probs = {1.0};
    return d;
  }
  // Non-finite logits (-inf masks, or NaN) are never candidates.
  d.ids.reserve(logits.size());
  for (size_t v = 0; v < logits.size(); ++v)
    if (std::isfinite(logits[v])) d.ids.push_back(int32_t(v));
  if (d.ids.empty())
    return invalid_argument("sampling: no finite logit in a row of {} values", logits.size());

  auto higher = [&](int32_t a, int32_t b) {
    const float la = logits[size_t(a)], lb = logits[size_t(b)];
    return la != lb ? la > lb : a < b;
  };
  if (params.top_k > 0 && size_t(params.top_k) < d.ids.size()) {
    std::nth_element(d.ids.begin(), d.ids.begin() + ptrdiff_t(params.top_k), d.ids.end(), higher);
    d.ids.resize(size_t(params.top_k));
    // Draw in descending order, independent of nth_element's arbitrary arrangement.
    std::sort(d.ids.begin(), d.ids.end(), higher);
  }
  d.probs = scaled_softmax(logits, d.ids, 1.0 / params.temperature);
  if (params.top_p < 1.0) apply_top_p(d, logits, params.top_p);
  if (params.min_p > 0.0) {
    const double max_p = *std::max_element(d.probs.begin(), d.probs.end());
    const double threshold = params.min_p * max_p;
    filter(d, [&](size_t i) { return d.probs[i] >= threshold; });
  }
  renormalise(d);
  return d;
}

int32_t draw_from(const SamplingDistribution& dist, double u) {
  double cum = 0;
  for (size_t i = 0; i < dist.ids.size(); ++i) {
    cum += dist.probs[i];
    if (u < cum) return dist.ids[i];
  }
  return dist.ids.back();  // u within rounding of 1
}

Result<int32_t> sample_token(std::span<const float> logits, const SamplingParams& params,
                             int64_t position) {
  if (params.greedy()) {
    if (Status st = validate_sampling(params); !st.ok()) return st;
    return argmax_token(logits);
  }
  FS_ASSIGN_OR_RETURN(SamplingDistribution d, sampling_distribution(logits, params));
  return draw_from(d, counter_uniform(params.seed, uint64_t(position)));
}

}  // namespace flashseek::engine
