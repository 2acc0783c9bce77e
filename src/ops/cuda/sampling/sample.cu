// Sampling kernels: the rule of ops/sample.h on the device, one 1024-thread block per row.
//
// Greedy rows: a block-wide argmax (lowest id on ties). Other rows draw by inverse CDF over the
// candidates in the CPU twin's order:
//   - ascending id (no top-k cut, no top-p): weights e_i = exp(l_i / T - max) straight from the
//     row (min-p zeroes those below min_p * max prob);
//   - descending logit (top-k cut or top-p): the row is first sorted by a CUB device radix sort of
//     (order-preserving key, id) pairs, stable, so equal logits keep the lower id first.
// The draw (and the top-p cut) finds the first candidate whose inclusive prefix of weights
// passes u * total (top-p: reaches top_p * total): chunk sums (one warp per chunk, coalesced),
// a block scan over the chunk sums, then one warp scans the chunk that holds the crossing.
// Sums are in double as on the CPU, in a different order: a token can differ from the twin's
// only when u (or top_p, or a min-p threshold) lies within rounding of a CDF boundary.
//
// Bytes: each pass reads the row once (V = 129,280: 517 KB, usually still in L2 after the head
// GEMV); greedy is one pass, an ascending draw 2-3, a sorted draw the sort (~4 passes over 1 MB of
// pairs) plus 2-4 passes over the sorted keys. FLOPs are negligible (one double exp per element
// and pass).
//
// Launches go through the launch tape (launch.cuh), so greedy and ascending draws can be replayed
// from a patched CUDA graph; the CUB sort cannot be taped, so a step with a sorted draw is recorded
// (kRecord) or, in patch mode, marked unpatchable without queuing anything.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>
#include <cstdint>

#include "ops/cuda/runtime/launch.cuh"
#include "ops/cuda/runtime/pdl.cuh"
#include "ops/cuda/sampling/sample_kernels.h"

namespace flashseek::ops::cuda::detail {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;
constexpr unsigned kFull = 0xffffffffu;

struct Scratch {
  double chunk[kThreads];  // chunk sums, then their exclusive prefixes
  double d[kWarps];
  int i[kWarps];
  int found;
};

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a > b ? a : b; }
};
struct Min {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a < b ? a : b; }
};

// Block-wide reduction; every thread gets the result. Fixed order: deterministic.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T* red) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(kFull, v, o));
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();  // `red` may still be read by the previous reduction
  if (lane == 0) red[w] = v;
  __syncthreads();
  T r = red[0];
  for (int k = 1; k < kWarps; ++k) r = op(r, red[k]);
  return r;
}

__device__ double warp_incl_scan(double v) {
  const int lane = threadIdx.x & 31;
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// Σ_j<n f(j) with kUnroll independent loads in flight per thread; f(j) must be 0 for non-candidates.
template <typename F>
__device__ double block_sum(int n, F f, Scratch& sm) {
  double acc = 0;
  for (int base = 0; base < n; base += kThreads * kUnroll) {
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = base + k * kThreads + int(threadIdx.x);
      if (j < n) acc += f(j);
    }
  }
  return block_reduce(acc, Sum{}, sm.d);
}

template <typename P>
__device__ int block_count(int n, P pred, Scratch& sm) {
  int c = 0;
  for (int base = 0; base < n; base += kThreads * kUnroll) {
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = base + k * kThreads + int(threadIdx.x);
      if (j < n && pred(j)) ++c;
    }
  }
  return block_reduce(c, Sum{}, sm.i);
}

struct Found {
  int index;     // first j with a positive weight whose inclusive prefix passes the target; -1: none
  double total;  // Σ weights
};

// First j in [0, n) whose inclusive prefix Σ_{i<=j} w(i) passes frac * total (strict: >, else >=),
// among j with w(j) > 0. Chunks of L elements (a multiple of 32·kUnroll); if rounding puts the
// crossing in a chunk whose own scan never passes, its last positive element is taken (that case
// is within rounding of a boundary).
template <typename F>
__device__ Found find_first(int n, F w, double frac, bool strict, Scratch& sm) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  constexpr int kStep = 32 * kUnroll;
  const int per_chunk = (n + kThreads - 1) / kThreads;
  const int L = (per_chunk + kStep - 1) / kStep * kStep;
  const int n_chunks = (n + L - 1) / L;
  for (int c = warp; c < kThreads; c += kWarps) {
    double acc = 0;
    if (c < n_chunks) {
      const int s = c * L, e = min(n, s + L);
      for (int b = s; b < e; b += kStep) {
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const int j = b + k * 32 + lane;
          if (j < e) acc += w(j);
        }
      }
      for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(kFull, acc, o);
    }
    if (lane == 0) sm.chunk[c] = acc;
  }
  __syncthreads();
  // Exclusive scan of the chunk sums (thread t = chunk t).
  const double v = sm.chunk[threadIdx.x];
  const double incl_w = warp_incl_scan(v);
  if (lane == 31) sm.d[warp] = incl_w;
  __syncthreads();
  double offset = 0, total = 0;
  for (int k = 0; k < kWarps; ++k) {
    if (k < warp) offset += sm.d[k];
    total += sm.d[k];
  }
  const double excl = offset + incl_w - v;
  const double target = frac * total;
  auto pass = [&](double x) { return strict ? x > target : x >= target; };
  __syncthreads();
  sm.chunk[threadIdx.x] = excl;
  const int c = block_reduce(v > 0 && pass(excl + v) ? int(threadIdx.x) : INT_MAX, Min{}, sm.i);
  if (c == INT_MAX) return {-1, total};
  if (warp == 0) {
    const int s = c * L, e = min(n, s + L);
    double run = sm.chunk[c];
    int idx = -1, last_pos = -1;
    for (int b = s; b < e && idx < 0; b += 32) {
      const int j = b + lane;
      const double x = j < e ? w(j) : 0.0;
      const double incl = warp_incl_scan(x);
      const unsigned hit = __ballot_sync(kFull, x > 0 && pass(run + incl));
      const unsigned pos = __ballot_sync(kFull, x > 0);
      if (hit) idx = b + __ffs(int(hit)) - 1;
      if (pos) last_pos = b + 31 - __clz(int(pos));
      run += __shfl_sync(kFull, incl, 31);
    }
    if (lane == 0) sm.found = idx >= 0 ? idx : last_pos;
  }
  __syncthreads();
  return {sm.found, total};
}

