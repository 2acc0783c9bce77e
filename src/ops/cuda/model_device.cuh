// Device twins of core/numeric.h and ops/quant.h scalar helpers (same rounding rules), shared by
// the model kernels. Only included from .cu files.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace flashseek::ops::cuda::detail {

__device__ __forceinline__ float dev_round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// core/numeric.h round_e4m3: RNE to e4m3, saturating at ±448.
__device__ __forceinline__ float dev_round_e4m3(float x) {
  if (isnan(x)) return x;
  const float a = fabsf(x);
  float r;
  if (a >= 448.0f) {
    r = 448.0f;
  } else if (a < 0.015625f) {
    r = rintf(a * 512.0f) / 512.0f;
  } else {
    uint32_t u = __float_as_uint(a);
    u += 0x7ffffu + ((u >> 20) & 1u);
    u &= ~0xfffffu;
    r = __uint_as_float(u);
    if (r > 448.0f) r = 448.0f;
  }
  return signbit(x) ? -r : r;
}

// core/numeric.h round_e2m1: nearest e2m1 value, ties to the even code, saturating at ±6.
__device__ __forceinline__ float dev_round_e2m1(float x) {
  const float vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = fabsf(x);
  int best = 7;
  if (!(a >= 6.0f)) {
    for (int c = 0; c < 7; ++c) {
      const float lo = vals[c], hi = vals[c + 1];
      if (a <= hi) {
        const float dlo = a - lo, dhi = hi - a;
        best = dlo < dhi ? c : dhi < dlo ? c + 1 : (c % 2 == 0 ? c : c + 1);
        break;
      }
    }
  }
  if (isnan(x)) best = 0;
  return signbit(x) ? -vals[best] : vals[best];
}

// ops::pow2_ceil: the smallest power of two >= v (v > 0).
__device__ __forceinline__ float dev_pow2_ceil(float v) {
  int e;
  const float m = frexpf(v, &e);
  return m == 0.5f ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
}

// exp/log1p through double: correctly rounded to FP32 in practice, like the CPU's libm (the FP32
// intrinsics are off by up to 2 ulp, which flips BF16/FP8 rounding points downstream).
__device__ __forceinline__ float dev_exp(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float dev_log1p(float x) { return float(log1p(double(x))); }
// a·b + c without FMA contraction (the CPU backend is built with -ffp-contract=off).
__device__ __forceinline__ float mul_add(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

// ops::dot_f32 bit for bit: eight interleaved partial sums combined in the same fixed tree.
__device__ __forceinline__ float dev_dot_f32(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = mul_add(a[i + j], b[i + j], s[j]);
  for (int j = 0; i < n; ++i, ++j) s[j] = mul_add(a[i], b[i], s[j]);
  return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[4]), __fadd_rn(s[2], s[6])),
                   __fadd_rn(__fadd_rn(s[1], s[5]), __fadd_rn(s[3], s[7])));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace flashseek::ops::cuda::detail
