// The CPU twin of the prefill GEMM's weight expansion (ops::gemm_expand_bf16_ref): stored FP8 /
// MXFP4 matrices → BF16 values code · scale. Properties: every value is exact (the BF16 value
// equals the FP32 product of the code's value and its block's scale) for the scales the
// checkpoints hold, both FP8 tile sizes and odd n (a partial last scale tile); FP4 nibble order;
// matrices skipped by row_start keep their bytes; the grouped twin over the expanded BF16 weights
// (w_bf16) gives the bits of the grouped twin over the stored FP4 experts; bad shapes are refused.
// The CUDA op against this twin: tests/ops_cuda/gemm_fp8_test.cpp (CudaGemmFp8.ExpandedWeights*).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "ops/block_scaled_data.h"
#include "ops/gemm_fp8.h"

namespace flashseek::ops {
namespace {

TEST(GemmExpandBf16, Fp8ValuesAreExactCodeTimesTileScale) {
  std::mt19937 rng(3);
  struct C {
    int64_t count, n, k, wb;
  };
  for (const C c : {C{1, 257, 384, 128}, C{2, 33, 96, 32}, C{1, 1, 128, 128}, C{3, 64, 64, 32}}) {
    SCOPED_TRACE(::testing::Message() << "count " << c.count << " n " << c.n << " k " << c.k << " wb " << c.wb);
    const int64_t nsb = (c.n + c.wb - 1) / c.wb, kbw = c.k / c.wb;
    const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(c.count * c.n * c.k));
    std::vector<uint8_t> s = random_e8m0_scales(rng, size_t(c.count * nsb * kbw));
    for (size_t i = 0; i < s.size(); i += 5) s[i] = uint8_t(127 + 10 + int(rng() % 100));  // large scales too
    std::vector<uint16_t> y(size_t(c.count * c.n * c.k), 0xdead);
    GemmExpandBf16Params p;
    p.w = w.data(), p.w_scale = s.data(), p.y = y.data(), p.count = c.count, p.n = c.n, p.k = c.k, p.w_block = c.wb;
    ASSERT_TRUE(gemm_expand_bf16_ref(p).ok());
    for (int64_t e = 0; e < c.count; ++e)
      for (int64_t r = 0; r < c.n; ++r)
        for (int64_t i = 0; i < c.k; ++i) {
          const size_t at = size_t((e * c.n + r) * c.k + i);
          const float want = e4m3_to_f32(w[at]) * e8m0_to_f32(s[size_t((e * nsb + r / c.wb) * kbw + i / c.wb)]);
          ASSERT_TRUE(std::isfinite(want));
          ASSERT_EQ(bf16_to_f32(y[at]), want) << "matrix " << e << " row " << r << " col " << i;
        }
  }
}

TEST(GemmExpandBf16, Fp4NibbleOrderRowScalesAndSkippedMatrices) {
  std::mt19937 rng(4);
  const int64_t E = 5, n = 40, k = 96, kb = k / 32;
  std::vector<uint8_t> w(size_t(E * n * k / 2));
  for (auto& b : w) b = uint8_t(rng());
  const std::vector<uint8_t> s = random_e8m0_scales(rng, size_t(E * n * kb));
  const std::vector<int32_t> starts = {0, 3, 3, 10, 10, 11};  // experts 1 and 3 have no rows
  std::vector<uint16_t> y(size_t(E * n * k), 0xbeef);
  GemmExpandBf16Params p;
  p.w = w.data(), p.w_scale = s.data(), p.y = y.data(), p.count = E, p.n = n, p.k = k, p.w_block = 32;
  p.w_format = WeightFormat::kFp4, p.row_start = starts.data();
  ASSERT_TRUE(gemm_expand_bf16_ref(p).ok());
  for (int64_t e = 0; e < E; ++e) {
    const bool skipped = starts[size_t(e + 1)] <= starts[size_t(e)];
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i) {
        const int64_t row = e * n + r;
        const size_t at = size_t(row * k + i);
        if (skipped) {
          ASSERT_EQ(y[at], 0xbeef) << "expert " << e << " has no rows but was written";
          continue;
        }
        const uint8_t nib = uint8_t((w[size_t(row * (k / 2) + i / 2)] >> (i % 2 == 0 ? 0 : 4)) & 15);
        ASSERT_EQ(bf16_to_f32(y[at]), e2m1_to_f32(nib) * e8m0_to_f32(s[size_t(row * kb + i / 32)])) << at;
      }
  }
  std::vector<int32_t> bad = starts;
  bad[2] = 1;  // decreasing
  p.row_start = bad.data();
  EXPECT_FALSE(gemm_expand_bf16_ref(p).ok());
}

