// A probe of what limits the decode GEMVs (issue 16): how fast can their access pattern stream
// weights from HBM, as a function of the instructions spent per loaded word and of the loads a warp
// keeps in flight? No model math: each kernel reads a weight matrix the way gemv_kernel does
// (ops/cuda/gemv/gemv.cu: 32-row tiles, 8 warps per CTA taking strided chunks of k blocks, lane
// (g = lane / 4, q = lane % 4) reading rows g, g+8, g+16, g+24 with the L2::256B hint), folds every
// loaded word through a chain of `math` integer multiply-adds (the stand-in for the FP4 expansion,
// the MMAs and the scale products: ~33 instructions per 32-bit FP4 word in the routed gate + up,
// ~9 per FP8 word), and writes one word per thread so nothing is optimised away. Variants:
// * occupancy: CTAs per SM forced by dynamic shared memory (the real kernels: 2, register-bound);
// * db: the next chunk's words loaded before this chunk's math (register double buffering);
// * the reference: a grid-stride 16-byte read of the same bytes (the copy-like ceiling);
// * `--wide`: the load width alone — the kernels' 4-byte (FP4) / 8-byte (FP8) loads against
//   16-byte loads whose words the quad's threads exchange into the same registers, at k splits 1-3.
// Each matrix is one of four copies read in turn, so that nothing is served from L2.
// Build: part of the CUDA build (bench/cuda/CMakeLists.txt); run on the GPU box with no arguments.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <string>
#include <vector>

#include "bench/cuda/probes/probe_util.h"

