// Compact cache rows (ops/cache_row.h): rows made by the reference's quantisers (ops/quant.h)
// pack and unpack to the same bits, for every format the caches use (spec perf-budget.md §2) and
// for hostile value ranges (zeros, negative zero, all-equal blocks, tiny and huge magnitudes);
// a row that is not exactly representable is refused, never rounded.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.h"
#include "ops/cache_row.h"
#include "ops/quant.h"

namespace flashseek::ops {
namespace {

struct Case {
  const char* name;
  CacheRowFormat fmt;
  int64_t row_bytes;  // perf-budget.md §2 (V4: 583 padded to 584)
};

// The quantiser the flow applies to a row of this format (forward/flow.cpp).
void quantise(const CacheRowFormat& f, float* x, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * f.dim;
    switch (f.codec) {
      case RowCodec::kFp8E8m0:
        fp8_quant_dequant(row, 1, f.coded, f.block);
        round_bf16_inplace(row + f.coded, f.dim - f.coded);  // V4: kv_norm / RoPE round to BF16
        break;
      case RowCodec::kFp4E8m0: fp4_quant_dequant_e8m0(row, 1, f.dim, f.block); break;
      case RowCodec::kFp4E4m3: fp4_quant_dequant_e4m3(row, 1, f.dim, f.block); break;
      case RowCodec::kF32: break;
    }
  }
}

// Rows whose blocks span the hostile cases: per block a magnitude from 0 to 1e37 (normals,
// FP32 subnormals, values the quantiser floors to zero), negative zeros, all-equal blocks,
// one non-zero value, alternating signs.
std::vector<float> hostile_rows(int64_t rows, int64_t dim, int64_t block, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float mags[] = {0.0f, 1e-40f, 1e-30f, 1e-12f, 1e-6f, 3e-3f, 1.0f, 7.5f, 448.0f, 3000.0f, 1e6f, 1e20f, 1e37f};
  std::vector<float> x(size_t(rows * dim));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b0 = 0; b0 < dim; b0 += block) {
      const float m = mags[g() % (sizeof(mags) / sizeof(mags[0]))];
      const int pattern = int(g() % 6);
      const float eq = nd(g) * m;
      for (int64_t i = b0; i < std::min(dim, b0 + block); ++i) {
        float v = nd(g) * m;
        if (pattern == 1) v = eq;                             // all equal
        if (pattern == 2) v = i == b0 + 3 ? m : -0.0f;        // one value among negative zeros
        if (pattern == 3) v = (i % 2 ? -1.0f : 1.0f) * m;     // alternating signs, equal magnitude
        if (pattern == 4 && g() % 3 == 0) v = -0.0f;
        x[size_t(r * dim + i)] = v;
      }
    }
  return x;
}

class CacheRow : public ::testing::TestWithParam<Case> {};

TEST_P(CacheRow, QuantisedRowsRoundTripBitwise) {
  const Case& c = GetParam();
  const CacheRowFormat& f = c.fmt;
  ASSERT_TRUE(validate_row_format(f).ok());
  EXPECT_EQ(f.row_bytes(), c.row_bytes);
  const int64_t rows = 300;
  std::vector<float> x = hostile_rows(rows, f.dim, f.block, 1234 + uint32_t(f.dim) + uint32_t(f.codec));
  quantise(f, x.data(), rows);
  int64_t neg_zero = 0, zero_blocks = 0;
  for (float v : x) neg_zero += std::bit_cast<uint32_t>(v) == 0x80000000u;
  for (int64_t b = 0; b < rows * f.dim; b += f.block) {
    bool z = true;
    for (int64_t i = 0; i < f.block; ++i) z = z && x[size_t(b + i)] == 0.0f;
    zero_blocks += z;
  }
  EXPECT_GT(neg_zero, 0) << "the inputs must exercise negative zero";
  EXPECT_GT(zero_blocks, 0) << "the inputs must exercise all-zero blocks";
  std::vector<uint8_t> packed(size_t(rows * f.row_bytes()), 0xee);
  const Status s = pack_cache_rows(f, x.data(), rows, packed.data());
  ASSERT_TRUE(s.ok()) << s.to_string();
  std::vector<float> back(x.size(), 1.0f);
  unpack_cache_rows(f, packed.data(), rows, back.data());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(x[i]))
        << c.name << " value " << i << ": " << x[i] << " came back as " << back[i];
  // Packing the unpacked rows again gives the same bytes (one encoding per row).
  std::vector<uint8_t> again(packed.size());
  ASSERT_TRUE(pack_cache_rows(f, back.data(), rows, again.data()).ok());
  EXPECT_EQ(again, packed);
}

