// RMS normalisation (v4 §3.4): y = w ⊙ x · rsqrt(mean(x²) + eps), eps added in FP32, so any
// eps (1e-6 for V4, 1e-20 for V4.1) behaves as in the reference.
#pragma once
#include <cstdint>

namespace flashseek::ops {

struct RmsNormParams {
  const float* x = nullptr;  // [rows, dim]
  const float* w = nullptr;  // [dim], nullable: unweighted norm
  float* y = nullptr;        // [rows, dim], may alias x
  int64_t rows = 0, dim = 0;
  float eps = 1e-6f;
  bool bf16_out = false;     // round the result to BF16 (reference numerics)
};
void rms_norm(const RmsNormParams& p);

// V4 per-head unweighted q norm done in BF16 the way the reference does it (v4 §3.4):
// squares rounded to BF16, summed in FP32, mean/eps/rsqrt/product each rounded to BF16.
void rms_norm_bf16_heads(float* x, int64_t rows, int64_t dim, float eps);

}  // namespace flashseek::ops
