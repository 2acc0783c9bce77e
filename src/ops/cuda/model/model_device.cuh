// Device twins of core/numeric.h and ops/quant.h scalar helpers (same rounding rules), shared by
// the model kernels. Only included from .cu files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace flashseek::ops::cuda::detail {

// Two floats as a BF16 pair (RNE), lo in the low half: one register of a BF16 MMA fragment.
__device__ __forceinline__ uint32_t dev_pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c += a · b by one m16n8k16 BF16 MMA with FP32 accumulation (a: 4 registers of the row-major
// 16x16 A fragment, b: 2 of the column-major 16x8 B fragment, c: the 16x8 FP32 D fragment).
__device__ __forceinline__ void dev_mma_bf16_16816(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float dev_round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// ops::apply_rope's angle of position p at one frequency: cos and sin taken in double and rounded
// to FP32 (sn negated for the inverse rotation).
__device__ __forceinline__ void dev_rope_trig(float p, float inv_freq, bool inverse, float& cs, float& sn) {
  const float ang = __fmul_rn(p, inv_freq);
  const float s = float(sin(double(ang)));
  cs = float(cos(double(ang)));
  sn = inverse ? -s : s;
}

// ops::apply_rope's rotation of the pair (a, b) by (cs, sn): unfused products and sums, as the CPU
// (built with -ffp-contract=off) computes them; both rounded to BF16 when bf16.
__device__ __forceinline__ void dev_rope_pair(float& a, float& b, float cs, float sn, bool bf16) {
  float ra = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
  float rb = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
  if (bf16) ra = dev_round_bf16(ra), rb = dev_round_bf16(rb);
  a = ra, b = rb;
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

// Code values: core/numeric.h e4m3_to_f32 (S.1111.111 is NaN), e8m0_to_f32 (2^(e−127); e = 0 the
// FP32 denormal 2^-127, never flushed; 0xFF NaN), e2m1_to_f32 (bit 3: sign).
__device__ __forceinline__ float dev_e4m3_value(uint32_t b) {
  const uint32_t exp = (b >> 3) & 0xfu, man = b & 7u;
  if (exp == 15u && man == 7u) return __uint_as_float(0x7fc00000u);
  const float v = exp == 0 ? float(man) * 0.001953125f : __uint_as_float(((exp + 120u) << 23) | (man << 20));
  return (b & 0x80u) ? -v : v;
}
__device__ __forceinline__ float dev_e8m0_value(uint32_t e) {
  if (e == 0xffu) return __uint_as_float(0x7fc00000u);
  return e == 0 ? __uint_as_float(0x00400000u) : __uint_as_float(e << 23);
}
__device__ __forceinline__ float dev_e2m1_value(uint32_t nib) {
  constexpr float kVals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kVals[nib & 7u];
  return (nib & 8u) ? -v : v;
}

// core/numeric.h f32_to_e2m1: the nearest e2m1 code, ties to the even code, saturating at ±6,
// sign in bit 3 (NaN: +0 with its sign bit).
__device__ __forceinline__ uint32_t dev_e2m1_code(float x) {
  const float vals[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float a = fabsf(x);
  uint32_t best = 7;
  if (!(a >= 6.0f)) {
    for (uint32_t c = 0; c < 7; ++c) {
      const float lo = vals[c], hi = vals[c + 1];
      if (a <= hi) {
        const float dlo = a - lo, dhi = hi - a;
        best = dlo < dhi ? c : dhi < dlo ? c + 1 : (c % 2 == 0 ? c : c + 1);
        break;
      }
    }
  }
  if (isnan(x)) best = 0;
  return signbit(x) ? (best | 8u) : best;
}

// core/numeric.h round_e2m1: the value of that code.
__device__ __forceinline__ float dev_round_e2m1(float x) { return dev_e2m1_value(dev_e2m1_code(x)); }

// ops::pow2_ceil: the smallest power of two >= v (v > 0).
__device__ __forceinline__ float dev_pow2_ceil(float v) {
  int e;
  const float m = frexpf(v, &e);
  return m == 0.5f ? ldexpf(1.0f, e - 1) : ldexpf(1.0f, e);
}

// FP8 activation blocks (v41 §1.4), with the layout the GEMVs and GEMMs use: a lane holds 8
// consecutive values, a quad of lanes one 32-block. The shared arithmetic of the GEMV's in-kernel
// quantisation, gemv_quantize, gemm_fp8_quantize and the fused SwiGLU quantisation, so that their
// codes are the same bits.
// The block's |max| over the quad (act_block 128: over 4 quads, 16 lanes).
__device__ __forceinline__ float dev_fp8_block_amax(const float (&v)[8], int act_block) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(v[i]));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
  if (act_block == 128) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
  }
  return m;
}
// The block's scale 2^ceil(log2(max(amax, 1e-4) / 448)): the float rounded up to a power of two
// by its bits.
__device__ __forceinline__ float dev_fp8_block_scale(float amax) {
  uint32_t u = __float_as_uint(fmaxf(amax, 1e-4f) / 448.0f);
  if (u & 0x7fffffu) u = (u & 0x7f800000u) + 0x00800000u;
  return __uint_as_float(u);
}
// The lane's 8 values times inv (1 / scale, exact: a power of two) as saturating e4m3 codes,
// value 0 in the lowest byte.
__device__ __forceinline__ uint2 dev_fp8_pack8(const float (&v)[8], float inv) {
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    packed[i] = __nv_cvt_float2_to_fp8x2(make_float2(v[2 * i] * inv, v[2 * i + 1] * inv), __NV_SATFINITE, __NV_E4M3);
  return make_uint2(packed[0] | (packed[1] << 16), packed[2] | (packed[3] << 16));
}

// exp/log1p through double: correctly rounded to FP32 in practice, like the CPU's libm (the FP32
// intrinsics are off by up to 2 ulp, which flips BF16/FP8 rounding points downstream).
__device__ __forceinline__ float dev_exp(float x) { return float(exp(double(x))); }
__device__ __forceinline__ float dev_log1p(float x) { return float(log1p(double(x))); }
// a·b + c without FMA contraction (the CPU backend is built with -ffp-contract=off).
__device__ __forceinline__ float mul_add(float a, float b, float c) { return __fadd_rn(__fmul_rn(a, b), c); }

// The fixed summation orders of ops/cpu/sum_order.h (read it first): n <= kSumChunk keeps the
// short orders, longer sums go by 1024-element chunks (128 partials, a 32-lane halving tree) whose
// sums are combined by stride doubling.
constexpr int64_t kSumChunk = 1024;

// Stride-doubling tree over c[0, m) (in place), one thread.
template <typename Acc>
__device__ __forceinline__ Acc dev_chunk_tree(Acc* c, int64_t m) {
  for (int64_t st = 1; st < m; st *= 2)
    for (int64_t i = 0; i + st < m; i += 2 * st) c[i] = c[i] + c[i + st];
  return c[0];
}

// The dots below read their second operand through a loader: b(i) is value i, b.load4(i, v)
// values i .. i+3 (i % 4 == 0), the same values (an FP32 row, or a compact cache row decoded on
// load: ops/cuda/cache/cache_row.cuh). Every product and sum is the same whatever the loader.
struct F32Loader {
  const float* p;
  __device__ __forceinline__ float operator()(int64_t i) const { return p[i]; }
  __device__ __forceinline__ void load4(int64_t i, float v[4]) const {
#pragma unroll
    for (int c = 0; c < 4; ++c) v[c] = p[i + c];
  }
};

// One chunk [o, o + len) (len <= kSumChunk) of the chunked dot by one thread: lane l's four
// partials, then the 32-lane halving tree.
template <typename Load>
__device__ __forceinline__ float dev_dot_chunk_serial_ld(const float* a, const Load& b, int64_t o, int64_t len) {
  float v[32];
  for (int l = 0; l < 32; ++l) {
    float p[4] = {0, 0, 0, 0};
    for (int64_t i = 4 * l; i < len; i += 128) {
      if (i + 3 < len && (o + i) % 4 == 0) {  // four values of one load, same products and sums
        float w[4];
        b.load4(o + i, w);
#pragma unroll
        for (int c = 0; c < 4; ++c) p[c] = mul_add(a[o + i + c], w[c], p[c]);
      } else {
        for (int c = 0; c < 4 && i + c < len; ++c) p[c] = mul_add(a[o + i + c], b(o + i + c), p[c]);
      }
    }
    v[l] = __fadd_rn(__fadd_rn(p[0], p[1]), __fadd_rn(p[2], p[3]));
  }
  for (int off = 16; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) v[l] = __fadd_rn(v[l], v[l + off]);
  return v[0];
}

// ops::dot_f32 bit for bit, one thread: eight interleaved partial sums combined in the same fixed
// tree; n > kSumChunk: the chunked order, chunk sums folded on a stack of complete subtrees
// (the same additions as the stride-doubling tree: complete 2^L blocks merge left + right, the
// ragged right edge folds right to left).
template <typename Load>
__device__ __forceinline__ float dev_dot_f32_ld(const float* a, const Load& b, int64_t n) {
  if (n > kSumChunk) {
    float val[48];
    int64_t size[48];
    int top = 0;
    for (int64_t o = 0; o < n; o += kSumChunk) {
      float v = dev_dot_chunk_serial_ld(a, b, o, n - o < kSumChunk ? n - o : kSumChunk);
      int64_t sz = 1;
      while (top > 0 && size[top - 1] == sz) v = __fadd_rn(val[--top], v), sz *= 2;
      val[top] = v, size[top++] = sz;
    }
    float acc = val[--top];
    while (top > 0) acc = __fadd_rn(val[--top], acc);
    return acc;
  }
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    float w[8];
    b.load4(i, w);
    b.load4(i + 4, w + 4);
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j] = mul_add(a[i + j], w[j], s[j]);
  }
  for (int j = 0; i < n; ++i, ++j) s[j] = mul_add(a[i], b(i), s[j]);
  return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[4]), __fadd_rn(s[2], s[6])),
                   __fadd_rn(__fadd_rn(s[1], s[5]), __fadd_rn(s[3], s[7])));
}

