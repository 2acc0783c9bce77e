// Cache row formats by model family and numerics (cache_format.h).
#include "forward/cache_format.h"

namespace flashseek::forward {
namespace {

// `codec` over the first `coded` of `dim` values in blocks of `block`; FP32 when that layout is
// not one the codecs support (validate_row_format).
ops::CacheRowFormat compact_or_f32(ops::RowCodec codec, int64_t dim, int64_t coded, int64_t block) {
  const ops::CacheRowFormat f{codec, int32_t(dim), int32_t(coded), int32_t(block)};
  if (dim <= 0 || dim > (1 << 20) || !ops::validate_row_format(f).ok()) return ops::f32_row_format(dim);
  return f;
}

}  // namespace

CacheFormats cache_formats(const model::ModelConfig& c, Numerics numerics) {
  const int64_t Dh = c.head_dim, Dr = c.rope_head_dim, dI = c.index_head_dim;
  if (numerics != Numerics::kReference)
    return {ops::f32_row_format(Dh), ops::f32_row_format(Dh), ops::f32_row_format(dI)};
  using ops::RowCodec;
  if (c.is_v41())  // flow.cpp project_qkv / finish_entries: quant_sim kFp8 32, kFp4E4m3 16, kFp4E8m0 32
    return {compact_or_f32(RowCodec::kFp8E8m0, Dh, Dh, 32), compact_or_f32(RowCodec::kFp4E4m3, Dh, Dh, 16),
            compact_or_f32(RowCodec::kFp4E8m0, dI, dI, 32)};
  // V4: kFp8 64 over the first Dh − Dr values (the tail is BF16), index keys kFp4E8m0 32.
  return {compact_or_f32(RowCodec::kFp8E8m0, Dh, Dh - Dr, 64), compact_or_f32(RowCodec::kFp8E8m0, Dh, Dh - Dr, 64),
          compact_or_f32(RowCodec::kFp4E8m0, dI, dI, 32)};
}

}  // namespace flashseek::forward
