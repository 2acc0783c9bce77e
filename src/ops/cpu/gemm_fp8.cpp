// CPU twin of the large-M FP8 GEMM (ops/gemm_fp8.h): quantise (or dequantise the given codes),
// dequantise W, FP32 dot per output. Same numbers as block_linear_ref for FP32 inputs.
#include "ops/gemm_fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/numeric.h"
#include "core/thread_pool.h"
#include "ops/fp4_fragments.h"
#include "ops/linear.h"
#include "ops/quant.h"

namespace flashseek::ops {

Status gemm_fp8_ref(const GemmFp8Params& p) {
  FS_RETURN_IF_ERROR(validate(p));
  const size_t mk = static_cast<size_t>(p.m * p.k);
  std::vector<float> xq(mk);
  if (p.x) {
    if (p.x_dtype == ActDtype::kBf16) {
      const auto* xb = static_cast<const uint16_t*>(p.x);
      for (size_t i = 0; i < mk; ++i) xq[i] = bf16_to_f32(xb[i]);
    } else {
      const auto* xf = static_cast<const float*>(p.x);
      xq.assign(xf, xf + mk);
    }
    fp8_quant_dequant(xq.data(), p.m, p.k, p.act_block);
  } else if (p.x_f16 || p.x_bf16) {
    const auto* xh = reinterpret_cast<const uint16_t*>(p.xq);  // the codes' values, or the BF16 values
    const int64_t ld = p.x_stride ? p.x_stride : p.k;
    for (int64_t r = 0; r < p.m; ++r)
      for (int64_t i = 0; i < p.k; ++i)
        xq[size_t(r * p.k + i)] = p.x_bf16 ? bf16_to_f32(xh[r * ld + i])
                                           : f16_to_f32(xh[r * ld + i]) * p.xs[(r * ld + i) / 32];
  } else {
    for (size_t i = 0; i < mk; ++i) xq[i] = e4m3_to_f32(p.xq[i]) * p.xs[i / 32];
  }
  const int64_t kbw = p.k / p.w_block;
  // Output columns in parallel (each output is one dot of its own, so the thread count changes
  // no bit): the GPU tests check prefill-sized shapes against this twin.
  ThreadPool::global().parallel_for(p.n, [&](int64_t r0, int64_t r1) {
    std::vector<float> wrow(static_cast<size_t>(p.k));
    for (int64_t r = r0; r < r1; ++r) {
      if (p.w_bf16) {
        const auto* w16 = reinterpret_cast<const uint16_t*>(p.w) + r * p.k;
        for (int64_t i = 0; i < p.k; ++i) wrow[size_t(i)] = bf16_to_f32(w16[i]);
      } else {
        const uint8_t* s = p.w_scale + (r / p.w_block) * kbw;
        for (int64_t i = 0; i < p.k; ++i)
          wrow[size_t(i)] = e4m3_to_f32(p.w[r * p.k + i]) * e8m0_to_f32(s[i / p.w_block]);
      }
      for (int64_t t = 0; t < p.m; ++t) {
        const float v = dot_f32(xq.data() + t * p.k, wrow.data(), p.k);
        const int64_t ldy = p.y_stride ? p.y_stride : p.n;
        if (p.bf16_out)
          static_cast<uint16_t*>(p.y)[t * ldy + r] = f32_to_bf16(v);
        else
          static_cast<float*>(p.y)[t * ldy + r] = p.bf16_round_out ? round_bf16(v) : v;
      }
    }
  });
  return {};
}

void quantize_f16_blocks_ref(const float* x, int64_t m, int64_t k, uint16_t* xq, float* xs) {
  for (int64_t b = 0; b < m * k / 32; ++b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    float s = 1.0f;
    if (amax > 0.0f) {
      const float a = std::max(amax, std::ldexp(1.0f, -100));
      int e = 0;
      const float f = std::frexp(a, &e);  // a = f · 2^e, f in [0.5, 1): ceil(log2 a) = e, or e - 1 when f == 0.5
      s = std::ldexp(1.0f, (f == 0.5f ? e - 1 : e) - 15);
    }
    xs[b] = s;
    for (int64_t i = 0; i < 32; ++i) xq[b * 32 + i] = f32_to_f16(x[b * 32 + i] / s);
  }
}

Status gemm_fp8_grouped_ref(const GemmFp8GroupedParams& p) {
  FS_RETURN_IF_ERROR(validate(p));
  if (p.row_start[0] != 0 || p.row_start[p.groups] != p.rows)
    return invalid_argument("gemm_fp8_grouped: row_start[0]={} must be 0 and row_start[{}]={} the rows {}",
                            p.row_start[0], p.groups, p.row_start[p.groups], p.rows);
  for (int64_t g = 0; g < p.groups; ++g)
    if (p.row_start[g + 1] < p.row_start[g])
      return invalid_argument("gemm_fp8_grouped: row_start decreases at group {}", g);
  const int64_t kbw = p.k / p.w_block, nsb = (p.n + p.w_block - 1) / p.w_block;
  const size_t out_bytes = p.bf16_out ? 2 : 4;
  if (p.w_format == WeightFormat::kFp4 && !p.w_bf16) {
    // e2m1 codes · per-(row, 32-block) scale against the dequantised activations, FP32 dots (the
    // same sums as gemm_fp8_ref on the e4m3 copy: every e2m1 value is exact in e4m3).
    const int64_t kb = p.k / 32;
    std::vector<float> xq, wrow(static_cast<size_t>(p.k));
    for (int64_t g = 0; g < p.groups; ++g) {
      const int64_t r0 = p.row_start[g], r1 = p.row_start[g + 1];
      if (r1 == r0) continue;
      xq.resize(size_t((r1 - r0) * p.k));
      const auto* xh = reinterpret_cast<const uint16_t*>(p.xq);  // x_f16: the codes' values; x_bf16: the values
      for (int64_t i = 0; i < (r1 - r0) * p.k; ++i)
        xq[size_t(i)] = p.x_bf16 ? bf16_to_f32(xh[r0 * p.k + i])
                                 : (p.x_f16 ? f16_to_f32(xh[r0 * p.k + i]) : e4m3_to_f32(p.xq[r0 * p.k + i])) *
                                       p.xs[r0 * kb + i / 32];
      for (int64_t r = 0; r < p.n; ++r) {
        const int64_t row = g * p.n + r;
        const uint8_t* c = p.w + row * (p.k / 2);
        const uint8_t* s = p.w_scale + row * kb;
        for (int64_t i = 0; i < p.k; ++i) {
          // w_fragments: byte (i % 8) / 2 of code word (i % 32) / 8 of block i / 32 (ops/fp4_fragments.h).
          const uint8_t byte = p.w_fragments ? p.w[fp4_fragment_word(row, i / 32, int(i % 32) / 8, p.k) + (i % 8) / 2]
                                             : c[i / 2];
          const uint8_t sc = p.w_fragments ? p.w_scale[fp4_fragment_scale(row, i / 32, p.k)] : s[i / 32];
          wrow[size_t(i)] = e2m1_to_f32(uint8_t((byte >> (4 * (i & 1))) & 15)) * e8m0_to_f32(sc);
        }
        for (int64_t t = r0; t < r1; ++t) {
          const float v = dot_f32(xq.data() + (t - r0) * p.k, wrow.data(), p.k);
          if (p.bf16_out)
            static_cast<uint16_t*>(p.y)[t * p.n + r] = f32_to_bf16(v);
          else
            static_cast<float*>(p.y)[t * p.n + r] = p.bf16_round_out ? round_bf16(v) : v;
        }
      }
    }
    return {};
  }
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t r0 = p.row_start[g], r1 = p.row_start[g + 1];
    if (r1 == r0) continue;
    GemmFp8Params q;
    if (p.w_bf16) {
      q.w = p.w + g * p.n * p.k * 2, q.w_bf16 = true;
    } else {
      q.w = p.w + g * p.n * p.k, q.w_scale = p.w_scale + g * nsb * kbw;
    }
    q.xq = p.xq + r0 * p.k * (p.x_f16 || p.x_bf16 ? 2 : 1), q.x_f16 = p.x_f16, q.x_bf16 = p.x_bf16;
    q.xs = p.x_bf16 ? nullptr : p.xs + r0 * (p.k / 32);
    q.y = static_cast<uint8_t*>(p.y) + size_t(r0 * p.n) * out_bytes;
    q.bf16_out = p.bf16_out, q.bf16_round_out = p.bf16_round_out, q.m = r1 - r0, q.n = p.n, q.k = p.k, q.w_block = p.w_block;
    FS_RETURN_IF_ERROR(gemm_fp8_ref(q));
  }
  return {};
}

