#include "ops/norm.h"

#include <cassert>
#include <cmath>

#include "core/numeric.h"
#include "ops/cpu/sum_order.h"

namespace flashseek::ops {

void rms_norm(const RmsNormParams& p) {
  assert(p.x && p.y && p.dim > 0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * p.dim;
    float* y = p.y + r * p.dim;
    // Sum of squares in double: a fixed order that is at least as accurate as the reference's
    // FP32 tree reduction (the chunked order of ops/cpu/sum_order.h; a row of up to 1024 values
    // is one chunk); the mean is then an FP32 value to which eps is added in FP32.
    const double ss = detail::sumsq_f64(x, p.dim);
    const float mean = float(ss / double(p.dim));
    const float r_inv = 1.0f / std::sqrt(mean + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      float v = x[i] * r_inv;
      if (p.w) v *= p.w[i];
      y[i] = p.bf16_out ? round_bf16(v) : v;
    }
  }
}

void rms_norm_bf16_heads(float* x, int64_t rows, int64_t dim, float eps) {
  const float eps_b = round_bf16(eps);
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * dim;
    float ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += round_bf16(v[i] * v[i]);
    const float mean = round_bf16(ss / float(dim));
    const float var = round_bf16(mean + eps_b);
    const float rs = round_bf16(1.0f / std::sqrt(var));
    for (int64_t i = 0; i < dim; ++i) v[i] = round_bf16(v[i] * rs);
  }
}

}  // namespace flashseek::ops