namespace {

__device__ __forceinline__ uint32_t ld_s32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint2 ld_s64(const uint2* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Words a lane loads per chunk: kMats matrices x 4 rows x kBlocks blocks x (FP4: 1 word of the
// block's 16 bytes; FP8: 2 words of its 32).
template <int kMats, int kBlocks, bool kFp4>
struct Chunk {
  static constexpr int kPer = kFp4 ? 1 : 2;
  static constexpr int kWords = kMats * 4 * kBlocks * kPer;
  uint32_t v[kWords];
};

template <int kMats, int kBlocks, bool kFp4>
__device__ __forceinline__ void load_chunk(Chunk<kMats, kBlocks, kFp4>& ch, const uint8_t* const (&w)[2],
                                           int64_t row_bytes, int row0, int kb0, int g, int q) {
  constexpr int kBlockBytes = kFp4 ? 16 : 32;
  int i = 0;
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int j = 0; j < kBlocks; ++j) {
        const uint8_t* p = w[m] + int64_t(row0 + r * 8 + g) * row_bytes + int64_t(kb0 + j) * kBlockBytes;
        if constexpr (kFp4) {
          ch.v[i++] = ld_s32(reinterpret_cast<const uint32_t*>(p + q * 4));
        } else {
          const uint2 u = ld_s64(reinterpret_cast<const uint2*>(p + q * 8));
          ch.v[i++] = u.x;
          ch.v[i++] = u.y;
        }
      }
}

__device__ __forceinline__ uint4 ld_s128(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Rotates r left by q (r'[i] = r[(i + q) & 3]) with selects (no local memory).
__device__ __forceinline__ void rotl4(uint32_t (&r)[4], int q) {
  if (q & 1) { const uint32_t t = r[0]; r[0] = r[1], r[1] = r[2], r[2] = r[3], r[3] = t; }
  if (q & 2) { uint32_t t = r[0]; r[0] = r[2], r[2] = t; t = r[1], r[1] = r[3], r[3] = t; }
}

// FP4 "wide": lane q of a row's quad loads 16 bytes, block kb + q of the row (4 words), and the
// quad transposes them so that lane q holds word q of blocks kb..kb+3: the 4-byte loads' register
// layout (gemv_kernel's fragments) from a quarter of the load instructions, each reading whole
// 32-byte sectors. Per 4 words: one 16-byte load, 4 shuffles and 16 selects.
__device__ __forceinline__ void load_wide4(uint32_t* dst, const uint8_t* row_kb, int q) {
  const uint4 v = ld_s128(reinterpret_cast<const uint4*>(row_kb + q * 16));
  uint32_t r[4] = {v.x, v.y, v.z, v.w};
  rotl4(r, q);  // r[s] = word (q + s) & 3 of block q: the word that lane (q + s) & 3 wants
  const int base = (threadIdx.x & 31) & ~3;
  uint32_t got[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) got[s] = __shfl_sync(0xffffffffu, r[s], base | ((q - s) & 3));
  // got[s] = word q of block (q - s) & 3; out[b] = got[(q - b) & 3], i.e. got reversed then rotated.
  uint32_t o[4] = {got[0], got[3], got[2], got[1]};  // o[i] = got[(-i) & 3]
  rotl4(o, (4 - q) & 3);                              // o'[b] = o[(b - q) & 3] = got[(q - b) & 3]
#pragma unroll
  for (int b = 0; b < 4; ++b) dst[b] = o[b];
}

// FP8 "wide": lane q of a row's quad loads 16 bytes at 16q of the row's two blocks (block q / 2,
// words 4(q % 2)..+3); lane q wants words 2q, 2q+1 of both blocks (the 8-byte loads' layout), which
// lane 2b + q / 2 holds at 2(q % 2), 2(q % 2) + 1. Per 4 words: one 16-byte load, 8 shuffles.
__device__ __forceinline__ void load_wide8(uint32_t* dst, const uint8_t* row_kb, int q) {
  const uint4 v = ld_s128(reinterpret_cast<const uint4*>(row_kb + q * 16));
  const int quad = (threadIdx.x & 31) & ~3;
#pragma unroll
  for (int b = 0; b < 2; ++b) {
    const int src = quad | (2 * b + (q >> 1));
    const uint32_t x0 = __shfl_sync(0xffffffffu, v.x, src), x1 = __shfl_sync(0xffffffffu, v.y, src);
    const uint32_t x2 = __shfl_sync(0xffffffffu, v.z, src), x3 = __shfl_sync(0xffffffffu, v.w, src);
    dst[2 * b] = (q & 1) ? x2 : x0;
    dst[2 * b + 1] = (q & 1) ? x3 : x1;
  }
}

template <int kMats, int kBlocks, bool kFp4>
__device__ __forceinline__ void load_chunk_wide(Chunk<kMats, kBlocks, kFp4>& ch, const uint8_t* const (&w)[2],
                                                int64_t row_bytes, int row0, int kb0, int g, int q) {
  constexpr int kStep = kFp4 ? 4 : 2;  // blocks per 16-byte load of a quad
  static_assert(kBlocks % kStep == 0, "wide loads take 4 FP4 / 2 FP8 blocks a quad");
  int i = 0;
#pragma unroll
  for (int m = 0; m < kMats; ++m)
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int j = 0; j < kBlocks; j += kStep, i += 4) {
        const uint8_t* row = w[m] + int64_t(row0 + r * 8 + g) * row_bytes;
        if constexpr (kFp4) load_wide4(ch.v + i, row + int64_t(kb0 + j) * 16, q);
        else load_wide8(ch.v + i, row + int64_t(kb0 + j) * 32, q);
      }
}

template <int kMath, int kWords>
__device__ __forceinline__ uint32_t fold(const uint32_t (&v)[kWords], uint32_t acc) {
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    uint32_t x = v[i];
#pragma unroll
    for (int m = 0; m < kMath; ++m) x = x * 0x9E3779B1u + uint32_t(m);
    acc += x;
  }
  return acc;
}

// Grid: x = 32-row tile of the group, y = group (expert); matrices of one group are consecutive.
// z = k slice of `gridDim.z` (gemv_kernel's cluster split: chunks [z·n/split, (z+1)·n/split)).
// kWide: FP4 words loaded 16 bytes a lane and transposed in the quad (load_wide4).
template <int kMats, int kBlocks, bool kFp4, int kMath, bool kDb, bool kWide = false>
__global__ void __launch_bounds__(256) gemv_probe(const uint8_t* base, int64_t rows, int64_t row_bytes,
                                                   uint32_t* out) {
  extern __shared__ uint8_t pad[];  // occupancy control only
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int row0 = int(blockIdx.x) * 32;
  const int64_t mat_bytes = rows * row_bytes;
  const uint8_t* const w[2] = {base + int64_t(blockIdx.y) * kMats * mat_bytes,
                               base + (int64_t(blockIdx.y) * kMats + (kMats - 1)) * mat_bytes};
  constexpr int kBlockBytes = kFp4 ? 16 : 32;
  const int all_chunks = int(row_bytes / kBlockBytes) / kBlocks;
  const int c_begin = int(blockIdx.z) * all_chunks / int(gridDim.z);
  const int n_chunks = (int(blockIdx.z) + 1) * all_chunks / int(gridDim.z);
  uint32_t acc = 0;
  using C = Chunk<kMats, kBlocks, kFp4>;  // the same registers either way
  auto load = [&](C& ch, int kb0) {
    if constexpr (kWide) load_chunk_wide(ch, w, row_bytes, row0, kb0, g, q);
    else load_chunk(ch, w, row_bytes, row0, kb0, g, q);
  };
  if constexpr (kDb) {
    int c = c_begin + warp;
    C cur, nxt;
    if (c < n_chunks) load(cur, c * kBlocks);
    for (; c < n_chunks; c += 8) {
      if (c + 8 < n_chunks) load(nxt, (c + 8) * kBlocks);
      acc = fold<kMath>(cur.v, acc);
#pragma unroll
      for (int i = 0; i < C::kWords; ++i) cur.v[i] = nxt.v[i];
    }
  } else {
    for (int c = c_begin + warp; c < n_chunks; c += 8) {
      C cur;
      load(cur, c * kBlocks);
      acc = fold<kMath>(cur.v, acc);
    }
  }
  if (acc == 0x12345678u) pad[0] = 1;  // never in practice; keeps pad referenced
  out[((int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * 256 + threadIdx.x] = acc;
}

__global__ void read_ref(const uint4* p, int64_t n, uint32_t* out) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc += a.x ^ b.y ^ c.z ^ d.w ^ a.w ^ b.x ^ c.y ^ d.z;
  }
  for (; i < n; i += stride) acc += p[i].x;
  out[int64_t(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

struct Shape {
  const char* name;
  int groups, mats;
  int64_t rows, row_bytes;  // per matrix
};

constexpr int kCopies = 4;
int g_sms = 0;
size_t g_smem_max = 0;

using probe::time_ms;

template <int kMats, int kBlocks, bool kFp4, int kMath, bool kDb, bool kWide = false>
void run(const Shape& s, uint8_t* const (&buf)[kCopies], uint32_t* out, int ctas_per_sm, double ref_gbps,
         int split = 1) {
  auto kern = gemv_probe<kMats, kBlocks, kFp4, kMath, kDb, kWide>;
  const size_t smem = (g_smem_max / ctas_per_sm) - 2048;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern, 256, smem));
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, kern));
  const dim3 grid(unsigned(s.rows / 32), unsigned(s.groups), unsigned(split));
  const double bytes = double(s.groups) * s.mats * s.rows * s.row_bytes;
  const float ms = time_ms([&](int i) { kern<<<grid, 256, smem>>>(buf[i % kCopies], s.rows, s.row_bytes, out); }, 20);
  CK(cudaGetLastError());
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  std::printf("| %s | %s %d-block%s%s | %d | %s | %d (%d regs) | %.2f | %.0f | %.0f %% |\n", s.name,
              kFp4 ? "FP4" : "FP8", kBlocks, kWide ? ", 16-byte loads + quad exchange" : "",
              split > 1 ? (split == 2 ? ", split 2" : split == 3 ? ", split 3" : ", split 4") : "", kMath,
              kDb ? "yes" : "no", occ, fa.numRegs, ms * 1e3, gbps, 100.0 * gbps / ref_gbps);
}

template <int kMats, int kBlocks, bool kFp4>
void sweep(const Shape& s, uint8_t* const (&buf)[kCopies], uint32_t* out, double ref) {
  for (int occ : {2, 4}) {
    run<kMats, kBlocks, kFp4, 0, false>(s, buf, out, occ, ref);
    run<kMats, kBlocks, kFp4, 0, true>(s, buf, out, occ, ref);
    run<kMats, kBlocks, kFp4, 9, false>(s, buf, out, occ, ref);
    run<kMats, kBlocks, kFp4, 9, true>(s, buf, out, occ, ref);
    run<kMats, kBlocks, kFp4, 33, false>(s, buf, out, occ, ref);
    run<kMats, kBlocks, kFp4, 33, true>(s, buf, out, occ, ref);
  }
}

}  // namespace

