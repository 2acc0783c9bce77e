// The fixed summation orders of the FP32 dot product (ops::dot_f32) and of the double sum of
// squares (rms_norm, the mHC flat RMS), shared by the CPU twins; the CUDA kernels reproduce them
// bit for bit (ops/cuda/model/model_device.cuh). Internal to src/ops/cpu.
//
// n <= kSumChunk: the short dot order (eight interleaved partial sums, element i into s[i % 8],
// combined ((s0+s4)+(s2+s6))+((s1+s5)+(s3+s7))); the sum of squares takes the chunk order below
// for any n (a short row is one chunk), so that one warp computes it on a GPU instead of one
// thread in index order.
// n > kSumChunk ("chunked"): chunks of kSumChunk elements (the last may be shorter). Inside a
// chunk, element j goes to partial s[j % 128], each partial summed in index order; lane l of 32
// holds (s[4l]+s[4l+1])+(s[4l+2]+s[4l+3]); lanes are combined by halving (l += l + 16, then
// + 8, 4, 2, 1: a warp's xor butterfly). Chunk sums c[0..m) are combined by stride doubling:
// for st = 1, 2, 4...: c[i] += c[i + st] for i = 0, 2st, 4st... with i + st < m. This order
// lets one warp own a chunk (coalesced 16-byte loads) and many warps share one dot.
#pragma once
#include <cstdint>
#include <vector>

namespace flashseek::ops::detail {

inline constexpr int64_t kSumChunk = 1024;
inline constexpr int kSumLanes = 128;

template <typename Acc>
Acc lane_tree(const Acc* s) {
  Acc v[32];
  for (int l = 0; l < 32; ++l) v[l] = (s[4 * l] + s[4 * l + 1]) + (s[4 * l + 2] + s[4 * l + 3]);
  for (int off = 16; off >= 1; off /= 2)
    for (int l = 0; l < off; ++l) v[l] = v[l] + v[l + off];
  return v[0];
}

template <typename Acc>
Acc chunk_tree(Acc* c, int64_t m) {
  for (int64_t st = 1; st < m; st *= 2)
    for (int64_t i = 0; i + st < m; i += 2 * st) c[i] = c[i] + c[i + st];
  return c[0];
}

inline float dot_chunk(const float* a, const float* b, int64_t len) {
  float s[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= len; i += kSumLanes)
    for (int j = 0; j < kSumLanes; ++j) s[j] += a[i + j] * b[i + j];
  for (int j = 0; i < len; ++i, ++j) s[j] += a[i] * b[i];
  return lane_tree(s);
}

inline double sumsq_chunk(const float* x, int64_t len) {
  double s[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= len; i += kSumLanes)
    for (int j = 0; j < kSumLanes; ++j) s[j] += double(x[i + j]) * double(x[i + j]);
  for (int j = 0; i < len; ++i, ++j) s[j] += double(x[i]) * double(x[i]);
  return lane_tree(s);
}

inline float dot_chunked(const float* a, const float* b, int64_t n) {
  const int64_t m = (n + kSumChunk - 1) / kSumChunk;
  float stack_buf[64] = {};  // every chunk sum is written before the tree reads it (zeroed for GCC's warning)
  std::vector<float> heap;
  float* c = stack_buf;
  if (m > 64) heap.resize(size_t(m)), c = heap.data();
  for (int64_t k = 0; k < m; ++k) {
    const int64_t o = k * kSumChunk;
    c[k] = dot_chunk(a + o, b + o, n - o < kSumChunk ? n - o : kSumChunk);
  }
  return chunk_tree(c, m);
}

// Sum of double(x)^2 over x[0, n) in the order above (one chunk when n <= kSumChunk).
inline double sumsq_f64(const float* x, int64_t n) {
  if (n <= kSumChunk) return sumsq_chunk(x, n);
  const int64_t m = (n + kSumChunk - 1) / kSumChunk;
  double stack_buf[64];
  std::vector<double> heap;
  double* c = stack_buf;
  if (m > 64) heap.resize(size_t(m)), c = heap.data();
  for (int64_t k = 0; k < m; ++k) {
    const int64_t o = k * kSumChunk;
    c[k] = sumsq_chunk(x + o, n - o < kSumChunk ? n - o : kSumChunk);
  }
  return chunk_tree(c, m);
}

}  // namespace flashseek::ops::detail
