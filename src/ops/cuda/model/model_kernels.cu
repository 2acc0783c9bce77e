// Elementwise, linear, mHC, Engram and MoE kernels of the whole-model GPU forward (declared in
// model_kernels.h). Written for exactness against the CPU twins: the FP32 linears, RMS norms and
// mHC mixes follow the summation orders of ops/cpu/sum_order.h, spread over warps (a chunk of
// 1024 values per warp); the FP8/FP4 decode kernels are gemv.cu / sparse_attn.cu.
#include <cooperative_groups.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <initializer_list>
#include <numeric>
#include <type_traits>

#include <cub/block/block_scan.cuh>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/model/model_device.cuh"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::ops::cuda::detail {

int device_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 1;
  int c = cache[dev].load(std::memory_order_acquire);
  if (c > 0) return c;
  if (cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || c <= 0) c = 1;
  cache[dev].store(c, std::memory_order_release);
  return c;
}

namespace {

unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

// One thread per block of `block` elements (serial inside, as the CPU does).
__global__ void quant_sim_kernel(float* x, int64_t rows, int64_t stride, int64_t qdim, int64_t block,
                                 QuantSim kind) {
  pdl_prologue();
  const int64_t per_row = qdim / block;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * per_row) return;
  float* b = x + (id / per_row) * stride + (id % per_row) * block;
  if (kind == QuantSim::kBf16) {
    for (int64_t i = 0; i < block; ++i) b[i] = dev_round_bf16(b[i]);
    return;
  }
  float amax = 0;
  for (int64_t i = 0; i < block; ++i) amax = fmaxf(amax, fabsf(b[i]));
  if (kind == QuantSim::kFp8) {
    const float sc = dev_pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
    for (int64_t i = 0; i < block; ++i) b[i] = dev_round_e4m3(fminf(fmaxf(b[i] / sc, -448.0f), 448.0f)) * sc;
    return;
  }
  float sc;
  if (kind == QuantSim::kFp4E8m0) sc = dev_pow2_ceil(fmaxf(amax, 6.0f * ldexpf(1.0f, -126)) * (1.0f / 6.0f));
  else sc = dev_round_e4m3(fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f);
  for (int64_t i = 0; i < block; ++i)
    b[i] = dev_round_bf16(dev_round_e2m1(fminf(fmaxf(b[i] / sc, -6.0f), 6.0f)) * sc);
}

// One warp per quantisation block (block > 1): the block maximum by a warp max reduction (max is
// order-free and exact; fmaxf ignores NaN as std::max(amax, |x|) does), then the same elementwise
// expressions as quant_sim_kernel, so the result is bitwise the same.
__global__ void quant_sim_warp_kernel(float* x, int64_t rows, int64_t stride, int64_t qdim, int64_t block,
                                      QuantSim kind) {
  pdl_prologue();
  const int64_t per_row = qdim / block;
  const int64_t id = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;  // the same for the whole warp
  const int lane = int(threadIdx.x & 31);
  if (id >= rows * per_row) return;
  float* b = x + (id / per_row) * stride + (id % per_row) * block;
  float amax = 0;
  for (int64_t i = lane; i < block; i += 32) amax = fmaxf(amax, fabsf(b[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (kind == QuantSim::kFp8) {
    const float sc = dev_pow2_ceil(fmaxf(amax, 1e-4f) / 448.0f);
    for (int64_t i = lane; i < block; i += 32) b[i] = dev_round_e4m3(fminf(fmaxf(b[i] / sc, -448.0f), 448.0f)) * sc;
    return;
  }
  float sc;
  if (kind == QuantSim::kFp4E8m0) sc = dev_pow2_ceil(fmaxf(amax, 6.0f * ldexpf(1.0f, -126)) * (1.0f / 6.0f));
  else sc = dev_round_e4m3(fmaxf(amax, 6.0f * ldexpf(1.0f, -9)) / 6.0f);
  for (int64_t i = lane; i < block; i += 32)
    b[i] = dev_round_bf16(dev_round_e2m1(fminf(fmaxf(b[i] / sc, -6.0f), 6.0f)) * sc);
}

// One block per row, the row in shared memory: stage h pairs (j, j + h) exactly as the serial
// loop does (every element sees the same sequence of additions / subtractions), so the result is
// bitwise hadamard_kernel's.
__global__ void hadamard_block_kernel(float* x, int64_t dim) {
  pdl_prologue();
  extern __shared__ float hv[];
  float* v = x + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) hv[i] = v[i];
  __syncthreads();
  for (int64_t h = 1; h < dim; h *= 2) {
    for (int64_t p = threadIdx.x; p < dim / 2; p += blockDim.x) {
      const int64_t j = (p / h) * 2 * h + p % h;
      const float a = hv[j], b = hv[j + h];
      hv[j] = a + b;
      hv[j + h] = a - b;
    }
    __syncthreads();
  }
  const float norm = 1.0f / sqrtf(float(dim));
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) v[i] = hv[i] * norm;
}

// One warp per row: the row staged in shared memory by the whole warp, the serial FP32 sum of
// BF16-rounded squares (index order, as the CPU) by lane 0, the scaling by all lanes.
constexpr int kHeadsWarps = 4;
constexpr int64_t kHeadsMaxDim = 2048;
__global__ void rms_bf16_heads_warp_kernel(float* x, int64_t rows, int64_t dim, float eps) {
  pdl_prologue();
  extern __shared__ float hsq[];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int64_t r = int64_t(blockIdx.x) * kHeadsWarps + warp;
  if (r >= rows) return;
  float* v = x + r * dim;
  float* sv = hsq + warp * dim;
  for (int64_t i = lane; i < dim; i += 32) sv[i] = v[i];
  __syncwarp();
  float rs = 0;
  if (lane == 0) {
    float ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += dev_round_bf16(sv[i] * sv[i]);
    const float mean = dev_round_bf16(ss / float(dim));
    const float var = dev_round_bf16(mean + dev_round_bf16(eps));
    rs = dev_round_bf16(1.0f / sqrtf(var));
  }
  rs = __shfl_sync(0xffffffffu, rs, 0);
  for (int64_t i = lane; i < dim; i += 32) v[i] = dev_round_bf16(sv[i] * rs);
}

__global__ void hadamard_kernel(float* x, int64_t rows, int64_t dim) {
  pdl_prologue();
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* v = x + r * dim;
  for (int64_t h = 1; h < dim; h *= 2)
    for (int64_t i = 0; i < dim; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
  const float norm = 1.0f / sqrtf(float(dim));
  for (int64_t i = 0; i < dim; ++i) v[i] *= norm;
}

__global__ void rms_bf16_heads_kernel(float* x, int64_t rows, int64_t dim, float eps) {
  pdl_prologue();
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* v = x + r * dim;
  float ss = 0;
  for (int64_t i = 0; i < dim; ++i) ss += dev_round_bf16(v[i] * v[i]);
  const float mean = dev_round_bf16(ss / float(dim));
  const float var = dev_round_bf16(mean + dev_round_bf16(eps));
  const float rs = dev_round_bf16(1.0f / sqrtf(var));
  for (int64_t i = 0; i < dim; ++i) v[i] = dev_round_bf16(v[i] * rs);
}

__global__ void scale_kernel(float* x, int64_t n, float scale, bool bf16) {
  pdl_prologue();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = bf16 ? dev_round_bf16(x[i] * scale) : x[i] * scale;
}

// Linear, in <= kSumChunk: 8 lanes per output (the short dot order), 16 outputs of one row per
// 128-thread block; grid ceil(out / 16) x rows, flattened (row fastest: blocks reading the same
// weight rows run together).
constexpr int kLinThreads = 128;
__device__ __forceinline__ const float* linear_w(const LinearArgs& a, int64_t r, int64_t o) {
  return a.w + (a.sel ? int64_t(a.sel[r]) * a.out * a.in : 0) + o * a.in;
}

// A grouped launch (LinearArgs::groups): blockIdx.y is the group; its x, y and weight rows.
__device__ __forceinline__ void enter_group(LinearArgs& a) {
  if (a.groups <= 1) return;
  const int64_t g = blockIdx.y;
  a.x += g * a.x_group;
  a.y += g * a.y_group;
  if (a.w) a.w += g * a.out * a.in;  // FP32 kernels read w; the typed ones wt (row0 is a stored row)
  a.wt.row0 += g * a.out;
}

__global__ void linear_short_kernel(LinearArgs a) {
  pdl_prologue();
  enter_group(a);
  const int64_t r = int64_t(blockIdx.x) % a.rows, ob = int64_t(blockIdx.x) / a.rows;
  const int64_t o = ob * (kLinThreads / 8) + threadIdx.x / 8;
  const bool ok = o < a.out;
  if (a.sel && a.sel[r] < 0) {  // a (token, slot) pair routed to another rank's expert: not computed
    if (ok && (threadIdx.x & 7) == 0) a.y[r * a.y_stride + o] = 0.0f;
    return;
  }
  const float* x = a.x + (r / a.x_row_div) * a.x_stride;
  const float acc = group8_dot(x, linear_w(a, r, ok ? o : 0), ok ? a.in : 0);
  if (ok && (threadIdx.x & 7) == 0) a.y[r * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
}

// ---- typed weights: one stored row, each value expanded exactly in registers ------------------
// Reads row `row` (stored row index, row0 included) of matrix `mat` of a typed weight: r(i) is the
// FP32 value of column i, exactly what model/quant.h's dequantisation gives (the products of a code
// and a power of two are exact in FP32).
template <WeightDtype F>
struct RowReader {
  const uint8_t* p = nullptr;   // the row's values / codes
  const uint8_t* sc = nullptr;  // the row's scale row (kFp8, kFp4)
  uint32_t bc = 1;
  __device__ __forceinline__ RowReader(const WeightRef& w, int64_t mat, int64_t row) {
    const uint8_t* base = static_cast<const uint8_t*>(w.data) + mat * w.matrix_bytes;
    const uint8_t* sbase = w.scale + mat * w.scale_matrix_bytes;
    if constexpr (F == WeightDtype::kF32) {
      p = base + row * w.cols * 4;
    } else if constexpr (F == WeightDtype::kBf16 || F == WeightDtype::kF16) {
      p = base + row * w.cols * 2;
    } else if constexpr (F == WeightDtype::kFp8) {
      p = base + row * w.cols;
      sc = sbase + (row / w.block_rows) * ((w.cols + w.block_cols - 1) / w.block_cols);
      bc = uint32_t(w.block_cols);
    } else {
      p = base + row * (w.cols / 2);
      sc = sbase + row * (w.cols / 32);
    }
  }
  __device__ __forceinline__ float operator()(int64_t i) const {
    if constexpr (F == WeightDtype::kF32) {
      return reinterpret_cast<const float*>(p)[i];
    } else if constexpr (F == WeightDtype::kBf16) {
      return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(p)[i]) << 16);
    } else if constexpr (F == WeightDtype::kF16) {
      return __half2float(reinterpret_cast<const __half*>(p)[i]);
    } else if constexpr (F == WeightDtype::kFp8) {
      return __fmul_rn(dev_e4m3_value(p[i]), dev_e8m0_value(sc[uint32_t(i) / bc]));
    } else {
      const uint32_t byte = p[i >> 1];
      return __fmul_rn(dev_e2m1_value((i & 1) ? byte >> 4 : byte & 15u), dev_e8m0_value(sc[i >> 5]));
    }
  }
};

// group8_dot (model_device.cuh) with the weights from a RowReader: the same order.
template <typename WR>
__device__ __forceinline__ float group8_dot_w(const float* a, const WR& w, int64_t n) {
  const int j = int(threadIdx.x & 7);
  float s = 0;
  for (int64_t i = j; i < n; i += 8) s = mul_add(a[i], w(i), s);
  s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 4));
  s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 2));
  s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, 1));
  return s;
}

// warp_dot_chunk (model_device.cuh, its scalar path: the same partials) over columns
// [off, off + len) with the weights from a RowReader.
template <typename WR>
__device__ __forceinline__ float warp_dot_chunk_w(const float* a, const WR& w, int64_t off, int64_t len) {
  const int lane = int(threadIdx.x & 31);
  float p0 = 0, p1 = 0, p2 = 0, p3 = 0;
  for (int64_t i = 4 * lane; i < len; i += 128) {
    p0 = mul_add(a[i], w(off + i), p0);
    if (i + 1 < len) p1 = mul_add(a[i + 1], w(off + i + 1), p1);
    if (i + 2 < len) p2 = mul_add(a[i + 2], w(off + i + 2), p2);
    if (i + 3 < len) p3 = mul_add(a[i + 3], w(off + i + 3), p3);
  }
  float v = __fadd_rn(__fadd_rn(p0, p1), __fadd_rn(p2, p3));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// linear_short_kernel with a typed weight.
template <WeightDtype F>
__global__ void linear_short_typed_kernel(LinearArgs a) {
  pdl_prologue();
  enter_group(a);
  const int64_t r = int64_t(blockIdx.x) % a.rows, ob = int64_t(blockIdx.x) / a.rows;
  const int64_t o = ob * (kLinThreads / 8) + threadIdx.x / 8;
  const bool ok = o < a.out;
  if (a.sel && a.sel[r] < 0) {  // another rank's expert (expert parallel): not computed
    if (ok && (threadIdx.x & 7) == 0) a.y[r * a.y_stride + o] = 0.0f;
    return;
  }
  const float* x = a.x + (r / a.x_row_div) * a.x_stride;
  const RowReader<F> w(a.wt, a.sel ? int64_t(a.sel[r]) : 0, a.wt.row0 + (ok ? o : 0));
  const float acc = group8_dot_w(x, w, ok ? a.in : 0);
  if (ok && (threadIdx.x & 7) == 0) a.y[r * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
}

// linear_chunked_kernel with a typed weight.
template <WeightDtype F>
__global__ void linear_chunked_typed_kernel(LinearArgs a) {
  pdl_prologue();
  enter_group(a);
  extern __shared__ float csum[];
  const int64_t r = int64_t(blockIdx.x) % a.rows, o = int64_t(blockIdx.x) / a.rows;
  if (a.sel && a.sel[r] < 0) {
    if (threadIdx.x == 0) a.y[r * a.y_stride + o] = 0.0f;
    return;
  }
  const float* x = a.x + (r / a.x_row_div) * a.x_stride;
  const RowReader<F> w(a.wt, a.sel ? int64_t(a.sel[r]) : 0, a.wt.row0 + o);
  const int64_t m = (a.in + kSumChunk - 1) / kSumChunk;
  for (int64_t c = threadIdx.x / 32; c < m; c += kLinThreads / 32) {
    const int64_t off = c * kSumChunk;
    const float v = warp_dot_chunk_w(x + off, w, off, a.in - off < kSumChunk ? a.in - off : kSumChunk);
    if ((threadIdx.x & 31) == 0) csum[c] = v;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const float acc = dev_chunk_tree(csum, m);
  a.y[r * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
}

// Linear, in > kSumChunk: one 128-thread block per (row, output); warp w sums chunks w, w + 4...
// into shared memory, thread 0 combines them in the fixed tree.
__global__ void linear_chunked_kernel(LinearArgs a) {
  pdl_prologue();
  enter_group(a);
  extern __shared__ float csum[];
  const int64_t r = int64_t(blockIdx.x) % a.rows, o = int64_t(blockIdx.x) / a.rows;
  if (a.sel && a.sel[r] < 0) {  // another rank's expert (expert parallel): not computed
    if (threadIdx.x == 0) a.y[r * a.y_stride + o] = 0.0f;
    return;
  }
  const float* x = a.x + (r / a.x_row_div) * a.x_stride;
  const float* w = linear_w(a, r, o);
  const int64_t m = (a.in + kSumChunk - 1) / kSumChunk;
  for (int64_t c = threadIdx.x / 32; c < m; c += kLinThreads / 32) {
    const int64_t off = c * kSumChunk;
    const float v = warp_dot_chunk(x + off, w + off, a.in - off < kSumChunk ? a.in - off : kSumChunk);
    if ((threadIdx.x & 31) == 0) csum[c] = v;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const float acc = dev_chunk_tree(csum, m);
  a.y[r * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
}

// ---- GEMV form of the chunked linear (in > kSumChunk, few rows) ---------------------------------
// Same partials and combines as linear_chunked(_typed)_kernel, work assigned differently: a
// 256-thread block stages its R input rows once in shared memory (zero-padded to whole chunks),
// then each warp task is (NO consecutive outputs, one chunk c): lane l loads 4 consecutive weights
// of each 128-column slice t = 0..7 of the chunk for all NO outputs at once (one 16/8/4/2-byte load
// per slice and output: F32 / BF16-F16 / FP8 / FP4), expands them in registers and accumulates
// partials 4l..4l+3 of every (row, output) in slice order, then the lane values and the xor
// butterfly give the chunk sum (warp_dot_chunk's order). Chunk sums go to shared memory and one
// thread per (row, output) combines them in the stride-doubling tree. Columns past `in` are zero on
// both sides: a +0 product leaves a partial unchanged (a partial is never -0), so the padding adds
// nothing. V (vector loads) needs in % 4 == 0, aligned rows and (FP8) power-of-two scale blocks of
// >= 4 columns; otherwise the weights are read one value at a time through RowReader.
constexpr int kGemvThreads = 256, kGemvWarps = kGemvThreads / 32;
constexpr int64_t kGemvMaxXFloats = 16384;  // R x padded in: 64 KB of shared memory at most
// Automatic choice: the short linear (in <= kSumChunk) takes its GEMV up to this many rows; a
// chunked one takes the GEMV at any row count (its row groups share each weight tile through L2,
// where the former kernel ran one block per (row, output) and re-read x and the weight row for
// each: 6x slower at 200 rows, and the model's prefill chunks have thousands).
constexpr int64_t kGemvMaxRows = 16;

template <WeightDtype F, int R>
__host__ __device__ constexpr int gemv_outputs_per_task() {
  // Registers: NO x 8 raw loads + R x NO x 4 partials within the 128 of 2 blocks per SM.
  if constexpr (F == WeightDtype::kF32) return R == 1 ? 2 : 1;
  else if constexpr (F == WeightDtype::kFp4) return R == 1 ? 2 : 1;
  else if constexpr (F == WeightDtype::kFp8) return R == 1 ? 4 : R == 2 ? 2 : 1;
  else return R == 1 ? 4 : 2;
}

// The raw bytes of 4 consecutive weights (and their scale byte) of one row.
template <WeightDtype F>
struct GemvRaw {
  uint32_t v[F == WeightDtype::kF32 ? 4 : F == WeightDtype::kBf16 || F == WeightDtype::kF16 ? 2 : 1];
  uint32_t s;  // E8M0 scale (kFp8, kFp4)
};

template <WeightDtype F>
__device__ __forceinline__ void gemv_load(const uint8_t* p, const uint8_t* sc, int bshift, int64_t col, bool ok,
                                          GemvRaw<F>& r) {
  r.s = 0;
  if constexpr (F == WeightDtype::kF32) {
    const uint4 u = ok ? ld_weight(reinterpret_cast<const uint4*>(p + col * 4)) : make_uint4(0, 0, 0, 0);
    r.v[0] = u.x, r.v[1] = u.y, r.v[2] = u.z, r.v[3] = u.w;
  } else if constexpr (F == WeightDtype::kBf16 || F == WeightDtype::kF16) {
    const uint2 u = ok ? ld_weight(reinterpret_cast<const uint2*>(p + col * 2)) : make_uint2(0, 0);
    r.v[0] = u.x, r.v[1] = u.y;
  } else if constexpr (F == WeightDtype::kFp8) {
    r.v[0] = ok ? ld_weight(reinterpret_cast<const unsigned int*>(p + col)) : 0u;
    r.s = ok ? uint32_t(ld_weight(sc + (col >> bshift))) : 0u;
  } else {
    r.v[0] = ok ? uint32_t(ld_weight(reinterpret_cast<const unsigned short*>(p + col / 2))) : 0u;
    r.s = ok ? uint32_t(ld_weight(sc + (col >> 5))) : 0u;
  }
}

// e2m1 nibble → its FP32 value (dev_e2m1_value's table, by bits): 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float dev_e2m1_bits(uint32_t nib) {
  const uint32_t e = (nib >> 1) & 3u, m = nib & 1u;
  const uint32_t mag = e ? (((e + 126u) << 23) | (m << 22)) : (m ? 0x3f000000u : 0u);
  return __uint_as_float(mag | ((nib & 8u) << 28));
}

// The FP32 values of the 4 weights: exactly RowReader's (all-zero raw bytes give +0 in every
// format, the padding). FP8 goes through the hardware e4m3x2 → f16x2 conversion, exact for every
// finite code (a NaN code stays NaN, and any NaN product is the canonical NaN either way).
template <WeightDtype F>
__device__ __forceinline__ float4 gemv_decode(const GemvRaw<F>& r) {
  if constexpr (F == WeightDtype::kF32) {
    return make_float4(__uint_as_float(r.v[0]), __uint_as_float(r.v[1]), __uint_as_float(r.v[2]),
                       __uint_as_float(r.v[3]));
  } else if constexpr (F == WeightDtype::kBf16) {
    return make_float4(__uint_as_float(r.v[0] << 16), __uint_as_float(r.v[0] & 0xffff0000u),
                       __uint_as_float(r.v[1] << 16), __uint_as_float(r.v[1] & 0xffff0000u));
  } else if constexpr (F == WeightDtype::kF16) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&r.v[0]));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&r.v[1]));
    return make_float4(a.x, a.y, b.x, b.y);
  } else if constexpr (F == WeightDtype::kFp8) {
    const float s = dev_e8m0_value(r.s);
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(r.v[0] & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(r.v[0] >> 16), __NV_E4M3);
    const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
    return make_float4(__fmul_rn(a.x, s), __fmul_rn(a.y, s), __fmul_rn(b.x, s), __fmul_rn(b.y, s));
  } else {
    const float s = dev_e8m0_value(r.s);
    const uint32_t b = r.v[0];  // byte 0: columns col, col+1 (low nibble first); byte 1: col+2, col+3
    return make_float4(__fmul_rn(dev_e2m1_bits(b & 15u), s), __fmul_rn(dev_e2m1_bits((b >> 4) & 15u), s),
                       __fmul_rn(dev_e2m1_bits((b >> 8) & 15u), s), __fmul_rn(dev_e2m1_bits((b >> 12) & 15u), s));
  }
}