// The FP4 load width at gemv_kernel's FP4 shapes: 4-byte loads (the kernel's) against 16-byte
// loads transposed in the quad, at the kernels' splits and 2 CTAs per SM, ~33 instructions per word.
template <int kMats>
void wide_sweep(const Shape& s, uint8_t* const (&buf)[kCopies], uint32_t* out, double ref) {
  for (int split : {1, 2, 3}) {
    run<kMats, 2, true, 33, false>(s, buf, out, 2, ref, split);
    run<kMats, 4, true, 33, false>(s, buf, out, 2, ref, split);
    run<kMats, 4, true, 33, false, true>(s, buf, out, 2, ref, split);
    run<kMats, 4, true, 33, true, true>(s, buf, out, 2, ref, split);
    run<kMats, 8, true, 33, false, true>(s, buf, out, 2, ref, split);
  }
}

// The FP8 load width at the dense FP8 shapes: 8-byte loads (the kernel's) against 16-byte loads
// exchanged in the quad, 4-block chunks, ~9 instructions per word.
void wide_sweep_fp8(const Shape& s, uint8_t* const (&buf)[kCopies], uint32_t* out, double ref) {
  for (int split : {1, 2}) {
    run<1, 4, false, 9, false>(s, buf, out, 2, ref, split);
    run<1, 4, false, 9, false, true>(s, buf, out, 2, ref, split);
    run<1, 4, false, 9, true, true>(s, buf, out, 2, ref, split);
  }
}

