// Host pack/unpack of compact cache rows; the layout: ops/cache_row_format.h.
#pragma once
#include <cstdint>

#include "core/status.h"
#include "ops/cache_row_format.h"

namespace flashseek::ops {

// OK when `f` describes a layout pack/unpack support (dim > 0, coded a multiple of block, FP4:
// every value coded and an even block; a BF16 tail only with kFp8E8m0).
Status validate_row_format(const CacheRowFormat& f);

// rows [n, f.dim] FP32 → n rows of f.row_bytes() bytes at `out`. Every value must be exactly
// representable (a row the matching quantiser produced); otherwise nothing is rounded: the
// result is an error naming the first row and value that is not (out is then partly written).
Status pack_cache_rows(const CacheRowFormat& f, const float* x, int64_t n, uint8_t* out);
// n packed rows → FP32 [n, f.dim]: the exact values pack_cache_rows was given.
void unpack_cache_rows(const CacheRowFormat& f, const uint8_t* in, int64_t n, float* out);

}  // namespace flashseek::ops