TEST(GemmExpandBf16, GroupedTwinOverExpandedWeightsIsTheFp4TwinsBits) {
  std::mt19937 rng(5);
  const int64_t G = 4, n = 130, k = 256, kb = k / 32;
  const std::vector<int32_t> starts = {0, 7, 7, 40, 41};
  const int64_t rows = starts.back();
  std::vector<uint8_t> w(size_t(G * n * k / 2));
  for (auto& b : w) b = uint8_t(rng());
  const std::vector<uint8_t> s = random_e8m0_scales(rng, size_t(G * n * kb));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(size_t(rows * k));
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  std::vector<uint16_t> wexp(size_t(G * n * k));
  GemmExpandBf16Params e;
  e.w = w.data(), e.w_scale = s.data(), e.y = wexp.data(), e.count = G, e.n = n, e.k = k, e.w_block = 32;
  e.w_format = WeightFormat::kFp4;
  ASSERT_TRUE(gemm_expand_bf16_ref(e).ok());
  std::vector<float> y4(size_t(rows * n), -1.0f), yb(size_t(rows * n), -2.0f);
  GemmFp8GroupedParams g;
  g.xq = reinterpret_cast<const uint8_t*>(x.data()), g.x_bf16 = true, g.row_start = starts.data();
  g.groups = G, g.rows = rows, g.n = n, g.k = k, g.w_block = 32, g.bf16_round_out = true;
  GemmFp8GroupedParams g4 = g, gb = g;
  g4.w = w.data(), g4.w_scale = s.data(), g4.w_format = WeightFormat::kFp4, g4.y = y4.data();
  gb.w = reinterpret_cast<const uint8_t*>(wexp.data()), gb.w_bf16 = true, gb.y = yb.data();
  ASSERT_TRUE(gemm_fp8_grouped_ref(g4).ok());
  ASSERT_TRUE(gemm_fp8_grouped_ref(gb).ok());
  EXPECT_EQ(0, std::memcmp(y4.data(), yb.data(), y4.size() * 4));
  gb.x_bf16 = false, gb.xs = y4.data();
  EXPECT_FALSE(validate(gb).ok()) << "w_bf16 without x_bf16 must be refused";
}

TEST(GemmExpandBf16, RefusesBadShapes) {
  std::vector<uint8_t> w(4096), s(64);
  std::vector<uint16_t> y(4096);
  GemmExpandBf16Params ok;
  ok.w = w.data(), ok.w_scale = s.data(), ok.y = y.data(), ok.n = 8, ok.k = 128, ok.w_block = 128;
  ASSERT_TRUE(validate(ok).ok());
  auto bad = [&](auto&& change) {
    GemmExpandBf16Params p = ok;
    change(p);
    return !validate(p).ok();
  };
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.w = nullptr; }));
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.y = nullptr; }));
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.k = 100; }));
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.k = 96; }));  // not a multiple of w_block 128
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.w_block = 64; }));
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.n = 0; }));
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.count = 0; }));
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.w_format = WeightFormat::kFp4; }));  // FP4: w_block 32
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.count = int64_t(1) << 21; }));
  EXPECT_TRUE(bad([](GemmExpandBf16Params& p) { p.n = int64_t(1) << 29, p.k = int64_t(1) << 29; }));
}

}  // namespace
}  // namespace flashseek::ops
