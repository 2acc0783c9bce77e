// The engine's sampling entry points: SamplingParams -> ops::SampleSpec, then the one
// implementation of the rule in ops/cpu/sample.cpp.
#include "engine/sampler.h"

namespace flashseek::engine {

namespace {
ops::SampleSpec filters_of(const SamplingParams& p) {
  ops::SampleSpec s;
  s.temperature = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  return s;
}
}  // namespace

Status validate_sampling(const SamplingParams& p) {
  return ops::validate(filters_of(p), /*check_u=*/false);
}

ops::SampleSpec sample_spec(const SamplingParams& params, int64_t position) {
  ops::SampleSpec s = filters_of(params);
  s.u = counter_uniform(params.seed, uint64_t(position));
  return s;
}

Result<int32_t> argmax_token(std::span<const float> logits) { return ops::argmax_row(logits); }

Result<SamplingDistribution> sampling_distribution(std::span<const float> logits,
                                                   const SamplingParams& params) {
  return ops::sample_distribution(logits, filters_of(params));
}

int32_t draw_from(const SamplingDistribution& dist, double u) {
  return ops::draw_inverse_cdf(dist, u);
}

Result<int32_t> sample_token(std::span<const float> logits, const SamplingParams& params,
                             int64_t position) {
  if (params.greedy()) {  // no draw: skip the hash
    if (Status st = validate_sampling(params); !st.ok()) return st;
    return argmax_token(logits);
  }
  return ops::sample_row(logits, sample_spec(params, position));
}

}  // namespace flashseek::engine
