#include "model/quant.h"

#include <array>
#include <cstring>

#include "core/numeric.h"

namespace flashseek::model {
namespace {

// 256-entry decode tables: the hot loops of big tensors (embedding, Engram rows) are table reads.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[size_t(i)] = e4m3_to_f32(uint8_t(i));
    return a;
  }();
  return t;
}

const std::array<float, 256>& e8m0_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[size_t(i)] = e8m0_to_f32(uint8_t(i));
    return a;
  }();
  return t;
}

template <typename T>
void convert_ints(const uint8_t* src, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * sizeof(T), sizeof(T));
    out[i] = float(v);
  }
}

}  // namespace

Status convert_to_f32(DType dt, std::span<const uint8_t> src, std::span<float> out) {
  const size_t n = out.size();
  if (src.size() != n * dtype_size(dt))
    return invalid_argument("convert_to_f32: {} bytes of {} for {} values", src.size(), dtype_name(dt), n);
  const uint8_t* s = src.data();
  float* o = out.data();
  switch (dt) {
    case DType::kF32: std::memcpy(o, s, n * 4); break;
    case DType::kF64: for (size_t i = 0; i < n; ++i) { double d; std::memcpy(&d, s + 8 * i, 8); o[i] = float(d); } break;
    case DType::kBF16: for (size_t i = 0; i < n; ++i) { uint16_t b; std::memcpy(&b, s + 2 * i, 2); o[i] = bf16_to_f32(b); } break;
    case DType::kF16: for (size_t i = 0; i < n; ++i) { uint16_t b; std::memcpy(&b, s + 2 * i, 2); o[i] = f16_to_f32(b); } break;
    case DType::kI64: convert_ints<int64_t>(s, o, n); break;
    case DType::kI32: convert_ints<int32_t>(s, o, n); break;
    case DType::kI16: convert_ints<int16_t>(s, o, n); break;
    case DType::kI8: convert_ints<int8_t>(s, o, n); break;
    case DType::kU8: case DType::kBool: convert_ints<uint8_t>(s, o, n); break;
    case DType::kF8E4M3: { const auto& t = e4m3_table(); for (size_t i = 0; i < n; ++i) o[i] = t[s[i]]; } break;
    case DType::kF8E8M0: { const auto& t = e8m0_table(); for (size_t i = 0; i < n; ++i) o[i] = t[s[i]]; } break;
  }
  return {};
}

void dequant_fp8_blocks(const uint8_t* w, const uint8_t* scale, int64_t rows, int64_t cols,
                        int64_t block_rows, int64_t block_cols, int64_t row_begin, int64_t row_end,
                        float* out) {
  assert(row_begin >= 0 && row_begin <= row_end && row_end <= rows && block_rows > 0 && block_cols > 0);
  const auto& code = e4m3_table();
  const auto& sc = e8m0_table();
  const int64_t scols = ceil_div(cols, block_cols);
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* wr = w + i * cols;
    const uint8_t* sr = scale + (i / block_rows) * scols;
    float* o = out + (i - row_begin) * cols;
    for (int64_t jb = 0; jb < scols; ++jb) {
      const float s = sc[sr[jb]];
      const int64_t j1 = std::min(cols, (jb + 1) * block_cols);
      for (int64_t j = jb * block_cols; j < j1; ++j) o[j] = code[wr[j]] * s;
    }
  }
}

void dequant_fp4(const uint8_t* packed, const uint8_t* scale, int64_t rows, int64_t cols,
                 int64_t row_begin, int64_t row_end, float* out) {
  assert(cols % 32 == 0 && row_begin >= 0 && row_begin <= row_end && row_end <= rows);
  const auto& sc = e8m0_table();
  const int64_t half = cols / 2, groups = cols / 32;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* pr = packed + i * half;
    const uint8_t* sr = scale + i * groups;
    float* o = out + (i - row_begin) * cols;
    for (int64_t j = 0; j < half; ++j) {
      const float s = sc[sr[(2 * j) / 32]];  // 2j and 2j+1 share a 32-group
      o[2 * j] = e2m1_to_f32(uint8_t(pr[j] & 0x0f)) * s;
      o[2 * j + 1] = e2m1_to_f32(uint8_t(pr[j] >> 4)) * s;
    }
  }
}

void pack_fp4(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* packed) {
  assert(cols % 2 == 0);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols / 2; ++j)
      packed[i * (cols / 2) + j] =
          uint8_t((codes[i * cols + 2 * j] & 0x0f) | ((codes[i * cols + 2 * j + 1] & 0x0f) << 4));
}

}  // namespace flashseek::model
