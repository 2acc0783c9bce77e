// The CPU twin of the prefill GEMM's weight expansion (ops::gemm_expand_bf16_ref): stored FP8 /
// MXFP4 matrices → BF16 values code · scale. Properties: every value is exact (the BF16 value
// equals the FP32 product of the code's value and its block's scale) for the scales the
// checkpoints hold, both FP8 tile sizes and odd n (a partial last scale tile); FP4 nibble order;
// matrices skipped by row_start keep their bytes; the grouped twin over the expanded BF16 weights
// (w_bf16) gives the bits of the grouped twin over the stored FP4 experts; bad shapes are refused.
// The CUDA op against this twin: tests/ops_cuda/gemm_fp8_test.cpp (CudaGemmFp8.ExpandedWeights*).
#include <gtest/gtest.h>

#include <algorithm>
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

// The reference's FP4 → FP8 re-pack (repack_fp4_to_fp8_128): with every 32-group scale within
// 2^14 of its 128 x 128 block's largest, code · block scale equals every stored value exactly
// (n = 257: a partial last row block; k = 384: three k blocks), the block scale is the largest
// group exponent − 6, and the count of inexact values is 0.
TEST(RepackFp4ToFp8, ExactWhereTheScalesSpanLessThanFourteenBinades) {
  std::mt19937 rng(11);
  const int64_t n = 257, k = 384;
  std::vector<uint8_t> w4(size_t(n * k / 2)), s32(size_t(n * k / 32));
  for (auto& b : w4) b = uint8_t(rng());
  for (auto& v : s32) v = uint8_t(110 + rng() % 15);  // 110 .. 124: 14 binades
  std::vector<uint8_t> w8(size_t(n * k), 0xAA), s128(size_t((n + 127) / 128 * (k / 128)), 0xAA);
  const auto r = repack_fp4_to_fp8_128(w4.data(), s32.data(), n, k, w8.data(), s128.data());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, 0);
  for (int64_t rb = 0; rb < (n + 127) / 128; ++rb)
    for (int64_t b = 0; b < k / 128; ++b) {
      int e_max = 0;
      for (int64_t i = rb * 128; i < std::min(n, rb * 128 + 128); ++i)
        for (int64_t g = 4 * b; g < 4 * b + 4; ++g) e_max = std::max(e_max, int(s32[size_t(i * (k / 32) + g)]));
      ASSERT_EQ(int(s128[size_t(rb * (k / 128) + b)]), e_max - 6) << "row block " << rb << " k block " << b;
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) {
      const double stored = double(e2m1_to_f32(uint8_t((w4[size_t(i * (k / 2) + j / 2)] >> (4 * (j & 1))) & 15))) *
                            std::ldexp(1.0, int(s32[size_t(i * (k / 32) + j / 32)]) - 127);
      const double repacked = double(e4m3_to_f32(w8[size_t(i * k + j)])) *
                              std::ldexp(1.0, int(s128[size_t(i / 128 * (k / 128) + j / 128)]) - 127);
      ASSERT_EQ(stored, repacked) << "row " << i << " k " << j;
    }
}

// Groups far below their block's largest scale lose values (counted, not hidden): a group 20
// binades down (every nonzero value under e4m3's smallest step) is counted value for value, one 8
// down stays exact; NaN scales count their 32 values and write NaN codes; a block whose largest
// exponent is under 6 takes scale exponent 0; bad shapes and missing buffers are refused.
TEST(RepackFp4ToFp8, CountsWhatE4m3CannotHold) {
  std::mt19937 rng(12);
  const int64_t n = 3, k = 128;
  std::vector<uint8_t> w4(size_t(n * k / 2)), s32(size_t(n * k / 32), 127);
  for (auto& b : w4) b = uint8_t(rng());
  s32[1] = 127 - 20;  // row 0, group 1
  s32[2] = 127 - 8;   // row 0, group 2
  s32[4 + 3] = 0xFF;  // row 1, group 3
  int64_t want = 32;  // the NaN group
  for (int64_t j = 32; j < 64; ++j) want += ((w4[size_t(j / 2)] >> (4 * (j & 1))) & 7) != 0;
  std::vector<uint8_t> w8(size_t(n * k)), s128(1);
  auto r = repack_fp4_to_fp8_128(w4.data(), s32.data(), n, k, w8.data(), s128.data());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, want);
  EXPECT_EQ(int(s128[0]), 127 - 6);
  for (int64_t j = 96; j < 128; ++j) EXPECT_EQ(w8[size_t(k + j)], 0x7F) << "NaN code at row 1, k " << j;
  for (int64_t j = 64; j < 96; ++j) {  // group 2: e2m1 · 2^-2, exact
    const float v = e2m1_to_f32(uint8_t((w4[size_t(j / 2)] >> (4 * (j & 1))) & 15));
    EXPECT_EQ(e4m3_to_f32(w8[size_t(j)]), std::ldexp(v, -2)) << "k " << j;
  }
  // Largest exponent 3: block scale exponent 0, values e2m1 · 2^3, exact.
  std::vector<uint8_t> small(s32.size(), 3);
  r = repack_fp4_to_fp8_128(w4.data(), small.data(), n, k, w8.data(), s128.data());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0);
  EXPECT_EQ(int(s128[0]), 0);
  EXPECT_FALSE(repack_fp4_to_fp8_128(w4.data(), s32.data(), n, 96, w8.data(), s128.data()).ok()) << "k % 128";
  EXPECT_FALSE(repack_fp4_to_fp8_128(w4.data(), s32.data(), 0, k, w8.data(), s128.data()).ok()) << "no rows";
  EXPECT_FALSE(repack_fp4_to_fp8_128(nullptr, s32.data(), n, k, w8.data(), s128.data()).ok()) << "no w4";
  EXPECT_FALSE(repack_fp4_to_fp8_128(w4.data(), s32.data(), int64_t(1) << 30, k, w8.data(), s128.data()).ok())
      << "too large";
}

}  // namespace
}  // namespace flashseek::ops
