#include "ops/mhc.h"

#include <cassert>
#include <cmath>
#include <vector>

#include "core/numeric.h"
#include "ops/cpu/sum_order.h"
#include "ops/linear.h"

namespace flashseek::ops {

namespace {
float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// rsqrt(mean(x²) + eps) over the flattened streams (one scalar), eps added in FP32; the double
// sum of squares in the order of ops/cpu/sum_order.h.
float flat_rsqrt(const float* x, int64_t n, float eps) {
  const double ss = detail::sumsq_f64(x, n);
  return 1.0f / std::sqrt(float(ss / double(n)) + eps);
}

// Sinkhorn of v4 §3.3 step 7 on P [hc, hc] (row j, column k), in place.
void sinkhorn(float* P, int64_t hc, float eps, int64_t iters) {
  auto col_norm = [&] {
    for (int64_t k = 0; k < hc; ++k) {
      float s = 0;
      for (int64_t j = 0; j < hc; ++j) s += P[j * hc + k];
      for (int64_t j = 0; j < hc; ++j) P[j * hc + k] /= (s + eps);
    }
  };
  for (int64_t j = 0; j < hc; ++j) {  // row softmax, then + eps
    float* row = P + j * hc;
    float m = row[0];
    for (int64_t k = 1; k < hc; ++k) m = std::max(m, row[k]);
    float s = 0;
    for (int64_t k = 0; k < hc; ++k) s += (row[k] = std::exp(row[k] - m));
    for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / s + eps;
  }
  col_norm();
  for (int64_t it = 1; it < iters; ++it) {
    for (int64_t j = 0; j < hc; ++j) {
      float* row = P + j * hc;
      float s = 0;
      for (int64_t k = 0; k < hc; ++k) s += row[k];
      for (int64_t k = 0; k < hc; ++k) row[k] /= (s + eps);
    }
    col_norm();
  }
}
}  // namespace

void hc_mixes(const HcMixParams& p) {
  const int64_t hc = p.hc, flat = hc * p.dim, n_mix = (2 + hc) * hc;
  std::vector<float> mu(static_cast<size_t>(n_mix));
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * flat;
    const float rs = flat_rsqrt(x, flat, p.norm_eps);
    for (int64_t m = 0; m < n_mix; ++m) mu[m] = dot_f32(p.fn + m * flat, x, flat) * rs;
    for (int64_t i = 0; i < hc; ++i) {
      p.pre[r * hc + i] = sigmoid(mu[i] * p.scale[0] + p.base[i]) + p.hc_eps;
      p.post[r * hc + i] = 2.0f * sigmoid(mu[hc + i] * p.scale[1] + p.base[hc + i]);
    }
    float* P = p.comb + r * hc * hc;
    for (int64_t i = 0; i < hc * hc; ++i) P[i] = mu[2 * hc + i] * p.scale[2] + p.base[2 * hc + i];
    sinkhorn(P, hc, p.hc_eps, p.sinkhorn_iters);
  }
}

void hc_collapse(const float* x, const float* pre, float* u, int64_t rows, int64_t hc, int64_t dim,
                 bool bf16_out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * hc * dim;
    for (int64_t d = 0; d < dim; ++d) {
      float s = 0;
      for (int64_t i = 0; i < hc; ++i) s += pre[r * hc + i] * xr[i * dim + d];
      u[r * dim + d] = bf16_out ? round_bf16(s) : s;
    }
  }
}

void hc_post(const float* f, const float* x, const float* post, const float* comb, float* x_out,
             int64_t rows, int64_t hc, int64_t dim, bool bf16_out) {
  std::vector<float> tmp(static_cast<size_t>(hc * dim));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * hc * dim;
    const float* P = comb + r * hc * hc;
    for (int64_t k = 0; k < hc; ++k) {
      for (int64_t d = 0; d < dim; ++d) {
        float s = post[r * hc + k] * f[r * dim + d];
        for (int64_t j = 0; j < hc; ++j) s += P[j * hc + k] * xr[j * dim + d];
        tmp[k * dim + d] = bf16_out ? round_bf16(s) : s;
      }
    }
    std::copy(tmp.begin(), tmp.end(), x_out + r * hc * dim);
  }
}

void hc_head_pre(const float* x, const float* fn, const float* base, const float* scale,
                 float* pre, int64_t rows, int64_t hc, int64_t dim, float norm_eps, float hc_eps) {
  const int64_t flat = hc * dim;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * flat;
    const float rs = flat_rsqrt(xr, flat, norm_eps);
    for (int64_t i = 0; i < hc; ++i) {
      const float mu = dot_f32(fn + i * flat, xr, flat) * rs;
      pre[r * hc + i] = sigmoid(mu * scale[0] + base[i]) + hc_eps;
    }
  }
}

}  // namespace flashseek::ops
