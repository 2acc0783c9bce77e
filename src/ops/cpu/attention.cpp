#include "ops/attention.h"

#include <cassert>
#include <cmath>
#include <limits>
#include <vector>

#include "core/numeric.h"
#include "ops/linear.h"

namespace flashseek::ops {

void sparse_attention(const SparseAttnParams& p) {
  assert(p.q && p.out && p.sink && p.head_dim > 0);
  std::vector<float> logit(static_cast<size_t>(p.n_keys));
  for (int64_t h = 0; h < p.n_heads; ++h) {
    const float* q = p.q + h * p.head_dim;
    float* o = p.out + h * p.head_dim;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < p.n_keys; ++s) {
      if (!p.keys[s]) continue;
      logit[s] = dot_f32(q, p.keys[s], p.head_dim) * p.scale;
      m = std::max(m, logit[s]);
    }
    for (int64_t d = 0; d < p.head_dim; ++d) o[d] = 0;
    if (m == -std::numeric_limits<float>::infinity()) continue;  // no key: output 0
    // The sink joins the denominator only, relative to the max of the real logits.
    float denom = 0;
    for (int64_t s = 0; s < p.n_keys; ++s) {
      if (!p.keys[s]) continue;
      const float e = std::exp(logit[s] - m);
      denom += e;
      const float pe = p.bf16_probs ? round_bf16(e) : e;
      const float* k = p.keys[s];
      for (int64_t d = 0; d < p.head_dim; ++d) o[d] += pe * k[d];
    }
    denom += std::exp(p.sink[h] - m);
    for (int64_t d = 0; d < p.head_dim; ++d) o[d] /= denom;
  }
}

}  // namespace flashseek::ops
