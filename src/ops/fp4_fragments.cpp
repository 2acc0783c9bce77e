// Host pack / unpack between the row-major FP4 / FP8 layouts and the GEMV fragment orders
// (ops/fp4_fragments.h). A permutation of 4-byte (FP4) or 8-byte (FP8) code pieces and of FP4
// scale bytes, so each direction is one pass of copies.
#include <cstring>
#include <vector>

#include "ops/fp4_fragments.h"
#include "ops/linear_quant.h"

namespace flashseek::ops {

namespace {
Status check(const char* op, const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, const uint8_t* oc,
             const uint8_t* os) {
  if (!codes || !scales || !oc || !os) return invalid_argument("{}: codes, scales and both outputs must be set", op);
  if (!fp4_fragment_shape_ok(n, k))
    return invalid_argument("{}: n={} must be a positive multiple of 32 and k={} of 64", op, n, k);
  const uintptr_t cb = uintptr_t(n * (k / 2)), sb = uintptr_t(n * (k / 32));
  auto overlap = [](const uint8_t* a, uintptr_t na, const uint8_t* b, uintptr_t nb) {
    return uintptr_t(a) < uintptr_t(b) + nb && uintptr_t(b) < uintptr_t(a) + na;
  };
  if (overlap(codes, cb, oc, cb) || overlap(scales, sb, os, sb) || overlap(oc, cb, os, sb))
    return invalid_argument("{}: the outputs overlap the inputs or each other", op);
  return {};
}

template <bool kPack>
void permute(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, uint8_t* oc, uint8_t* os) {
  const int64_t nkb = k / 32;
  for (int64_t row = 0; row < n; ++row)
    for (int64_t kb = 0; kb < nkb; ++kb) {
      const int64_t rs = row * nkb + kb, fs = fp4_fragment_scale(row, kb, k);
      if constexpr (kPack) os[fs] = scales[rs];
      else os[rs] = scales[fs];
      for (int q = 0; q < 4; ++q) {
        const int64_t rw = row * (k / 2) + kb * 16 + q * 4, fw = fp4_fragment_word(row, kb, q, k);
        if constexpr (kPack) std::memcpy(oc + fw, codes + rw, 4);
        else std::memcpy(oc + rw, codes + fw, 4);
      }
    }
}

template <bool kPack>
void permute8(const uint8_t* codes, int64_t n, int64_t k, uint8_t* oc) {
  for (int64_t row = 0; row < n; ++row)
    for (int64_t kb = 0; kb < k / 32; ++kb)
      for (int q = 0; q < 4; ++q) {
        const int64_t rw = row * k + kb * 32 + q * 8, fw = fp8_fragment_piece(row, kb, q, k);
        if constexpr (kPack) std::memcpy(oc + fw, codes + rw, 8);
        else std::memcpy(oc + rw, codes + fw, 8);
      }
}

}  // namespace

Status unpack_weight_fragments(WeightFormat f, int64_t n, int64_t k, std::vector<uint8_t>& codes,
                               std::vector<uint8_t>& scales, const uint8_t*& w, const uint8_t*& ws) {
  if (f == WeightFormat::kFp4) {
    codes.resize(size_t(n * (k / 2))), scales.resize(size_t(n * (k / 32)));
    FS_RETURN_IF_ERROR(unpack_fp4_fragments(w, ws, n, k, codes.data(), scales.data()));
    w = codes.data(), ws = scales.data();
    return {};
  }
  codes.resize(size_t(n * k));
  FS_RETURN_IF_ERROR(unpack_fp8_fragments(w, n, k, codes.data()));
  w = codes.data();
  return {};
}

Status check_fp8_fragment_args(const char* op, const uint8_t* codes, int64_t n, int64_t k, const uint8_t* oc) {
  if (!codes || !oc) return invalid_argument("{}: codes and the output must be set", op);
  if (!fp8_fragment_shape_ok(n, k))
    return invalid_argument("{}: n={} must be a positive multiple of 32 and k={} of 32", op, n, k);
  const uintptr_t cb = uintptr_t(n * k);
  if (uintptr_t(codes) < uintptr_t(oc) + cb && uintptr_t(oc) < uintptr_t(codes) + cb)
    return invalid_argument("{}: the output overlaps the input", op);
  return {};
}

Status pack_fp8_fragments(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes) {
  FS_RETURN_IF_ERROR(check_fp8_fragment_args("pack_fp8_fragments", codes, n, k, out_codes));
  permute8<true>(codes, n, k, out_codes);
  return {};
}

Status unpack_fp8_fragments(const uint8_t* codes, int64_t n, int64_t k, uint8_t* out_codes) {
  FS_RETURN_IF_ERROR(check_fp8_fragment_args("unpack_fp8_fragments", codes, n, k, out_codes));
  permute8<false>(codes, n, k, out_codes);
  return {};
}

Status pack_fp4_fragments(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, uint8_t* out_codes,
                          uint8_t* out_scales) {
  FS_RETURN_IF_ERROR(check("pack_fp4_fragments", codes, scales, n, k, out_codes, out_scales));
  permute<true>(codes, scales, n, k, out_codes, out_scales);
  return {};
}

Status unpack_fp4_fragments(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k, uint8_t* out_codes,
                            uint8_t* out_scales) {
  FS_RETURN_IF_ERROR(check("unpack_fp4_fragments", codes, scales, n, k, out_codes, out_scales));
  permute<false>(codes, scales, n, k, out_codes, out_scales);
  return {};
}

}  // namespace flashseek::ops
