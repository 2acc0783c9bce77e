// Per-row arithmetic of the RMS norm, RoPE and FP8 simulation kernels, shared with the decode
// GEMV's row epilogue (ops/cuda/gemv/gemv.cu), which applies the same ops to a linear's output in
// the linear's own launch: one set of expressions, so the fused launch and the standalone kernels
// give the same bits by construction. Only included from .cu files.
#pragma once
#include <cstdint>

#include "ops/cuda/model/model_device.cuh"

namespace flashseek::ops::cuda::detail {

// The stride-doubling chunk tree of sum_order.h (c[i] += c[i + st] for i = 0, 2st, 4st.. with
// i + st < m) over lanes: lane c holds chunk sum c (m <= 32), lane 0 returns the root. Each lane
// that adds holds c[i] and receives c[i + st], so every addition is the serial tree's.
template <typename Acc>
__device__ __forceinline__ Acc warp_chunk_tree(Acc v, int m) {
  const int lane = int(threadIdx.x & 31);
  for (int st = 1; st < m; st *= 2) {
    const Acc o = __shfl_down_sync(0xffffffffu, v, unsigned(st));
    if ((lane & (2 * st - 1)) == 0 && lane + st < m) v = v + o;
  }
  return v;
}

// RMS norm, one warp per chunk of kSumChunk values of a row: lane l holds values 128i + 4l + q
// (i < 8, q < 4) of the chunk in xv[4i + q] (len: the chunk's values, the rest ignored). Returns
// the chunk's double sum of squares in the sum_order.h order (four partials per lane, then the
// lanes' halving tree), on every lane. All 32 lanes call it; a lane of a warp without a row
// passes live = false and contributes 0.
__device__ __forceinline__ double dev_norm_chunk_sumsq(const float (&xv)[32], int64_t len, bool live) {
  const int lane = int(threadIdx.x & 31);
  double p[4] = {0, 0, 0, 0};
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (live && 128 * i + 4 * lane + q < len)
        p[q] = __dadd_rn(p[q], __dmul_rn(double(xv[4 * i + q]), double(xv[4 * i + q])));
  double v = __dadd_rn(__dadd_rn(p[0], p[1]), __dadd_rn(p[2], p[3]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// 1 / rms of a row of `dim` values whose squares sum to ss.
__device__ __forceinline__ float dev_norm_inv_rms(double ss, int64_t dim, float eps) {
  return 1.0f / sqrtf(__fadd_rn(float(ss / double(dim)), eps));
}
// One normalised value: x · ri (· w when weighted), BF16-rounded when bf16.
__device__ __forceinline__ float dev_norm_value(float x, float ri, const float* w, float wv, bool bf16) {
  float t = __fmul_rn(x, ri);
  if (w) t = __fmul_rn(t, wv);
  return bf16 ? dev_round_bf16(t) : t;
}

// RoPE (ops::apply_rope): cos / sin of position p at inverse frequency f, taken in double and
// rounded to FP32 (sin negated for the inverse rotation), and the rotation of one pair (a, b)
// with unfused products.
__device__ __forceinline__ void dev_rope_trig(float p, float inv_freq, bool inverse, float& cs, float& sn) {
  const float ang = __fmul_rn(p, inv_freq);
  const float s = float(sin(double(ang)));
  cs = float(cos(double(ang)));
  sn = inverse ? -s : s;
}
__device__ __forceinline__ void dev_rope_rotate(float& a, float& b, float cs, float sn, bool bf16) {
  float ra = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
  float rb = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
  if (bf16) ra = dev_round_bf16(ra), rb = dev_round_bf16(rb);
  a = ra, b = rb;
}

// quant_sim kFp8 (ops/quant.h): a block's power-of-two scale from its |max|, and one value's
// simulated e4m3 code times that scale.
__device__ __forceinline__ float dev_qsim_fp8_scale(float amax) { return dev_pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f); }
__device__ __forceinline__ float dev_qsim_fp8(float v, float sc) {
  return dev_round_e4m3(fminf(fmaxf(v / sc, -448.0f), 448.0f)) * sc;
}

}  // namespace flashseek::ops::cuda::detail
