// CPU twins of the block-scaled linears (ops/linear_quant.h): the straightforward dequantise +
// FP32 dot that the CUDA kernels are compared against.
#include "ops/linear_quant.h"

#include <vector>

#include "core/numeric.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/quant.h"

namespace flashseek::ops {

namespace {
// Dequantised row `r` of an [n, k] weight in either format.
void dequant_row(const BlockLinearParams& p, int64_t r, float* out) {
  if (p.format == WeightFormat::kFp8) {
    const int64_t kb = p.k / p.w_block;
    const uint8_t* s = p.w_scale + (r / p.w_block) * kb;
    for (int64_t i = 0; i < p.k; ++i) out[i] = e4m3_to_f32(p.w[r * p.k + i]) * e8m0_to_f32(s[i / p.w_block]);
  } else {
    const uint8_t* codes = p.w + r * (p.k / 2);
    const uint8_t* s = p.w_scale + r * (p.k / 32);
    for (int64_t i = 0; i < p.k; ++i) {
      const uint8_t byte = codes[i / 2];
      const uint8_t nib = (i % 2 == 0) ? (byte & 0xf) : (byte >> 4);
      out[i] = e2m1_to_f32(nib) * e8m0_to_f32(s[i / 32]);
    }
  }
}
}  // namespace

Status block_linear_ref(const BlockLinearParams& p) {
  FS_RETURN_IF_ERROR(validate(p));
  if (p.w_packed) {  // the fragment order holds the same matrices: the twin reads them row-major
    BlockLinearParams q = p;
    q.w_packed = false;
    std::vector<uint8_t> c, s, cu, su;
    FS_RETURN_IF_ERROR(unpack_weight_fragments(p.format, p.n, p.k, c, s, q.w, q.w_scale));
    if (p.w_up) FS_RETURN_IF_ERROR(unpack_weight_fragments(p.format, p.n, p.k, cu, su, q.w_up, q.w_up_scale));
    return block_linear_ref(q);
  }
  std::vector<float> xq(p.x, p.x + p.m * p.k);
  if (p.bf16_in)
    for (float& v : xq) v = round_bf16(v);
  fp8_quant_dequant(xq.data(), p.m, p.k, p.act_block);
  std::vector<float> wrow(static_cast<size_t>(p.k)), urow(p.w_up ? static_cast<size_t>(p.k) : 0);
  BlockLinearParams up = p;
  up.w = p.w_up, up.w_scale = p.w_up_scale;
  for (int64_t r = 0; r < p.n; ++r) {
    dequant_row(p, r, wrow.data());
    if (p.w_up) dequant_row(up, r, urow.data());
    for (int64_t t = 0; t < p.m; ++t) {
      float v = dot_f32(xq.data() + t * p.k, wrow.data(), p.k);
      if (p.w_up) {  // gated: the model's swiglu of the (rounded) gate and up sums
        float u = dot_f32(xq.data() + t * p.k, urow.data(), p.k);
        if (p.bf16_round_gate_up) v = round_bf16(v), u = round_bf16(u);
        float h = 0;
        swiglu(&v, &u, &h, 1, p.swiglu_limit, 1.0f);
        v = h;
      }
      // Rows [0, n - n2) to y, the rest to y2 (stacked matrices), each with its own row stride.
      const int64_t n1 = p.n - p.n2;
      void* y = r < n1 ? p.y : p.y2;
      const int64_t at = r < n1 ? t * n1 + r : t * p.n2 + (r - n1);
      if (p.bf16_out) static_cast<uint16_t*>(y)[at] = f32_to_bf16(v);
      else static_cast<float*>(y)[at] = p.bf16_round_out ? round_bf16(v) : v;
    }
  }
  return {};
}

}  // namespace flashseek::ops