// One task's weights: raw[j][t] = the 4 weights of output o_first + j at columns c·1024 + 128t +
// 4·lane.. (zero past `in` or `out`). Only loads: issued ahead of their use (software pipeline).
template <WeightDtype F, int NO>
__device__ __forceinline__ void gemv_issue(const LinearArgs& a, int64_t mat, int64_t o_first, int64_t c, int bshift,
                                           GemvRaw<F> (&raw)[NO][8]) {
  const int64_t col0 = c * kSumChunk + 4 * int(threadIdx.x & 31);
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int64_t o = o_first + j;
    const bool ok_o = o < a.out;
    const RowReader<F> rr(a.wt, mat, a.wt.row0 + (ok_o ? o : 0));
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      const int64_t col = col0 + 128 * t;
      gemv_load<F>(rr.p, rr.sc, bshift, col, ok_o && col < a.in, raw[j][t]);
    }
  }
}

// One task's partials from its loaded weights: acc[i][j][q] of row i, output j, partial 4·lane + q,
// each in slice order.
template <WeightDtype F, int R, int NO>
__device__ __forceinline__ void gemv_compute(const GemvRaw<F> (&raw)[NO][8], int64_t c, const float4* xs4,
                                             int64_t xlen4, float (&acc)[R][NO][4]) {
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < NO; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    float4 xv[R];
#pragma unroll
    for (int i = 0; i < R; ++i) xv[i] = xs4[i * xlen4 + (c * kSumChunk + 128 * t) / 4 + lane];
#pragma unroll
    for (int j = 0; j < NO; ++j) {
      const float4 w = gemv_decode<F>(raw[j][t]);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        acc[i][j][0] = mul_add(xv[i].x, w.x, acc[i][j][0]);
        acc[i][j][1] = mul_add(xv[i].y, w.y, acc[i][j][1]);
        acc[i][j][2] = mul_add(xv[i].z, w.z, acc[i][j][2]);
        acc[i][j][3] = mul_add(xv[i].w, w.w, acc[i][j][3]);
      }
    }
  }
}

// The same partials with the weights read one value at a time (rows not a multiple of 4 values,
// unaligned matrices, FP8 scale blocks that are not a power of two >= 4).
template <WeightDtype F, int R, int NO>
__device__ __forceinline__ void gemv_task_scalar(const LinearArgs& a, int64_t mat, int64_t o_first, int64_t c,
                                                 const float4* xs4, int64_t xlen4, float (&acc)[R][NO][4]) {
  const int lane = int(threadIdx.x & 31);
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < NO; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
  const int64_t col0 = c * kSumChunk + 4 * lane;
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int64_t o = o_first + j;
    if (o >= a.out) continue;
    const RowReader<F> rr(a.wt, mat, a.wt.row0 + o);
#pragma unroll 1
    for (int t = 0; t < 8; ++t) {
      const int64_t col = col0 + 128 * t;
      float w[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) w[q] = col + q < a.in ? rr(col + q) : 0.0f;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float4 xv = xs4[i * xlen4 + (c * kSumChunk + 128 * t) / 4 + lane];
        acc[i][j][0] = mul_add(xv.x, w[0], acc[i][j][0]);
        acc[i][j][1] = mul_add(xv.y, w[1], acc[i][j][1]);
        acc[i][j][2] = mul_add(xv.z, w[2], acc[i][j][2]);
        acc[i][j][3] = mul_add(xv.w, w[3], acc[i][j][3]);
      }
    }
  }
}

// Grid: (row groups of R rows, fastest) x (output tiles of G·NO outputs). With sel, R == 1.
// V: each warp's first weights are loaded before x is staged, and the next task's weights are in
// flight while a task's lane values and butterflies run.
template <WeightDtype F, int R, bool V>
__global__ void __launch_bounds__(kGemvThreads, 2) linear_gemv_kernel(LinearArgs a, int64_t n_rg, int G, int bshift) {
  pdl_prologue();
  enter_group(a);
  constexpr int NO = gemv_outputs_per_task<F, R>();
  extern __shared__ float4 gsm[];
  const int64_t m = (a.in + kSumChunk - 1) / kSumChunk, xlen = m * kSumChunk, xlen4 = xlen / 4;
  float* xs = reinterpret_cast<float*>(gsm);  // [R][xlen]
  float* csum = xs + R * xlen;                 // [G·NO][R][m]
  const int64_t rg = int64_t(blockIdx.x) % n_rg, tile = int64_t(blockIdx.x) / n_rg;
  const int64_t r0 = rg * R, o0 = tile * G * NO;
  const int nr = int(a.rows - r0 < R ? a.rows - r0 : R);
  int64_t mat = 0;
  if (a.sel) {  // R == 1
    const int32_t e = a.sel[r0];
    if (e < 0) {  // a (token, slot) pair routed to another rank's expert: not computed
      for (int64_t q = threadIdx.x; q < int64_t(G) * NO; q += kGemvThreads)
        if (o0 + q < a.out) a.y[r0 * a.y_stride + o0 + q] = 0.0f;
      return;
    }
    mat = e;
  }
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int64_t tasks = int64_t(G) * m;
  GemvRaw<F> raw[NO][8];
  if constexpr (V) {
    if (warp < tasks) gemv_issue<F, NO>(a, mat, o0 + (warp / m) * NO, warp % m, bshift, raw);
  }
  for (int i = 0; i < R; ++i) {
    float* dst = xs + i * xlen;
    if (i < nr) {
      const float* src = a.x + ((r0 + i) / a.x_row_div) * a.x_stride;
      for (int64_t k = threadIdx.x; k < xlen; k += kGemvThreads) dst[k] = k < a.in ? src[k] : 0.0f;
    } else {
      for (int64_t k = threadIdx.x; k < xlen; k += kGemvThreads) dst[k] = 0.0f;
    }
  }
  __syncthreads();
  for (int64_t task = warp; task < tasks; task += kGemvWarps) {
    const int64_t g = task / m, c = task % m;
    float acc[R][NO][4];
    if constexpr (V) {
      gemv_compute<F, R, NO>(raw, c, gsm, xlen4, acc);
      const int64_t next = task + kGemvWarps;
      if (next < tasks) gemv_issue<F, NO>(a, mat, o0 + (next / m) * NO, next % m, bshift, raw);
    } else {
      gemv_task_scalar<F, R, NO>(a, mat, o0 + g * NO, c, gsm, xlen4, acc);
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int j = 0; j < NO; ++j) {
        float v = __fadd_rn(__fadd_rn(acc[i][j][0], acc[i][j][1]), __fadd_rn(acc[i][j][2], acc[i][j][3]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) csum[((g * NO + j) * R + i) * m + c] = v;
      }
  }
  __syncthreads();
  for (int64_t q = threadIdx.x; q < int64_t(G) * NO * R; q += kGemvThreads) {
    const int64_t o = o0 + q / R;
    const int i = int(q % R);
    if (o >= a.out || i >= nr) continue;
    const float acc = dev_chunk_tree(csum + q * m, m);
    a.y[(r0 + i) * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
  }
}

// ---- Streaming GEMV of the chunked linear (in > kSumChunk, at most 8 rows: decode, verify) ------
// The same products, partials, butterfly and chunk tree as linear_gemv_kernel (warp_dot_chunk's
// order, then dev_chunk_tree), laid out to keep HBM busy:
//  - Wide loads: lane l = V·p + g (group g = l % V, p = l / V) loads the 4V consecutive weights
//    at columns 128t + 4Vp .. 128t + 4Vp + 4V - 1 of slice t of its group's output chunk (for 1-2
//    rows V = 1 / 2 / 4 / 4 for F32 / BF16-F16 / FP8 / FP4: 16 / 16 / 16 / 8 bytes), i.e. it
//    stands for lanes Vp .. Vp + V - 1 of warp_dot_chunk and keeps their four partials each
//    (acc[..][4u + q]: lane Vp + u, partial q), each in slice order. A warp task is (set, chunk):
//    group g takes NO outputs of the set's V·NO (the NO outputs of a lane share each x value).
//    The V lanes of one p read the same x (a broadcast) and 8 consecutive lanes read 8 / V
//    consecutive 16-byte words (no bank conflict).
//  - The butterfly over those 32 lane values in warp_dot_chunk's level order: levels 16 .. V pair
//    lane Vp + u with V(p ^ o/V) + u, held by lane l ^ o (a shuffle by o, same group); levels
//    V/2 .. 1 pair u with u ^ o inside the lane. Every level adds the same pairs (fadd is
//    commutative).
//  - A ring of D slices per output: a slice's registers are refilled with the load D slices ahead
//    (past the last slice: the warp's next task) as soon as they are decoded, so D loads per
//    output stay in flight across tasks, tiles and barriers (D = 8: the whole next task).
//  - Persistent blocks: all rows of x (zero-padded to whole chunks) staged once per block; a block
//    walks output tiles of S sets (gridDim.x apart), each tile's S·m tasks dealt round-robin to the
//    warps (S·m is a multiple of the warp count), the chunk sums in shared memory (two buffers: one
//    barrier per tile), then one thread per (output, row) folds them in the stride-doubling tree.
// Columns past `in` are zero on both sides (+0 products leave a partial unchanged: a partial is
// never -0), as in linear_gemv_kernel. Needs in % 4V == 0, L-aligned rows and (FP8) power-of-two
// scale blocks of >= 4V columns (launch_linear_stream checks); rows >= nr are skipped (uniform).
constexpr int kStreamMaxThreads = 512;
constexpr int64_t kStreamMaxRows = 8;
constexpr int64_t kStreamMaxXFloats = 32768;  // rows x padded in: 128 KB of shared memory at most

// Per (dtype, row bound R): V lanes per load, NO outputs per lane, D slices in flight, sized so
// that the kernel stays within 128 registers without spilling. Up to 2 rows a 16-byte load per
// slice (FP4: 8 bytes, V = 4); 4 and 8 rows (the products dominate) one lane value per load, at 4
// rows two outputs per lane (each x value read from shared memory feeds two products). D = 8
// (a whole task ahead) where the registers allow: at 8 rows a task's products take about as long
// as a load's latency.
template <WeightDtype F, int R>
struct StreamShape {
  static constexpr int kHalfBytes = F == WeightDtype::kF32 ? 8 : F == WeightDtype::kFp8 ? 2 : F == WeightDtype::kFp4 ? 1 : 4;
  static constexpr int V = R <= 2 ? (8 / kHalfBytes < 4 ? 8 / kHalfBytes : 4) : 1;
  static constexpr int NO = R == 4 ? 2 : 1;
  static constexpr int D = R == 1 || (R == 8 && F != WeightDtype::kF32) ? 8 : R == 4 && F == WeightDtype::kF32 ? 2 : 4;
  static constexpr int kLoadBytes = 2 * V * kHalfBytes;  // 4V weights
};

template <WeightDtype F, int V>
struct StreamRaw {
  static constexpr int kHalfBytes = StreamShape<F, 1>::kHalfBytes;
  static constexpr int kBytes = 2 * V * kHalfBytes;
  static_assert(kBytes >= 2 && kBytes <= 16, "one load of 2..16 bytes");
  uint32_t v[kBytes >= 4 ? kBytes / 4 : 1];
  uint32_t s;  // E8M0 scale (kFp8, kFp4)
};

template <WeightDtype F, int V>
__device__ __forceinline__ void stream_load(const uint8_t* p, const uint8_t* sc, int bshift, int64_t col, bool ok,
                                            StreamRaw<F, V>& r) {
  constexpr int kB = StreamRaw<F, V>::kBytes;
  const uint8_t* q = p + col * StreamRaw<F, V>::kHalfBytes / 2;
  if constexpr (kB == 16) {
    const uint4 u = ok ? ld_weight(reinterpret_cast<const uint4*>(q)) : make_uint4(0, 0, 0, 0);
    r.v[0] = u.x, r.v[1] = u.y, r.v[2] = u.z, r.v[3] = u.w;
  } else if constexpr (kB == 8) {
    const uint2 u = ok ? ld_weight(reinterpret_cast<const uint2*>(q)) : make_uint2(0, 0);
    r.v[0] = u.x, r.v[1] = u.y;
  } else if constexpr (kB == 4) {
    r.v[0] = ok ? ld_weight(reinterpret_cast<const unsigned int*>(q)) : 0u;
  } else {
    r.v[0] = ok ? uint32_t(ld_weight(reinterpret_cast<const unsigned short*>(q))) : 0u;
  }
  if constexpr (F == WeightDtype::kFp8) r.s = ok ? uint32_t(ld_weight(sc + (col >> bshift))) : 0u;
  else if constexpr (F == WeightDtype::kFp4) r.s = ok ? uint32_t(ld_weight(sc + (col >> 5))) : 0u;
  else r.s = 0;
}

// The 4V weights' FP32 values: exactly gemv_decode's / RowReader's (all-zero raw bytes give +0).
template <WeightDtype F, int V>
__device__ __forceinline__ void stream_decode(const StreamRaw<F, V>& r, float (&w)[4 * V]) {
  if constexpr (F == WeightDtype::kF32) {
#pragma unroll
    for (int q = 0; q < 4 * V; ++q) w[q] = __uint_as_float(r.v[q]);
  } else if constexpr (F == WeightDtype::kBf16) {
#pragma unroll
    for (int k = 0; k < 2 * V; ++k)
      w[2 * k] = __uint_as_float(r.v[k] << 16), w[2 * k + 1] = __uint_as_float(r.v[k] & 0xffff0000u);
  } else if constexpr (F == WeightDtype::kF16) {
#pragma unroll
    for (int k = 0; k < 2 * V; ++k) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r.v[k]));
      w[2 * k] = f.x, w[2 * k + 1] = f.y;
    }
  } else if constexpr (F == WeightDtype::kFp8) {
    const float s = dev_e8m0_value(r.s);
#pragma unroll
    for (int k = 0; k < 2 * V; ++k) {
      const uint32_t pair = (r.v[k / 2] >> (16 * (k % 2))) & 0xffffu;
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      w[2 * k] = __fmul_rn(f.x, s), w[2 * k + 1] = __fmul_rn(f.y, s);
    }
  } else {
    const float s = dev_e8m0_value(r.s);
#pragma unroll
    for (int q = 0; q < 4 * V; ++q) w[q] = __fmul_rn(dev_e2m1_bits((r.v[q / 8] >> (4 * (q % 8))) & 15u), s);
  }
}

// The rows of one warp task's NO outputs (row pointers resolved once per task).
template <WeightDtype F, int NO>
struct StreamTask {
  const uint8_t* p[NO];
  const uint8_t* sc[NO];
  bool ok[NO];
  int64_t col0;  // the lane's first column: chunk start + 4V·p
};

template <WeightDtype F, int V, int NO>
__device__ __forceinline__ StreamTask<F, NO> stream_task(const LinearArgs& a, int64_t set, int64_t c, int grp, int p) {
  StreamTask<F, NO> k;
#pragma unroll
  for (int j = 0; j < NO; ++j) {
    const int64_t o = (set * V + grp) * NO + j;
    k.ok[j] = o < a.out;
    const RowReader<F> rr(a.wt, 0, a.wt.row0 + (k.ok[j] ? o : 0));
    k.p[j] = rr.p, k.sc[j] = rr.sc;
  }
  k.col0 = c * kSumChunk + 4 * V * p;
  return k;
}

template <WeightDtype F, int V, int NO>
__device__ __forceinline__ void stream_issue(const LinearArgs& a, const StreamTask<F, NO>& k, int t, int bshift,
                                             StreamRaw<F, V> (&dst)[NO]) {
  const int64_t col = k.col0 + 128 * t;
#pragma unroll
  for (int j = 0; j < NO; ++j) stream_load<F, V>(k.p[j], k.sc[j], bshift, col, k.ok[j] && col < a.in, dst[j]);
}

// Grid: (blocks walking the tiles, groups). Shared memory: x [nr][m·1024], chunk sums [2][S·V·NO][R][m].
template <WeightDtype F, int R>
__global__ void __launch_bounds__(kStreamMaxThreads) linear_stream_kernel(LinearArgs a, int S, int64_t n_tiles,
                                                                          int bshift) {
  pdl_prologue();
  using Sh = StreamShape<F, R>;
  constexpr int V = Sh::V, NO = Sh::NO, D = Sh::D, kSetOut = V * NO;
  enter_group(a);
  extern __shared__ float4 tsm[];
  const int W = int(blockDim.x / 32), warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int grp = lane % V, p = lane / V;
  const int nr = int(a.rows);
  const int64_t m = (a.in + kSumChunk - 1) / kSumChunk, xlen = m * kSumChunk;
  const int64_t per_warp = int64_t(S) * m / W, cs_len = int64_t(S) * kSetOut * R * m;
  float* xs = reinterpret_cast<float*>(tsm);
  float* csum = xs + nr * xlen;
  int64_t tile = blockIdx.x;
  if (tile >= n_tiles) return;  // the whole block (the grid is at most n_tiles wide)
  StreamTask<F, NO> cur = stream_task<F, V, NO>(a, tile * S + warp / m, warp % m, grp, p);
  StreamRaw<F, V> raw[D][NO];
#pragma unroll
  for (int d = 0; d < D; ++d) stream_issue<F, V, NO>(a, cur, d, bshift, raw[d]);
  // x, every row, while the first weights are in flight: 8 loads per thread issued before their
  // stores (16-byte loads where x's rows are 16-byte aligned; in % 4 == 0 here), so staging takes
  // one or two round trips to L2, not one per row. Plain loads: x is step-written (runtime/pdl.cuh).
  {
    const int64_t bd = blockDim.x;
    if (((reinterpret_cast<uintptr_t>(a.x) | uintptr_t(a.x_stride * 4)) & 15) == 0) {
      const int64_t xl4 = xlen / 4, in4 = a.in / 4, total = nr * xl4;
      for (int64_t e0 = threadIdx.x; e0 < total; e0 += 8 * bd) {
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int64_t e = e0 + u * bd, i = e / xl4, k = e % xl4;
          v[u] = e < total && k < in4
                     ? *(reinterpret_cast<const float4*>(a.x + (i / a.x_row_div) * a.x_stride) + k)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
          if (e0 + u * bd < total) tsm[e0 + u * bd] = v[u];
      }
    } else {
      const int64_t total = nr * xlen;
      for (int64_t e0 = threadIdx.x; e0 < total; e0 += 8 * bd) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int64_t e = e0 + u * bd, i = e / xlen, k = e % xlen;
          v[u] = e < total && k < a.in ? a.x[(i / a.x_row_div) * a.x_stride + k] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
          if (e0 + u * bd < total) xs[e0 + u * bd] = v[u];
      }
    }
  }
  __syncthreads();
  for (int buf = 0;; buf ^= 1) {
    float* cs = csum + buf * cs_len;
    for (int64_t kk = 0; kk < per_warp; ++kk) {
      const int64_t tau = warp + kk * W, c = tau % m;
      int64_t ntile = tile, ntau = tau + W;
      if (kk + 1 == per_warp) ntile = tile + gridDim.x, ntau = warp;
      const bool has_next = ntile < n_tiles;
      const StreamTask<F, NO> nxt = stream_task<F, V, NO>(a, ntile * S + ntau / m, ntau % m, grp, p);
      float acc[R][NO][4 * V];
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < NO; ++j)
#pragma unroll
          for (int q = 0; q < 4 * V; ++q) acc[i][j][q] = 0.0f;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        float w[NO][4 * V];
#pragma unroll
        for (int j = 0; j < NO; ++j) stream_decode<F, V>(raw[t % D][j], w[j]);
        if (t + D < 8) stream_issue<F, V, NO>(a, cur, t + D, bshift, raw[t % D]);
        else if (has_next) stream_issue<F, V, NO>(a, nxt, t + D - 8, bshift, raw[t % D]);
        const float4* x4 = tsm + (c * kSumChunk + 128 * t + 4 * V * p) / 4;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          if (i >= nr) break;
#pragma unroll
          for (int u = 0; u < V; ++u) {
            const float4 xv = x4[i * xlen / 4 + u];
#pragma unroll
            for (int j = 0; j < NO; ++j) {
              acc[i][j][4 * u + 0] = mul_add(xv.x, w[j][4 * u + 0], acc[i][j][4 * u + 0]);
              acc[i][j][4 * u + 1] = mul_add(xv.y, w[j][4 * u + 1], acc[i][j][4 * u + 1]);
              acc[i][j][4 * u + 2] = mul_add(xv.z, w[j][4 * u + 2], acc[i][j][4 * u + 2]);
              acc[i][j][4 * u + 3] = mul_add(xv.w, w[j][4 * u + 3], acc[i][j][4 * u + 3]);
            }
          }
        }
      }
      const int64_t set_local = tau / m;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i >= nr) break;
#pragma unroll
        for (int j = 0; j < NO; ++j) {
          float v[V];
#pragma unroll
          for (int u = 0; u < V; ++u)
            v[u] = __fadd_rn(__fadd_rn(acc[i][j][4 * u], acc[i][j][4 * u + 1]),
                             __fadd_rn(acc[i][j][4 * u + 2], acc[i][j][4 * u + 3]));
#pragma unroll
          for (int o = 16; o >= V; o >>= 1)
#pragma unroll
            for (int u = 0; u < V; ++u) v[u] = __fadd_rn(v[u], __shfl_xor_sync(0xffffffffu, v[u], o));
#pragma unroll
          for (int o = V / 2; o >= 1; o >>= 1) {
            float nv[V];
#pragma unroll
            for (int u = 0; u < V; ++u) nv[u] = __fadd_rn(v[u], v[u ^ o]);
#pragma unroll
            for (int u = 0; u < V; ++u) v[u] = nv[u];
          }
          if (p == 0) cs[((set_local * kSetOut + grp * NO + j) * R + i) * m + c] = v[0];
        }
      }
      cur = nxt;
    }
    __syncthreads();  // the tile's chunk sums are in cs (the other buffer is free since the last barrier)
    const int64_t nq = int64_t(S) * kSetOut * R;
    for (int64_t q = threadIdx.x; q < nq; q += blockDim.x) {
      const int i = int(q % R);
      const int64_t o = tile * S * kSetOut + q / R;
      if (i >= nr || o >= a.out) continue;
      const float acc = dev_chunk_tree(cs + q * m, m);
      a.y[i * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
    }
    tile += gridDim.x;
    if (tile >= n_tiles) break;
  }
}

// ---- GEMV form of the short linear (in <= kSumChunk, few rows) ----------------------------------
// ops::dot_f32's short order: element i into partial s[i % 8], each partial in index order, then
// ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7)). Here one thread owns one output and all eight partials, so
// every 8-column step is one 32/16/8/4-byte weight load (F32 / BF16-F16 / FP8 / FP4) expanded in
// registers and 8 products per row; the block's R input rows are staged once in shared memory
// (zero-padded to a multiple of 8: +0 products leave a partial unchanged) and read as broadcasts.
// V (vector loads) needs in % 8 == 0, aligned rows and (FP8) power-of-two scale blocks of >= 8
// columns; otherwise the weights are read one value at a time through RowReader.
constexpr int kShortThreads = 64;

