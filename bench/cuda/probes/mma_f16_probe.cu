// A probe of the FP4 decode GEMV's operand path (issue 16). On sm_90a the e4m3 MMA the GEMVs issue
// (mma.sync.m16n8k32.e4m3.e4m3.f32) is not a native instruction: ptxas unpacks both operands to
// f16 (F2FP.F16.E4M3.UNPACK_B, a conversion) and issues two HMMA.16816.F32. The FP4 weights are
// first expanded to e4m3 (fp4x8_to_e4m3x8), so every FP4 value passes through two formats. This
// probe asks two questions before the kernel changes:
//  1. Bits: which arrangement of f16 operands into two m16n8k16 MMAs (each candidate: the e4m3
//     registers unpacked by cvt.rn.f16x2.e4m3x2, the same values) gives the e4m3 MMA's result bit
//     for bit, over random FP4 x e4m3 tiles (the full e4m3 range: the MMA's alignment and
//     truncation are exercised) and narrow-range tiles with cancellation. And is the direct FP4 ->
//     f16x2 expansion (fp4x8_to_f16x8: a table prmt of the f16 high bytes, prmt-interleaved with
//     zero low bytes) the unpacked e4m3 expansion bit for bit, over every nibble value?
//  2. Cost: cycles of the gated FP4 GEMV's inner body (2 matrices x 2 row tiles x 2 blocks, the
//     scale products) on register-resident weights, through e4m3 + the e4m3 MMA against the direct
//     f16 path, at the kernels' 16 warps per SM.
// Build: part of the CUDA build (bench/cuda/CMakeLists.txt); run on the GPU box with no arguments.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench/cuda/probes/probe_util.h"
#include "ops/cuda/gemv/fp4_expand.cuh"

