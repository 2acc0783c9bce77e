// Byte slices of stored matrices (stored_slice.h): plain host code, in every build.
#include "backends/cuda/stored_slice.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "model/quant.h"

namespace flashseek::forward {

namespace {

const char* format_name(StoredFormat f) {
  switch (f) {
    case StoredFormat::kF32: return "F32";
    case StoredFormat::kBf16: return "BF16";
    case StoredFormat::kF16: return "F16";
    case StoredFormat::kFp8: return "FP8 e4m3";
    case StoredFormat::kFp4: return "MXFP4";
  }
  return "?";
}

bool scaled(StoredFormat f) { return f == StoredFormat::kFp8 || f == StoredFormat::kFp4; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Code bytes of `values` consecutive values of one row (FP4: `values` even).
int64_t code_bytes_of(StoredFormat f, int64_t values) {
  switch (f) {
    case StoredFormat::kF32: return 4 * values;
    case StoredFormat::kBf16: case StoredFormat::kF16: return 2 * values;
    case StoredFormat::kFp8: return values;
    case StoredFormat::kFp4: return values / 2;
  }
  return 0;
}

}  // namespace

Status check_stored(const StoredMatrixView& m) {
  if (m.n <= 0 || m.k <= 0) return invalid_argument("stored matrix: shape {}x{} is empty", m.n, m.k);
  if (m.block_rows <= 0 || m.block_cols <= 0)
    return invalid_argument("stored matrix: scale block {}x{} is not positive", m.block_rows, m.block_cols);
  if (m.format == StoredFormat::kFp4 && (m.k % 32 != 0 || m.block_rows != 1 || m.block_cols != 32))
    return invalid_argument("stored MXFP4 matrix {}x{}: expects 32-value row blocks (scale block {}x{})", m.n, m.k,
                            m.block_rows, m.block_cols);
  if (!scaled(m.format) && (m.block_rows != 1 || m.block_cols != 1 || !m.scales.empty()))
    return invalid_argument("stored {} matrix: has scales", format_name(m.format));
  if (m.n > (int64_t(1) << 40) / m.k) return invalid_argument("stored matrix: shape {}x{} is too large", m.n, m.k);
  const int64_t code = m.n * code_bytes_of(m.format, m.k);
  const int64_t scale = scaled(m.format) ? ceil_div(m.n, m.block_rows) * ceil_div(m.k, m.block_cols) : 0;
  if (int64_t(m.codes.size()) != code || int64_t(m.scales.size()) != scale)
    return invalid_argument("stored {} matrix {}x{}: {} code / {} scale bytes, expected {} / {}", format_name(m.format),
                            m.n, m.k, m.codes.size(), m.scales.size(), code, scale);
  return {};
}

Result<StoredSlice> slice_stored(const StoredMatrixView& m, SliceAxis axis, int64_t start, int64_t count) {
  FS_RETURN_IF_ERROR(check_stored(m));
  const bool rows = axis == SliceAxis::kRows;
  const char* what = rows ? "rows" : "columns";
  const int64_t extent = rows ? m.n : m.k;
  if (count <= 0 || start < 0 || start > extent - count)
    return invalid_argument("stored matrix {}x{}: {} [{}, {}) are not a non-empty range inside [0, {})", m.n, m.k, what,
                            start, start + count, extent);
  // Whole scale blocks only: a slice's scales then belong to it alone (edge blocks of the source
  // may be partial; a slice may end at the matrix's end inside one).
  const int64_t blk = rows ? m.block_rows : m.block_cols;
  if (start % blk != 0 || (count % blk != 0 && start + count != extent))
    return invalid_argument("stored {} matrix {}x{}: {} [{}, {}) do not start and end on whole {}x{} scale blocks",
                            format_name(m.format), m.n, m.k, what, start, start + count, m.block_rows, m.block_cols);
  StoredSlice s;
  s.n = rows ? count : m.n;
  s.k = rows ? m.k : count;
  const int64_t scale_cols = scaled(m.format) ? ceil_div(m.k, m.block_cols) : 0;
  if (rows) {  // contiguous: code rows and scale block rows
    const int64_t rb = code_bytes_of(m.format, m.k);
    s.src_codes = m.codes.subspan(size_t(start * rb), size_t(count * rb));
    if (scaled(m.format)) {
      const int64_t s0 = start / m.block_rows, s1 = ceil_div(start + count, m.block_rows);
      s.src_scales = m.scales.subspan(size_t(s0 * scale_cols), size_t((s1 - s0) * scale_cols));
    }
    return s;
  }
  s.gathered = true;  // each row's piece of the codes, then the matching scale columns
  const int64_t rb = code_bytes_of(m.format, m.k), off = code_bytes_of(m.format, start),
                nb = code_bytes_of(m.format, count);
  s.code_buf.resize(size_t(m.n * nb));
  for (int64_t r = 0; r < m.n; ++r)
    std::memcpy(s.code_buf.data() + r * nb, m.codes.data() + r * rb + off, size_t(nb));
  if (scaled(m.format)) {
    const int64_t srows = ceil_div(m.n, m.block_rows);
    const int64_t c0 = start / m.block_cols, c1 = ceil_div(start + count, m.block_cols), sn = c1 - c0;
    s.scale_buf.resize(size_t(srows * sn));
    for (int64_t r = 0; r < srows; ++r)
      std::memcpy(s.scale_buf.data() + r * sn, m.scales.data() + r * scale_cols + c0, size_t(sn));
  }
  return s;
}

Result<Vec> dequant_stored(const StoredMatrixView& m) {
  FS_RETURN_IF_ERROR(check_stored(m));
  Vec out(size_t(m.n * m.k));
  switch (m.format) {
    case StoredFormat::kF32: FS_RETURN_IF_ERROR(model::convert_to_f32(DType::kF32, m.codes, out)); break;
    case StoredFormat::kBf16: FS_RETURN_IF_ERROR(model::convert_to_f32(DType::kBF16, m.codes, out)); break;
    case StoredFormat::kF16: FS_RETURN_IF_ERROR(model::convert_to_f32(DType::kF16, m.codes, out)); break;
    case StoredFormat::kFp8:
      model::dequant_fp8_blocks(m.codes.data(), m.scales.data(), m.n, m.k, m.block_rows, m.block_cols, 0, m.n,
                                out.data());
      break;
    case StoredFormat::kFp4: model::dequant_fp4(m.codes.data(), m.scales.data(), m.n, m.k, 0, m.n, out.data()); break;
  }
  return out;
}

Status slice_f32(Vec& v, int64_t rows, int64_t cols, SliceAxis axis, int64_t start, int64_t count, const char* what) {
  if (v.empty()) return {};
  if (rows < 0 || cols < 0 || int64_t(v.size()) != rows * cols)
    return internal_error("tensor parallel: {} has {} values, expected {}x{}", what, v.size(), rows, cols);
  const int64_t extent = axis == SliceAxis::kRows ? rows : cols;
  if (count < 0 || start < 0 || start > extent - count)
    return internal_error("tensor parallel: {} slice [{}, {}) outside [0, {})", what, start, start + count, extent);
  Vec out;
  if (axis == SliceAxis::kRows) {
    out.assign(v.begin() + start * cols, v.begin() + (start + count) * cols);
  } else {
    out.resize(size_t(rows * count));
    for (int64_t r = 0; r < rows; ++r)
      std::copy(v.begin() + r * cols + start, v.begin() + r * cols + start + count, out.begin() + r * count);
  }
  v.swap(out);
  return {};
}

}  // namespace flashseek::forward