template <WeightDtype F>
struct ShortRaw {
  uint32_t v[F == WeightDtype::kF32 ? 8 : F == WeightDtype::kBf16 || F == WeightDtype::kF16 ? 4
                                         : F == WeightDtype::kFp8 ? 2 : 1];
  uint32_t s;
};

template <WeightDtype F>
__device__ __forceinline__ void short_load(const uint8_t* p, const uint8_t* sc, int bshift, int64_t col, bool ok,
                                           ShortRaw<F>& r) {
  r.s = 0;
  if constexpr (F == WeightDtype::kF32) {
    const uint4 z = make_uint4(0, 0, 0, 0);
    const uint4 u0 = ok ? ld_weight(reinterpret_cast<const uint4*>(p + col * 4)) : z;
    const uint4 u1 = ok ? ld_weight(reinterpret_cast<const uint4*>(p + col * 4 + 16)) : z;
    r.v[0] = u0.x, r.v[1] = u0.y, r.v[2] = u0.z, r.v[3] = u0.w, r.v[4] = u1.x, r.v[5] = u1.y, r.v[6] = u1.z, r.v[7] = u1.w;
  } else if constexpr (F == WeightDtype::kBf16 || F == WeightDtype::kF16) {
    const uint4 u = ok ? ld_weight(reinterpret_cast<const uint4*>(p + col * 2)) : make_uint4(0, 0, 0, 0);
    r.v[0] = u.x, r.v[1] = u.y, r.v[2] = u.z, r.v[3] = u.w;
  } else if constexpr (F == WeightDtype::kFp8) {
    const uint2 u = ok ? ld_weight(reinterpret_cast<const uint2*>(p + col)) : make_uint2(0, 0);
    r.v[0] = u.x, r.v[1] = u.y;
    r.s = ok ? uint32_t(ld_weight(sc + (col >> bshift))) : 0u;
  } else {
    r.v[0] = ok ? ld_weight(reinterpret_cast<const unsigned int*>(p + col / 2)) : 0u;
    r.s = ok ? uint32_t(ld_weight(sc + (col >> 5))) : 0u;
  }
}

// The 8 weights' FP32 values (RowReader's, exactly; all-zero raw bytes give +0).
template <WeightDtype F>
__device__ __forceinline__ void short_decode(const ShortRaw<F>& r, float (&w)[8]) {
  if constexpr (F == WeightDtype::kF32) {
#pragma unroll
    for (int q = 0; q < 8; ++q) w[q] = __uint_as_float(r.v[q]);
  } else if constexpr (F == WeightDtype::kBf16) {
#pragma unroll
    for (int q = 0; q < 4; ++q) w[2 * q] = __uint_as_float(r.v[q] << 16), w[2 * q + 1] = __uint_as_float(r.v[q] & 0xffff0000u);
  } else if constexpr (F == WeightDtype::kF16) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r.v[q]));
      w[2 * q] = f.x, w[2 * q + 1] = f.y;
    }
  } else if constexpr (F == WeightDtype::kFp8) {
    const float s = dev_e8m0_value(r.s);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t pair = (r.v[q / 2] >> (16 * (q % 2))) & 0xffffu;
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(pair), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      w[2 * q] = __fmul_rn(f.x, s), w[2 * q + 1] = __fmul_rn(f.y, s);
    }
  } else {
    const float s = dev_e8m0_value(r.s);
#pragma unroll
    for (int q = 0; q < 8; ++q) w[q] = __fmul_rn(dev_e2m1_bits((r.v[0] >> (4 * q)) & 15u), s);
  }
}

// Grid: (row groups of R rows, fastest) x (tiles of kShortThreads outputs). With sel, R == 1.
template <WeightDtype F, int R, bool V>
__global__ void __launch_bounds__(kShortThreads) linear_short_gemv_kernel(LinearArgs a, int64_t n_rg, int bshift) {
  pdl_prologue();
  enter_group(a);
  extern __shared__ float4 ssm[];
  float* xs = reinterpret_cast<float*>(ssm);  // [R][xlen]
  const int64_t xlen = (a.in + 7) / 8 * 8, steps = xlen / 8;
  const int64_t rg = int64_t(blockIdx.x) % n_rg, tile = int64_t(blockIdx.x) / n_rg;
  const int64_t r0 = rg * R, o = tile * kShortThreads + threadIdx.x;
  const int nr = int(a.rows - r0 < R ? a.rows - r0 : R);
  int64_t mat = 0;
  if (a.sel) {  // R == 1; the whole block leaves together
    const int32_t e = a.sel[r0];
    if (e < 0) {  // another rank's expert (expert parallel): not computed
      if (o < a.out) a.y[r0 * a.y_stride + o] = 0.0f;
      return;
    }
    mat = e;
  }
  for (int i = 0; i < R; ++i) {
    const float* src = i < nr ? a.x + ((r0 + i) / a.x_row_div) * a.x_stride : nullptr;
    for (int64_t k = threadIdx.x; k < xlen; k += kShortThreads) xs[i * xlen + k] = src && k < a.in ? src[k] : 0.0f;
  }
  __syncthreads();
  if (o >= a.out) return;
  const RowReader<F> rr(a.wt, mat, a.wt.row0 + o);
  float s[R][8];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int q = 0; q < 8; ++q) s[i][q] = 0.0f;
  auto step = [&](int64_t k, const float (&w)[8]) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const float4 x0 = ssm[(i * xlen + 8 * k) / 4], x1 = ssm[(i * xlen + 8 * k) / 4 + 1];
      s[i][0] = mul_add(x0.x, w[0], s[i][0]), s[i][1] = mul_add(x0.y, w[1], s[i][1]);
      s[i][2] = mul_add(x0.z, w[2], s[i][2]), s[i][3] = mul_add(x0.w, w[3], s[i][3]);
      s[i][4] = mul_add(x1.x, w[4], s[i][4]), s[i][5] = mul_add(x1.y, w[5], s[i][5]);
      s[i][6] = mul_add(x1.z, w[6], s[i][6]), s[i][7] = mul_add(x1.w, w[7], s[i][7]);
    }
  };
  if constexpr (V) {
    constexpr int kU = 4;  // steps in flight
    for (int64_t k0 = 0; k0 < steps; k0 += kU) {
      ShortRaw<F> raw[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) short_load<F>(rr.p, rr.sc, bshift, 8 * (k0 + u), k0 + u < steps, raw[u]);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (k0 + u < steps) {
          float w[8];
          short_decode<F>(raw[u], w);
          step(k0 + u, w);
        }
      }
    }
  } else {
#pragma unroll 1
    for (int64_t k = 0; k < steps; ++k) {
      float w[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) w[q] = 8 * k + q < a.in ? rr(8 * k + q) : 0.0f;
      step(k, w);
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    if (i >= nr) break;
    const float acc = __fadd_rn(__fadd_rn(__fadd_rn(s[i][0], s[i][4]), __fadd_rn(s[i][2], s[i][6])),
                                __fadd_rn(__fadd_rn(s[i][1], s[i][5]), __fadd_rn(s[i][3], s[i][7])));
    a.y[(r0 + i) * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
  }
}

// ---- Tiled exactness linear (in > kSumChunk, many rows: prefill) --------------------------------
// The same products, partials, lane values, butterfly and chunk tree as linear_gemv_kernel
// (warp_dot_chunk's order, then dev_chunk_tree), with the weights held in registers:
//  - A block owns 32 consecutive outputs (4 per warp) and up to 64 rows (n_sub units of 8 rows).
//    It walks the chunks c; at the start of each chunk a warp loads its 4 outputs' 1024 weights
//    of the chunk (lane l: columns c·1024 + 128t + 4l.., t = 0..7, gemv_load / gemv_decode or
//    RowReader: the GEMV's values) and keeps them in registers (128 floats per lane) for every row
//    of the block, so each weight is decoded once per block, not once per row group.
//  - x comes through shared memory: the block stages units of (8 rows, one chunk) in a ring of
//    3 buffers by cp.async (zero-filled past `in` and past the last row), one barrier per unit.
//    For each row, lane l reads its 4 columns of each slice t (one 16-byte load) and feeds each x
//    value to the 4 outputs: the partials acc[s][q] (output slot s, partial 4l + q) are summed in
//    slice order exactly as the GEMV sums them, one row at a time.
//  - The lane values ((p0+p1)+(p2+p3)) of the 4 outputs are combined by a transposed butterfly:
//    lane L keeps output slot s for output s ^ key(L) (key = bits 4..3 of L, the weights are
//    loaded in that order), so at level 16 a lane keeps slots 0, 1 and receives slots 2, 3 of
//    lane L ^ 16, which hold the same two outputs; at level 8 it keeps slot 0 and receives slot 1
//    of lane L ^ 8 (again its output); levels 4, 2, 1 are the xor butterfly within groups of 8.
//    Every level adds the pair of values that warp_dot_chunk's level adds (fadd is commutative),
//    with 6 shuffles per row for 4 outputs instead of 20. Lane 8k ends with output k's chunk sum.
//    In a full unit a row's butterfly is issued together with the next row's products.
//  - Chunk sums go to shared memory; after the last chunk one thread per (row, output) folds them
//    in the stride-doubling tree.
// Columns past `in` are zero on both sides (+0 products leave a partial unchanged: a partial is
// never -0), as in linear_gemv_kernel. VW: 4-value weight loads (in % 4 == 0, aligned weights,
// FP8 scale blocks a power of two >= 4 columns), else RowReader one value at a time. VX: 16-byte
// x copies (16-byte aligned x, x_stride and x_group multiples of 4), else 4-byte copies.
constexpr int kTiledThreads = 256, kTiledWarps = kTiledThreads / 32;
constexpr int kTiledOut = 4;                                  // outputs per warp
constexpr int kTiledBlockOut = kTiledWarps * kTiledOut;       // outputs per block
constexpr int kTiledSubRows = 8;                              // rows per staged unit
constexpr int kTiledStages = 3;                               // staged units in the ring
constexpr int kTiledMaxSub = 8;                               // units of rows per block: 64 rows
constexpr int kTiledUnitF4 = kTiledSubRows * int(kSumChunk) / 4;  // float4 per unit (32 KB)
constexpr int64_t kTiledMaxChunks = 16;
// Automatic choice: from this many rows (chunked linears without sel). Below it the GEMV's row
// groups (and for FP8 up to 8 rows the streaming GEMV) keep more blocks busy on few rows.
constexpr int64_t kTiledMinRows = 32;

__device__ __forceinline__ void tiled_cp16(float4* dst, const float* src, int bytes) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void tiled_cp4(float* dst, const float* src, int bytes) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(bytes));
}

// Stages x rows [8·sp, 8·sp + 8) of the block (row pointers xrow, nullptr past the last row) x
// columns of chunk c into buf (zeros past `in` and for absent rows). Thread j copies column
// piece j of each row: the row is the same for the whole block at each step.
template <bool VX>
__device__ __forceinline__ void tiled_stage(const float* const* xrow, int64_t in, int sp, int64_t c, float4* buf) {
  const int64_t col_base = c * kSumChunk;
  if constexpr (VX) {
    const int64_t col = col_base + 4 * int(threadIdx.x), left = in - col;
    const int full = left <= 0 ? 0 : left >= 4 ? 16 : int(4 * left);
#pragma unroll
    for (int i = 0; i < kTiledSubRows; ++i) {
      const float* row = xrow[sp * kTiledSubRows + i];
      const int bytes = row ? full : 0;
      tiled_cp16(buf + i * int(kSumChunk / 4) + int(threadIdx.x), bytes ? row + col : xrow[0], bytes);
    }
  } else {
    float* fb = reinterpret_cast<float*>(buf);
#pragma unroll 4
    for (int e0 = 0; e0 < kTiledSubRows * int(kSumChunk); e0 += kTiledThreads) {
      const float* row = xrow[sp * kTiledSubRows + e0 / int(kSumChunk)];
      const int64_t col = col_base + e0 % int(kSumChunk) + int(threadIdx.x);
      const int bytes = row && col < in ? 4 : 0;
      tiled_cp4(fb + e0 + int(threadIdx.x), bytes ? row + col : xrow[0], bytes);
    }
  }
}

// A warp's weights of chunk c: w[s][t] = the 4 weights of output o_w + (s ^ key) at columns
// c·1024 + 128t + 4·lane.. (zero past `in` or `out`), the values gemv_decode / RowReader give.
template <WeightDtype F, bool VW>
__device__ __forceinline__ void tiled_weights(const LinearArgs& a, int64_t o_w, int key, int64_t c, int bshift,
                                              float4 (&w)[kTiledOut][8]) {
  const int64_t col0 = c * kSumChunk + 4 * int(threadIdx.x & 31);
  if constexpr (VW) {
    GemvRaw<F> raw[kTiledOut][8];
#pragma unroll
    for (int s = 0; s < kTiledOut; ++s) {
      const int64_t o = o_w + (s ^ key);
      const bool ok = o < a.out;
      const RowReader<F> rr(a.wt, 0, a.wt.row0 + (ok ? o : 0));
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const int64_t col = col0 + 128 * t;
        gemv_load<F>(rr.p, rr.sc, bshift, col, ok && col < a.in, raw[s][t]);
      }
    }
#pragma unroll
    for (int s = 0; s < kTiledOut; ++s)
#pragma unroll
      for (int t = 0; t < 8; ++t) w[s][t] = gemv_decode<F>(raw[s][t]);
  } else {
#pragma unroll
    for (int s = 0; s < kTiledOut; ++s) {
      const int64_t o = o_w + (s ^ key);
      const bool ok = o < a.out;
      const RowReader<F> rr(a.wt, 0, a.wt.row0 + (ok ? o : 0));
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const int64_t col = col0 + 128 * t;
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = ok && col + q < a.in ? rr(col + q) : 0.0f;
        w[s][t] = make_float4(v[0], v[1], v[2], v[3]);
      }
    }
  }
}

// One row's lane values: v[s] = ((p0+p1)+(p2+p3)) of output slot s, the partials p_q summed over
// the slices t in order (xr: the row's staged chunk, offset by the lane).
__device__ __forceinline__ void tiled_row_lanes(const float4* xr, const float4 (&w)[kTiledOut][8], float (&v)[kTiledOut]) {
  float acc[kTiledOut][4];
#pragma unroll
  for (int s = 0; s < kTiledOut; ++s) acc[s][0] = acc[s][1] = acc[s][2] = acc[s][3] = 0.0f;
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const float4 xv = xr[32 * t];
#pragma unroll
    for (int s = 0; s < kTiledOut; ++s) {
      acc[s][0] = mul_add(xv.x, w[s][t].x, acc[s][0]);
      acc[s][1] = mul_add(xv.y, w[s][t].y, acc[s][1]);
      acc[s][2] = mul_add(xv.z, w[s][t].z, acc[s][2]);
      acc[s][3] = mul_add(xv.w, w[s][t].w, acc[s][3]);
    }
  }
#pragma unroll
  for (int s = 0; s < kTiledOut; ++s) v[s] = __fadd_rn(__fadd_rn(acc[s][0], acc[s][1]), __fadd_rn(acc[s][2], acc[s][3]));
}

// The transposed butterfly of one row's lane values (see above): lane 8k stores output k's chunk
// sum at dst (dst: this lane's output's entry).
__device__ __forceinline__ void tiled_row_fold(const float (&v)[kTiledOut], float* dst, int lane) {
  const float u0 = __fadd_rn(v[0], __shfl_xor_sync(0xffffffffu, v[2], 16));
  const float u1 = __fadd_rn(v[1], __shfl_xor_sync(0xffffffffu, v[3], 16));
  float z = __fadd_rn(u0, __shfl_xor_sync(0xffffffffu, u1, 8));
  z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, 4));
  z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, 2));
  z = __fadd_rn(z, __shfl_xor_sync(0xffffffffu, z, 1));
  if ((lane & 7) == 0) *dst = z;
}

// Grid: (output tiles of 32, fastest) x (row tiles of 8·n_sub rows), groups. Shared memory: the
// ring [kTiledStages][8][1024] floats, then the chunk sums [8·n_sub rows][32 outputs][cs >= m].
template <WeightDtype F, bool VW, bool VX>
__global__ void __launch_bounds__(kTiledThreads, 1) linear_tiled_kernel(LinearArgs a, int64_t n_ot, int n_sub, int cs,
                                                                        int bshift) {
  pdl_prologue();
  enter_group(a);
  extern __shared__ float4 tlsm[];
  __shared__ const float* xrow[kTiledMaxSub * kTiledSubRows];  // the block's x rows (nullptr: past the last)
  float* csum = reinterpret_cast<float*>(tlsm + kTiledStages * kTiledUnitF4);
  const int64_t ot = int64_t(blockIdx.x) % n_ot, rt = int64_t(blockIdx.x) / n_ot;
  const int64_t o0 = ot * kTiledBlockOut, r0 = rt * n_sub * kTiledSubRows;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), key = (lane >> 3) & 3;
  const int m = int((a.in + kSumChunk - 1) / kSumChunk), units = m * n_sub;
  const int64_t o_w = o0 + warp * kTiledOut;
  const bool active = o_w < a.out;  // warp-uniform: a warp past the last output only stages x
  if (threadIdx.x < n_sub * kTiledSubRows) {
    const int64_t r = r0 + threadIdx.x;
    xrow[threadIdx.x] = r < a.rows ? a.x + (r / a.x_row_div) * a.x_stride : nullptr;
  }
  __syncthreads();
  // Unit u = (chunk u / n_sub, rows 8·(u % n_sub)..) lives in ring buffer u % kTiledStages.
#pragma unroll
  for (int u = 0; u < kTiledStages - 1; ++u) {
    if (u < units) tiled_stage<VX>(xrow, a.in, u % n_sub, u / n_sub, tlsm + u * kTiledUnitF4);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  int c = 0, sp = 0, buf = 0;  // unit u's chunk, row unit and buffer
  int nc = (kTiledStages - 1) / n_sub, nsp = (kTiledStages - 1) % n_sub, nbuf = kTiledStages - 1;  // unit u + 2's
  float4 w[kTiledOut][8];
  for (int u = 0; u < units; ++u) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kTiledStages - 2));
    __syncthreads();  // unit u is staged; every warp is done with unit u - 1, whose buffer is refilled next
    if (u + kTiledStages - 1 < units) tiled_stage<VX>(xrow, a.in, nsp, nc, tlsm + nbuf * kTiledUnitF4);
    asm volatile("cp.async.commit_group;\n" ::);
    if (++nsp == n_sub) nsp = 0, ++nc;
    if (++nbuf == kTiledStages) nbuf = 0;
    const int cur_c = c, cur_sp = sp, cur_buf = buf;
    if (++sp == n_sub) sp = 0, ++c;
    if (++buf == kTiledStages) buf = 0;
    if (!active) continue;
    if (cur_sp == 0) tiled_weights<F, VW>(a, o_w, key, cur_c, bshift, w);
    const float4* ub = tlsm + cur_buf * kTiledUnitF4 + lane;
    float* cs_unit = csum + (cur_sp * kTiledSubRows * kTiledBlockOut + warp * kTiledOut + key) * cs + cur_c;
    const int64_t left = a.rows - (r0 + cur_sp * kTiledSubRows);
    if (left >= kTiledSubRows) {
      // A full unit: row i's butterfly is issued with row i + 1's products (independent work that
      // hides the shuffles' latency).
      float pv[kTiledOut];
      tiled_row_lanes(ub, w, pv);
#pragma unroll 1
      for (int i = 1; i < kTiledSubRows; ++i) {
        float v[kTiledOut];
        tiled_row_lanes(ub + i * int(kSumChunk / 4), w, v);
        tiled_row_fold(pv, cs_unit + (i - 1) * kTiledBlockOut * cs, lane);
#pragma unroll
        for (int s = 0; s < kTiledOut; ++s) pv[s] = v[s];
      }
      tiled_row_fold(pv, cs_unit + (kTiledSubRows - 1) * kTiledBlockOut * cs, lane);
    } else {
#pragma unroll 1
      for (int i = 0; i < left; ++i) {
        float v[kTiledOut];
        tiled_row_lanes(ub + i * int(kSumChunk / 4), w, v);
        tiled_row_fold(v, cs_unit + i * kTiledBlockOut * cs, lane);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();
  const int nq = n_sub * kTiledSubRows * kTiledBlockOut;
  for (int q = int(threadIdx.x); q < nq; q += kTiledThreads) {
    const int64_t r = r0 + q / kTiledBlockOut, o = o0 + q % kTiledBlockOut;
    if (r >= a.rows || o >= a.out) continue;
    const float acc = dev_chunk_tree(csum + int64_t(q) * cs, m);
    a.y[r * a.y_stride + o] = a.bf16_out ? dev_round_bf16(acc) : acc;
  }
}

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

// ops::rms_norm: double sum of squares in the sum_order.h order, FP32 scaling. Warp c of a row
// owns chunk c (a short row is one chunk): its values (and the weights) stay in registers from
// the sum of squares to the scaled store, so x and w are read once, in one round of 16-byte loads
// (lane l: values 128i + 4l .. +3, the chunk order's partials); after one block barrier every warp
// of the row folds the row's chunk sums in the chunk tree by shuffles. norm_rows_per_block(m) rows share a block when rows are
// short. Rows of more than kNormMaxChunks chunks: rms_norm_wide_kernel. y may alias x (every
// value is read before the block barrier, written after it).
constexpr int kNormMaxChunks = 16, kNormThreads = 512;
__host__ __device__ constexpr int norm_rows_per_block(int64_t m) { return m == 1 ? 4 : m == 2 ? 2 : 1; }

// kHc > 0 (launch_hc_collapse_norm): the row's values are first formed as hc_collapse_vec_kernel
// forms them, u = bf16?(Σ_i pre[r,i] · x[r,i,:]) with x the row's kHc streams, in registers (the
// same expressions: the same bits), so the collapsed row never goes through global memory.
template <int kHc = 0>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const float* x, const float* w, float* y, int64_t rows,
                                                        int64_t dim, float eps, bool bf16, const float* pre = nullptr) {
  pdl_prologue();
  __shared__ double csq[32];
  const int m = int((dim + kSumChunk - 1) / kSumChunk);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  const int rw = warp / m, c = warp % m;  // row within the block, chunk
  const int64_t row = int64_t(blockIdx.x) * norm_rows_per_block(m) + rw;
  const bool live = row < rows;
  const int64_t off = int64_t(c) * kSumChunk, len = dim - off < kSumChunk ? dim - off : kSumChunk;
  constexpr int kStreams = kHc > 0 ? kHc : 1;
  const float* xr = x + (live ? row : 0) * kStreams * dim + off;  // stream i of the row: xr + i · dim
  const float* wr = w ? w + off : nullptr;
  float* yr = y + (live ? row : 0) * dim + off;
  const bool vec = len == kSumChunk && (kHc == 0 || dim % 4 == 0) &&
                   ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr) |
                     reinterpret_cast<uintptr_t>(wr)) & 15) == 0;
  float xv[32], wv[32];  // [i][q]: value 128i + 4·lane + q of the chunk
  float pr[kStreams];    // kHc: the row's collapse weights
  if constexpr (kHc > 0) {
#pragma unroll
    for (int i = 0; i < kHc; ++i) pr[i] = live ? pre[row * kHc + i] : 0.0f;
  }
  if (live) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        if constexpr (kHc == 0) {
          const float4 v = *reinterpret_cast<const float4*>(xr + 128 * i + 4 * lane);  // not __ldg: y may alias x
          xv[4 * i] = v.x, xv[4 * i + 1] = v.y, xv[4 * i + 2] = v.z, xv[4 * i + 3] = v.w;
        } else {
          float4 v[kHc];
#pragma unroll
          for (int j = 0; j < kHc; ++j) v[j] = *reinterpret_cast<const float4*>(xr + j * dim + 128 * i + 4 * lane);
          float s[4] = {0, 0, 0, 0};
#pragma unroll
          for (int j = 0; j < kHc; ++j) {
            s[0] = mul_add(pr[j], v[j].x, s[0]), s[1] = mul_add(pr[j], v[j].y, s[1]);
            s[2] = mul_add(pr[j], v[j].z, s[2]), s[3] = mul_add(pr[j], v[j].w, s[3]);
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) xv[4 * i + q] = bf16 ? dev_round_bf16(s[q]) : s[q];
        }
      }
      if (wr) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 v = ld_weight(reinterpret_cast<const float4*>(wr + 128 * i + 4 * lane));
          wv[4 * i] = v.x, wv[4 * i + 1] = v.y, wv[4 * i + 2] = v.z, wv[4 * i + 3] = v.w;
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int64_t k = 128 * i + 4 * lane + q;
          if constexpr (kHc == 0) {
            xv[4 * i + q] = k < len ? xr[k] : 0.0f;
          } else {
            float s = 0;
            if (k < len) {
#pragma unroll
              for (int j = 0; j < kHc; ++j) s = mul_add(pr[j], xr[j * dim + k], s);
            }
            xv[4 * i + q] = bf16 ? dev_round_bf16(s) : s;
          }
          wv[4 * i + q] = wr && k < len ? wr[k] : 0.0f;
        }
    }
  }
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
  if (lane == 0) csq[warp] = v;
  __syncthreads();
  if (!live) return;
  // Every warp of the row folds the row's chunk sums itself (the same additions): no second barrier.
  const double ss = __shfl_sync(0xffffffffu, warp_chunk_tree(lane < m ? csq[rw * m + lane] : 0.0, m), 0);
  const float ri = 1.0f / sqrtf(__fadd_rn(float(ss / double(dim)), eps));