namespace {

using flashseek::ops::cuda::detail::fp4x8_to_e4m3x8;  // the GEMV's expansion
using flashseek::ops::cuda::detail::prmt;

// The same eight values as f16: each e2m1 value's f16 has a zero low byte, so a table prmt of the
// high bytes (0, 0.5, 1, 1.5, 2, 3, 4, 6) with the sign ORed in gives four high bytes, and two
// prmts against zero spread them into f16x2 pairs: r[0] = (e0, e1), r[1] = (e2, e3), r[2] =
// (e4, e5), r[3] = (e6, e7) — the order in which cvt.rn.f16x2.e4m3x2 unpacks the e4m3 bytes.
__device__ __forceinline__ void fp4x8_to_f16x8(uint32_t v, uint32_t (&r)[4]) {
  const uint32_t m = v & 0x77777777u, a = v << 4;
  const uint32_t lo = prmt(0x3E3C3800u, 0x46444240u, m) | (prmt(a, v, 0xD9C8u) & 0x80808080u);
  const uint32_t hi = prmt(0x3E3C3800u, 0x46444240u, m >> 16) | (prmt(a, v, 0xFBEAu) & 0x80808080u);
  r[0] = prmt(lo, 0u, 0x1404u), r[1] = prmt(lo, 0u, 0x3424u);
  r[2] = prmt(hi, 0u, 0x1404u), r[3] = prmt(hi, 0u, 0x3424u);
}

// Two e4m3 bytes (the low 16 bits of x) -> f16x2, low byte in the low half.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t d;
  asm("{\n .reg .b16 t;\n cvt.u16.u32 t, %1;\n cvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(d) : "r"(x));
  return d;
}
__device__ __forceinline__ uint32_t lo16(uint32_t x) { return e4m3x2_to_f16x2(x & 0xFFFFu); }
__device__ __forceinline__ uint32_t hi16(uint32_t x) { return e4m3x2_to_f16x2(x >> 16); }

__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// d = A·B + c, m16n8k16, f16 operands, f32 accumulation.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1, const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

constexpr int kCands = 6;
const char* const kCandNames[kCands] = {
    "A: k16 halves {lo a0, lo a1, hi a0, hi a1}, then a2/a3 (chained)",
    "B: pairs {lo a0, lo a1, lo a2, lo a3}, then hi (chained)",
    "C: as A, a2/a3 half first (chained)",
    "D: as B, hi first (chained)",
    "E: as A, the halves summed apart, then added in f32",
    "F: as A with the two pairs of each register swapped (hi before lo)",
};

// Candidate c of the f16 form of one m16n8k32 e4m3 MMA (a: the e4m3 A fragment, b0/b1: B).
__device__ __forceinline__ void cand_mma(int c, float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const float z[4] = {0, 0, 0, 0};
  float t[4];
  switch (c) {
    case 0:
      mma_f16(t, lo16(a[0]), lo16(a[1]), hi16(a[0]), hi16(a[1]), lo16(b0), hi16(b0), z);
      mma_f16(d, lo16(a[2]), lo16(a[3]), hi16(a[2]), hi16(a[3]), lo16(b1), hi16(b1), t);
      break;
    case 1:
      mma_f16(t, lo16(a[0]), lo16(a[1]), lo16(a[2]), lo16(a[3]), lo16(b0), lo16(b1), z);
      mma_f16(d, hi16(a[0]), hi16(a[1]), hi16(a[2]), hi16(a[3]), hi16(b0), hi16(b1), t);
      break;
    case 2:
      mma_f16(t, lo16(a[2]), lo16(a[3]), hi16(a[2]), hi16(a[3]), lo16(b1), hi16(b1), z);
      mma_f16(d, lo16(a[0]), lo16(a[1]), hi16(a[0]), hi16(a[1]), lo16(b0), hi16(b0), t);
      break;
    case 3:
      mma_f16(t, hi16(a[0]), hi16(a[1]), hi16(a[2]), hi16(a[3]), hi16(b0), hi16(b1), z);
      mma_f16(d, lo16(a[0]), lo16(a[1]), lo16(a[2]), lo16(a[3]), lo16(b0), lo16(b1), t);
      break;
    case 4: {
      float u[4];
      mma_f16(t, lo16(a[0]), lo16(a[1]), hi16(a[0]), hi16(a[1]), lo16(b0), hi16(b0), z);
      mma_f16(u, lo16(a[2]), lo16(a[3]), hi16(a[2]), hi16(a[3]), lo16(b1), hi16(b1), z);
      for (int i = 0; i < 4; ++i) d[i] = t[i] + u[i];
      break;
    }
    default:
      mma_f16(t, hi16(a[0]), hi16(a[1]), lo16(a[0]), lo16(a[1]), hi16(b0), lo16(b0), z);
      mma_f16(d, hi16(a[2]), hi16(a[3]), lo16(a[2]), lo16(a[3]), hi16(b1), lo16(b1), t);
      break;
  }
}

// One m16n8k32 tile per warp: lane words w[warp][lane] = {fp4 word h0, fp4 word h1, fp4 word of
// rows +16 (unused), b0, b1}. mism[c] counts lanes x outputs where candidate c differs in bits
// from the e4m3 MMA; bad_direct counts f16x8 expansions that differ from the unpacked e4m3 ones.
__global__ void bits_kernel(const uint32_t* words, int tiles, unsigned long long* mism, unsigned long long* bad_direct) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= tiles) return;  // warp-uniform
  const uint32_t* w = words + (int64_t(warp) * 32 + lane) * 4;
  uint32_t a[4];
  fp4x8_to_e4m3x8(w[0], a[0], a[2]);
  fp4x8_to_e4m3x8(w[1], a[1], a[3]);
  const uint32_t b0 = w[2], b1 = w[3];
  float ref[4];
  mma_e4m3(ref, a, b0, b1);
  for (int c = 0; c < kCands; ++c) {
    float d[4];
    cand_mma(c, d, a, b0, b1);
    int n = 0;
    for (int i = 0; i < 4; ++i) n += __float_as_uint(d[i]) != __float_as_uint(ref[i]);
    if (n) atomicAdd(mism + c, (unsigned long long)n);
  }
  // The direct expansion against cvt of the e4m3 bytes, for both words.
  for (int h = 0; h < 2; ++h) {
    uint32_t r[4], lo, hi;
    fp4x8_to_f16x8(w[h], r);
    fp4x8_to_e4m3x8(w[h], lo, hi);
    const uint32_t want[4] = {lo16(lo), hi16(lo), lo16(hi), hi16(hi)};
    for (int i = 0; i < 4; ++i)
      if (r[i] != want[i]) atomicAdd(bad_direct, 1ull);
  }
}