// Order-preserving uint32 key of a finite float (+0 for ±0); 0 marks a non-candidate (every
// finite float maps above 0: -FLT_MAX gives 0x00800000).
__device__ __forceinline__ uint32_t sort_key(float x) {
  if (!isfinite(x)) return 0u;
  if (x == 0.0f) x = 0.0f;
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The logits rows, keys and ids below are step-written: not const __restrict__, which nvcc turns
// into ld.global.nc loads (runtime/pdl.cuh).
// Block b: the argmax of row b (rows V apart) into out[b].
__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* row, int V, int32_t* out) {
  pdl_prologue();
  row += size_t(blockIdx.x) * size_t(V);
  out += blockIdx.x;
  __shared__ float sv[kWarps];
  __shared__ int si[kWarps];
  float bv = 0.0f;
  int bi = -1;
  for (int base = 0; base < V; base += kThreads * kUnroll) {
    float x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = base + k * kThreads + int(threadIdx.x);
      x[k] = j < V ? row[j] : __int_as_float(0x7fc00000);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {  // ascending j per thread: ties keep the lower id
      const int j = base + k * kThreads + int(threadIdx.x);
      if (isfinite(x[k]) && (bi < 0 || x[k] > bv)) bv = x[k], bi = j;
    }
  }
  auto better = [](float av, int ai, float cv, int ci) {  // true: (cv, ci) wins over (av, ai)
    if (ci < 0) return false;
    if (ai < 0) return true;
    return cv > av || (cv == av && ci < ai);
  };
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, bv, o);
    const int oi = __shfl_xor_sync(kFull, bi, o);
    if (better(bv, bi, ov, oi)) bv = ov, bi = oi;
  }
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < kWarps; ++k)
      if (better(bv, bi, sv[k], si[k])) bv = sv[k], bi = si[k];
    *out = bi;
  }
}

// Inverse-CDF draw over the finite entries of `row` in ascending id, with optional min-p.
__device__ int draw_ascending(const float* row, int V, const SampleRowSpec& s, Scratch& sm) {
  const double inv_t = 1.0 / s.temperature;
  double mx = -INFINITY;
  int nf = 0;
  for (int base = 0; base < V; base += kThreads * kUnroll) {
    float x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int j = base + k * kThreads + int(threadIdx.x);
      x[k] = j < V ? row[j] : -INFINITY;
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
      if (isfinite(x[k])) mx = fmax(mx, double(x[k]) * inv_t), ++nf;
  }
  mx = block_reduce(mx, Max{}, sm.d);
  nf = block_reduce(nf, Sum{}, sm.i);
  if (nf == 0) return -1;
  auto e = [=](int j) {
    const float x = row[j];
    return isfinite(x) ? exp(double(x) * inv_t - mx) : 0.0;
  };
  double S = 0, thr = 0;
  if (s.min_p > 0) {
    S = block_sum(V, e, sm);
    thr = s.min_p * (1.0 / S);
  }
  auto cand = [=](int j, double ej) { return s.min_p <= 0 || ej / S >= thr; };
  auto w = [=](int j) {
    const double ej = e(j);
    return cand(j, ej) ? ej : 0.0;
  };
  const Found f = find_first(V, w, s.u, /*strict=*/true, sm);
  if (f.index >= 0) return f.index;
  // u within rounding of 1: the last candidate, as the twin.
  int last = -1;
  for (int j = int(threadIdx.x); j < V; j += kThreads)
    if (isfinite(row[j]) && cand(j, e(j))) last = j;
  return block_reduce(last, Max{}, sm.i);
}