__device__ __forceinline__ float dev_dot_f32(const float* a, const float* b, int64_t n) {
  return dev_dot_f32_ld(a, F32Loader{b}, n);
}

// A chunk dot's end: the lane's partials (p0 + p1) + (p2 + p3), then the xor butterfly (every
// lane returns the chunk sum).
__device__ __forceinline__ float warp_fold_partials(float p0, float p1, float p2, float p3) {
  float v = __fadd_rn(__fadd_rn(p0, p1), __fadd_rn(p2, p3));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One whole chunk's dot from values the lanes hold: lane l's av[i] / bv[i] are values 128i + 4l ..
// 128i + 4l + 3 (warp_dot_chunk's order).
__device__ __forceinline__ float warp_dot_chunk_f4(const float4 (&av)[8], const float4 (&bv)[8]) {
  float p0 = 0, p1 = 0, p2 = 0, p3 = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    p0 = mul_add(av[i].x, bv[i].x, p0), p1 = mul_add(av[i].y, bv[i].y, p1);
    p2 = mul_add(av[i].z, bv[i].z, p2), p3 = mul_add(av[i].w, bv[i].w, p3);
  }
  return warp_fold_partials(p0, p1, p2, p3);
}

// One chunk of the chunked dot by a whole warp (every lane returns the chunk sum): lane l holds
// partials 4l..4l+3 (16-byte loads when a and b are 16-byte aligned), then the xor butterfly.
// Plain loads for both: either operand may be step-written (x is a in linear_chunked_kernel, b in
// hc_mixes_kernel), and ld.global.nc can read stale values under PDL (runtime/pdl.cuh).
__device__ __forceinline__ float warp_dot_chunk(const float* a, const float* b, int64_t len) {
  const int lane = int(threadIdx.x & 31);
  if (len == kSumChunk && ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15) == 0) {
    float4 av[8], bv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      av[i] = *reinterpret_cast<const float4*>(a + 128 * i + 4 * lane);
      bv[i] = *reinterpret_cast<const float4*>(b + 128 * i + 4 * lane);
    }
    return warp_dot_chunk_f4(av, bv);
  }
  float p0 = 0, p1 = 0, p2 = 0, p3 = 0;
  for (int64_t i = 4 * lane; i < len; i += 128) {
    p0 = mul_add(a[i], b[i], p0);
    if (i + 1 < len) p1 = mul_add(a[i + 1], b[i + 1], p1);
    if (i + 2 < len) p2 = mul_add(a[i + 2], b[i + 2], p2);
    if (i + 3 < len) p3 = mul_add(a[i + 3], b[i + 3], p3);
  }
  return warp_fold_partials(p0, p1, p2, p3);
}