#pragma unroll
  for (int k = 0; k < 32; ++k) {  // scaled in place
    float t = __fmul_rn(xv[k], ri);
    if (wr) t = __fmul_rn(t, wv[k]);
    xv[k] = bf16 ? dev_round_bf16(t) : t;
  }
  if (vec) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
      *reinterpret_cast<float4*>(yr + 128 * i + 4 * lane) = make_float4(xv[4 * i], xv[4 * i + 1], xv[4 * i + 2], xv[4 * i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (128 * i + 4 * lane + q < len) yr[128 * i + 4 * lane + q] = xv[4 * i + q];
  }
}

// Rows of more than kNormMaxChunks chunks: warps loop over the chunks (the same sums), thread 0
// folds them, every thread scales its values.
__global__ void rms_norm_wide_kernel(const float* x, const float* w, float* y, int64_t dim, float eps, bool bf16) {
  pdl_prologue();
  extern __shared__ double csq[];
  __shared__ float r_inv;
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  const int64_t m = (dim + kSumChunk - 1) / kSumChunk;
  for (int64_t c = threadIdx.x / 32; c < m; c += blockDim.x / 32) {
    const int64_t off = c * kSumChunk;
    const double v = warp_sumsq_chunk(xr + off, dim - off < kSumChunk ? dim - off : kSumChunk);
    if ((threadIdx.x & 31) == 0) csq[c] = v;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const double ss = dev_chunk_tree(csq, m);
    r_inv = 1.0f / sqrtf(__fadd_rn(float(ss / double(dim)), eps));
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = __fmul_rn(xr[i], r_inv);
    if (w) v = __fmul_rn(v, w[i]);
    yr[i] = bf16 ? dev_round_bf16(v) : v;
  }
}

// A cluster of `csize` blocks (kMixThreads each) per row. flat = hc·dim > kSumChunk: the
// (n_mix + 1) x chunks work items (the flat sum of squares and every mix dot, one chunk each) are
// spread over the cluster's warps, each partial lands in its block's shared memory and rank 0
// gathers them (distributed shared memory) and combines them in the fixed trees; else (csize 1)
// warp 0 sums the squares (one chunk) and 8-lane groups take one mix dot each. Then rank 0
// forms the pre/post mixes (hc threads) and the row softmax + Sinkhorn (one thread per comb entry,
// each sum in the CPU's order, recomputed identically by the threads that need it).
constexpr int kMixThreads = 512;
constexpr int kMixCluster = 8;  // blocks per row when hc·dim > kSumChunk
// The slot that holds mix `mix` of row r between the row-tile dots and hc_mixes_kernel (dots_ready):
// the outputs themselves (n_mix = 2hc + hc² = |pre| + |post| + |comb| per row; head-only: |pre|).
__device__ __forceinline__ float* hc_dot_slot(const HcMixArgs& a, int64_t r, int64_t mix) {
  const int64_t hc = a.hc;
  if (mix < hc) return a.pre + r * hc + mix;
  if (mix < 2 * hc) return a.post + r * hc + mix - hc;
  return a.comb + r * hc * hc + mix - 2 * hc;
}

// The mixes' inverse RMS of a row from its double sum of squares over `flat` values (ops::hc_mixes).
__device__ __forceinline__ float hc_inv_rms(double ss, int64_t flat, float eps) {
  return 1.0f / sqrtf(__fadd_rn(float(ss / double(flat)), eps));
}

// The pre / post mixes of entry i < hc of row r from the scaled dots mu (ops::hc_mixes).
__device__ __forceinline__ float hc_sigm(float v) { return 1.0f / (1.0f + dev_exp(-v)); }
__device__ __forceinline__ void hc_pre_post(const HcMixArgs& a, const float* mu, int64_t r, int i) {
  const int64_t hc = a.hc;
  a.pre[r * hc + i] = hc_sigm(mul_add(mu[i], a.scale[0], a.base[i])) + a.hc_eps;
  if (!a.head_only) a.post[r * hc + i] = 2.0f * hc_sigm(mul_add(mu[hc + i], a.scale[1], a.base[hc + i]));
}

// Row softmax + Sinkhorn of row r's comb by one warp (hc·hc <= 32; all 32 lanes call it): lane
// j·hc + k owns P[j][k]; a row or column sum takes the hc entries from their lanes by shuffles and
// adds them in the CPU's order (q = 0, 1, ..), so every lane of that row / column forms the same
// sum the serial loop does, without a block barrier per step. Each exp is taken once, by its owner.
// kHc > 0: hc known at compile time (the models' hc_mult 4), so the shuffles of a sum are
// unrolled and issued together; the additions keep their order.
template <int kHc>
__device__ __forceinline__ void hc_sinkhorn_warp(const HcMixArgs& a, const float* mu, int64_t r) {
  const int hc = kHc > 0 ? kHc : int(a.hc), lane = int(threadIdx.x & 31);
  const bool own = lane < hc * hc;
  const int j = own ? lane / hc : 0, k = own ? lane % hc : 0;
  const float eps = a.hc_eps;
  const float lg = own ? mul_add(mu[2 * hc + lane], a.scale[2], a.base[2 * hc + lane]) : 0.0f;
  float mx = __shfl_sync(0xffffffffu, lg, j * hc);
#pragma unroll
  for (int q = 1; q < hc; ++q) mx = fmaxf(mx, __shfl_sync(0xffffffffu, lg, j * hc + q));
  const float e = dev_exp(lg - mx);
  float s = 0;
#pragma unroll
  for (int q = 0; q < hc; ++q) s += __shfl_sync(0xffffffffu, e, j * hc + q);
  float pv = e / s + eps;  // row softmax, then + eps
  const int64_t iters = a.sinkhorn_iters > 1 ? a.sinkhorn_iters : 1;
  for (int64_t it = 0; it < iters; ++it) {
    if (it > 0) {  // row normalisation
      s = 0;
#pragma unroll
      for (int q = 0; q < hc; ++q) s += __shfl_sync(0xffffffffu, pv, j * hc + q);
      pv = pv / (s + eps);
    }
    s = 0;  // column normalisation
#pragma unroll
    for (int q = 0; q < hc; ++q) s += __shfl_sync(0xffffffffu, pv, q * hc + k);
    pv = pv / (s + eps);
  }
  if (own) a.comb[r * int64_t(hc) * hc + lane] = pv;
}

// hc·hc <= 32: row r's epilogue by two warps, the Sinkhorn warp (shuffles) and the pre / post warp
// (lanes < hc); `sinkhorn` says which of the two the calling warp is (all its lanes call).
__device__ __forceinline__ void hc_mix_epilogue_warp(const HcMixArgs& a, const float* mu, int64_t r, bool sinkhorn) {
  const int lane = int(threadIdx.x & 31);
  if (!sinkhorn) {
    if (lane < a.hc) hc_pre_post(a, mu, r, lane);
  } else if (!a.head_only) {
    if (a.hc == 4) hc_sinkhorn_warp<4>(a, mu, r);
    else hc_sinkhorn_warp<0>(a, mu, r);
  }
}

// pre, post and comb of row r from mu [n_mix] (shared memory, complete); every thread of the block
// calls it (blockDim >= 64). hc·hc <= 32: warp 1 the pre/post mixes, warp 0 Sinkhorn by shuffles;
// larger hc: one thread per comb entry with a block barrier per step (P [hc, hc] shared scratch).
__device__ void hc_mix_epilogue(const HcMixArgs& a, const float* mu, float* P, int64_t r) {
  const int64_t hc = a.hc;
  if (hc * hc <= 32) {
    const int warp = int(threadIdx.x / 32);
    if (warp < 2) hc_mix_epilogue_warp(a, mu, r, warp == 0);
    return;
  }
  if (threadIdx.x < hc) hc_pre_post(a, mu, r, int(threadIdx.x));
  if (a.head_only) return;
  const float eps = a.hc_eps;
  const bool own = threadIdx.x < hc * hc;
  const int64_t j = own ? threadIdx.x / hc : 0, k = own ? threadIdx.x % hc : 0;
  float* prow = P + j * hc;
  float pv = 0;
  if (own) {  // row softmax, then + eps (every thread of row j recomputes the row's sum)
    float mx = mul_add(mu[2 * hc + j * hc], a.scale[2], a.base[2 * hc + j * hc]);
    for (int64_t q = 1; q < hc; ++q) mx = fmaxf(mx, mul_add(mu[2 * hc + j * hc + q], a.scale[2], a.base[2 * hc + j * hc + q]));
    float s = 0, mine = 0;
    for (int64_t q = 0; q < hc; ++q) {
      const float e = dev_exp(mul_add(mu[2 * hc + j * hc + q], a.scale[2], a.base[2 * hc + j * hc + q]) - mx);
      s += e;
      if (q == k) mine = e;
    }
    pv = mine / s + eps;
    prow[k] = pv;
  }
  __syncthreads();
  for (int64_t it = 0; it < (a.sinkhorn_iters > 1 ? a.sinkhorn_iters : 1); ++it) {
    if (it > 0) {
      float s = 0;
      if (own)
        for (int64_t q = 0; q < hc; ++q) s += prow[q];
      __syncthreads();
      if (own) prow[k] = pv = pv / (s + eps);
      __syncthreads();
    }
    float s = 0;
    if (own)
      for (int64_t q = 0; q < hc; ++q) s += P[q * hc + k];
    __syncthreads();
    if (own) prow[k] = pv = pv / (s + eps);
    __syncthreads();
  }
  if (own) a.comb[r * hc * hc + j * hc + k] = pv;
}

// dots_ready: the row-tile kernel below has left each mix dot (the full chunked sum) in its
// hc_dot_slot; only the sum of squares is computed here (csize 1).
__global__ void __launch_bounds__(kMixThreads) hc_mixes_kernel(HcMixArgs a, int csize, bool dots_ready) {
  pdl_prologue();
  extern __shared__ double hsm[];
  const int64_t hc = a.hc, flat = hc * a.dim, n_mix = a.head_only ? hc : (2 + hc) * hc;
  const int64_t m = flat > kSumChunk ? (flat + kSumChunk - 1) / kSumChunk : 1;
  double* sq = hsm;                                   // [m]
  float* part = reinterpret_cast<float*>(hsm + m);    // [n_mix, m]
  float* mu = part + n_mix * m;                       // [n_mix]
  float* P = mu + n_mix;                              // [hc, hc]
  __shared__ float rs;
  const int64_t row = blockIdx.x / csize;
  const int rank = int(blockIdx.x % csize);
  const float* x = a.x + row * flat;
  const int warp = int(threadIdx.x / 32), n_warps = int(blockDim.x / 32);
  if (flat > kSumChunk) {
    const int64_t items = (dots_ready ? 1 : n_mix + 1) * m, all_warps = int64_t(n_warps) * csize;
    for (int64_t item = int64_t(rank) * n_warps + warp; item < items; item += all_warps) {
      const int64_t mix = item / m - 1, c = item % m, off = c * kSumChunk;
      const int64_t len = flat - off < kSumChunk ? flat - off : kSumChunk;
      if (mix < 0) {
        const double v = warp_sumsq_chunk(x + off, len);
        if ((threadIdx.x & 31) == 0) sq[c] = v;
      } else {
        const float v = warp_dot_chunk(a.fn + mix * flat + off, x + off, len);
        if ((threadIdx.x & 31) == 0) part[mix * m + c] = v;
      }
    }
    if (csize > 1) {
      namespace cg = cooperative_groups;
      cg::cluster_group cluster = cg::this_cluster();
      cluster.sync();  // every rank's partials are in its shared memory
      if (rank == 0)
        for (int64_t item = threadIdx.x; item < items; item += blockDim.x) {
          const int owner = int((item % all_warps) / n_warps);
          if (owner == 0) continue;
          const int64_t mix = item / m - 1, c = item % m;
          if (mix < 0) sq[c] = *cluster.map_shared_rank(sq + c, owner);
          else part[mix * m + c] = *cluster.map_shared_rank(part + mix * m + c, owner);
        }
      cluster.sync();  // rank 0 has read them before the other blocks exit
      if (rank != 0) return;
    }
  } else {
    if (threadIdx.x < 32) {  // one chunk: warp 0 in the chunk order
      const double ss = warp_sumsq_chunk(x, flat);
      if (threadIdx.x == 0) sq[0] = ss;
    }
    const int64_t groups = blockDim.x / 8;
    for (int64_t base = 0; base < n_mix; base += groups) {
      const int64_t mix = base + threadIdx.x / 8;
      const bool ok = mix < n_mix;
      const float v = group8_dot(a.fn + (ok ? mix : 0) * flat, x, ok ? flat : 0);
      if (ok && (threadIdx.x & 7) == 0) part[mix] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const double ss = m > 1 ? dev_chunk_tree(sq, m) : sq[0];
    rs = hc_inv_rms(ss, flat, a.norm_eps);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n_mix; i += blockDim.x)
    mu[i] = __fmul_rn(dots_ready ? *hc_dot_slot(a, row, i) : m > 1 ? dev_chunk_tree(part + i * m, m) : part[i], rs);
  __syncthreads();
  hc_mix_epilogue(a, mu, P, row);
}

// hc_mixes_kernel's dots_ready pass (after the row tiles) where hc·hc <= 32: kReadyRows rows per
// block, so that an SM holds many rows' loads and epilogues at once (hc_mixes_kernel gives each
// row a 512-thread block whose warps then wait for the row's one-warp Sinkhorn). The warps take the
// block's rows' chunks of the flat sum of squares (warp_sumsq_chunk, as there), one thread per row
// folds them (dev_chunk_tree) and scales the row's dots, then warps 2k and 2k + 1 run row k's
// epilogue (hc_mix_epilogue's Sinkhorn warp and pre / post warp). Same operations, same bits.
constexpr int kReadyRows = 4, kReadyThreads = 64 * kReadyRows;
__global__ void __launch_bounds__(kReadyThreads) hc_mixes_ready_kernel(HcMixArgs a) {
  pdl_prologue();
  extern __shared__ double rsm[];
  __shared__ float rs[kReadyRows];
  const int64_t hc = a.hc, flat = hc * a.dim, n_mix = a.head_only ? hc : (2 + hc) * hc;
  const int64_t m = (flat + kSumChunk - 1) / kSumChunk;
  double* sq = rsm;                                              // [kReadyRows][m]
  float* mu = reinterpret_cast<float*>(rsm + kReadyRows * m);    // [kReadyRows][n_mix]
  const int64_t row0 = int64_t(blockIdx.x) * kReadyRows;
  const int nr = int(a.rows - row0 < kReadyRows ? a.rows - row0 : kReadyRows);
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31);
  for (int64_t item = warp; item < nr * m; item += kReadyThreads / 32) {
    const int64_t k = item / m, c = item % m, off = c * kSumChunk;
    const double v = warp_sumsq_chunk(a.x + (row0 + k) * flat + off, flat - off < kSumChunk ? flat - off : kSumChunk);
    if (lane == 0) sq[k * m + c] = v;
  }
  __syncthreads();
  if (int(threadIdx.x) < nr) {
    const double ss = m > 1 ? dev_chunk_tree(sq + threadIdx.x * m, m) : sq[threadIdx.x * m];
    rs[threadIdx.x] = hc_inv_rms(ss, flat, a.norm_eps);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < nr * n_mix; i += kReadyThreads) {
    const int64_t k = i / n_mix;
    mu[i] = __fmul_rn(*hc_dot_slot(a, row0 + k, i % n_mix), rs[k]);
  }
  __syncthreads();
  const int k = warp / 2;
  if (k < nr) hc_mix_epilogue_warp(a, mu + k * n_mix, row0 + k, warp % 2 == 0);
}

// The row's mix dots and flat sum of squares split by chunk over a cluster (decode: few rows,
// flat = hc·dim > kSumChunk, m <= kSplitMaxChunks chunks). Block b of the row's cluster owns the
// chunks b, b + csize, ..; for each it stages the chunk of x in shared memory (one round of loads,
// issued together with the fn loads) and its warps take one work item each: item 0 the chunk's
// sum of squares, item 1 + i mix i's chunk dot (lane l: the partials 4l..4l+3 over the 8
// 128-value slices of the chunk, then the xor butterfly: warp_dot_chunk's and warp_sumsq_chunk's
// order). Each chunk sum is stored into rank 0's shared memory (distributed shared memory); after
// one cluster barrier rank 0 alone goes on: each warp folds the m chunk sums of squares and then
// its mixes' chunk sums in the chunk tree (warp_chunk_tree), scales them, and after one block
// barrier hc_mix_epilogue. Same bits as hc_mixes_kernel.
constexpr int kSplitMaxChunks = 32;
constexpr int kSplitMaxCluster = 16;  // a non-portable cluster size (sm_90: where the device allows it)
constexpr int kSplitMaxWarps = 25;    // hc 4: one warp per item (24 mixes + the sum of squares)
__global__ void __launch_bounds__(kSplitMaxWarps * 32) hc_mixes_split_kernel(HcMixArgs a, int csize) {
  pdl_prologue();
  extern __shared__ float4 ssm[];
  const int64_t hc = a.hc, flat = hc * a.dim, n_mix = a.head_only ? hc : (2 + hc) * hc;
  const int m = int((flat + kSumChunk - 1) / kSumChunk);
  float* xs = reinterpret_cast<float*>(ssm);                        // [kSumChunk] x of the chunk
  double* sq = reinterpret_cast<double*>(xs + kSumChunk);           // [m] chunk sums of squares (rank 0)
  float* part = reinterpret_cast<float*>(sq + m);                   // [n_mix, m] chunk dots (rank 0)
  float* mu = part + n_mix * m;                                     // [n_mix]
  float* P = mu + n_mix;                                            // [hc, hc] (hc·hc > 32)
  const int64_t row = blockIdx.x / unsigned(csize);
  const int rank = int(blockIdx.x % unsigned(csize));
  const float* x = a.x + row * flat;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), n_warps = int(blockDim.x / 32);
  const int64_t items = n_mix + 1;
  namespace cg = cooperative_groups;
  double* sq0 = sq;
  float* part0 = part;
  bool started = csize == 1;  // every block of the cluster has started (its shared memory may be written)
  if (csize > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    sq0 = cluster.map_shared_rank(sq, 0), part0 = cluster.map_shared_rank(part, 0);
    cluster.barrier_arrive();  // waited for after the first loads are out
  }
  for (int c = rank; c < m; c += csize) {
    const int64_t off = int64_t(c) * kSumChunk, len = flat - off < kSumChunk ? flat - off : kSumChunk;
    if (c != rank) __syncthreads();  // every warp is done with the previous chunk's xs
    // The first item's fn loads go out before the x staging barrier (one round of memory latency).
    const bool fvec = len == kSumChunk && ((reinterpret_cast<uintptr_t>(a.fn) | uintptr_t(flat * 4)) & 15) == 0;
    float4 fv[8];
    if (fvec && warp >= 1 && warp < items) {
      const float* f = a.fn + int64_t(warp - 1) * flat + off + 4 * lane;
#pragma unroll
      for (int i = 0; i < 8; ++i) fv[i] = ld_weight(reinterpret_cast<const float4*>(f + 128 * i));
    }
    if (len == kSumChunk && (reinterpret_cast<uintptr_t>(x + off) & 15) == 0) {
      for (int i = int(threadIdx.x); i < kSumChunk / 4; i += int(blockDim.x))
        reinterpret_cast<float4*>(xs)[i] = reinterpret_cast<const float4*>(x + off)[i];  // plain: x step-written
    } else {
      for (int i = int(threadIdx.x); i < kSumChunk; i += int(blockDim.x)) xs[i] = i < len ? x[off + i] : 0.0f;
    }
    __syncthreads();
    if (!started) cg::this_cluster().barrier_wait(), started = true;
    for (int64_t item = warp; item < items; item += n_warps) {
      if (item == 0) {  // the chunk's double sum of squares
        double p[4] = {0, 0, 0, 0};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int k = 128 * i + 4 * lane + q;
            if (k < len) p[q] = __dadd_rn(p[q], __dmul_rn(double(xs[k]), double(xs[k])));
          }
        double v = __dadd_rn(__dadd_rn(p[0], p[1]), __dadd_rn(p[2], p[3]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) sq0[c] = v;
        continue;
      }
      const float* f = a.fn + (item - 1) * flat + off;
      float p0 = 0, p1 = 0, p2 = 0, p3 = 0;
      if (fvec) {
        if (item != warp) {  // a later item of this warp (n_mix + 1 > warps): its loads now
#pragma unroll
          for (int i = 0; i < 8; ++i) fv[i] = ld_weight(reinterpret_cast<const float4*>(f + 128 * i + 4 * lane));
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float4 xv = reinterpret_cast<const float4*>(xs)[32 * i + lane];
          p0 = mul_add(fv[i].x, xv.x, p0), p1 = mul_add(fv[i].y, xv.y, p1);
          p2 = mul_add(fv[i].z, xv.z, p2), p3 = mul_add(fv[i].w, xv.w, p3);
        }
      } else {
        for (int64_t i = 4 * lane; i < len; i += 128) {
          p0 = mul_add(f[i], xs[i], p0);
          if (i + 1 < len) p1 = mul_add(f[i + 1], xs[i + 1], p1);
          if (i + 2 < len) p2 = mul_add(f[i + 2], xs[i + 2], p2);
          if (i + 3 < len) p3 = mul_add(f[i + 3], xs[i + 3], p3);
        }
      }
      float v = __fadd_rn(__fadd_rn(p0, p1), __fadd_rn(p2, p3));
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
      if (lane == 0) part0[(item - 1) * m + c] = v;
    }
  }
  if (csize > 1) {
    if (!started) cg::this_cluster().barrier_wait();  // a block without chunks (csize > m)
    cg::this_cluster().sync();  // every chunk sum is in rank 0's shared memory
    if (rank != 0) return;
  } else {
    __syncthreads();
  }
  // The chunk trees: every warp folds the sums of squares itself (the same additions), then its
  // mixes' dots, a warp per mix.
  const double ss = __shfl_sync(0xffffffffu, warp_chunk_tree(lane < m ? sq[lane] : 0.0, m), 0);
  const float rs = hc_inv_rms(ss, flat, a.norm_eps);
  for (int64_t mix = warp; mix < n_mix; mix += n_warps) {
    const float d = warp_chunk_tree(lane < m ? part[mix * m + lane] : 0.0f, m);
    if (lane == 0) mu[mix] = __fmul_rn(d, rs);
  }
  __syncthreads();
  hc_mix_epilogue(a, mu, P, row);
}