Status gemm_expand_bf16_ref(const GemmExpandBf16Params& p) {
  FS_RETURN_IF_ERROR(validate(p));
  if (p.row_start)
    for (int64_t e = 0; e < p.count; ++e)
      if (p.row_start[e + 1] < p.row_start[e])
        return invalid_argument("gemm_expand_bf16: row_start decreases at matrix {}", e);
  const bool fp4 = p.w_format == WeightFormat::kFp4;
  const int64_t nsb = (p.n + p.w_block - 1) / p.w_block, kbw = p.k / p.w_block;
  for (int64_t e = 0; e < p.count; ++e) {
    if (p.row_start && p.row_start[e + 1] <= p.row_start[e]) continue;
    for (int64_t r = 0; r < p.n; ++r) {
      const int64_t row = e * p.n + r;
      uint16_t* y = p.y + row * p.k;
      for (int64_t i = 0; i < p.k; ++i) {
        float v, s;
        if (fp4) {
          // Byte i/2 of the row: row-major, or byte (i % 8) / 2 of word (i % 32) / 8 of block i / 32.
          const int64_t at = p.w_fragments ? fp4_fragment_word(row, i / 32, int(i % 32) / 8, p.k) + (i % 8) / 2
                                           : row * (p.k / 2) + i / 2;
          v = e2m1_to_f32(uint8_t((p.w[at] >> (4 * (i & 1))) & 15));
          s = e8m0_to_f32(p.w_scale[p.w_fragments ? fp4_fragment_scale(row, i / 32, p.k) : row * (p.k / 32) + i / 32]);
        } else {
          v = e4m3_to_f32(p.w[row * p.k + i]);
          s = e8m0_to_f32(p.w_scale[(e * nsb + r / p.w_block) * kbw + i / p.w_block]);
        }
        y[i] = f32_to_bf16(v * s);
      }
    }
  }
  return {};
}

