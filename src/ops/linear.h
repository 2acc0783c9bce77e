// y = x · Wᵀ with FP32 accumulation on a dequantised FP32 weight. In `reference` numerics the
// input is FP8-quantised per `act_block` elements first (as the reference does before every FP8
// or FP4 GEMM) and the output can be rounded to BF16.
#pragma once
#include <cstdint>

namespace flashseek::ops {

struct LinearParams {
  const float* x = nullptr;  // [rows, in]
  const float* w = nullptr;  // [out, in]
  float* y = nullptr;        // [rows, out], must not alias x
  int64_t rows = 0, in = 0, out = 0;
  int64_t act_block = 0;     // > 0: FP8 E4M3 quant-dequant of x per block (v4 §5.1)
  bool bf16_in = false;      // round x to BF16 first (BF16 GEMMs of the reference)
  bool bf16_out = false;     // round y to BF16
};
// Every output element is one dot product in a fixed order (independent of rows), parallel over
// output rows: batch-invariant.
void linear(const LinearParams& p);

// y[r, o] = Σ_i |x_i · w_i|: the magnitudes of the products linear(p) sums for that output, after
// the same input rounding (bf16_in, then the FP8 quant-dequant of act_block), in FP32 with
// dot_f32's order. It is the scale of the rounding error of that dot summed in any other order
// (each term perturbed by a relative ≤ γ_K). Because the FP8 block scale comes from the block's
// amax and e4m3 rounding is sign-symmetric, q(|x|) = |q(x)| bit for bit, so the result equals
// linear() on |x| and |W| with the same act_block. bf16_out is ignored (the result is FP32).
void linear_abs_terms(const LinearParams& p);

// Dot product with the fixed summation order used everywhere (8 interleaved partial sums).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace flashseek::ops