// Row tiles (large M): the mix dots as a small FP32 GEMM [rows, flat] x [n_mix, flat]ᵀ in the
// exact chunked order of ops::dot_f32 (flat > kSumChunk), so that fn is read once per 16 rows
// instead of once per row. A 256-thread block owns 16 rows x 12 mixes; warp w computes rows
// 4(w % 4).. x mixes 6(w / 4).. with lane l holding partials 4l..4l+3 of a chunk (one float4
// column of each 128-wide slice, the 8 slices of a chunk in index order), so a chunk sum is
// warp_dot_chunk's (p0+p1)+(p2+p3) and xor butterfly. kSlices 128-column slices of the 16 x rows
// and 12 fn rows form one stage of a cp.async ring (one block barrier per stage); columns past
// flat are zero on both sides (a +0 product leaves a partial, never -0, unchanged). Chunk sums go
// to shared memory, the stride-doubling tree per (row, mix) follows, and the dot lands in its
// hc_dot_slot.
constexpr int kTileRows = 16, kTileMix = 12, kTileThreads = 256;
constexpr int kTileSlots = kTileRows + kTileMix;  // staged rows of one 128-column slice
constexpr int kTileSliceF4 = kTileSlots * 32;     // float4 per staged slice
// kHcTileMinRows: a row tile's CTA adds 16 rows x 12 mixes over the whole of flat; below ~256
// rows too few of them run to beat the split row kernel, whose clusters re-read fn per row.
constexpr int64_t kTileMaxChunks = 64, kHcTileMinRows = 256, kHcTileGroupMinRows = 16;
template <int kSlices>
struct HcTile {
  static constexpr int kStages = kSlices >= 4 ? 3 : 4;
  static constexpr int kStageF4 = kSlices * kTileSliceF4;
  static constexpr size_t kRingBytes = size_t(kStages) * kStageF4 * sizeof(float4);
};

// 16 bytes from src into shared address d; ok false: 16 zero bytes (source size 0, src not read).
__device__ __forceinline__ void hc_cp_async16_zfill(uint32_t d, const float* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(ok ? 16 : 0));
}

// Chunk groups (cpg < m): CTA (tile, mix block, group) adds chunks [group·cpg, +cpg) only and
// writes their sums to a.work [rows, n_mix, m]; hc_mix_tree_kernel then folds each (row, mix).
template <int kSlices>
__global__ void __launch_bounds__(kTileThreads, 1) hc_mix_dots_tiled_kernel(HcMixArgs a, int n_mix, int mix_blocks,
                                                                            int cpg) {
  pdl_prologue();
  using T = HcTile<kSlices>;
  extern __shared__ float4 tsm[];
  float4* ring = tsm;                                                // [stages][slices][slots][32]
  float* csum = reinterpret_cast<float*>(tsm + T::kStages * T::kStageF4);  // [16 x 12][m]
  const int64_t flat = a.hc * a.dim, m = (flat + kSumChunk - 1) / kSumChunk;
  const int64_t groups = (m + cpg - 1) / cpg, tm = blockIdx.x / groups, grp = blockIdx.x % groups;
  const int64_t c_lo = grp * cpg, c_hi = c_lo + cpg < m ? c_lo + cpg : m;
  const int64_t stages = c_hi * (8 / kSlices), st_lo = c_lo * (8 / kSlices);
  const int64_t row0 = (tm / mix_blocks) * kTileRows;
  const int mix0 = int(tm % mix_blocks) * kTileMix;
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid & 31;
  const int wr = (warp % 4) * 4, wm = (warp / 4) * 6;
  // Thread (warp g, lane q) copies float4 q of slots g, g + 8, g + 16, g + 24 (< kTileSlots) of
  // each staged slice: their row pointers are taken once, and a missing row or a column past flat
  // (flat % 4 == 0: whole float4s) is a zero-filling copy (cp.async with source size 0).
  constexpr int kSlotGroups = kTileThreads / 32, kSlotsPer = (kTileSlots + kSlotGroups - 1) / kSlotGroups;
  const float* src[kSlotsPer];
#pragma unroll
  for (int j = 0; j < kSlotsPer; ++j) {
    const int slot = warp + kSlotGroups * j;
    src[j] = nullptr;
    if (slot < kTileRows) {
      if (row0 + slot < a.rows) src[j] = a.x + (row0 + slot) * flat;
    } else if (slot < kTileSlots && mix0 + slot - kTileRows < n_mix) {
      src[j] = a.fn + int64_t(mix0 + slot - kTileRows) * flat;
    }
  }
  const uint32_t ring_s = uint32_t(__cvta_generic_to_shared(ring));
  auto load = [&](int64_t st) {  // stage st: columns [st·kSlices·128, +kSlices·128) into its slot
    if (st < stages) {
      const int64_t col0 = st * (kSlices * 128) + 4 * lane;
      const uint32_t buf = ring_s + uint32_t((st % T::kStages) * T::kStageF4 * 16);
#pragma unroll
      for (int sl = 0; sl < kSlices; ++sl)
#pragma unroll
        for (int j = 0; j < kSlotsPer; ++j) {
          const int slot = warp + kSlotGroups * j;
          if (kTileSlots % kSlotGroups == 0 || slot < kTileSlots) {
            const int64_t col = col0 + sl * 128;
            const bool ok = src[j] != nullptr && col < flat;
            hc_cp_async16_zfill(buf + uint32_t((sl * kTileSliceF4 + slot * 32 + lane) * 16), ok ? src[j] + col : a.fn, ok);
          }
        }
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };
  float acc[4][6][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 6; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;
  for (int st = 0; st < T::kStages - 1; ++st) load(st_lo + st);
  for (int64_t c = c_lo; c < c_hi; ++c) {
#pragma unroll 1
    for (int64_t st = c * (8 / kSlices); st < (c + 1) * (8 / kSlices); ++st) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(T::kStages - 2));
      __syncthreads();  // stage st is in; every warp is done with stage st - 1, whose slot is refilled
      load(st + T::kStages - 1);
#pragma unroll
      for (int sl = 0; sl < kSlices; ++sl) {  // the stage's slices in index order
        const float4* buf = ring + (st % T::kStages) * T::kStageF4 + sl * kTileSliceF4 + lane;
        float4 xv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) xv[i] = buf[(wr + i) * 32];
#pragma unroll
        for (int j = 0; j < 6; ++j) {
          const float4 f = buf[(kTileRows + wm + j) * 32];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[i][j][0] = mul_add(f.x, xv[i].x, acc[i][j][0]);
            acc[i][j][1] = mul_add(f.y, xv[i].y, acc[i][j][1]);
            acc[i][j][2] = mul_add(f.z, xv[i].z, acc[i][j][2]);
            acc[i][j][3] = mul_add(f.w, xv[i].w, acc[i][j][3]);
          }
        }
      }
    }
    // Chunk c complete: lane values, butterfly, chunk sum to shared memory.
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 6; ++j) {
        float v = __fadd_rn(__fadd_rn(acc[i][j][0], acc[i][j][1]), __fadd_rn(acc[i][j][2], acc[i][j][3]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) {
          const int64_t r = row0 + wr + i;
          const int mix = mix0 + wm + j;
          if (groups == 1) csum[((wr + i) * kTileMix + wm + j) * m + c] = v;
          else if (r < a.rows && mix < n_mix) a.work[(r * n_mix + mix) * m + c] = v;
        }
        acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
      }
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  if (groups > 1) return;  // hc_mix_tree_kernel folds the chunk sums
  __syncthreads();
  for (int o = tid; o < kTileRows * kTileMix; o += kTileThreads) {
    const int64_t r = row0 + o / kTileMix;
    const int mix = mix0 + o % kTileMix;
    if (r < a.rows && mix < n_mix) *hc_dot_slot(a, r, mix) = dev_chunk_tree(csum + int64_t(o) * m, m);
  }
}

// One thread per (row, mix): the stride-doubling tree over its m chunk sums into its slot.
__global__ void hc_mix_tree_kernel(HcMixArgs a, int n_mix) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= a.rows * n_mix) return;
  const int64_t m = (a.hc * a.dim + kSumChunk - 1) / kSumChunk;
  *hc_dot_slot(a, id / n_mix, id % n_mix) = dev_chunk_tree(a.work + id * m, m);
}

// Chunks per group for the tiled dots: one group while the tiles alone give ~2 CTAs per SM (or
// there is no workspace), else groups of chunks until they do.
int64_t hc_tile_cpg(const HcMixArgs& a, int64_t n_mix, int64_t m) {
  if (!a.work) return m;
  const int64_t tiles = (a.rows + kTileRows - 1) / kTileRows * ((n_mix + kTileMix - 1) / kTileMix);
  const int64_t want = (2 * int64_t(device_sm_count()) + tiles - 1) / tiles;  // groups
  if (want <= 1) return m;
  const int64_t g = want < m ? want : m;
  return (m + g - 1) / g;
}

template <int kSlices>
cudaError_t launch_hc_mix_dots_tiled(const HcMixArgs& a, int64_t n_mix, int64_t m, cudaStream_t s) {
  const int mix_blocks = int((n_mix + kTileMix - 1) / kTileMix);
  const int64_t cpg = hc_tile_cpg(a, n_mix, m), groups = (m + cpg - 1) / cpg;
  const int64_t blocks = (a.rows + kTileRows - 1) / kTileRows * mix_blocks * groups;
  const size_t smem = HcTile<kSlices>::kRingBytes + size_t(kTileRows * kTileMix * m) * sizeof(float);
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  // Set on every launch: the attribute belongs to the current device (TP ranks run on several).
  const cudaError_t e = cudaFuncSetAttribute(hc_mix_dots_tiled_kernel<kSlices>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const cudaError_t d = launch_kernel(hc_mix_dots_tiled_kernel<kSlices>, unsigned(blocks), kTileThreads, smem, s, a,
                                      int(n_mix), mix_blocks, int(cpg));
  if (d != cudaSuccess || groups == 1) return d;
  return launch_kernel(hc_mix_tree_kernel, blocks_for(a.rows * n_mix, 256), 256, 0, s, a, int(n_mix));
}

__global__ void hc_collapse_kernel(const float* x, const float* pre, float* u, int64_t rows, int64_t hc,
                                   int64_t dim, bool bf16) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * dim) return;
  const int64_t r = id / dim, d = id % dim;
  float s = 0;
  for (int64_t i = 0; i < hc; ++i) s = mul_add(pre[r * hc + i], x[(r * hc + i) * dim + d], s);
  u[id] = bf16 ? dev_round_bf16(s) : s;
}

constexpr int kMaxHc = 16;
__global__ void hc_post_kernel(const float* f, float* x, const float* post, const float* comb, int64_t rows,
                               int64_t hc, int64_t dim, bool bf16) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * dim) return;
  const int64_t r = id / dim, d = id % dim;
  float xs[kMaxHc], out[kMaxHc];
  for (int64_t j = 0; j < hc; ++j) xs[j] = x[(r * hc + j) * dim + d];
  const float* P = comb + r * hc * hc;
  for (int64_t k = 0; k < hc; ++k) {
    float s = __fmul_rn(post[r * hc + k], f[r * dim + d]);
    for (int64_t j = 0; j < hc; ++j) s = mul_add(P[j * hc + k], xs[j], s);
    out[k] = bf16 ? dev_round_bf16(s) : s;
  }
  for (int64_t k = 0; k < hc; ++k) x[(r * hc + k) * dim + d] = out[k];
}

// Stream k of one column after the update: post_k · fv + Σ_j comb[j][k] · xs[j] in ops::hc_post's
// order (P: the row's comb [HC, HC]; xs: the column's streams before the update).
template <int HC>
__device__ __forceinline__ float hc_post_value(const float* P, float post_k, const float (&xs)[HC], float fv, int k,
                                               bool bf16) {
  float s = __fmul_rn(post_k, fv);
#pragma unroll
  for (int j = 0; j < HC; ++j) s = mul_add(P[j * HC + k], xs[j], s);
  return bf16 ? dev_round_bf16(s) : s;
}

// Column d of row r's HC streams ← post ⊗ fv + combᵀ xs (ops::hc_post's order), xs their values
// before the update.
template <int HC>
__device__ __forceinline__ void hc_post_column(float* x, const float* post, const float* comb, int64_t r, int64_t dim,
                                               int64_t d, const float (&xs)[HC], float fv, bool bf16) {
  const float* P = comb + r * HC * HC;
  float out[HC];
#pragma unroll
  for (int k = 0; k < HC; ++k) out[k] = hc_post_value<HC>(P, post[r * HC + k], xs, fv, k, bf16);
#pragma unroll
  for (int k = 0; k < HC; ++k) x[(r * HC + k) * dim + d] = out[k];
}

// hc_post_kernel with the stream count known at compile time (the configs' hc_mult 4): the streams
// in registers instead of local-memory arrays, row blockIdx.x and columns over blockIdx.y (no
// 64-bit division per element); the same operations in the same order, so the same bits.
template <int HC>
__global__ void hc_post_fixed_kernel(const float* f, float* x, const float* post, const float* comb, int64_t dim,
                                     bool bf16) {
  pdl_prologue();
  const int64_t r = blockIdx.x, d = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (d >= dim) return;
  float xs[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) xs[j] = x[(r * HC + j) * dim + d];
  hc_post_column<HC>(x, post, comb, r, dim, d, xs, f[r * dim + d], bf16);
}

// The MoE combine of (row t, column d) in slot order (ops::moe_combine before its rounding): row_of
// maps pair (t, k) to its row of y (outputs in expert-sorted order), else t·K + k; a negative row
// (another rank's expert) adds +0, as the exactness path writes such an output.
// W adjacent columns d.. at once (W = 4: one 16-byte load per source row; the four-column kernels).
template <int W>
__device__ __forceinline__ void load_cols(const float* p, float (&v)[W]) {
  if constexpr (W == 4) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
  } else {
#pragma unroll
    for (int c = 0; c < W; ++c) v[c] = p[c];
  }
}
template <int W>
__device__ __forceinline__ void moe_combine_sum_cols(const float* y, const float* ys, const int32_t* row_of, int64_t t,
                                                     int64_t K, int64_t dim, int64_t d, float (&s)[W]) {
#pragma unroll
  for (int c = 0; c < W; ++c) s[c] = 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t r = row_of ? int64_t(row_of[t * K + k]) : t * K + k;
    float v[W];
#pragma unroll
    for (int c = 0; c < W; ++c) v[c] = 0.0f;
    if (r >= 0) load_cols<W>(y + r * dim + d, v);
#pragma unroll
    for (int c = 0; c < W; ++c) s[c] += v[c];
  }
  float b[W];
  load_cols<W>(ys + t * dim + d, b);
#pragma unroll
  for (int c = 0; c < W; ++c) s[c] = s[c] + b[c];
}
__device__ __forceinline__ float moe_combine_sum(const float* y, const float* ys, const int32_t* row_of, int64_t t,
                                                 int64_t K, int64_t dim, int64_t d) {
  float s[1];
  moe_combine_sum_cols<1>(y, ys, row_of, t, K, dim, d, s);
  return s[0];
}

// moe_combine_kernel's value for (row t, column d), stored to out, then hc_post_fixed_kernel's
// update of the HC streams from it: the two kernels' expressions in their order.
template <int HC>
__global__ void moe_combine_post_kernel(const float* y, const float* ys, float* out, int64_t K, int64_t dim, bool bf16,
                                        const int32_t* row_of, float* x, const float* post, const float* comb,
                                        bool post_bf16) {
  pdl_prologue();
  const int64_t t = blockIdx.x, d = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (d >= dim) return;
  float xs[HC];
#pragma unroll
  for (int j = 0; j < HC; ++j) xs[j] = x[(t * HC + j) * dim + d];  // issued before the combine's loads
  const float s = moe_combine_sum(y, ys, row_of, t, K, dim, d);
  const float fv = bf16 ? dev_round_bf16(s) : s;
  out[t * dim + d] = fv;
  hc_post_column<HC>(x, post, comb, t, dim, d, xs, fv, post_bf16);
}