Result<int64_t> repack_fp4_to_fp8_128(const uint8_t* w4, const uint8_t* s32, int64_t n, int64_t k, uint8_t* w8,
                                      uint8_t* s128) {
  if (!w4 || !s32 || !w8 || !s128) return invalid_argument("repack_fp4_to_fp8_128: w4, s32, w8 and s128 must be set");
  if (n <= 0 || k <= 0 || k % 128 != 0)
    return invalid_argument("repack_fp4_to_fp8_128: n={} must be positive, k={} a positive multiple of 128", n, k);
  if (n >= (int64_t(1) << 30) || k >= (int64_t(1) << 30) || n > (int64_t(1) << 40) / k)
    return out_of_range("repack_fp4_to_fp8_128: n={}, k={} too large", n, k);
  const int64_t kg = k / 32, kb = k / 128;
  int64_t inexact = 0;
  for (int64_t rb = 0; rb * 128 < n; ++rb) {
    const int64_t r0 = rb * 128, r1 = std::min(n, r0 + 128);
    for (int64_t b = 0; b < kb; ++b) {
      int e_max = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t g = 4 * b; g < 4 * b + 4; ++g)
          if (s32[r * kg + g] != 0xFF) e_max = std::max(e_max, int(s32[r * kg + g]));
      const int e = std::max(e_max - 6, 0);
      s128[rb * kb + b] = uint8_t(e);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t i = 128 * b; i < 128 * b + 128; ++i) {
          const uint8_t sg = s32[r * kg + i / 32];
          const uint8_t nib = uint8_t((w4[r * (k / 2) + i / 2] >> (4 * (i & 1))) & 15);
          if (sg == 0xFF) {
            w8[r * k + i] = 0x7F;  // e4m3 NaN
            ++inexact;
            continue;
          }
          const float v = std::ldexp(e2m1_to_f32(nib), int(sg) - e);  // e2m1 · 2^(s − E): |v| <= 384
          const uint8_t code = f32_to_e4m3(v);
          w8[r * k + i] = code;
          if (e4m3_to_f32(code) != v) ++inexact;
        }
    }
  }
  return inexact;
}

}  // namespace flashseek::ops
