#include "ops/rope.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>

#include "core/numeric.h"

namespace flashseek::ops {

namespace {
// ω bit patterns of the released 64-dim tables as the reference computes them on its GPU
// (v4 §3.5.3): FP64-then-round differs by 1–2 ulp in some entries.
constexpr uint32_t kTheta10k[32] = {
    0x3f800000, 0x3f3ff911, 0x3f0ff59a, 0x3ed7e89b, 0x3ea1e89b, 0x3e72d423, 0x3e361887,
    0x3e088d77, 0x3dcccccd, 0x3d99940d, 0x3d6655c2, 0x3d2cba16, 0x3d0186e3, 0x3cc2434f,
    0x3c91ad39, 0x3c5a7bf2, 0x3c23d70a, 0x3bf5b9b0, 0x3bb8449c, 0x3b8a2e77, 0x3b4f3e38,
    0x3b1b690d, 0x3ae91528, 0x3aaec98e, 0x3a83126f, 0x3a44948d, 0x3a136a16, 0x39dd1725,
    0x39a5cb60, 0x3978a815, 0x393a7753, 0x390bd472};
constexpr uint32_t kTheta160kYarn[32] = {
    0x3f800000, 0x3f300a3a, 0x3ef21c1f, 0x3ea67d01, 0x3e64f92e, 0x3e1d7475, 0x3dd88cb4,
    0x3d94e963, 0x3d4ccccd, 0x3d0cd4fb, 0x3cc1b019, 0x3c8530ce, 0x3c372dbf, 0x3bfbed88,
    0x3bad3d5e, 0x3b6e4237, 0x3b147ae1, 0x3ab714e0, 0x3a5ebdb6, 0x3a0530ce, 0x399bb3af,
    0x39305978, 0x38be904d, 0x383e9b5f, 0x37a3d708, 0x36b443d0, 0x3677eba6, 0x362a7be8,
    0x35ea77ff, 0x35a13bdc, 0x355dbf30, 0x35187c4d};

// d(r) = dim · ln(orig / (2π·r)) / (2 · ln θ)  (the reference's correction dim, in double).
double correction_dim(double rotations, int64_t dim, double theta, int64_t orig) {
  return double(dim) * std::log(double(orig) / (rotations * 2 * M_PI)) / (2 * std::log(theta));
}
}  // namespace

std::vector<float> rope_inv_freq(const RopeSpec& s) {
  assert(s.rope_dim > 0 && s.rope_dim % 2 == 0);
  const int64_t half = s.rope_dim / 2;
  std::vector<float> w(static_cast<size_t>(half), 0.0f);
  const bool yarn = s.yarn && s.original_len > 0 && s.factor != 1;
  if (s.rope_dim == 64 && !yarn && s.theta == 10000) {
    for (int64_t i = 0; i < half; ++i) w[i] = std::bit_cast<float>(kTheta10k[i]);
    return w;
  }
  if (s.rope_dim == 64 && yarn && s.theta == 160000 && s.factor == 16 &&
      s.original_len == 65536 && s.beta_fast == 32 && s.beta_slow == 1) {
    for (int64_t i = 0; i < half; ++i) w[i] = std::bit_cast<float>(kTheta160kYarn[i]);
    return w;
  }
  // The reference's formula in FP32: 1 / θ^(2i/dim), then the YaRN blend
  // freqs/factor·(1 − smooth) + freqs·smooth with smooth = 1 − clamp((i − lo)/(hi − lo), 0, 1).
  for (int64_t i = 0; i < half; ++i) {
    const float expo = float(2 * i) / float(s.rope_dim);
    const float p = float(std::pow(double(float(s.theta)), double(expo)));
    w[i] = 1.0f / p;
  }
  if (yarn) {
    double lo = std::floor(correction_dim(s.beta_fast, s.rope_dim, s.theta, s.original_len));
    double hi = std::ceil(correction_dim(s.beta_slow, s.rope_dim, s.theta, s.original_len));
    lo = std::max(lo, 0.0);
    hi = std::min(hi, double(s.rope_dim - 1));
    if (lo == hi) hi += 0.001;
    for (int64_t i = 0; i < half; ++i) {
      const float lin = (float(i) - float(lo)) / (float(hi) - float(lo));
      const float smooth = 1.0f - std::clamp(lin, 0.0f, 1.0f);
      w[i] = w[i] / float(s.factor) * (1.0f - smooth) + w[i] * smooth;
    }
  }
  return w;
}

void apply_rope(const RopeParams& p) {
  assert(p.x && p.pos && p.inv_freq && p.rope_dim <= p.vec_dim && p.rope_dim % 2 == 0);
  const int64_t half = p.rope_dim / 2;
  std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
  for (int64_t r = 0; r < p.rows; ++r) {
    // Angle in FP32 (the reference's outer product), cos/sin correctly rounded to FP32.
    const float pos = float(p.pos[r]);
    for (int64_t i = 0; i < half; ++i) {
      const float ang = pos * p.inv_freq[i];
      cs[i] = float(std::cos(double(ang)));
      sn[i] = p.inverse ? -float(std::sin(double(ang))) : float(std::sin(double(ang)));
    }
    for (int64_t v = 0; v < p.n_vec; ++v) {
      float* x = p.x + (r * p.n_vec + v) * p.vec_dim + (p.vec_dim - p.rope_dim);
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[2 * i], b = x[2 * i + 1];
        float ra = a * cs[i] - b * sn[i];
        float rb = a * sn[i] + b * cs[i];
        if (p.bf16_out) {
          ra = round_bf16(ra);
          rb = round_bf16(rb);
        }
        x[2 * i] = ra;
        x[2 * i + 1] = rb;
      }
    }
  }
}

}  // namespace flashseek::ops