int main(int argc, char** argv) {
  const bool wide_only = argc > 1 && std::string(argv[1]) == "--wide";
  cudaDeviceProp p{};
  CK(cudaGetDeviceProperties(&p, 0));
  g_sms = p.multiProcessorCount;
  g_smem_max = p.sharedMemPerMultiprocessor;
  std::printf("%s, %d SMs, %zu KB shared memory per SM, L2 %d MB\n", p.name, g_sms, g_smem_max / 1024, p.l2CacheSize >> 20);
  // The layer slice's M = 1 GEMVs (V4.1 real widths; FP4 rows of k / 2 bytes, FP8 rows of k).
  const Shape shapes[] = {
      {"routed gate+up, 6 experts [2304 x 5120] x2", 6, 2, 2304, 2560},
      {"routed down, 6 experts [5120 x 2304]", 6, 1, 5120, 1152},
      {"wq_b [32768 x 1024]", 1, 1, 32768, 1024},
      {"wo_b [5120 x 8192]", 1, 1, 5120, 8192},
  };
  size_t max_bytes = 0;
  for (const Shape& s : shapes) max_bytes = std::max(max_bytes, size_t(s.groups) * s.mats * s.rows * s.row_bytes);
  uint8_t* buf[kCopies];
  for (auto& b : buf) {
    CK(cudaMalloc(&b, max_bytes));
    CK(cudaMemset(b, 0x5A, max_bytes));
  }
  uint32_t* out = nullptr;
  CK(cudaMalloc(&out, size_t(64) << 20));
  // The copy-like ceiling: a grid-stride 16-byte read of the largest matrix.
  const int64_t n16 = int64_t(max_bytes / 16);
  const float ref_ms = time_ms([&](int i) { read_ref<<<g_sms * 8, 256>>>(reinterpret_cast<const uint4*>(buf[i % kCopies]), n16, out); }, 20);
  const double ref = double(max_bytes) / (ref_ms * 1e-3) / 1e9;
  std::printf("read reference: %.1f MB in %.2f us = %.0f GB/s\n\n", max_bytes / 1e6, ref_ms * 1e3, ref);
  std::printf("| matrix | chunk | math instr / word | next chunk in registers | CTAs per SM | us | GB/s | %% of read ref |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  if (wide_only) {
    wide_sweep<2>(shapes[0], buf, out, ref);
    wide_sweep<1>(shapes[1], buf, out, ref);
    wide_sweep_fp8(shapes[2], buf, out, ref);
    wide_sweep_fp8(shapes[3], buf, out, ref);
  } else {
    sweep<2, 2, true>(shapes[0], buf, out, ref);
    sweep<1, 2, true>(shapes[1], buf, out, ref);
    sweep<1, 4, true>(shapes[1], buf, out, ref);
    sweep<1, 4, false>(shapes[2], buf, out, ref);
    sweep<1, 4, false>(shapes[3], buf, out, ref);
  }
  for (auto& b : buf) CK(cudaFree(b));
  CK(cudaFree(out));
  return 0;
}