// The same for the double sum of squares of one chunk (x is step-written: plain loads).
__device__ __forceinline__ double warp_sumsq_chunk(const float* x, int64_t len) {
  const int lane = int(threadIdx.x & 31);
  double p0 = 0, p1 = 0, p2 = 0, p3 = 0;
  auto sq = [](float v) { return __dmul_rn(double(v), double(v)); };
  if (len == kSumChunk && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
    float4 xv[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) xv[i] = *reinterpret_cast<const float4*>(x + 128 * i + 4 * lane);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      p0 = __dadd_rn(p0, sq(xv[i].x)), p1 = __dadd_rn(p1, sq(xv[i].y));
      p2 = __dadd_rn(p2, sq(xv[i].z)), p3 = __dadd_rn(p3, sq(xv[i].w));
    }
  } else {
    for (int64_t i = 4 * lane; i < len; i += 128) {
      p0 = __dadd_rn(p0, sq(x[i]));
      if (i + 1 < len) p1 = __dadd_rn(p1, sq(x[i + 1]));
      if (i + 2 < len) p2 = __dadd_rn(p2, sq(x[i + 2]));
      if (i + 3 < len) p3 = __dadd_rn(p3, sq(x[i + 3]));
    }
  }
  double v = __dadd_rn(__dadd_rn(p0, p1), __dadd_rn(p2, p3));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The short dot order by 8 consecutive lanes of a warp (lane j of the group sums elements
// i % 8 == j); every lane of the group returns the result. All 32 lanes must call it.
__device__ __forceinline__ float group8_dot(const float* a, const float* b, int64_t n) {
  const int j = int(threadIdx.x & 7);
  float s = 0;
  for (int64_t i = j; i < n; i += 8) s = mul_add(a[i], b[i], s);
  s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 4));
  s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
  s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace flashseek::ops::cuda::detail
