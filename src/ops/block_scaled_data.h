// Random inputs for the block-scaled kernels (FP8 e4m3 codes, E8M0 scales, activations whose
// 32-element blocks exercise the quantiser's cases), shared by the kernel tests and the kernel
// benchmarks so both run on the same kind of data.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace flashseek::ops {

// e4m3 codes, NaN codes (0x7f / 0xff) replaced by the largest finite magnitude.
inline std::vector<uint8_t> random_fp8_codes(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> c(n);
  for (auto& b : c) {
    b = uint8_t(rng());
    if ((b & 0x7f) == 0x7f) b &= 0xfe;
  }
  return c;
}

// E8M0 scales 2^-6 .. 2^2.
inline std::vector<uint8_t> random_e8m0_scales(std::mt19937& rng, size_t n) {
  std::vector<uint8_t> s(n);
  for (auto& v : s) v = uint8_t(127 - 6 + int(rng() % 9));
  return s;
}

// Activations [rows, k] with per-32-block character: normal, all-zero (amax floor), tiny,
// one outlier.
inline std::vector<float> random_block_activations(std::mt19937& rng, int64_t rows, int64_t k) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (int64_t b = 0; b < rows * k; b += 32) {
    const int kind = int(rng() % 8);
    for (int64_t i = b; i < b + 32 && i < rows * k; ++i) {
      float v = nd(rng);
      if (kind == 0) v = 0;
      if (kind == 1) v *= 1e-6f;
      if (kind == 2 && i == b + 5) v *= 3000.0f;
      x[size_t(i)] = v;
    }
  }
  return x;
}

}  // namespace flashseek::ops
