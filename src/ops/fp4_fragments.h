// The fragment order of an MXFP4 matrix: the decode GEMV's register layout stored in memory, so
// that each thread of a warp reads its weights as whole 16-byte vectors and a warp's load is one
// contiguous 512-byte run (the row-major layout gives each thread 4 bytes of each of 8 rows per
// load: half-sector requests from 32 rows).
//
// A matrix [n, k] (n % 32 == 0, k % 64 == 0) in row-major form has codes [n, k / 2] (two e2m1
// nibbles per byte) and E8M0 scales [n, k / 32]. The fragment order keeps the same bytes, moved:
// * codes: units of 1,024 bytes, one per (32-row tile t, pair of 32-blocks p), in the order
//   (t, p); inside a unit, lane l = 4g + q (g = 0..7, q = 0..3) owns 32 bytes: 8 words
//   s = 4j + 2mt + h (j: the block of the pair, mt, h: row r = 16mt + 8h + g of the tile), word s
//   being bytes 4q..4q+3 of block 2p + j of that row — the 4-byte word gemv_kernel's thread
//   (g, q) loads for its A fragment (ops/cuda/gemv/gemv.cu);
// * scales: units of 64 bytes per (t, p); inside, 8 bytes per g: byte 2(2mt + h) + j is the
//   scale of row 16mt + 8h + g, block 2p + j.
// So the first 16 bytes of a lane's 32 are its words of block 2p, the next 16 those of 2p + 1,
// and a lane's scales of a block pair are one 8-byte load.
//
// FP8 matrices (e4m3 codes [n, k], n % 32 == 0) have the same order at the FP8 fragment's grain:
// units of 1,024 bytes per (32-row tile t, 32-block kb), in the order (t, kb); lane l = 4g + q owns
// 32 bytes, four 8-byte pieces s = 2mt + h, piece s being bytes 8q..8q+7 of block kb of row
// 16mt + 8h + g (the two words gemv_kernel's thread (g, q) loads for its A fragment). The scales
// (one per w_block × w_block tile) stay as they are.
//
// This header: the layouts only (shared with CUDA code); host pack / unpack: ops/linear_quant.h.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FS_FRAG_HD __host__ __device__
#else
#define FS_FRAG_HD
#endif

namespace flashseek::ops {

// Shape rule of the fragment order.
FS_FRAG_HD inline constexpr bool fp4_fragment_shape_ok(int64_t n, int64_t k) {
  return n > 0 && k > 0 && n % 32 == 0 && k % 64 == 0;
}

// Byte offset, in the fragment order, of the 4-byte code word q (bytes 4q..4q+3) of block kb of
// row `row` (row-major offset: row · k/2 + 16kb + 4q).
FS_FRAG_HD inline constexpr int64_t fp4_fragment_word(int64_t row, int64_t kb, int q, int64_t k) {
  const int64_t t = row / 32, r = row % 32, pairs = k / 64;
  const int64_t mt = r / 16, h = (r / 8) % 2, g = r % 8;
  const int64_t unit = t * pairs + kb / 2, s = 4 * (kb % 2) + 2 * mt + h;
  return (unit * 32 + 4 * g + q) * 32 + 4 * s;
}

// Byte offset, in the fragment order, of the scale of block kb of row `row` (row-major: row · k/32 + kb).
FS_FRAG_HD inline constexpr int64_t fp4_fragment_scale(int64_t row, int64_t kb, int64_t k) {
  const int64_t t = row / 32, r = row % 32, pairs = k / 64;
  const int64_t mt = r / 16, h = (r / 8) % 2, g = r % 8;
  const int64_t unit = t * pairs + kb / 2;
  return (unit * 8 + g) * 8 + 2 * (2 * mt + h) + kb % 2;
}

// FP8: shape rule, and the byte offset of the 8-byte piece q (bytes 8q..8q+7) of block kb of row
// `row` (row-major offset: row · k + 32kb + 8q).
FS_FRAG_HD inline constexpr bool fp8_fragment_shape_ok(int64_t n, int64_t k) {
  return n > 0 && k > 0 && n % 32 == 0 && k % 32 == 0;
}
FS_FRAG_HD inline constexpr int64_t fp8_fragment_piece(int64_t row, int64_t kb, int q, int64_t k) {
  const int64_t t = row / 32, r = row % 32, mt = r / 16, h = (r / 8) % 2, g = r % 8;
  return ((t * (k / 32) + kb) * 32 + 4 * g + q) * 32 + 8 * (2 * mt + h);
}

}  // namespace flashseek::ops