// hc_post, then the next sublayer's mixes of the updated streams, in one launch (decode rows; hc
// 4, dim a multiple of kSumChunk, at most kSplitMaxChunks chunks). Grid: rows x dim / kSumChunk x 4
// blocks, a cluster per column block: block (row r, column block b, rank i) owns stream i's
// columns [b·kSumChunk, +kSumChunk), which are the row's flat chunk c = i·dim / kSumChunk + b. It
// reads the column block of all four streams and f, forms its stream's update (hc_post_value, as
// hc_post_fixed_kernel) into shared memory and, once every block of its cluster has read the old
// streams (the cluster barrier), stores it. Its warps then take the chunk's items as
// hc_mixes_split_kernel's do (warp 0 the double sum of squares, warp 1 + j mix j's dot: the same
// lane partials and butterfly) and store the chunk sums to `work`; the row's last block to finish
// (a ticket per row, reset by that block) folds them in the chunk tree, scales them and runs the
// epilogue as the split kernel's rank 0 does. So the same bits as hc_post then hc_mixes. The mixes'
// fn rows are weights: each warp requests its row's chunk before the PDL wait. With p.y the
// update's f is the MoE combine of those columns (moe_combine_post_kernel's sum and rounding; the
// rank-0 block stores it to p.out), so the launch is moe_combine_post then the mixes.
constexpr int kPmHc = 4, kPmMix = (2 + kPmHc) * kPmHc, kPmWarps = kPmMix + 1;
// Block (row r, column block b, rank i) of hc_post_mixes_kernel's grid and its flat chunk c.
struct PmBlock {
  int i, b, c;
  int64_t r;
  __device__ __forceinline__ explicit PmBlock(int64_t dim) {
    const unsigned nb = unsigned(dim / kSumChunk);
    i = int(blockIdx.x % kPmHc), b = int(blockIdx.x / kPmHc % nb), r = int64_t(blockIdx.x / (kPmHc * nb));
    c = i * int(nb) + b;
  }
};
struct PmFn {
  float4 v[8];
};
__global__ void __launch_bounds__(kPmWarps * 32) hc_post_mixes_kernel(HcPostMixArgs p) {
  const PmFn fn = pdl_prologue([&] {  // warp w >= 1: its mix's fn row over the block's chunk
    PmFn v{};
    const int w = int(threadIdx.x / 32);
    if (w >= 1) {
      const int64_t flat = kPmHc * p.mix.dim;
      const int64_t off = int64_t(PmBlock(p.mix.dim).c) * kSumChunk;
      const float* fr = p.mix.fn + int64_t(w - 1) * flat + off + 4 * (threadIdx.x & 31);
#pragma unroll
      for (int s = 0; s < 8; ++s) v.v[s] = ld_weight(reinterpret_cast<const float4*>(fr + 128 * s));
    }
    return v;
  });
  const float4 (&fv)[8] = fn.v;
  constexpr int HC = kPmHc;
  const HcMixArgs& a = p.mix;
  const int64_t dim = a.dim, flat = HC * dim;
  const int m = int(HC * (dim / kSumChunk));
  const PmBlock blk(dim);
  const int i = blk.i, c = blk.c;
  const int64_t r = blk.r, d0 = int64_t(blk.b) * kSumChunk;
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), t = int(threadIdx.x);
  __shared__ __align__(16) float xn[kSumChunk];
  __shared__ float mu[kPmMix];
  __shared__ bool last;
  namespace cg = cooperative_groups;
  float4 out = make_float4(0, 0, 0, 0);
  if (t < kSumChunk / 4) {  // plain loads: x, f, post and comb are step-written
    const int64_t d = d0 + 4 * t;
    float4 s4[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) s4[j] = *reinterpret_cast<const float4*>(p.x + (r * HC + j) * dim + d);
    float4 f4;
    if (p.y) {
      float fv[4];
      moe_combine_sum_cols<4>(p.y, p.ys, p.row_of, r, p.K, dim, d, fv);
#pragma unroll
      for (int q = 0; q < 4; ++q) fv[q] = p.combine_bf16 ? dev_round_bf16(fv[q]) : fv[q];
      f4 = make_float4(fv[0], fv[1], fv[2], fv[3]);
      if (i == 0) *reinterpret_cast<float4*>(p.out + r * dim + d) = f4;
    } else {
      f4 = *reinterpret_cast<const float4*>(p.f + r * dim + d);
    }
    const float* P = p.comb + r * HC * HC;
    const float pk = p.post[r * HC + i];
    const float xs0[HC] = {s4[0].x, s4[1].x, s4[2].x, s4[3].x}, xs1[HC] = {s4[0].y, s4[1].y, s4[2].y, s4[3].y};
    const float xs2[HC] = {s4[0].z, s4[1].z, s4[2].z, s4[3].z}, xs3[HC] = {s4[0].w, s4[1].w, s4[2].w, s4[3].w};
    out.x = hc_post_value<HC>(P, pk, xs0, f4.x, i, p.bf16);
    out.y = hc_post_value<HC>(P, pk, xs1, f4.y, i, p.bf16);
    out.z = hc_post_value<HC>(P, pk, xs2, f4.z, i, p.bf16);
    out.w = hc_post_value<HC>(P, pk, xs3, f4.w, i, p.bf16);
    reinterpret_cast<float4*>(xn)[t] = out;
  }
  cg::this_cluster().sync();  // the cluster's blocks have read the old streams; xn is complete
  if (t < kSumChunk / 4) *reinterpret_cast<float4*>(p.x + (r * HC + i) * dim + d0 + 4 * t) = out;
  double* wsq = reinterpret_cast<double*>(p.work) + r * m;               // [rows][m]
  float* wpart = p.work + 2 * a.rows * m + r * int64_t(kPmMix) * m;      // [rows][n_mix][m]
  if (warp == 0) {  // the chunk's double sum of squares (xn: 16-byte aligned, a whole chunk)
    const double v = warp_sumsq_chunk(xn, kSumChunk);
    if (lane == 0) wsq[c] = v;
  } else {  // mix warp - 1's chunk dot
    float4 xv[8];
#pragma unroll
    for (int s = 0; s < 8; ++s) xv[s] = reinterpret_cast<const float4*>(xn)[32 * s + lane];
    const float v = warp_dot_chunk_f4(fv, xv);
    if (lane == 0) wpart[(warp - 1) * m + c] = v;
  }
  if (lane == 0) __threadfence();  // the chunk sum is visible to the row's last block
  __syncthreads();
  if (t == 0) last = atomicAdd(p.tickets + r, 1) == m - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The row's last block: the chunk trees, the scaling, then the epilogue (the split kernel's rank 0).
  const double ss = __shfl_sync(0xffffffffu, warp_chunk_tree(lane < m ? __ldcg(wsq + lane) : 0.0, m), 0);
  const float rs = hc_inv_rms(ss, flat, a.norm_eps);
  if (warp < kPmMix) {
    const float dsum = warp_chunk_tree(lane < m ? __ldcg(wpart + warp * m + lane) : 0.0f, m);
    if (lane == 0) mu[warp] = __fmul_rn(dsum, rs);
  }
  if (t == 0) p.tickets[r] = 0;  // for the next launch (the row's other blocks are done with it)
  __syncthreads();
  hc_mix_epilogue(a, mu, xn, r);
}

__global__ void embed_kernel(const float* embed, const int32_t* tokens, float* X, int64_t T, int64_t hc,
                             int64_t dim) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * hc * dim) return;
  const int64_t t = id / (hc * dim), d = id % dim;
  X[id] = embed[int64_t(tokens[t]) * dim + d];
}

template <WeightDtype F>
__global__ void embed_typed_kernel(WeightRef w, const int32_t* tokens, float* X, int64_t T, int64_t hc, int64_t dim) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * hc * dim) return;
  const int64_t t = id / (hc * dim), d = id % dim;
  X[id] = RowReader<F>(w, 0, w.row0 + int64_t(tokens[t]))(d);
}

// The chunked dot of (a ⊙ b) with c over one chunk by a whole warp: a·b rounded to FP32 first (the
// CPU materialises it), then the order of warp_dot_chunk.
__device__ __forceinline__ float warp_dot3_chunk(const float* a, const float* b, const float* c, int64_t len) {
  const int lane = int(threadIdx.x & 31);
  float p0 = 0, p1 = 0, p2 = 0, p3 = 0;
  for (int64_t i = 4 * lane; i < len; i += 128) {
    p0 = mul_add(__fmul_rn(a[i], b[i]), c[i], p0);
    if (i + 1 < len) p1 = mul_add(__fmul_rn(a[i + 1], b[i + 1]), c[i + 1], p1);
    if (i + 2 < len) p2 = mul_add(__fmul_rn(a[i + 2], b[i + 2]), c[i + 2], p2);
    if (i + 3 < len) p3 = mul_add(__fmul_rn(a[i + 3], b[i + 3]), c[i + 3], p3);
  }
  float v = __fadd_rn(__fadd_rn(p0, p1), __fadd_rn(p2, p3));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

constexpr int64_t kEngramMaxChunks = 64;  // dim <= 64 · kSumChunk (launch_engram_gate checks)

// One block per (row, stream), in ops::engram_gate's orders (sum_order.h): the sums of squares by
// warps over 1024-element chunks combined by the chunk tree (a short row is one chunk); the dot
// the same way for rows longer than kSumChunk, else by thread 0 (dot_f32's eight partial sums);
// then the gated update.
__global__ void engram_gate_kernel(float* xall, const float* kvall, const float* wqk, int64_t hc, int64_t dim,
                                   float eps, bool bf16) {
  pdl_prologue();
  __shared__ float gate;
  __shared__ double csx[kEngramMaxChunks], csk[kEngramMaxChunks];
  __shared__ float cdot[kEngramMaxChunks];
  const int64_t r = blockIdx.x / hc, c = blockIdx.x % hc;
  float* x = xall + (r * hc + c) * dim;
  const float* kv = kvall + r * (hc + 1) * dim;
  const float* key = kv + c * dim;
  const float* w = wqk + c * dim;
  const int64_t m = (dim + kSumChunk - 1) / kSumChunk;
  for (int64_t ch = threadIdx.x / 32; ch < m; ch += blockDim.x / 32) {
    const int64_t off = ch * kSumChunk, len = dim - off < kSumChunk ? dim - off : kSumChunk;
    const double vx = warp_sumsq_chunk(x + off, len), vk = warp_sumsq_chunk(key + off, len);
    const float vd = dim > kSumChunk ? warp_dot3_chunk(x + off, w + off, key + off, len) : 0.0f;
    if ((threadIdx.x & 31) == 0) csx[ch] = vx, csk[ch] = vk, cdot[ch] = vd;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const double sxx = dev_chunk_tree(csx, m), skk = dev_chunk_tree(csk, m);
    float dotv = 0;
    if (dim > kSumChunk) {
      dotv = dev_chunk_tree(cdot, m);
    } else {
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t i = 0; i < dim; ++i) s[i % 8] = mul_add(__fmul_rn(x[i], w[i]), key[i], s[i % 8]);
      dotv = __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[4]), __fadd_rn(s[2], s[6])),
                       __fadd_rn(__fadd_rn(s[1], s[5]), __fadd_rn(s[3], s[7])));
    }
    const float rx = 1.0f / sqrtf(__fadd_rn(float(sxx / double(dim)), eps));
    const float rk = 1.0f / sqrtf(__fadd_rn(float(skk / double(dim)), eps));
    const float z = __fmul_rn(__fmul_rn(dotv, rx), rk) / sqrtf(float(dim));
    const float sq = copysignf(sqrtf(fmaxf(fabsf(z), 1e-6f)), z);
    gate = 1.0f / (1.0f + dev_exp(-sq));
  }
  __syncthreads();
  const float* value = kv + hc * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = mul_add(gate, value[i], x[i]);
    x[i] = bf16 ? dev_round_bf16(v) : v;
  }
}

__global__ void ring_write_kernel(float* ring, const float* kv, const int64_t* pos, int64_t t0, int64_t T,
                                  int64_t ring_size, int64_t dim) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= (T - t0) * dim) return;
  const int64_t t = t0 + id / dim, d = id % dim;
  ring[(pos[t] % ring_size) * dim + d] = kv[t * dim + d];
}

__global__ void add_ape_kernel(float* z, const float* ape, const int64_t* pos, int64_t T, int64_t width,
                               int64_t ratio) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * width) return;
  const int64_t t = id / width, j = id % width;
  z[id] += ape[(pos[t] % ratio) * width + j];
}

__global__ void softmax_pool_kernel(const float* const* v, const float* const* z, int64_t n_slots, int64_t dim,
                                    float* out) {
  pdl_prologue();
  const int64_t g = blockIdx.y, d = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= dim) return;
  const float* const* vs = v + g * n_slots;
  const float* const* zs = z + g * n_slots;
  float m = -INFINITY;
  for (int64_t s = 0; s < n_slots; ++s)
    if (zs[s]) m = fmaxf(m, zs[s][d]);
  float den = 0;
  for (int64_t s = 0; s < n_slots; ++s)
    if (zs[s]) den += dev_exp(zs[s][d] - m);
  float acc = 0;
  for (int64_t s = 0; s < n_slots; ++s)
    if (zs[s]) acc = mul_add(dev_exp(zs[s][d] - m) / den, vs[s][d], acc);
  out[g * dim + d] = acc;
}

// ops::swiglu's value (the clamp when limit > 0, then silu(g) · u · w, unfused), BF16-rounded when asked.
__device__ __forceinline__ float dev_swiglu(float gv, float uv, float limit, float w, bool bf16) {
  if (limit > 0) {
    gv = fminf(gv, limit);
    uv = fminf(fmaxf(uv, -limit), limit);
  }
  const float v = __fmul_rn(__fmul_rn(gv / (1.0f + dev_exp(-gv)), uv), w);
  return bf16 ? dev_round_bf16(v) : v;
}

__global__ void swiglu_kernel(const float* g, const float* u, float* h, const float* weight, int64_t rows,
                              int64_t n, float limit, bool bf16) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * n) return;
  h[id] = dev_swiglu(g[id], u[id], limit, weight ? weight[id / n] : 1.0f, bf16);
}

__global__ void moe_combine_kernel(const float* y, const float* ys, float* out, int64_t T, int64_t K,
                                   int64_t dim, bool bf16, const int32_t* row_of) {
  pdl_prologue();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= T * dim) return;
  const float s = moe_combine_sum(y, ys, row_of, id / dim, K, dim, id % dim);
  out[id] = bf16 ? dev_round_bf16(s) : s;
}

// Four adjacent columns per thread (prefill-sized launches, launch_* below): the elementwise
// kernels above with 16-byte loads and stores, the row and column taken once per four values
// instead of a 64-bit division per value, and a row's per-row operands (mixes, routing weight)
// loaded once for the four. Every value gets the scalar kernel's operations in its order, so
// the same bits; the scalar kernels stay for small launches (decode), unaligned operands and
// widths that are not a multiple of 4.
constexpr int kVecThreads = 256;
constexpr int64_t kVecMinValues = int64_t(1) << 20;  // below: the scalar kernels (decode-sized launches)
__device__ __forceinline__ void st4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

// hc_collapse_kernel, hc known: row blockIdx.x, columns 4·(blockIdx.y·blockDim.x + threadIdx.x)..
template <int HC>
__global__ void __launch_bounds__(kVecThreads) hc_collapse_vec_kernel(const float* x, const float* pre, float* u,
                                                                      int64_t dim, bool bf16) {
  pdl_prologue();
  const int64_t r = blockIdx.x, d = 4 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (d >= dim) return;
  float xs[HC][4], p[HC];
#pragma unroll
  for (int i = 0; i < HC; ++i) load_cols<4>(x + (r * HC + i) * dim + d, xs[i]), p[i] = pre[r * HC + i];
  float o[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    float s = 0;
#pragma unroll
    for (int i = 0; i < HC; ++i) s = mul_add(p[i], xs[i][c], s);
    o[c] = bf16 ? dev_round_bf16(s) : s;
  }
  st4(u + r * dim + d, o);
}

// Columns d..d+3 of row r's HC streams ← post ⊗ fv + combᵀ xs, hc_post_column's expressions per
// column (xs[j][c]: stream j, column d + c, before the update).
template <int HC>
__device__ __forceinline__ void hc_post_columns4(float* x, const float* post, const float* comb, int64_t r,
                                                 int64_t dim, int64_t d, const float (&xs)[HC][4],
                                                 const float (&fv)[4], bool bf16) {
  float pc[HC * HC], po[HC];  // the row's mixes, loaded once for the four columns
#pragma unroll
  for (int k = 0; k < HC; ++k) po[k] = post[r * HC + k];
#pragma unroll
  for (int i = 0; i < HC * HC; ++i) pc[i] = comb[r * HC * HC + i];
#pragma unroll
  for (int k = 0; k < HC; ++k) {
    float o[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float col[HC];
#pragma unroll
      for (int j = 0; j < HC; ++j) col[j] = xs[j][c];
      o[c] = hc_post_value<HC>(pc, po[k], col, fv[c], k, bf16);
    }
    st4(x + (r * HC + k) * dim + d, o);
  }
}

// hc_post_fixed_kernel, four columns per thread.
template <int HC>
__global__ void __launch_bounds__(kVecThreads) hc_post_vec_kernel(const float* f, float* x, const float* post,
                                                                  const float* comb, int64_t dim, bool bf16) {
  pdl_prologue();
  const int64_t r = blockIdx.x, d = 4 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (d >= dim) return;
  float xs[HC][4], fv[4];
#pragma unroll
  for (int j = 0; j < HC; ++j) load_cols<4>(x + (r * HC + j) * dim + d, xs[j]);
  load_cols<4>(f + r * dim + d, fv);
  hc_post_columns4<HC>(x, post, comb, r, dim, d, xs, fv, bf16);
}

// swiglu_kernel, values 4·id.. of the flat [rows, n] (n % 4 == 0: one row).
__global__ void __launch_bounds__(kVecThreads) swiglu_vec_kernel(const float* g, const float* u, float* h,
                                                                 const float* weight, int64_t rows, int64_t n,
                                                                 float limit, bool bf16) {
  pdl_prologue();
  const int64_t i0 = 4 * (int64_t(blockIdx.x) * blockDim.x + threadIdx.x);
  if (i0 >= rows * n) return;
  float gv[4], uv[4], o[4];
  load_cols<4>(g + i0, gv);
  load_cols<4>(u + i0, uv);
  const float w = weight ? weight[i0 / n] : 1.0f;
#pragma unroll
  for (int c = 0; c < 4; ++c) o[c] = dev_swiglu(gv[c], uv[c], limit, w, bf16);
  st4(h + i0, o);
}

// moe_combine_kernel, row blockIdx.x, four columns per thread.
__global__ void __launch_bounds__(kVecThreads) moe_combine_vec_kernel(const float* y, const float* ys, float* out,
                                                                      int64_t K, int64_t dim, bool bf16,
                                                                      const int32_t* row_of) {
  pdl_prologue();
  const int64_t t = blockIdx.x, d = 4 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (d >= dim) return;
  float s[4];
  moe_combine_sum_cols<4>(y, ys, row_of, t, K, dim, d, s);
#pragma unroll
  for (int c = 0; c < 4; ++c) s[c] = bf16 ? dev_round_bf16(s[c]) : s[c];
  st4(out + t * dim + d, s);
}

// moe_combine_post_kernel, four columns per thread.
template <int HC>
__global__ void __launch_bounds__(kVecThreads) moe_combine_post_vec_kernel(const float* y, const float* ys, float* out,
                                                                           int64_t K, int64_t dim, bool bf16,
                                                                           const int32_t* row_of, float* x,
                                                                           const float* post, const float* comb,
                                                                           bool post_bf16) {
  pdl_prologue();
  const int64_t t = blockIdx.x, d = 4 * (int64_t(blockIdx.y) * blockDim.x + threadIdx.x);
  if (d >= dim) return;
  float xs[HC][4];
#pragma unroll
  for (int j = 0; j < HC; ++j) load_cols<4>(x + (t * HC + j) * dim + d, xs[j]);  // issued before the combine's loads
  float fv[4];
  moe_combine_sum_cols<4>(y, ys, row_of, t, K, dim, d, fv);
#pragma unroll
  for (int c = 0; c < 4; ++c) fv[c] = bf16 ? dev_round_bf16(fv[c]) : fv[c];
  st4(out + t * dim + d, fv);
  hc_post_columns4<HC>(x, post, comb, t, dim, d, xs, fv, post_bf16);
}

// Grouping routed pairs by expert, a stable counting sort. One block (few pairs): expert counts
// (shared atomics: order-free), an exclusive scan by thread 0, then the stable scatter
// (moe_scatter_tiles). Many pairs (launch_moe_group with counts scratch): chunks of kMoeGroupChunk
// pairs, one block each: moe_count_kernel writes each chunk's expert counts, then
// moe_scatter_kernel gives every block its experts' first positions (the experts' totals scanned,
// plus the earlier chunks' pairs of the same expert) and scatters its chunk: the same positions.
constexpr int kMoeGroupThreads = 256;
constexpr int64_t kMoeGroupMaxExperts = 4096;
constexpr int kMoeGroupChunk = 2048;
constexpr int kMoeScanItems = int(kMoeGroupMaxExperts) / kMoeGroupThreads;  // experts per thread in the scan

// The stable scatter of pairs [begin, end) over tiles of kMoeGroupThreads consecutive pairs, next[e]
// holding expert e's next sorted position: a pair's position is its expert's offset plus the number
// of lower-indexed pairs of the tile with the same expert; the last such pair of the tile then
// moves the offset past them.
__device__ void moe_scatter_tiles(const int32_t* sel, const float* weight, int begin, int end, int n_experts, int k,
                                  int32_t* next, int32_t* tile, int32_t* pair_row, float* sorted_weight,
                                  int32_t* slot_pos) {
  for (int base = begin; base < end; base += blockDim.x) {
    const int p = base + int(threadIdx.x);
    const int e = p < end ? sel[p] : -1;
    const bool ok = e >= 0 && e < n_experts;
    if (!ok && p < end) slot_pos[p] = -1;  // no sorted row: the combine adds +0 for it
    tile[threadIdx.x] = ok ? e : -1;
    __syncthreads();
    int rank = 0;  // earlier pairs of this tile with the same expert
    if (ok)
      for (int j = 0; j < int(threadIdx.x); ++j) rank += tile[j] == e;
    if (ok) {
      const int s = next[e] + rank;
      pair_row[s] = p / k;
      sorted_weight[s] = weight[p];
      slot_pos[p] = s;
    }
    __syncthreads();  // every thread has read next[] for this tile
    if (ok) {
      // The last pair of each expert in the tile moves the expert's offset past the tile's pairs.
      bool last = true;
      for (int j = int(threadIdx.x) + 1; j < kMoeGroupThreads && base + j < end; ++j)
        if (tile[j] == e) {
          last = false;
          break;
        }
      if (last) next[e] += rank + 1;
    }
    __syncthreads();
  }
}

// The expert counts of pairs [begin, end) into the block's shared c[n_experts] (zeroed here;
// shared atomics, order-free); an id out of range sets *bad (nullable). Ends with a block barrier.
__device__ void moe_count_range(const int32_t* sel, int begin, int end, int n_experts, int32_t* c, int32_t* bad) {
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) c[e] = 0;
  __syncthreads();
  for (int p = begin + int(threadIdx.x); p < end; p += blockDim.x) {
    const int e = sel[p];
    if (e < 0 || e >= n_experts) {
      if (bad) *bad = 1;
    } else {
      atomicAdd(&c[e], 1);
    }
  }
  __syncthreads();
}

// cstart / cexpert (nullable): the compact lists of cslots groups (launch_moe_group's `compact`).
// The expert offsets and the compact slots come from two block scans (thread t owns experts
// t · kMoeScanItems ..): integer sums, so the same lists as one thread walking the experts.
__global__ void __launch_bounds__(kMoeGroupThreads) moe_group_kernel(const int32_t* sel, const float* weight,
                                                                   int n_pairs, int n_experts, int k,
                                                                   int32_t* group_start, int32_t* pair_row,
                                                                   float* sorted_weight, int32_t* slot_pos, int32_t* bad,
                                                                   int32_t* cstart, int32_t* cexpert, int cslots) {
  pdl_prologue();
  using Scan = cub::BlockScan<int32_t, kMoeGroupThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int32_t next[kMoeGroupMaxExperts];
  __shared__ int32_t tile[kMoeGroupThreads];
  moe_count_range(sel, 0, n_pairs, n_experts, next, bad);
  int32_t pos[kMoeScanItems], slot[kMoeScanItems];
#pragma unroll
  for (int i = 0; i < kMoeScanItems; ++i) {
    const int e = int(threadIdx.x) * kMoeScanItems + i;
    pos[i] = e < n_experts ? next[e] : 0;
    slot[i] = pos[i] > 0 ? 1 : 0;
  }
  int32_t total = 0, used = 0;
  Scan(scan_tmp).ExclusiveSum(pos, pos, total);  // pos[i]: the first sorted position of expert e
  __syncthreads();                               // scan_tmp is reused
  Scan(scan_tmp).ExclusiveSum(slot, slot, used);  // slot[i]: expert e's compact slot when it has pairs
#pragma unroll
  for (int i = 0; i < kMoeScanItems; ++i) {
    const int e = int(threadIdx.x) * kMoeScanItems + i;
    if (e >= n_experts) continue;
    // (next[e] still holds the count: expert e has pairs iff the next offset moved.)
    const bool has = next[e] > 0;
    if (cstart && has && slot[i] < cslots) cstart[slot[i]] = pos[i], cexpert[slot[i]] = e;  // the launch checked
    group_start[e] = pos[i];
  }
  __syncthreads();  // every count was read before next[] becomes the offsets
#pragma unroll
  for (int i = 0; i < kMoeScanItems; ++i) {
    const int e = int(threadIdx.x) * kMoeScanItems + i;
    if (e < n_experts) next[e] = pos[i];
  }
  if (threadIdx.x == 0) group_start[n_experts] = total;
  if (cstart) {
    for (int g = min(used, cslots) + int(threadIdx.x); g < cslots; g += kMoeGroupThreads) cstart[g] = total, cexpert[g] = -1;
    if (threadIdx.x == 0) cstart[cslots] = total;
  }
  __syncthreads();
  moe_scatter_tiles(sel, weight, 0, n_pairs, n_experts, k, next, tile, pair_row, sorted_weight, slot_pos);
}

