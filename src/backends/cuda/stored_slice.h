// Row and column slices of a matrix in the checkpoint's stored format (host bytes, no CUDA): what
// a tensor-parallel rank (gpu_tp.h) uploads of a matrix it holds only part of. Plain host code,
// compiled in every build, so that the CPU tests check the byte slicing against the dequantiser.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "forward/weights.h"

namespace flashseek::forward {

// How a matrix is stored (the formats GpuModel keeps on the device as stored).
enum class StoredFormat {
  kF32,   // 4 bytes a value
  kBf16,  // 2 bytes a value
  kF16,   // 2 bytes a value
  kFp8,   // e4m3 codes [n, k] + E8M0 scales [ceil(n/block_rows), ceil(k/block_cols)]
  kFp4,   // MXFP4: e2m1 packed [n, k/2] (two values a byte) + E8M0 scales [n, k/32]
};

// A host view of one stored matrix: `n` rows of `k` logical values. block_rows × block_cols is
// the E8M0 scale block (FP8: b×b, or 1×32 per-row groups; FP4: 1×32); 1×1 and no scales for the
// unscaled formats.
struct StoredMatrixView {
  StoredFormat format = StoredFormat::kF32;
  int64_t n = 0, k = 0;
  int64_t block_rows = 1, block_cols = 1;
  std::span<const uint8_t> codes, scales;
};

// The sizes of the view are consistent (codes and scales bytes match n, k and the blocks).
Status check_stored(const StoredMatrixView& m);

enum class SliceAxis { kRows, kCols };

// A slice [n, k] of a stored matrix, in the same format and scale blocks. A row slice points into
// the source's bytes (contiguous: no copy); a column slice gathers each row's piece of the codes
// and the matching scale columns into the buffers.
struct StoredSlice {
  int64_t n = 0, k = 0;
  std::span<const uint8_t> src_codes, src_scales;  // row slices
  std::vector<uint8_t> code_buf, scale_buf;        // column slices
  bool gathered = false;
  std::span<const uint8_t> codes() const { return gathered ? std::span<const uint8_t>(code_buf) : src_codes; }
  std::span<const uint8_t> scales() const { return gathered ? std::span<const uint8_t>(scale_buf) : src_scales; }
  // The slice as a view (for dequant_stored or another slice); valid while this object and the
  // source live.
  StoredMatrixView view(const StoredMatrixView& of) const {
    StoredMatrixView v = of;
    v.n = n, v.k = k, v.codes = codes(), v.scales = scales();
    return v;
  }
};

// Rows (axis kRows) or columns (kCols) [start, start + count) of `m`. A slice of a block-scaled
// matrix must start on a whole scale block and end on one or at the matrix's end (so that its
// scale rows / columns belong to it alone); MXFP4 columns move in whole 32-value blocks (the
// packed bytes then split on byte boundaries too). Otherwise, and for an empty or out-of-range
// slice, an invalid_argument error that names the range, the axis and the block.
Result<StoredSlice> slice_stored(const StoredMatrixView& m, SliceAxis axis, int64_t start, int64_t count);

// Every value of `m` as FP32 (row-major [n, k]), by the checkpoint's dequantisers (model/quant.h).
Result<Vec> dequant_stored(const StoredMatrixView& m);

// Rows / columns [start, start + count) of a row-major FP32 [rows, cols] matrix (an empty `v`
// stays empty); `what` names it in the error for a size that does not match.
Status slice_f32(Vec& v, int64_t rows, int64_t cols, SliceAxis axis, int64_t start, int64_t count, const char* what);

}  // namespace flashseek::forward
