// CPU twin of the sampling op and the one implementation of the engine's sampling rule
// (ops/sample.h; the engine's sampler calls these functions).
#include <algorithm>
#include <cmath>

#include "ops/sample.h"

namespace flashseek::ops {

Result<int32_t> argmax_row(std::span<const float> logits) {
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
void filter(SampleDistribution& d, Keep keep) {
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

void renormalise(SampleDistribution& d) {
  double sum = 0;
  for (double p : d.probs) sum += p;
  for (double& p : d.probs) p /= sum;
}

// Keeps the shortest highest-logit prefix of `d` whose mass reaches top_p, sorted descending
// (lower id first on equal logits). Only a growing head is selected (nth_element) and sorted until
// it holds the mass, and candidates are sorted as flat records rather than through indices: a full
// indirect sort of a 129k vocabulary costs ~50 ms per token. The result equals a full sort because
// the order is strict and total.
void apply_top_p(SampleDistribution& d, std::span<const float> logits, double top_p) {
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

Result<SampleDistribution> sample_distribution(std::span<const float> logits, const SampleSpec& s) {
  if (Status st = validate(s, /*check_u=*/false); !st.ok()) return st;
  if (logits.empty()) return invalid_argument("sampling: empty logits row");
  SampleDistribution d;
  if (s.greedy()) {
    FS_ASSIGN_OR_RETURN(int32_t best, argmax_row(logits));
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
  if (s.top_k > 0 && size_t(s.top_k) < d.ids.size()) {
    std::nth_element(d.ids.begin(), d.ids.begin() + ptrdiff_t(s.top_k), d.ids.end(), higher);
    d.ids.resize(size_t(s.top_k));
    // Draw in descending order, independent of nth_element's arbitrary arrangement.
    std::sort(d.ids.begin(), d.ids.end(), higher);
  }
  d.probs = scaled_softmax(logits, d.ids, 1.0 / s.temperature);
  if (s.top_p < 1.0) apply_top_p(d, logits, s.top_p);
  if (s.min_p > 0.0) {
    const double max_p = *std::max_element(d.probs.begin(), d.probs.end());
    const double threshold = s.min_p * max_p;
    filter(d, [&](size_t i) { return d.probs[i] >= threshold; });
  }
  renormalise(d);
  return d;
}

int32_t draw_inverse_cdf(const SampleDistribution& d, double u) {
  double cum = 0;
  for (size_t i = 0; i < d.ids.size(); ++i) {
    cum += d.probs[i];
    if (u < cum) return d.ids[i];
  }
  return d.ids.back();  // u within rounding of 1
}

Result<int32_t> sample_row(std::span<const float> logits, const SampleSpec& s) {
  if (s.greedy()) {
    if (Status st = validate(s, /*check_u=*/false); !st.ok()) return st;
    return argmax_row(logits);
  }
  FS_ASSIGN_OR_RETURN(SampleDistribution d, sample_distribution(logits, s));
  return draw_inverse_cdf(d, s.u);
}

Status sample_rows_ref(const SampleRowsParams& p) {
  FS_RETURN_IF_ERROR(validate(p));
  const size_t V = size_t(p.vocab);
  for (int64_t r = 0; r < p.rows; ++r) {
    const std::span<const float> row(p.logits + size_t(r) * V, V);
    const SampleSpec& s = p.specs[r];
    bool any_finite = false;
    for (float x : row) any_finite = any_finite || std::isfinite(x);
    if (!any_finite) {
      p.out[r] = -1;
      continue;
    }
    FS_ASSIGN_OR_RETURN(p.out[r], sample_row(row, s));
  }
  return {};
}

}  // namespace flashseek::ops
