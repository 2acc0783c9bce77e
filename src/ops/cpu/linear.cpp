#include "ops/linear.h"

#include <cassert>
#include <cmath>
#include <vector>

#include "core/numeric.h"
#include "core/thread_pool.h"
#include "ops/cpu/sum_order.h"
#include "ops/quant.h"

namespace flashseek::ops {

// The CPU oracle spends most of its time here. target_clones builds an AVX2 version next to the
// baseline one and picks it at load time where the CPU has it: the eight partial sums are then
// one 8-wide multiply and add per step instead of two 4-wide ones. The bits do not change: each
// partial is the same IEEE multiply then add (-ffp-contract=off: no FMA), in the same order.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
float dot_f32(const float* a, const float* b, int64_t n) {
  // Eight interleaved partial sums, combined in a fixed tree: vectorisable without
  // -ffast-math and identical for every call with the same n. Longer dots use the chunked order
  // of ops/cpu/sum_order.h (128 partials per 1024-element chunk, chunk sums in a fixed tree),
  // which a GPU spreads over many warps.
  if (n > detail::kSumChunk) return detail::dot_chunked(a, b, n);
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) s[j] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

void linear(const LinearParams& p) {
  assert(p.x && p.w && p.y && p.x != p.y);
  const float* x = p.x;
  std::vector<float> xq;
  if (p.act_block > 0 || p.bf16_in) {
    xq.assign(p.x, p.x + p.rows * p.in);
    if (p.bf16_in) round_bf16_inplace(xq.data(), int64_t(xq.size()));
    if (p.act_block > 0) fp8_quant_dequant(xq.data(), p.rows, p.in, p.act_block);
    x = xq.data();
  }
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, p.in));
  ThreadPool::global().parallel_for(
      p.out,
      [&](int64_t o0, int64_t o1) {
        for (int64_t r = 0; r < p.rows; ++r) {
          const float* xr = x + r * p.in;
          float* yr = p.y + r * p.out;
          for (int64_t o = o0; o < o1; ++o) {
            const float v = dot_f32(xr, p.w + o * p.in, p.in);
            yr[o] = p.bf16_out ? round_bf16(v) : v;
          }
        }
      },
      grain);
}

void linear_abs_terms(const LinearParams& p) {
  assert(p.x && p.w && p.y && p.x != p.y);
  // |x_i·w_i| = |x_i|·|w_i| exactly (rounding is sign-symmetric), so the terms are the products
  // of the absolute rounded input and the absolute weight row, summed in dot_f32's order.
  std::vector<float> xa(p.x, p.x + p.rows * p.in);
  if (p.bf16_in) round_bf16_inplace(xa.data(), int64_t(xa.size()));
  if (p.act_block > 0) fp8_quant_dequant(xa.data(), p.rows, p.in, p.act_block);
  for (float& v : xa) v = std::fabs(v);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, p.in));
  ThreadPool::global().parallel_for(
      p.out,
      [&](int64_t o0, int64_t o1) {
        std::vector<float> wa(size_t(p.in));
        for (int64_t o = o0; o < o1; ++o) {
          const float* wr = p.w + o * p.in;
          for (int64_t i = 0; i < p.in; ++i) wa[size_t(i)] = std::fabs(wr[i]);
          for (int64_t r = 0; r < p.rows; ++r) p.y[r * p.out + o] = dot_f32(xa.data() + r * p.in, wa.data(), p.in);
        }
      },
      grain);
}

}  // namespace flashseek::ops
