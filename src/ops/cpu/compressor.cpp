#include "ops/compressor.h"

#include <cassert>
#include <cmath>
#include <limits>

namespace flashseek::ops {

void softmax_pool(const SoftmaxPoolParams& p) {
  assert(p.v && p.z && p.out);
  for (int64_t d = 0; d < p.dim; ++d) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < p.n_slots; ++s) {
      if (p.z[s]) m = std::max(m, p.z[s][d]);
    }
    float denom = 0;
    for (int64_t s = 0; s < p.n_slots; ++s) {
      if (p.z[s]) denom += std::exp(p.z[s][d] - m);
    }
    float acc = 0;
    for (int64_t s = 0; s < p.n_slots; ++s) {
      if (p.z[s]) acc += (std::exp(p.z[s][d] - m) / denom) * p.v[s][d];
    }
    p.out[d] = acc;
  }
}

}  // namespace flashseek::ops
