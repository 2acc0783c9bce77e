// Host pack / unpack between the row-major FP4 layout and the GEMV fragment order
// (ops/fp4_fragments.h). A permutation of 4-byte code words and of scale bytes, so each direction
// is one pass of copies.
#include <cstring>

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
}  // namespace

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
