#include "engine/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace flashseek::engine {

Result<double> log_sum_exp(std::span<const float> logits) {
  double mx = -INFINITY;
  for (float x : logits)
    if (std::isfinite(x)) mx = std::max(mx, double(x));
  if (!std::isfinite(mx))
    return invalid_argument("logprobs: no finite logit in a row of {} values", logits.size());
  double sum = 0;
  for (float x : logits)
    if (std::isfinite(x)) sum += std::exp(double(x) - mx);
  return mx + std::log(sum);
}

Result<PositionLogprobs> position_logprobs(std::span<const float> logits, int32_t chosen,
                                           int64_t top_k) {
  if (chosen < 0 || size_t(chosen) >= logits.size())
    return out_of_range("logprobs: token id {} outside the vocabulary of {}", chosen,
                        logits.size());
  FS_ASSIGN_OR_RETURN(double lse, log_sum_exp(logits));
  // Non-finite logits get -inf logprob (NaN is reported as -inf rather than propagated).
  auto lp = [&](int32_t id) {
    const float x = logits[size_t(id)];
    return std::isfinite(x) ? float(double(x) - lse) : -INFINITY;
  };
  PositionLogprobs out;
  out.chosen = {chosen, lp(chosen)};
  const size_t k = size_t(std::clamp<int64_t>(top_k, 0, int64_t(logits.size())));
  if (k == 0) return out;
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto higher = [&](int32_t a, int32_t b) {
    const float la = lp(a), lb = lp(b);
    return la != lb ? la > lb : a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), higher);
  out.top.reserve(k);
  for (size_t i = 0; i < k; ++i) out.top.push_back({ids[i], lp(ids[i])});
  return out;
}

}  // namespace flashseek::engine
