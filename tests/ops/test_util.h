// Helpers shared by the op tests: seeded random vectors and a max-abs comparison.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace flashseek::ops::testing {

inline std::vector<float> randn(Rng& rng, int64_t n, double scale = 1.0) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = float(rng.normal() * scale);
  return v;
}

inline double max_abs_diff(const float* a, const double* b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

}  // namespace flashseek::ops::testing
