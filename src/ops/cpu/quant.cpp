#include "ops/quant.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "core/numeric.h"

namespace flashseek::ops {

float pow2_ceil(float v) {
  assert(v > 0);
  int e;
  const float m = std::frexp(v, &e);  // v = m · 2^e, m in [0.5, 1)
  return m == 0.5f ? std::ldexp(1.0f, e - 1) : std::ldexp(1.0f, e);
}

namespace {
float block_amax(const float* x, int64_t n) {
  float a = 0;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}
}  // namespace

void fp8_quant_dequant(float* x, int64_t rows, int64_t dim, int64_t block) {
  assert(block > 0 && dim % block == 0);
  for (int64_t b = 0; b < rows * dim; b += block) {
    float* blk = x + b;
    const float s = pow2_ceil(std::max(block_amax(blk, block), 1e-4f) / kE4M3Max);
    for (int64_t i = 0; i < block; ++i) {
      const float q = std::clamp(blk[i] / s, -kE4M3Max, kE4M3Max);
      blk[i] = round_e4m3(q) * s;
    }
  }
}

void fp4_quant_dequant_e8m0(float* x, int64_t rows, int64_t dim, int64_t block) {
  assert(block > 0 && dim % block == 0);
  const float floor_amax = 6.0f * std::ldexp(1.0f, -126);
  const float inv6 = 1.0f / 6.0f;
  for (int64_t b = 0; b < rows * dim; b += block) {
    float* blk = x + b;
    const float s = pow2_ceil(std::max(block_amax(blk, block), floor_amax) * inv6);
    for (int64_t i = 0; i < block; ++i) {
      blk[i] = round_bf16(round_e2m1(std::clamp(blk[i] / s, -6.0f, 6.0f)) * s);
    }
  }
}

void fp4_quant_dequant_e4m3(float* x, int64_t rows, int64_t dim, int64_t block) {
  assert(block > 0 && dim % block == 0);
  const float floor_amax = 6.0f * std::ldexp(1.0f, -9);
  for (int64_t b = 0; b < rows * dim; b += block) {
    float* blk = x + b;
    const float s = round_e4m3(std::max(block_amax(blk, block), floor_amax) / 6.0f);
    for (int64_t i = 0; i < block; ++i) {
      blk[i] = round_bf16(round_e2m1(std::clamp(blk[i] / s, -6.0f, 6.0f)) * s);
    }
  }
}

void round_bf16_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

void hadamard_inplace(float* x, int64_t rows, int64_t dim) {
  assert(dim > 0 && (dim & (dim - 1)) == 0);
  const float norm = 1.0f / std::sqrt(float(dim));
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * dim;
    for (int64_t h = 1; h < dim; h *= 2) {
      for (int64_t i = 0; i < dim; i += 2 * h) {
        for (int64_t j = i; j < i + h; ++j) {
          const float a = v[j], b = v[j + h];
          v[j] = a + b;
          v[j + h] = a - b;
        }
      }
    }
    for (int64_t i = 0; i < dim; ++i) v[i] *= norm;
  }
}

}  // namespace flashseek::ops
