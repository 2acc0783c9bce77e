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

// Dot product with the fixed summation order used everywhere (8 interleaved partial sums).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace flashseek::ops
