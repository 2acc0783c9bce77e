// Checkpoint number formats -> float32 (spec model-v4.md §2.3, model-v41.md §1.4, §4.6).
// All functions work on a row range [row_begin, row_end) of a logical 2-D weight [rows, cols]
// so callers can dequantise one embedding / Engram row without touching the rest.
// NaN scales (e8m0 0xFF) and NaN codes propagate as NaN; nothing here fails on values.
#pragma once
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/status.h"

namespace flashseek::model {

// Element-wise conversion of `out.size()` values of dtype `dt` (BF16, F16, F32, F64, I64, I32,
// I16, I8, U8, BOOL, F8_E4M3, F8_E8M0 as the scale value 2^(e-127)). `src` must hold exactly
// out.size() * dtype_size(dt) bytes.
Status convert_to_f32(DType dt, std::span<const uint8_t> src, std::span<float> out);

// FP8 e4m3 weight `w` [rows, cols] with e8m0 `scale` [ceil(rows/block_rows), ceil(cols/block_cols)]:
// W[i, j] = e4m3(w[i, j]) * 2^(scale[i/block_rows, j/block_cols] - 127). Edge blocks are partial.
// Writes rows [row_begin, row_end) to out [(row_end - row_begin), cols].
// Engram tables are the case block_rows = 1, block_cols = 32.
void dequant_fp8_blocks(const uint8_t* w, const uint8_t* scale, int64_t rows, int64_t cols,
                        int64_t block_rows, int64_t block_cols, int64_t row_begin, int64_t row_end,
                        float* out);

// FP4 e2m1 experts: `packed` [rows, cols/2] (byte j of a row: element 2j in the low nibble,
// 2j+1 in the high nibble), e8m0 `scale` [rows, cols/32]. cols must be a multiple of 32.
void dequant_fp4(const uint8_t* packed, const uint8_t* scale, int64_t rows, int64_t cols,
                 int64_t row_begin, int64_t row_end, float* out);

// Encoders used by make-tiny and tests (exact inverses of the decoders on representable values).
// Packs logical e2m1 codes [rows, cols] (one nibble per byte, low 4 bits) into [rows, cols/2].
void pack_fp4(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* packed);

}  // namespace flashseek::model