// ---- Cost of the inner body --------------------------------------------------------------------
// One gated FP4 chunk-2 iteration of gemv_kernel at batch 1 (kOne): 2 matrices x 2 row tiles x 2
// blocks, each an MMA and its two scale products, the words varied per iteration (xor with the
// counter) so nothing is hoisted. kDirect: the f16 expansion and two f16 MMAs (candidate `kCand`'s
// arrangement, with B unpacked once per block); else the e4m3 path.
template <bool kDirect>
__global__ void __launch_bounds__(256, 2) cost_kernel(const uint32_t* seed, int iters, float* out) {
  const int lane = threadIdx.x & 31;
  uint32_t w[2][2][2][2];  // [mat][mt][block][h]
  for (int i = 0; i < 16; ++i) (&w[0][0][0][0])[i] = seed[(i * 32 + lane) & 1023];
  uint32_t b[2][2] = {{seed[lane + 512], seed[lane + 544]}, {seed[lane + 576], seed[lane + 608]}};
  float acc[2][2][4] = {};
  const float s0 = __uint_as_float(seed[700] & 0x3F800000u | 0x3F000000u);
  for (int it = 0; it < iters; ++it) {
    const uint32_t x = uint32_t(it) * 0x9E3779B1u;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint32_t bf[4];
      if constexpr (kDirect) bf[0] = lo16(b[j][0]), bf[1] = hi16(b[j][0]), bf[2] = lo16(b[j][1]), bf[3] = hi16(b[j][1]);
#pragma unroll
      for (int mat = 0; mat < 2; ++mat)
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          float d[4];
          if constexpr (kDirect) {
            uint32_t r0[4], r1[4];
            fp4x8_to_f16x8(w[mat][mt][j][0] ^ x, r0);
            fp4x8_to_f16x8(w[mat][mt][j][1] ^ x, r1);
            const float z[4] = {0, 0, 0, 0};
            float t[4];
            mma_f16(t, r0[0], r1[0], r0[1], r1[1], bf[0], bf[1], z);
            mma_f16(d, r0[2], r1[2], r0[3], r1[3], bf[2], bf[3], t);
          } else {
            uint32_t af[4];
            fp4x8_to_e4m3x8(w[mat][mt][j][0] ^ x, af[0], af[2]);
            fp4x8_to_e4m3x8(w[mat][mt][j][1] ^ x, af[1], af[3]);
            mma_e4m3(d, af, b[j][0], b[j][1]);
          }
          const float w0 = __uint_as_float((w[mat][mt][j][0] & 0x7F) << 23 | 0x1u);
          acc[mat][mt][0] += d[0] * (w0 * s0);
          acc[mat][mt][2] += d[2] * (w0 * s0);
        }
    }
  }
  float s = 0;
  for (int i = 0; i < 16; ++i) s += (&acc[0][0][0])[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}