// counts[b · n_experts + e]: pairs of chunk b routed to expert e.
__global__ void moe_count_kernel(const int32_t* sel, int n_pairs, int n_experts, int32_t* counts, int32_t* bad) {
  pdl_prologue();
  __shared__ int32_t c[kMoeGroupMaxExperts];
  const int begin = int(blockIdx.x) * kMoeGroupChunk;
  moe_count_range(sel, begin, min(begin + kMoeGroupChunk, n_pairs), n_experts, c, bad);
  for (int e = threadIdx.x; e < n_experts; e += blockDim.x) counts[int64_t(blockIdx.x) * n_experts + e] = c[e];
}

__global__ void __launch_bounds__(kMoeGroupThreads) moe_scatter_kernel(const int32_t* sel, const float* weight,
                                                                     int n_pairs, int n_experts, int k,
                                                                     const int32_t* counts, int32_t* group_start,
                                                                     int32_t* pair_row, float* sorted_weight,
                                                                     int32_t* slot_pos) {
  pdl_prologue();
  using Scan = cub::BlockScan<int32_t, kMoeGroupThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int32_t next[kMoeGroupMaxExperts];
  __shared__ int32_t tile[kMoeGroupThreads];
  const int b = int(blockIdx.x), nb = int(gridDim.x);
  // Thread t owns experts t · kMoeScanItems .. + kMoeScanItems - 1 (blocked, for the scan): their
  // totals over all chunks, and in next[] the pairs of the chunks before this one.
  int32_t total[kMoeScanItems];
#pragma unroll
  for (int i = 0; i < kMoeScanItems; ++i) {
    const int e = int(threadIdx.x) * kMoeScanItems + i;
    int32_t t = 0, before = 0;
    if (e < n_experts)
      for (int bb = 0; bb < nb; ++bb) {
        const int32_t c = counts[int64_t(bb) * n_experts + e];
        t += c;
        before += bb < b ? c : 0;
      }
    total[i] = t;
    if (e < n_experts) next[e] = before;
  }
  int32_t sum = 0;
  Scan(scan_tmp).ExclusiveSum(total, total, sum);
#pragma unroll
  for (int i = 0; i < kMoeScanItems; ++i) {
    const int e = int(threadIdx.x) * kMoeScanItems + i;
    if (e < n_experts) {
      next[e] += total[i];
      if (b == 0) group_start[e] = total[i];
    }
  }
  if (b == 0 && threadIdx.x == 0) group_start[n_experts] = sum;
  __syncthreads();
  const int begin = b * kMoeGroupChunk, end = min(begin + kMoeGroupChunk, n_pairs);
  moe_scatter_tiles(sel, weight, begin, end, n_experts, k, next, tile, pair_row, sorted_weight, slot_pos);
}

}  // namespace

cudaError_t launch_quant_sim(float* x, int64_t rows, int64_t stride, int64_t qdim, int64_t block,
                             QuantSim kind, cudaStream_t s) {
  if (kind == QuantSim::kBf16) block = 1;
  if (block <= 0 || qdim % block != 0 || qdim > stride) return cudaErrorInvalidValue;
  const int64_t n = rows * (qdim / block);
  if (n == 0) return cudaSuccess;
  if (block == 1) return launch_kernel(quant_sim_kernel, blocks_for(n, 128), 128, 0, s, x, rows, stride, qdim, block, kind);
  if (n > INT32_MAX / 32) return cudaErrorInvalidValue;
  return launch_kernel(quant_sim_warp_kernel, blocks_for(n * 32, 256), 256, 0, s, x, rows, stride, qdim, block, kind);
}

cudaError_t launch_hadamard(float* x, int64_t rows, int64_t dim, cudaStream_t s) {
  if (dim <= 0 || (dim & (dim - 1)) != 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  if (dim > 12 * 1024 || rows > INT32_MAX)  // more than 48 KB of shared memory: one thread per row
    return launch_kernel(hadamard_kernel, blocks_for(rows, 64), 64, 0, s, x, rows, dim);
  const int threads = dim / 2 >= 256 ? 256 : dim / 2 >= 32 ? int(dim / 2) : 32;
  return launch_kernel(hadamard_block_kernel, unsigned(rows), threads, size_t(dim) * sizeof(float), s, x, dim);
}

cudaError_t launch_rms_norm_bf16_heads(float* x, int64_t rows, int64_t dim, float eps, cudaStream_t s) {
  if (rows == 0) return cudaSuccess;
  if (dim > kHeadsMaxDim || dim <= 0) return launch_kernel(rms_bf16_heads_kernel, blocks_for(rows, 64), 64, 0, s, x, rows, dim, eps);
  return launch_kernel(rms_bf16_heads_warp_kernel, blocks_for(rows, kHeadsWarps), kHeadsWarps * 32,
                       size_t(kHeadsWarps * dim) * sizeof(float), s, x, rows, dim, eps);
}

cudaError_t launch_scale(float* x, int64_t n, float scale, bool bf16, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return launch_kernel(scale_kernel, blocks_for(n, 256), 256, 0, s, x, n, scale, bf16);
}

namespace {

// Calls fn(std::integral_constant<WeightDtype, F>{}) for the weight format d (`unknown` for a value
// outside the enum): one place that maps the runtime format to the typed launches' template.
template <class Fn>
cudaError_t with_dtype(WeightDtype d, cudaError_t unknown, Fn&& fn) {
  switch (d) {
    case WeightDtype::kF32: return fn(std::integral_constant<WeightDtype, WeightDtype::kF32>{});
    case WeightDtype::kBf16: return fn(std::integral_constant<WeightDtype, WeightDtype::kBf16>{});
    case WeightDtype::kF16: return fn(std::integral_constant<WeightDtype, WeightDtype::kF16>{});
    case WeightDtype::kFp8: return fn(std::integral_constant<WeightDtype, WeightDtype::kFp8>{});
    case WeightDtype::kFp4: return fn(std::integral_constant<WeightDtype, WeightDtype::kFp4>{});
  }
  return unknown;
}

// The shape rules of a typed weight read as [.., cols] rows (row0 + rows used inside the matrix
// is the caller's contract, as the FP32 pointer's extent is).
bool weight_ref_ok(const WeightRef& w, int64_t cols) {
  if (!w.data || w.cols != cols || w.row0 < 0 || w.matrix_bytes < 0 || w.scale_matrix_bytes < 0) return false;
  switch (w.dtype) {
    case WeightDtype::kF32: case WeightDtype::kBf16: case WeightDtype::kF16: return true;
    case WeightDtype::kFp8: return w.scale && w.block_rows > 0 && w.block_cols > 0 && w.block_cols <= INT32_MAX;
    case WeightDtype::kFp4: return w.scale && cols % 32 == 0;
  }
  return false;
}

template <WeightDtype F>
cudaError_t launch_linear_typed(const LinearArgs& a, bool chunked, unsigned blocks, size_t smem, cudaStream_t s) {
  const dim3 grid(blocks, unsigned(a.groups));
  if (chunked) return launch_kernel(linear_chunked_typed_kernel<F>, grid, kLinThreads, smem, s, a);
  return launch_kernel(linear_short_typed_kernel<F>, grid, kLinThreads, 0, s, a);
}

template <WeightDtype F, int R>
cudaError_t launch_gemv_r(const LinearArgs& a, bool vec, int64_t n_rg, int G, int bshift, unsigned blocks, size_t smem,
                          cudaStream_t s) {
  void (*k)(LinearArgs, int64_t, int, int) = vec ? linear_gemv_kernel<F, R, true> : linear_gemv_kernel<F, R, false>;
  if (smem > 48 * 1024) {  // set on every launch: the attribute belongs to the current device
    const cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  return launch_kernel(k, dim3(blocks, unsigned(a.groups)), kGemvThreads, smem, s, a, n_rg, G, bshift);
}

// The GEMV launch of a chunked linear with a typed weight (the FP32 pointer becomes a kF32 ref).
// R: the smallest of 1, 2, 4 that holds the rows (1 with sel), as long as R rows of padded x fit
// kGemvMaxXFloats; G: output groups per block, 8 warp tasks per block at least, more (up to 32)
// while the grid keeps >= 4 blocks per SM of a large GPU, fewer where the grid has fewer blocks
// than the device has SMs.
template <WeightDtype F>
cudaError_t launch_gemv_typed(const LinearArgs& a, cudaStream_t s) {
  const int64_t m = (a.in + kSumChunk - 1) / kSumChunk, xlen = m * kSumChunk;
  int R = 1;
  if (!a.sel) {
    while (R < 4 && R < a.rows) R *= 2;
    while (R > 1 && R * xlen > kGemvMaxXFloats) R /= 2;
  }
  const int NO = R == 1 ? gemv_outputs_per_task<F, 1>() : R == 2 ? gemv_outputs_per_task<F, 2>()
                                                                  : gemv_outputs_per_task<F, 4>();
  const int64_t n_rg = (a.rows + R - 1) / R, groups = (a.out + NO - 1) / NO;
  int G = int((kGemvWarps + m - 1) / m);
  while (2 * G * m <= 32 && (groups + 2 * G - 1) / (2 * G) * n_rg >= 4 * 132) G *= 2;
  // Few outputs (the router's 384 at one row: 48 blocks of G 2): fewer tasks per block while the
  // grid leaves SMs idle, so that more SMs stream the rows (each output's sums are the same).
  while (G > 1 && (groups + G - 1) / G * n_rg < device_sm_count()) G /= 2;
  const int64_t blocks = (groups + G - 1) / G * n_rg;
  const size_t smem = size_t(R * xlen + int64_t(G) * NO * R * m) * sizeof(float);
  if (blocks > INT32_MAX || smem > 100 * 1024) return cudaErrorInvalidValue;
  // Vector loads: 4 consecutive columns in one aligned load (and one FP8 scale per 4 columns).
  const int64_t align = F == WeightDtype::kF32 ? 16 : F == WeightDtype::kFp8 ? 4 : F == WeightDtype::kFp4 ? 2 : 8;
  bool vec = a.in % 4 == 0 && reinterpret_cast<uintptr_t>(a.wt.data) % align == 0 && a.wt.matrix_bytes % align == 0;
  int bshift = 0;
  if (F == WeightDtype::kFp8) {
    while ((int64_t(1) << bshift) < a.wt.block_cols) ++bshift;
    vec = vec && a.wt.block_cols >= 4 && (int64_t(1) << bshift) == a.wt.block_cols;
  }
  if (R == 1) return launch_gemv_r<F, 1>(a, vec, n_rg, G, bshift, unsigned(blocks), smem, s);
  if (R == 2) return launch_gemv_r<F, 2>(a, vec, n_rg, G, bshift, unsigned(blocks), smem, s);
  return launch_gemv_r<F, 4>(a, vec, n_rg, G, bshift, unsigned(blocks), smem, s);
}

template <WeightDtype F, int R>
cudaError_t launch_short_gemv_r(const LinearArgs& a, bool vec, int64_t n_rg, int bshift, unsigned blocks, size_t smem,
                                cudaStream_t s) {
  void (*k)(LinearArgs, int64_t, int) = vec ? linear_short_gemv_kernel<F, R, true> : linear_short_gemv_kernel<F, R, false>;
  return launch_kernel(k, dim3(blocks, unsigned(a.groups)), kShortThreads, smem, s, a, n_rg, bshift);
}

// The GEMV launch of a short linear (in <= kSumChunk): R the smallest of 1, 2, 4 that holds the
// rows (1 with sel), kShortThreads outputs per block.
template <WeightDtype F>
cudaError_t launch_short_gemv_typed(const LinearArgs& a, cudaStream_t s) {
  int R = 1;
  if (!a.sel)
    while (R < 4 && R < a.rows) R *= 2;
  const int64_t xlen = (a.in + 7) / 8 * 8, n_rg = (a.rows + R - 1) / R;
  const int64_t blocks = (a.out + kShortThreads - 1) / kShortThreads * n_rg;
  const size_t smem = size_t(R * xlen) * sizeof(float);
  if (blocks > INT32_MAX || smem > 48 * 1024) return cudaErrorInvalidValue;
  const int64_t align = F == WeightDtype::kF32 ? 16 : F == WeightDtype::kFp8 ? 8 : F == WeightDtype::kFp4 ? 4 : 16;
  bool vec = a.in % 8 == 0 && reinterpret_cast<uintptr_t>(a.wt.data) % align == 0 && a.wt.matrix_bytes % align == 0;
  int bshift = 0;
  if (F == WeightDtype::kFp8) {
    while ((int64_t(1) << bshift) < a.wt.block_cols) ++bshift;
    vec = vec && a.wt.block_cols >= 8 && (int64_t(1) << bshift) == a.wt.block_cols;
  }
  if (R == 1) return launch_short_gemv_r<F, 1>(a, vec, n_rg, bshift, unsigned(blocks), smem, s);
  if (R == 2) return launch_short_gemv_r<F, 2>(a, vec, n_rg, bshift, unsigned(blocks), smem, s);
  return launch_short_gemv_r<F, 4>(a, vec, n_rg, bshift, unsigned(blocks), smem, s);
}

// The streaming GEMV (linear_stream_kernel) with R the smallest of 1, 2, 4, 8 that holds the rows.
// *taken = false (nothing launched) where its conditions do not hold: in % 4V, an L-aligned weight,
// FP8 scale blocks a power of two >= 4V columns wide, rows x padded in within kStreamMaxXFloats.
// 256 threads per block (512 when x takes more than 64 KB, so that an SM still holds 16 warps);
// S sets per tile with S·m a multiple of the warps per block; as many blocks as fit on the GPU at
// once (the occupancy of this kernel), split over the groups (rounded down: no second wave), at
// most one per tile.
template <WeightDtype F, int R>
cudaError_t launch_stream_r(const LinearArgs& a, cudaStream_t s, bool* taken) {
  using Sh = StreamShape<F, R>;
  constexpr int V = Sh::V, kSetOut = V * Sh::NO, L = Sh::kLoadBytes;
  *taken = false;
  const int64_t m = (a.in + kSumChunk - 1) / kSumChunk, xlen = m * kSumChunk;
  if (a.in % (4 * V) != 0 || reinterpret_cast<uintptr_t>(a.wt.data) % L != 0) return cudaSuccess;
  if (a.rows * xlen > kStreamMaxXFloats) return cudaSuccess;
  int bshift = 0;
  if (F == WeightDtype::kFp8) {
    while ((int64_t(1) << bshift) < a.wt.block_cols) ++bshift;
    if (a.wt.block_cols < 4 * V || (int64_t(1) << bshift) != a.wt.block_cols) return cudaSuccess;
  }
  const int threads = a.rows * xlen > 16384 ? 512 : 256, W = threads / 32;
  const int S = int(W / std::gcd(int64_t(W), m));
  const int64_t n_sets = (a.out + kSetOut - 1) / kSetOut, n_tiles = (n_sets + S - 1) / S;
  const size_t smem = size_t(a.rows * xlen + 2 * int64_t(S) * kSetOut * R * m) * sizeof(float);
  void (*k)(LinearArgs, int, int64_t, int) = linear_stream_kernel<F, R>;
  // Set on every launch (the attribute belongs to the current device); a device with less shared
  // memory per block than this launch needs leaves it to the GEMV.
  if (smem > 48 * 1024 && cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  *taken = true;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, threads, smem) != cudaSuccess || per_sm < 1) per_sm = 1;
  const int64_t want = int64_t(device_sm_count()) * per_sm / a.groups;
  const int64_t blocks = std::min<int64_t>(n_tiles, std::max<int64_t>(1, want));
  return launch_kernel(k, dim3(unsigned(blocks), unsigned(a.groups)), threads, smem, s, a, S, n_tiles, bshift);
}

template <WeightDtype F>
cudaError_t launch_stream_typed(const LinearArgs& a, cudaStream_t s, bool* taken) {
  if (a.rows <= 1) return launch_stream_r<F, 1>(a, s, taken);
  if (a.rows <= 2) return launch_stream_r<F, 2>(a, s, taken);
  if (a.rows <= 4) return launch_stream_r<F, 4>(a, s, taken);
  return launch_stream_r<F, 8>(a, s, taken);
}

// The args with an FP32 weight pointer [E?, out, in] turned into a kF32 reference: the typed
// kernels read it as they read any stored format (same values, so the same sums).
LinearArgs with_typed_weight(const LinearArgs& a0) {
  LinearArgs a = a0;
  if (a.w) {
    a.wt = WeightRef{};
    a.wt.dtype = WeightDtype::kF32, a.wt.data = a.w, a.wt.cols = a.in, a.wt.matrix_bytes = a.out * a.in * 4;
  }
  return a;
}

// The streaming GEMV of a chunked linear with at most kStreamMaxRows rows and no sel; *taken =
// false where it does not apply (launch_stream_r's conditions), and nothing was launched.
cudaError_t launch_linear_stream(const LinearArgs& a0, cudaStream_t s, bool* taken) {
  *taken = false;
  if (a0.in <= kSumChunk || a0.rows > kStreamMaxRows || a0.sel) return cudaSuccess;
  const LinearArgs a = with_typed_weight(a0);
  return with_dtype(a.wt.dtype, cudaSuccess, [&](auto f) {
    return launch_stream_typed<decltype(f)::value>(a, s, taken);
  });
}

int tiled_smem_optin() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 48 * 1024;
  int c = cache[dev].load(std::memory_order_acquire);
  if (c > 0) return c;
  if (cudaDeviceGetAttribute(&c, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess || c <= 0) c = 48 * 1024;
  cache[dev].store(c, std::memory_order_release);
  return c;
}

// The tiled kernel (linear_tiled_kernel) of a chunked linear without sel; *taken = false (nothing
// launched) where it does not apply: in > kTiledMaxChunks chunks, or its shared memory (the ring
// and one row unit's chunk sums) over the device's limit per block. n_sub: 8 units of rows per
// block (64 rows), halved while half of them would hold all rows, while the shared memory is over
// the limit, and while the grid would have fewer than 2 blocks per SM.
template <WeightDtype F>
cudaError_t launch_tiled_typed(const LinearArgs& a, cudaStream_t s, bool* taken) {
  *taken = false;
  const int64_t m = (a.in + kSumChunk - 1) / kSumChunk;
  if (a.in <= kSumChunk || m > kTiledMaxChunks || a.sel) return cudaSuccess;
  const int cs = int(m % 2 == 0 ? m + 1 : m);  // odd stride: the tree threads read distinct banks
  const int64_t ring = int64_t(kTiledStages) * kTiledUnitF4 * 16;
  auto smem_of = [&](int n_sub) { return ring + int64_t(n_sub) * kTiledSubRows * kTiledBlockOut * cs * 4; };
  // The dynamic shared memory may take the device's limit per block less the static row pointers.
  const int64_t limit = tiled_smem_optin() - int64_t(kTiledMaxSub * kTiledSubRows * sizeof(const float*));
  const int64_t n_ot = (a.out + kTiledBlockOut - 1) / kTiledBlockOut;
  auto blocks_of = [&](int n_sub) { return n_ot * ((a.rows + n_sub * kTiledSubRows - 1) / (n_sub * kTiledSubRows)); };
  int n_sub = kTiledMaxSub;
  while (n_sub > 1 && (smem_of(n_sub) > limit || int64_t(n_sub / 2) * kTiledSubRows >= a.rows ||
                       blocks_of(n_sub) * a.groups < 2 * int64_t(device_sm_count())))
    n_sub /= 2;
  const int64_t smem = smem_of(n_sub), blocks = blocks_of(n_sub);
  if (smem > limit) return cudaSuccess;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  const int64_t align = F == WeightDtype::kF32 ? 16 : F == WeightDtype::kFp8 ? 4 : F == WeightDtype::kFp4 ? 2 : 8;
  bool vw = a.in % 4 == 0 && reinterpret_cast<uintptr_t>(a.wt.data) % align == 0;
  int bshift = 0;
  if (F == WeightDtype::kFp8) {
    while ((int64_t(1) << bshift) < a.wt.block_cols) ++bshift;
    vw = vw && a.wt.block_cols >= 4 && (int64_t(1) << bshift) == a.wt.block_cols;
  }
  const bool vx = reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.x_stride % 4 == 0 && a.x_group % 4 == 0;
  void (*k)(LinearArgs, int64_t, int, int, int) =
      vw ? (vx ? linear_tiled_kernel<F, true, true> : linear_tiled_kernel<F, true, false>)
         : (vx ? linear_tiled_kernel<F, false, true> : linear_tiled_kernel<F, false, false>);
  // Set on every launch: the attribute belongs to the current device (the ring alone is 96 KB).
  if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess) {
    cudaGetLastError();
    return cudaSuccess;
  }
  *taken = true;
  return launch_kernel(k, dim3(unsigned(blocks), unsigned(a.groups)), kTiledThreads, size_t(smem), s, a, n_ot, n_sub,
                       cs, bshift);
}

// The tiled kernel of a chunked linear (FP32 weights through a kF32 reference); *taken as above.
cudaError_t launch_linear_tiled(const LinearArgs& a0, cudaStream_t s, bool* taken) {
  *taken = false;
  const LinearArgs a = with_typed_weight(a0);
  return with_dtype(a.wt.dtype, cudaSuccess, [&](auto f) {
    return launch_tiled_typed<decltype(f)::value>(a, s, taken);
  });
}

cudaError_t launch_linear_gemv(const LinearArgs& a0, cudaStream_t s) {
  const LinearArgs a = with_typed_weight(a0);
  if (a.in <= kSumChunk) {
    return with_dtype(a.wt.dtype, cudaErrorInvalidValue, [&](auto f) {
      return launch_short_gemv_typed<decltype(f)::value>(a, s);
    });
  }
  return with_dtype(a.wt.dtype, cudaErrorInvalidValue, [&](auto f) {
    return launch_gemv_typed<decltype(f)::value>(a, s);
  });
}

template <WeightDtype F>
cudaError_t launch_embed_typed(const WeightRef& w, const int32_t* tokens, float* X, int64_t T, int64_t hc,
                               int64_t dim, cudaStream_t s) {
  return launch_kernel(embed_typed_kernel<F>, blocks_for(T * hc * dim, 256), 256, 0, s, w, tokens, X, T, hc, dim);
}

}  // namespace

