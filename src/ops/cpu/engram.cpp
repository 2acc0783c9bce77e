#include "ops/engram.h"

#include <cassert>
#include <cmath>
#include <set>
#include <vector>

#include "core/numeric.h"
#include "ops/cpu/sum_order.h"
#include "ops/linear.h"

namespace flashseek::ops {

namespace {
bool is_prime(int64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (int64_t d = 3; d * d <= v; d += 2) {
    if (v % d == 0) return false;
  }
  return true;
}
}  // namespace

std::vector<EngramLayout> engram_layouts(int64_t n_layers, int64_t max_ngram, int64_t n_heads,
                                         int64_t vocab_size) {
  std::vector<EngramLayout> out(static_cast<size_t>(n_layers));
  std::set<int64_t> seen;
  for (auto& l : out) {
    l.max_ngram = max_ngram;
    l.n_heads = n_heads;
    for (int64_t n = 2; n <= max_ngram; ++n) {
      int64_t cur = vocab_size - 1;
      for (int64_t k = 0; k < n_heads; ++k) {
        do {
          ++cur;
        } while (!is_prime(cur) || seen.count(cur));
        seen.insert(cur);
        l.primes.push_back(cur);
      }
    }
    int64_t off = 0;
    for (int64_t pr : l.primes) {
      l.offsets.push_back(off);
      off += pr;
    }
  }
  return out;
}

void engram_hash(const EngramLayout& L, const int64_t* ctx, int64_t n_back, int64_t n,
                 int64_t first_pos, int64_t pad_c, int64_t* ids_out) {
  const int64_t N = L.max_ngram, nh = L.n_heads, ncol = L.n_cols();
  assert(int64_t(L.multipliers.size()) >= N && n_back == std::min<int64_t>(first_pos, N - 1));
  std::vector<int64_t> u(static_cast<size_t>(N));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = first_pos + i;
    bool blocked = false;
    for (int64_t s = 0; s < N; ++s) {
      // A DEAD token cuts every longer look-back (and itself hashes as pad).
      blocked = blocked || p < s || ctx[n_back + i - s] == kEngramDead;
      u[s] = blocked ? pad_c : ctx[n_back + i - s];
    }
    int64_t h = u[0] * L.multipliers[0];
    for (int64_t ng = 2; ng <= N; ++ng) {
      h ^= u[ng - 1] * L.multipliers[ng - 1];
      for (int64_t k = 0; k < nh; ++k) {
        const int64_t col = (ng - 2) * nh + k;
        ids_out[i * ncol + col] = h % L.primes[col] + L.offsets[col];
      }
    }
  }
}

void engram_gate(const EngramGateParams& p) {
  const int64_t D = p.dim;
  const float* value = p.kv + p.hc * D;
  for (int64_t c = 0; c < p.hc; ++c) {
    float* x = p.x + c * D;
    const float* key = p.kv + c * D;
    const float* w = p.wqk + c * D;
    float g = 0;
    if (!p.dead) {
      // The fixed orders of sum_order.h (those of rms_norm and dot_f32), which a GPU block
      // reproduces with all its warps: sums of squares in double, Σ (x·w)·key in FP32.
      const double sxx = detail::sumsq_f64(x, D), skk = detail::sumsq_f64(key, D);
      std::vector<float> xw(static_cast<size_t>(D));
      for (int64_t d = 0; d < D; ++d) xw[size_t(d)] = x[d] * w[d];
      const float dotv = dot_f32(xw.data(), key, D);
      const float rx = 1.0f / std::sqrt(float(sxx / double(D)) + p.eps);
      const float rk = 1.0f / std::sqrt(float(skk / double(D)) + p.eps);
      const float z = dotv * rx * rk / std::sqrt(float(D));
      // Signed square root with the sign bit (copysign: −0 gives −).
      const float sq = std::copysign(std::sqrt(std::max(std::fabs(z), 1e-6f)), z);
      g = 1.0f / (1.0f + std::exp(-sq));
    }
    for (int64_t d = 0; d < D; ++d) {
      const float v = x[d] + g * value[d];
      x[d] = p.bf16_out ? round_bf16(v) : v;
    }
  }
}

}  // namespace flashseek::ops
