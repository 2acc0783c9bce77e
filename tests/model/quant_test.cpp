// Number-format decoders on hand-made values: signed zeros, extremes (±448, ±6), NaN codes and
// NaN scales, partial edge blocks, nibble order.
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "core/numeric.h"
#include "core/rng.h"
#include "model/quant.h"

namespace flashseek::model {
namespace {

std::vector<float> convert(DType dt, const std::vector<uint8_t>& bytes, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(convert_to_f32(dt, bytes, out).ok());
  return out;
}

TEST(Quant, ConvertScalars) {
  auto bf = convert(DType::kBF16, {0x80, 0x3f, 0x00, 0x80, 0x80, 0x7f}, 3);  // 1, -0, +inf
  EXPECT_EQ(bf[0], 1.0f);
  EXPECT_TRUE(bf[1] == 0.0f && std::signbit(bf[1]));
  EXPECT_TRUE(std::isinf(bf[2]));
  auto h = convert(DType::kF16, {0x00, 0x3c, 0x00, 0xc0}, 2);
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  auto e4 = convert(DType::kF8E4M3, {0x7e, 0xfe, 0x80, 0x7f, 0x01, 0x38}, 6);
  EXPECT_EQ(e4[0], 448.0f);
  EXPECT_EQ(e4[1], -448.0f);
  EXPECT_TRUE(e4[2] == 0.0f && std::signbit(e4[2]));
  EXPECT_TRUE(std::isnan(e4[3]));
  EXPECT_EQ(e4[4], std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4[5], 1.0f);
  auto e8 = convert(DType::kF8E8M0, {127, 0, 0xff, 254}, 4);
  EXPECT_EQ(e8[0], 1.0f);
  EXPECT_EQ(e8[1], std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8[2]));
  EXPECT_EQ(e8[3], std::ldexp(1.0f, 127));
  auto i8 = convert(DType::kI8, {0xfb, 0x7f}, 2);
  EXPECT_EQ(i8[0], -5.0f);
  EXPECT_EQ(i8[1], 127.0f);
  auto u8 = convert(DType::kU8, {0xfb}, 1);
  EXPECT_EQ(u8[0], 251.0f);
  std::vector<uint8_t> i64(16);
  const int64_t v[2] = {-3, 255};
  std::memcpy(i64.data(), v, 16);
  auto l = convert(DType::kI64, i64, 2);
  EXPECT_EQ(l[0], -3.0f);
  EXPECT_EQ(l[1], 255.0f);
  std::vector<float> bad(3);
  EXPECT_FALSE(convert_to_f32(DType::kF32, std::vector<uint8_t>(8), bad).ok());
}

// [5, 7] with 2x4 blocks: scale grid [3, 2], last row block and last column block are partial.
TEST(Quant, Fp8EdgeBlocksAndNanScale) {
  const int64_t rows = 5, cols = 7, br = 2, bc = 4;
  std::vector<uint8_t> w(rows * cols), s = {127, 128, 126, 0xff, 130, 120};
  Rng rng(9);
  for (auto& c : w) {
    c = uint8_t(rng.below(256));
    if ((c & 0x7f) == 0x7f) c = 0x7e;  // keep NaN codes out of this grid
  }
  w[0] = 0x7e;         // +448 in block (0,0), scale 1
  w[1 * cols + 6] = 0x80;  // -0 in block (0,1), scale 2
  std::vector<float> out(rows * cols);
  dequant_fp8_blocks(w.data(), s.data(), rows, cols, br, bc, 0, rows, out.data());
  EXPECT_EQ(out[0], 448.0f);
  EXPECT_TRUE(out[1 * cols + 6] == 0.0f && std::signbit(out[1 * cols + 6]));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const uint8_t sc = s[size_t((i / br) * 2 + j / bc)];
      const float got = out[size_t(i * cols + j)];
      if (sc == 0xff) {
        EXPECT_TRUE(std::isnan(got)) << i << "," << j;
        continue;
      }
      EXPECT_EQ(got, std::ldexp(e4m3_to_f32(w[size_t(i * cols + j)]), int(sc) - 127)) << i << "," << j;
    }
  // Row 4 alone (the partial last row block) equals the same rows of the full decode.
  std::vector<float> part(cols);
  dequant_fp8_blocks(w.data(), s.data(), rows, cols, br, bc, 4, 5, part.data());
  for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(part[size_t(j)], out[size_t(4 * cols + j)]);
}

// Engram rows: [rows, 64] with one scale per 32 values of a row.
TEST(Quant, EngramRowScales) {
  std::vector<uint8_t> w(3 * 64, 0x38);  // all 1.0
  std::vector<uint8_t> s = {127, 128, 125, 126, 0xff, 127};
  std::vector<float> out(3 * 64);
  dequant_fp8_blocks(w.data(), s.data(), 3, 64, 1, 32, 0, 3, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[31], 1.0f);
  EXPECT_EQ(out[32], 2.0f);
  EXPECT_EQ(out[64], 0.25f);
  EXPECT_EQ(out[64 + 32], 0.5f);
  EXPECT_TRUE(std::isnan(out[128]));
  EXPECT_EQ(out[128 + 32], 1.0f);
}

TEST(Quant, Fp4NibbleOrderExtremesAndGroups) {
  const int64_t rows = 2, cols = 64;
  std::vector<uint8_t> packed(rows * cols / 2, 0x00), s = {127, 129, 126, 0xff};
  packed[0] = 0x71;       // element 0 = code 1 (0.5), element 1 = code 7 (6)
  packed[1] = 0xf8;       // element 2 = -0, element 3 = -6
  packed[16] = 0x2a;      // element 32 (group 1, scale 4) = code 10 (-1), element 33 = code 2 (1)
  packed[32] = 0x77;      // row 1, elements 0,1 = 6 * 0.5
  packed[48] = 0x11;      // row 1 group 1: NaN scale
  std::vector<float> out(rows * cols);
  dequant_fp4(packed.data(), s.data(), rows, cols, 0, rows, out.data());
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_TRUE(out[2] == 0.0f && std::signbit(out[2]));
  EXPECT_EQ(out[3], -6.0f);
  EXPECT_EQ(out[31], 0.0f);
  EXPECT_EQ(out[32], -4.0f);
  EXPECT_EQ(out[33], 4.0f);
  EXPECT_EQ(out[64], 3.0f);
  EXPECT_EQ(out[65], 3.0f);
  EXPECT_TRUE(std::isnan(out[96]));
}

TEST(Quant, PackFp4InvertsDequant) {
  Rng rng(4);
  const int64_t rows = 3, cols = 96;
  std::vector<uint8_t> codes(rows * cols), packed(rows * cols / 2), s(rows * cols / 32, 127);
  for (auto& c : codes) c = uint8_t(rng.below(16));
  pack_fp4(codes.data(), rows, cols, packed.data());
  std::vector<float> out(rows * cols);
  dequant_fp4(packed.data(), s.data(), rows, cols, 0, rows, out.data());
  for (size_t i = 0; i < codes.size(); ++i) {
    const float want = e2m1_to_f32(codes[i]);
    EXPECT_EQ(std::signbit(out[i]), std::signbit(want)) << i;
    EXPECT_EQ(out[i], want) << i;
  }
}

}  // namespace
}  // namespace flashseek::model