cudaError_t launch_linear(const LinearArgs& a0, cudaStream_t s) {
  LinearArgs a = a0;
  if (a.x_stride == 0) a.x_stride = a.in;
  if (a.y_stride == 0) a.y_stride = a.out;
  if (a.in <= 0 || a.out <= 0 || a.x_row_div <= 0 || a.rows > 65535 || a.kernel < 0 || a.kernel > 5)
    return cudaErrorInvalidValue;
  if (a.groups < 1 || a.groups > 65535 || (a.groups > 1 && a.sel)) return cudaErrorInvalidValue;
  const bool typed = !a.w;
  if (typed && !weight_ref_ok(a.wt, a.in)) return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  // BF16 inputs: the tensor-core linear (another summation order; the same at every row count).
  if (a.kernel == 5 || (a.kernel == 0 && a.x_bf16 && linear_mma_applies(a))) return launch_linear_mma(a, s);
  const bool chunked = a.in > kSumChunk;
  // Automatic: the streaming GEMV for FP8 weights only; for BF16 / FP32 rows (the LM head, the
  // router gate) the GEMV's two row groups read as fast or faster (bench --kernels exact).
  const bool stream_auto = typed && a.wt.dtype == WeightDtype::kFp8 && chunked && a.rows <= kStreamMaxRows && !a.sel;
  // Automatic: the tiled kernel from kTiledMinRows rows (prefill), where it applies.
  if (a.kernel == 4 || (a.kernel == 0 && chunked && !a.sel && a.rows >= kTiledMinRows)) {
    bool taken = false;
    const cudaError_t e = launch_linear_tiled(a, s, &taken);
    if (taken || e != cudaSuccess) return e;
    if (a.kernel == 4) return cudaErrorInvalidValue;  // forced, but its conditions do not hold
  }
  if (a.kernel == 3 || (a.kernel == 0 && stream_auto)) {
    bool taken = false;
    const cudaError_t e = launch_linear_stream(a, s, &taken);
    if (taken || e != cudaSuccess) return e;
    if (a.kernel == 3) return cudaErrorInvalidValue;  // forced, but its conditions do not hold
  }
  {
    const bool gemv_ok = !chunked || (a.in + kSumChunk - 1) / kSumChunk * kSumChunk <= kGemvMaxXFloats;
    if (a.kernel == 2 && !gemv_ok) return cudaErrorInvalidValue;
    if (a.kernel == 2 || (a.kernel == 0 && gemv_ok && (chunked || a.rows <= kGemvMaxRows)))
      return launch_linear_gemv(a, s);
  }
  int64_t blocks = 0;
  size_t smem = 0;
  if (!chunked) {
    blocks = (a.out + kLinThreads / 8 - 1) / (kLinThreads / 8) * a.rows;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  } else {
    smem = size_t((a.in + kSumChunk - 1) / kSumChunk) * sizeof(float);
    blocks = a.out * a.rows;
    if (smem > 48 * 1024 || blocks > INT32_MAX) return cudaErrorInvalidValue;
  }
  if (typed) {
    return with_dtype(a.wt.dtype, cudaErrorInvalidValue, [&](auto f) {
      return launch_linear_typed<decltype(f)::value>(a, chunked, unsigned(blocks), smem, s);
    });
  }
  const dim3 grid(unsigned(blocks), unsigned(a.groups));
  if (!chunked) return launch_kernel(linear_short_kernel, grid, kLinThreads, 0, s, a);
  return launch_kernel(linear_chunked_kernel, grid, kLinThreads, smem, s, a);
}

cudaError_t launch_model_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t dim, float eps,
                                  bool bf16, cudaStream_t s) {
  if (dim <= 0) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t m = (dim + kSumChunk - 1) / kSumChunk;
  if (m <= kNormMaxChunks) {
    const int64_t rpb = norm_rows_per_block(m), blocks = (rows + rpb - 1) / rpb;
    if (blocks > INT32_MAX) return cudaErrorInvalidValue;
    return launch_kernel(rms_norm_kernel<0>, unsigned(blocks), unsigned(32 * m * rpb), 0, s, x, w, y, rows, dim, eps,
                         bf16, static_cast<const float*>(nullptr));
  }
  const size_t smem = size_t(m) * sizeof(double);
  if (smem > 48 * 1024 || rows > INT32_MAX) return cudaErrorInvalidValue;
  return launch_kernel(rms_norm_wide_kernel, unsigned(rows), 256, smem, s, x, w, y, dim, eps, bf16);
}

namespace {

// The largest cluster hc_mixes_split_kernel may use on the current device: kSplitMaxCluster (a
// non-portable size, allowed on the function here) where such a cluster of the largest block
// (kSplitMaxWarps warps, 48 KB) can be resident, else kMixCluster. Cached per device, so that a decode
// step under graph capture asks once.
int hc_split_cluster_cap() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0 unknown, else the cap
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    (void)cudaGetLastError();
    return kMixCluster;
  }
  const int known = cache[dev].load(std::memory_order_acquire);
  if (known) return known;
  int cap = kMixCluster, major = 0, clusters = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9 &&
      cudaFuncSetAttribute(hc_mixes_split_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(kSplitMaxCluster), cfg.blockDim = dim3(kSplitMaxWarps * 32), cfg.dynamicSmemBytes = 48 * 1024;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = kSplitMaxCluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr, cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&clusters, hc_mixes_split_kernel, &cfg) == cudaSuccess && clusters > 0)
      cap = kSplitMaxCluster;
  }
  (void)cudaGetLastError();  // a refused query leaves no sticky error behind
  cache[dev].store(cap, std::memory_order_release);
  return cap;
}

}  // namespace

cudaError_t launch_hc_mixes(const HcMixArgs& a, cudaStream_t s) {
  if (a.hc <= 0 || a.hc > kMaxHc || a.dim <= 0 || a.cluster < 0 || a.cluster > kSplitMaxCluster || a.kernel < 0 ||
      a.kernel > 2)
    return cudaErrorInvalidValue;
  if (a.rows == 0) return cudaSuccess;
  const int64_t n_mix = a.head_only ? a.hc : (2 + a.hc) * a.hc, flat = a.hc * a.dim;
  const int64_t m = flat > kSumChunk ? (flat + kSumChunk - 1) / kSumChunk : 1;
  const bool split_ok = flat > kSumChunk && m <= kSplitMaxChunks;
  if (a.kernel == 2 && !split_ok) return cudaErrorInvalidValue;
  const size_t smem = size_t(m) * sizeof(double) + size_t(n_mix * m + n_mix + a.hc * a.hc) * sizeof(float);
  if (smem > 200 * 1024 || a.rows * kSplitMaxCluster > INT32_MAX) return cudaErrorInvalidValue;
  if (smem > 48 * 1024 &&
      cudaFuncSetAttribute(hc_mixes_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return cudaGetLastError();
  // Row tiles: flat > kSumChunk, 16-byte aligned rows, at most kTileMaxChunks chunks; automatic
  // from kHcTileMinRows rows (the row kernel re-reads the whole fn matrix for every row).
  const bool tiles_ok = flat > kSumChunk && m <= kTileMaxChunks && flat % 4 == 0 &&
                        ((reinterpret_cast<uintptr_t>(a.x) | reinterpret_cast<uintptr_t>(a.fn)) & 15) == 0;
  // With a workspace the tiles split the chunks over CTAs, so they pay from kHcTileGroupMinRows.
  const int64_t tile_min = a.work ? kHcTileGroupMinRows : kHcTileMinRows;
  if (a.kernel == 0 && tiles_ok && (a.tiled > 0 || (a.tiled < 0 && a.rows >= tile_min))) {
    const int slices = a.tiled == 1 || a.tiled == 4 ? a.tiled : 2;  // 128-column slices per ring stage
    const cudaError_t e = slices == 1   ? launch_hc_mix_dots_tiled<1>(a, n_mix, m, s)
                          : slices == 4 ? launch_hc_mix_dots_tiled<4>(a, n_mix, m, s)
                                        : launch_hc_mix_dots_tiled<2>(a, n_mix, m, s);
    if (e != cudaSuccess) return e;
    if (a.hc * a.hc <= 32 && (a.rows + kReadyRows - 1) / kReadyRows <= INT32_MAX) {
      const size_t rsmem = size_t(kReadyRows) * (size_t(m) * sizeof(double) + size_t(n_mix) * sizeof(float));
      return launch_kernel(hc_mixes_ready_kernel, unsigned((a.rows + kReadyRows - 1) / kReadyRows), kReadyThreads,
                           rsmem, s, a);
    }
    return launch_kernel(hc_mixes_kernel, unsigned(a.rows), kMixThreads, smem, s, a, 1, true);
  }
  if (split_ok && a.kernel != 1) {
    const int cap = a.cluster == 0 || a.cluster > kMixCluster ? hc_split_cluster_cap() : kMixCluster;
    if (a.cluster > cap) return cudaErrorInvalidValue;  // 9..16 blocks where the device cannot run them
    const int csize = int(std::min<int64_t>(a.cluster > 0 ? a.cluster : cap, m));
    const unsigned threads = unsigned(32 * std::min<int64_t>(n_mix + 1, kSplitMaxWarps));
    const size_t ssmem = size_t(kSumChunk) * sizeof(float) + smem;  // x chunk + hc_mixes_kernel's layout
    if (ssmem > 48 * 1024 &&
        cudaFuncSetAttribute(hc_mixes_split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(ssmem)) != cudaSuccess)
      return cudaGetLastError();
    if (csize == 1) return launch_kernel(hc_mixes_split_kernel, unsigned(a.rows), threads, ssmem, s, a, 1);
    return launch_kernel_cluster(hc_mixes_split_kernel, unsigned(a.rows * csize), threads, ssmem, s, unsigned(csize), a,
                                 csize);
  }
  // The row kernel: clusters of at most kMixCluster blocks (same bits for any size).
  const int csize = flat <= kSumChunk ? 1 : a.cluster > 0 ? std::min(a.cluster, kMixCluster) : kMixCluster;
  if (csize == 1) {
    return launch_kernel(hc_mixes_kernel, unsigned(a.rows), kMixThreads, smem, s, a, 1, false);
  }
  return launch_kernel_cluster(hc_mixes_kernel, unsigned(a.rows * csize), kMixThreads, smem, s, unsigned(csize), a, csize,
                               false);
}

int64_t hc_mixes_work_floats(const HcMixArgs& a) {
  const int64_t n_mix = a.head_only ? a.hc : (2 + a.hc) * a.hc;
  return a.rows * n_mix * ((a.hc * a.dim + kSumChunk - 1) / kSumChunk);
}

// Whether a launch of `rows` rows of `width` values takes the four-column kernels: large enough
// (prefill), whole float4s per row, a grid of (rows, column blocks) that fits, 16-byte aligned.
static bool vec_launch(int64_t rows, int64_t width, std::initializer_list<const void*> ptrs) {
  if (rows * width < kVecMinValues || width % 4 != 0 || rows > INT32_MAX ||
      (width / 4 + kVecThreads - 1) / kVecThreads > 65535)
    return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}
static dim3 vec_grid(int64_t rows, int64_t width) {
  return dim3(unsigned(rows), unsigned((width / 4 + kVecThreads - 1) / kVecThreads));
}

bool hc_collapse_norm_supported(int64_t hc, int64_t dim) {
  return hc == 4 && dim > 0 && (dim + kSumChunk - 1) / kSumChunk <= kNormMaxChunks;
}

cudaError_t launch_hc_collapse_norm(const float* x, const float* pre, const float* w, float* y, int64_t rows,
                                    int64_t hc, int64_t dim, float eps, bool bf16, cudaStream_t s) {
  if (!hc_collapse_norm_supported(hc, dim)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const int64_t m = (dim + kSumChunk - 1) / kSumChunk;
  const int64_t rpb = norm_rows_per_block(m), blocks = (rows + rpb - 1) / rpb;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  return launch_kernel(rms_norm_kernel<4>, unsigned(blocks), unsigned(32 * m * rpb), 0, s, x, w, y, rows, dim, eps,
                       bf16, pre);
}

cudaError_t launch_hc_collapse(const float* x, const float* pre, float* u, int64_t rows, int64_t hc,
                               int64_t dim, bool bf16, cudaStream_t s) {
  if (rows * dim == 0) return cudaSuccess;
  if (hc == 4 && vec_launch(rows, dim, {x, u}))
    return launch_kernel(hc_collapse_vec_kernel<4>, vec_grid(rows, dim), kVecThreads, 0, s, x, pre, u, dim, bf16);
  return launch_kernel(hc_collapse_kernel, blocks_for(rows * dim, 256), 256, 0, s, x, pre, u, rows, hc, dim, bf16);
}

cudaError_t launch_hc_post(const float* f, float* x, const float* post, const float* comb, int64_t rows,
                           int64_t hc, int64_t dim, bool bf16, cudaStream_t s) {
  if (hc > kMaxHc) return cudaErrorInvalidValue;
  if (rows * dim == 0) return cudaSuccess;
  if (hc == 4 && vec_launch(rows, dim, {f, x}))
    return launch_kernel(hc_post_vec_kernel<4>, vec_grid(rows, dim), kVecThreads, 0, s, f, x, post, comb, dim, bf16);
  if (hc == 4 && rows <= INT32_MAX && (dim + 255) / 256 <= 65535)
    return launch_kernel(hc_post_fixed_kernel<4>, dim3(unsigned(rows), unsigned((dim + 255) / 256)), 256, 0, s, f, x,
                         post, comb, dim, bf16);
  return launch_kernel(hc_post_kernel, blocks_for(rows * dim, 256), 256, 0, s, f, x, post, comb, rows, hc, dim, bf16);
}

bool hc_post_mixes_supported(const HcPostMixArgs& p, int64_t n_tickets) {
  const HcMixArgs& a = p.mix;
  const auto al16 = [](const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; };
  const bool f_ok = p.y ? p.ys && p.out && p.K >= 0 && al16(p.y) && al16(p.ys) && al16(p.out) : al16(p.f);
  return a.hc == kPmHc && !a.head_only && a.dim > 0 && a.dim % kSumChunk == 0 &&
         kPmHc * a.dim / kSumChunk <= kSplitMaxChunks && a.rows >= 1 && a.rows <= n_tickets &&
         a.rows * kPmHc * (a.dim / kSumChunk) <= INT32_MAX && f_ok && al16(p.x) && al16(a.fn) && p.work &&
         p.tickets && a.post != p.post && a.comb != p.comb;
}

int64_t hc_post_mixes_work_floats(int64_t rows, int64_t dim) {
  const int64_t m = kPmHc * dim / kSumChunk;
  return rows * (2 * m + kPmMix * m);
}

cudaError_t launch_hc_post_mixes(const HcPostMixArgs& p, int64_t n_tickets, cudaStream_t s) {
  if (!hc_post_mixes_supported(p, n_tickets)) return cudaErrorInvalidValue;
  const unsigned blocks = unsigned(p.mix.rows * kPmHc * (p.mix.dim / kSumChunk));
  return launch_kernel_cluster(hc_post_mixes_kernel, blocks, kPmWarps * 32, 0, s, unsigned(kPmHc), p);
}

cudaError_t launch_embed(const float* embed, const int32_t* tokens, float* X, int64_t T, int64_t hc,
                         int64_t dim, cudaStream_t s) {
  if (T * hc * dim == 0) return cudaSuccess;
  return launch_kernel(embed_kernel, blocks_for(T * hc * dim, 256), 256, 0, s, embed, tokens, X, T, hc, dim);
}

cudaError_t launch_embed_w(const WeightRef& w, const int32_t* tokens, float* X, int64_t T, int64_t hc,
                           int64_t dim, cudaStream_t s) {
  if (!weight_ref_ok(w, dim)) return cudaErrorInvalidValue;
  if (T * hc * dim == 0) return cudaSuccess;
  return with_dtype(w.dtype, cudaErrorInvalidValue, [&](auto f) {
    return launch_embed_typed<decltype(f)::value>(w, tokens, X, T, hc, dim, s);
  });
}

cudaError_t launch_engram_gate(float* x, const float* kv, const float* wqk, int64_t rows, int64_t hc,
                               int64_t dim, float eps, bool bf16, cudaStream_t s) {
  if (rows * hc == 0) return cudaSuccess;
  if (dim <= 0 || dim > kEngramMaxChunks * kSumChunk) return cudaErrorInvalidValue;
  return launch_kernel(engram_gate_kernel, unsigned(rows * hc), 256, 0, s, x, kv, wqk, hc, dim, eps, bf16);
}

cudaError_t launch_ring_write(float* ring, const float* kv, const int64_t* pos, int64_t t0, int64_t T,
                              int64_t ring_size, int64_t dim, cudaStream_t s) {
  if (T <= t0) return cudaSuccess;
  return launch_kernel(ring_write_kernel, blocks_for((T - t0) * dim, 256), 256, 0, s, ring, kv, pos, t0, T, ring_size, dim);
}

cudaError_t launch_add_ape(float* z, const float* ape, const int64_t* pos, int64_t T, int64_t width,
                           int64_t ratio, cudaStream_t s) {
  if (T * width == 0) return cudaSuccess;
  return launch_kernel(add_ape_kernel, blocks_for(T * width, 256), 256, 0, s, z, ape, pos, T, width, ratio);
}

cudaError_t launch_softmax_pool(const float* const* v, const float* const* z, int64_t n_groups,
                                int64_t n_slots, int64_t dim, float* out, cudaStream_t s) {
  if (n_groups == 0) return cudaSuccess;
  return launch_kernel(softmax_pool_kernel, dim3(blocks_for(dim, 128), unsigned(n_groups)), 128, 0, s, v, z, n_slots, dim, out);
}

cudaError_t launch_swiglu(const float* g, const float* u, float* h, const float* weight, int64_t rows,
                          int64_t n, float limit, bool bf16, cudaStream_t s) {
  if (rows * n == 0) return cudaSuccess;
  // The flat values in groups of four (n % 4 == 0: a group never straddles two rows' weights).
  if (vec_launch(rows, n, {g, u, h}) && rows * n / 4 / kVecThreads < INT32_MAX)
    return launch_kernel(swiglu_vec_kernel, blocks_for(rows * n / 4, kVecThreads), kVecThreads, 0, s, g, u, h, weight,
                         rows, n, limit, bf16);
  return launch_kernel(swiglu_kernel, blocks_for(rows * n, 256), 256, 0, s, g, u, h, weight, rows, n, limit, bf16);
}

cudaError_t launch_moe_combine(const float* y, const float* ys, float* out, int64_t T, int64_t K,
                               int64_t dim, bool bf16, cudaStream_t s, const int32_t* row_of) {
  if (T * dim == 0) return cudaSuccess;
  if (vec_launch(T, dim, {y, ys, out}))
    return launch_kernel(moe_combine_vec_kernel, vec_grid(T, dim), kVecThreads, 0, s, y, ys, out, K, dim, bf16, row_of);
  return launch_kernel(moe_combine_kernel, blocks_for(T * dim, 256), 256, 0, s, y, ys, out, T, K, dim, bf16, row_of);
}

bool moe_combine_post_supports(int64_t T, int64_t hc, int64_t dim) {
  return hc == 4 && T >= 0 && T <= INT32_MAX && dim > 0 && (dim + 255) / 256 <= 65535;
}

cudaError_t launch_moe_combine_post(const float* y, const float* ys, float* out, int64_t T, int64_t K, int64_t dim,
                                    bool bf16, const int32_t* row_of, float* x, const float* post, const float* comb,
                                    int64_t hc, bool post_bf16, cudaStream_t s) {
  if (!moe_combine_post_supports(T, hc, dim) || K < 0) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  if (vec_launch(T, dim, {y, ys, out, x}))
    return launch_kernel(moe_combine_post_vec_kernel<4>, vec_grid(T, dim), kVecThreads, 0, s, y, ys, out, K, dim, bf16,
                         row_of, x, post, comb, post_bf16);
  return launch_kernel(moe_combine_post_kernel<4>, dim3(unsigned(T), unsigned((dim + 255) / 256)), 256, 0, s, y, ys,
                       out, K, dim, bf16, row_of, x, post, comb, post_bf16);
}

int64_t moe_group_scratch_ints(int64_t n_pairs, int64_t n_experts) {
  return (n_pairs + kMoeGroupChunk - 1) / kMoeGroupChunk * n_experts;
}

cudaError_t launch_moe_group(const int32_t* sel, const float* weight, int64_t n_pairs, int64_t n_experts, int64_t k,
                             int32_t* group_start, int32_t* pair_row, float* sorted_weight, int32_t* slot_pos,
                             int32_t* bad, cudaStream_t s, int32_t* counts, const MoeCompactGroups* compact) {
  if (n_experts <= 0 || n_experts > kMoeGroupMaxExperts || k <= 0 || n_pairs < 0 || n_pairs > INT32_MAX)
    return cudaErrorInvalidValue;
  // Every expert with pairs needs a slot: at most min(n_pairs, n_experts) of them.
  if (compact && (!compact->start || !compact->expert || compact->slots < std::min(n_pairs, n_experts) ||
                  compact->slots > INT32_MAX - 1))
    return cudaErrorInvalidValue;
  if (!counts || n_pairs <= kMoeGroupChunk || compact)
    return launch_kernel(moe_group_kernel, 1, kMoeGroupThreads, 0, s, sel, weight, int(n_pairs), int(n_experts),
                         int(k), group_start, pair_row, sorted_weight, slot_pos, bad,
                         compact ? compact->start : nullptr, compact ? compact->expert : nullptr,
                         compact ? int(compact->slots) : 0);
  const int chunks = int((n_pairs + kMoeGroupChunk - 1) / kMoeGroupChunk);
  if (const cudaError_t e = launch_kernel(moe_count_kernel, chunks, kMoeGroupThreads, 0, s, sel, int(n_pairs),
                                          int(n_experts), counts, bad);
      e != cudaSuccess)
    return e;
  return launch_kernel(moe_scatter_kernel, chunks, kMoeGroupThreads, 0, s, sel, weight, int(n_pairs), int(n_experts),
                       int(k), static_cast<const int32_t*>(counts), group_start, pair_row, sorted_weight, slot_pos);
}

}  // namespace flashseek::ops::cuda::detail