__global__ void __launch_bounds__(kThreads) ascending_kernel(const float* row, int V, SampleRowSpec s, int32_t* out) {
  pdl_prologue();
  __shared__ Scratch sm;
  const int t = draw_ascending(row, V, s, sm);
  if (threadIdx.x == 0) *out = t;
}

__global__ void sort_input_kernel(const float* row, int V, uint32_t* keys, int32_t* ids) {
  pdl_prologue();
  const int j = int(blockIdx.x) * blockDim.x + int(threadIdx.x);
  if (j >= V) return;
  keys[j] = sort_key(row[j]);
  ids[j] = j;
}

// After the descending sort: top-k cut, softmax, top-p cut, min-p, draw.
__global__ void __launch_bounds__(kThreads) sorted_kernel(const float* row, int V, const uint32_t* keys,
                                                          const int32_t* ids, SampleRowSpec s, int32_t* out) {
  pdl_prologue();
  __shared__ Scratch sm;
  const int nf = block_count(V, [=](int j) { return keys[j] != 0u; }, sm);
  int t = -1;
  const bool cut_k = s.top_k > 0 && s.top_k < nf;
  if (nf == 0) {
    t = -1;
  } else if (!cut_k && s.top_p >= 1.0) {  // the twin keeps ascending id order here
    t = draw_ascending(row, V, s, sm);
  } else {
    const int n = cut_k ? int(s.top_k) : nf;
    const double inv_t = 1.0 / s.temperature;
    const double mx = double(key_value(keys[0])) * inv_t;
    auto e = [=](int j) { return exp(double(key_value(keys[j])) * inv_t - mx); };
    int n_keep = n;
    double S = -1;
    if (s.top_p < 1.0) {
      const Found f = find_first(n, e, s.top_p, /*strict=*/false, sm);
      S = f.total;
      if (f.index >= 0) n_keep = f.index + 1;
    }
    if (s.min_p > 0) {
      if (S < 0) S = block_sum(n, e, sm);
      const double thr = s.min_p * (1.0 / S);
      n_keep = block_count(n_keep, [=](int j) { return e(j) / S >= thr; }, sm);
    }
    const Found f = find_first(n_keep, e, s.u, /*strict=*/true, sm);
    t = ids[f.index >= 0 ? f.index : n_keep - 1];
  }
  if (threadIdx.x == 0) *out = t;
}

size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

}  // namespace

cudaError_t sample_workspace_bytes(int vocab, size_t* bytes) {
  size_t temp = 0;
  const cudaError_t e = cub::DeviceRadixSort::SortPairsDescending(
      nullptr, temp, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), vocab);
  if (e != cudaSuccess) return e;
  *bytes = 4 * align_up(size_t(vocab) * 4) + align_up(temp);
  return cudaSuccess;
}

cudaError_t launch_sample_rows(const float* logits, int rows, int vocab, const SampleRowSpec* specs,
                               int32_t* out, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  const size_t a = align_up(size_t(vocab) * 4);
  char* ws = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<uint32_t*>(ws);
  auto* keys_out = reinterpret_cast<uint32_t*>(ws + a);
  auto* ids_in = reinterpret_cast<int32_t*>(ws + 2 * a);
  auto* ids_out = reinterpret_cast<int32_t*>(ws + 3 * a);
  void* temp = ws + 4 * a;
  size_t temp_bytes = workspace_bytes - 4 * a;
  auto greedy_at = [&](int r) { return specs[r].temperature <= 0.0 || specs[r].top_k == 1; };
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + size_t(r) * size_t(vocab);
    const SampleRowSpec& s = specs[r];
    const bool greedy = greedy_at(r);
    const bool sorted = (s.top_k > 0 && s.top_k < vocab) || s.top_p < 1.0;
    cudaError_t e = cudaSuccess;
    if (greedy) {  // this row and the greedy rows after it: a block each
      int n = 1;
      while (r + n < rows && greedy_at(r + n)) ++n;
      e = launch_kernel(argmax_kernel, unsigned(n), kThreads, 0, stream, row, vocab, out + r);
      r += n - 1;
    } else if (!sorted) {
      e = launch_kernel(ascending_kernel, 1, kThreads, 0, stream, row, vocab, s, out + r);
    } else {
      e = launch_kernel(sort_input_kernel, unsigned((vocab + 255) / 256), 256, 0, stream, row, vocab, keys_in, ids_in);
      if (e != cudaSuccess) return e;
      LaunchTape& tape = launch_tape();
      if (tape.mode == LaunchTape::kPatch) {
        tape.failed = true;  // CUB is not on the tape: the step gets recorded instead
      } else {
        launch_tape_unpatchable();
        e = cub::DeviceRadixSort::SortPairsDescending(temp, temp_bytes, keys_in, keys_out, ids_in, ids_out,
                                                      vocab, 0, 32, stream);
        if (e != cudaSuccess) return e;
      }
      e = launch_kernel(sorted_kernel, 1, kThreads, 0, stream, row, vocab, static_cast<const uint32_t*>(keys_out),
                        static_cast<const int32_t*>(ids_out), s, out + r);
    }
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace flashseek::ops::cuda::detail
