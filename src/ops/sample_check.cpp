// Range and shape checks of ops/sample.h, shared by the CPU twin and the CUDA launcher.
#include <cmath>

#include "ops/sample.h"

namespace flashseek::ops {

Status validate(const SampleSpec& s, bool check_u) {
  if (!std::isfinite(s.temperature))
    return invalid_argument("sampling: temperature must be finite (got {})", s.temperature);
  if (!(s.top_p > 0.0 && s.top_p <= 1.0))
    return invalid_argument("sampling: top_p must be in (0, 1] (got {})", s.top_p);
  if (!(s.min_p >= 0.0 && s.min_p <= 1.0))
    return invalid_argument("sampling: min_p must be in [0, 1] (got {})", s.min_p);
  if (check_u && !(s.u >= 0.0 && s.u < 1.0))
    return invalid_argument("sampling: u must be in [0, 1) (got {})", s.u);
  return {};
}

Status validate(const SampleRowsParams& p) {
  if (p.rows < 0) return invalid_argument("sample_rows: rows must be >= 0 (got {})", p.rows);
  if (p.vocab < 1 || p.vocab >= (int64_t(1) << 31))
    return invalid_argument("sample_rows: vocab must be in [1, 2^31) (got {})", p.vocab);
  if (p.rows == 0) return {};
  if (!p.logits || !p.specs || !p.out)
    return invalid_argument("sample_rows: logits, specs and out must be non-null");
  for (int64_t r = 0; r < p.rows; ++r) {
    Status st = validate(p.specs[r]);
    if (!st.ok()) return invalid_argument("sample_rows: row {}: {}", r, st.message());
  }
  return {};
}

}  // namespace flashseek::ops
