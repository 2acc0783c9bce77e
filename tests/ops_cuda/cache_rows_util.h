// Test helper shared by the compact-cache tests (cache_rows_test.cpp, model_attn_test.cpp): the
// quantiser the model's flow applies to rows of a cache row format (forward/flow.cpp), so that
// the rows are exactly representable in it.
#pragma once
#include <cstdint>

#include "core/numeric.h"
#include "ops/cache_row.h"
#include "ops/quant.h"

namespace flashseek::ops::cuda::testing {

inline void quantise_cache_rows(const CacheRowFormat& f, float* x, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * f.dim;
    if (f.codec == RowCodec::kFp8E8m0) {
      fp8_quant_dequant(row, 1, f.coded, f.block);
      round_bf16_inplace(row + f.coded, f.dim - f.coded);
    } else if (f.codec == RowCodec::kFp4E8m0) {
      fp4_quant_dequant_e8m0(row, 1, f.dim, f.block);
    } else if (f.codec == RowCodec::kFp4E4m3) {
      fp4_quant_dequant_e4m3(row, 1, f.dim, f.block);
    }
  }
}

}  // namespace flashseek::ops::cuda::testing