uint32_t rand_e4m3x4(std::mt19937& g, bool narrow) {
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    uint32_t byte;
    do {
      byte = g() & 0xFF;
      if (narrow) byte = (byte & 0x87) | (((g() % 3) + 6) << 3);  // exponents 6..8: cancellation
    } while ((byte & 0x7F) == 0x7F);  // no NaN
    r |= byte << (8 * i);
  }
  return r;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  // 1. Bits.
  const int tiles = 1 << 15;
  std::mt19937 g(12345);
  std::vector<uint32_t> words(size_t(tiles) * 32 * 4);
  uint32_t *dw = nullptr, *seed = nullptr;
  unsigned long long* dm = nullptr;
  float* dout = nullptr;
  CK(cudaMalloc(&dw, words.size() * 4));
  CK(cudaMalloc(&dm, (kCands + 1) * sizeof(unsigned long long)));
  std::printf("\n| data | tiles | outputs |");
  for (int c = 0; c < kCands; ++c) std::printf(" %c mismatches |", 'A' + c);
  std::printf(" direct f16x8 != unpacked e4m3 |\n|---|---|---|");
  for (int c = 0; c <= kCands; ++c) std::printf("---|");
  std::printf("\n");
  for (int pass = 0; pass < 3; ++pass) {
    const bool narrow = pass == 1;
    for (size_t i = 0; i < words.size(); i += 4) {
      const size_t t = i / 128;
      // Pass 2: every FP4 word one nibble value repeated (each of the 16 codes in every position).
      words[i] = pass == 2 ? uint32_t(t % 16) * 0x11111111u : g();
      words[i + 1] = pass == 2 ? uint32_t((t / 16) % 16) * 0x11111111u : g();
      words[i + 2] = rand_e4m3x4(g, narrow);
      words[i + 3] = rand_e4m3x4(g, narrow);
    }
    CK(cudaMemcpy(dw, words.data(), words.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dm, 0, (kCands + 1) * sizeof(unsigned long long)));
    bits_kernel<<<tiles / 8, 256>>>(dw, tiles, dm, dm + kCands);
    CK(cudaGetLastError());
    unsigned long long m[kCands + 1];
    CK(cudaMemcpy(m, dm, sizeof(m), cudaMemcpyDeviceToHost));
    std::printf("| %s | %d | %lld |", pass == 0 ? "random FP4 x full-range e4m3" : pass == 1 ? "random FP4 x e4m3 exponents 6-8" : "each FP4 code x full-range e4m3",
                tiles, (long long)tiles * 32 * 4);
    for (int c = 0; c <= kCands; ++c) std::printf(" %llu |", m[c]);
    std::printf("\n");
  }
  for (int c = 0; c < kCands; ++c) std::printf("%c = %s\n", 'A' + c, kCandNames[c]);
  // 2. Cost.
  std::vector<uint32_t> s(1024);
  for (auto& v : s) v = g();
  CK(cudaMalloc(&seed, 4096));
  CK(cudaMemcpy(seed, s.data(), 4096, cudaMemcpyHostToDevice));
  const int blocks = prop.multiProcessorCount * 2, iters = 4096;
  CK(cudaMalloc(&dout, size_t(blocks) * 256 * 4));
  std::printf("\n| inner body (gated FP4, chunk 2, batch 1) | ms | ns per warp iteration per SM sub-partition | vs e4m3 |\n|---|---|---|---|\n");
  float base = 0;
  for (int v = 0; v < 2; ++v) {
    auto launch = [&](int) {
      if (v == 0) cost_kernel<false><<<blocks, 256>>>(seed, iters, dout);
      else cost_kernel<true><<<blocks, 256>>>(seed, iters, dout);
    };
    const float ms = probe::time_ms(launch, 5);
    CK(cudaGetLastError());
    if (v == 0) base = ms;
    // 16 warps per SM over 4 sub-partitions: 4 warps each; per warp iteration per sub-partition.
    const double ns = ms * 1e6 / iters / 4;
    std::printf("| %s | %.3f | %.1f | %.3fx |\n", v == 0 ? "e4m3 expansion + e4m3 MMA (now)" : "f16 expansion + two f16 MMAs", ms, ns, ms / base);
  }
  CK(cudaFree(dw));
  CK(cudaFree(dm));
  CK(cudaFree(seed));
  CK(cudaFree(dout));
  return 0;
}