TEST_P(CacheRow, UnrepresentableRowsAreRefused) {
  const Case& c = GetParam();
  const CacheRowFormat& f = c.fmt;
  const int64_t rows = 8;
  std::vector<uint8_t> packed(size_t(rows * f.row_bytes()));
  // Raw (unquantised) values: some value of these rows is off every code grid.
  std::vector<float> raw = hostile_rows(rows, f.dim, f.dim, 99);
  for (int64_t i = 0; i < rows * f.dim; ++i) raw[size_t(i)] = 1.0f + float(i % 97) * 0.0123f;
  EXPECT_FALSE(pack_cache_rows(f, raw.data(), rows, packed.data()).ok()) << c.name;
  // A quantised row with one value moved by one ulp, in a coded block and (V4) in the BF16 tail.
  std::vector<float> q = hostile_rows(rows, f.dim, f.block, 7);
  for (auto& v : q) v = 1.0f + std::fabs(v) * 0.0f + float(&v - q.data()) * 0.01f;  // non-zero everywhere
  quantise(f, q.data(), rows);
  ASSERT_TRUE(pack_cache_rows(f, q.data(), rows, packed.data()).ok());
  for (const int64_t at : {int64_t(5), int64_t(f.dim - 1)}) {
    std::vector<float> bad = q;
    float& v = bad[size_t(3 * f.dim + at)];
    v = std::nextafter(v, std::numeric_limits<float>::infinity());
    const Status s = pack_cache_rows(f, bad.data(), rows, packed.data());
    EXPECT_FALSE(s.ok()) << c.name << " value " << at;
    EXPECT_NE(s.to_string().find("row 3"), std::string::npos) << s.to_string();
  }
  for (const float nonfinite : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> bad = q;
    bad[size_t(f.dim + 2)] = nonfinite;
    EXPECT_FALSE(pack_cache_rows(f, bad.data(), rows, packed.data()).ok()) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, CacheRow,
    ::testing::Values(
        Case{"v41_ring", {RowCodec::kFp8E8m0, 512, 512, 32}, 528},
        Case{"v41_ckv", {RowCodec::kFp4E4m3, 512, 512, 16}, 288},
        Case{"v41_ikeys", {RowCodec::kFp4E8m0, 128, 128, 32}, 68},
        Case{"v4_ring_ckv", {RowCodec::kFp8E8m0, 512, 448, 64}, 584},
        Case{"tiny_v4_ring", {RowCodec::kFp8E8m0, 128, 64, 64}, 196},
        Case{"tiny_v41_ckv", {RowCodec::kFp4E4m3, 64, 64, 16}, 36},
        Case{"tiny_v41_ikeys", {RowCodec::kFp4E8m0, 32, 32, 32}, 20}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(CacheRowFormat, RejectsLayoutsTheCodecsCannotHold) {
  EXPECT_FALSE(validate_row_format({RowCodec::kFp8E8m0, 0, 0, 32}).ok());
  EXPECT_FALSE(validate_row_format({RowCodec::kFp8E8m0, 100, 100, 32}).ok());  // partial block
  EXPECT_FALSE(validate_row_format({RowCodec::kFp8E8m0, 64, 96, 32}).ok());    // more coded than dims
  EXPECT_FALSE(validate_row_format({RowCodec::kFp4E8m0, 64, 32, 32}).ok());    // FP4 with a tail
  EXPECT_FALSE(validate_row_format({RowCodec::kFp4E4m3, 66, 66, 33}).ok());    // odd FP4 block
  EXPECT_TRUE(validate_row_format(f32_row_format(7)).ok());
  EXPECT_EQ(f32_row_format(7).row_bytes(), 28);
}

}  // namespace
}  // namespace flashseek::ops
