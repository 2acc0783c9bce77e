// A probe of issue 16's L2 weight prefetch (tried in session 51, branch wip/l2-prefetch): how much
// faster is a decode GEMV whose weights an earlier prefetch put in L2, and how fast does a
// cp.async.bulk.prefetch.L2 launch fill L2? Each case times two launch sequences per repetition,
// the matrix one of enough copies read in turn that nothing stays in L2 from the previous
// repetition:
//   cold: spin(D) ; gemv                      minus spin(D) alone
//   warm: prefetch ; spin(D) ; gemv           minus prefetch ; spin(D)
// spin(D) is one block busy-waiting D µs: the latency-bound kernels of a decode step that leave HBM
// idle. A plain 16-byte read of the same bytes (`read`) gives the bandwidth ceiling cold and warm.
// Sweeps: D (how fast the fill is), the prefetch's blocks and chunk size, and its byte budget
// against a matrix larger than L2 (wq_b, 42 MB). The prefetch kernel is this file's own (a thread
// per chunk; a budget below the matrix takes chunks spread evenly over it). Run by hand on the GPU
// box (sm_90+), no arguments.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cuda/probes/probe_util.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/model/small_kernels.h"

namespace {

using flashseek::ops::BlockLinearParams;
using flashseek::ops::WeightFormat;
namespace fc = flashseek::ops::cuda;

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void read_kernel(const uint4* p, int64_t n, uint32_t* out) {
  uint32_t acc = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

struct PrefetchParams {
  int64_t budget = int64_t(1) << 40;  // bytes requested over the spans, in order (see the file comment)
  int64_t chunk = 32 << 10;           // bytes per prefetch instruction (a multiple of 16)
  int ctas = 16;                      // blocks of 64 threads
};

// Requests chunk floor(i · chunks / take) of [p, p + bytes) for i < take (bytes a multiple of 16).
__global__ void prefetch_kernel(const char* p, uint64_t bytes, uint32_t chunk, uint32_t chunks, uint32_t take) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < take; i += gridDim.x * blockDim.x) {
    const uint64_t off = uint64_t(i) * chunks / take * chunk;
    const uint32_t len = uint32_t(min(uint64_t(chunk), bytes - off));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + off), "r"(len) : "memory");
  }
#endif
}

struct Mat {
  std::string name;
  int64_t n, k;
  bool gated;
  int copies = 0;
  std::vector<uint8_t*> w, s, wu, su;
  int64_t code_bytes() const { return n * k; }
  int64_t scale_bytes() const { return ((n + 31) / 32) * (k / 32); }
  int64_t bytes() const { return (code_bytes() + scale_bytes()) * (gated ? 2 : 1); }
};

void check(const flashseek::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.message().c_str());
    std::exit(1);
  }
}

uint8_t* alloc_fill(int64_t n, int kind, uint64_t seed) {
  uint8_t* p = nullptr;
  CK(cudaMalloc(&p, size_t(n)));
  CK(fc::detail::launch_fill_bytes(p, n, seed, kind, nullptr));
  return p;
}

int g_sms = 132;
double g_cycles_per_us = 1980;
float* g_x = nullptr;
float* g_y = nullptr;
uint32_t* g_sink = nullptr;

void gemv(const Mat& m, int c, int rows) {
  BlockLinearParams p;
  p.x = g_x, p.y = g_y, p.m = rows, p.n = m.n, p.k = m.k, p.format = WeightFormat::kFp8, p.w_block = 32;
  p.act_block = 32, p.w = m.w[size_t(c)], p.w_scale = m.s[size_t(c)];
  if (m.gated) p.w_up = m.wu[size_t(c)], p.w_up_scale = m.su[size_t(c)], p.swiglu_limit = 10.f;
  check(fc::block_linear_cuda(p, nullptr), "gemv");
}

void read(const Mat& m, int c) {
  read_kernel<<<g_sms * 4, 256>>>(reinterpret_cast<const uint4*>(m.w[size_t(c)]), m.code_bytes() / 16, g_sink);
  CK(cudaGetLastError());
}

void prefetch(const Mat& m, int c, const PrefetchParams& pp) {
  std::vector<std::pair<const uint8_t*, int64_t>> spans = {{m.w[size_t(c)], m.code_bytes()},
                                                           {m.s[size_t(c)], m.scale_bytes()}};
  if (m.gated) {
    spans.push_back({m.wu[size_t(c)], m.code_bytes()});
    spans.push_back({m.su[size_t(c)], m.scale_bytes()});
  }
  int64_t left = pp.budget;
  for (const auto& [p, n0] : spans) {
    const int64_t n = n0 & ~int64_t(15);  // cudaMalloc'd: 16-byte aligned starts
    if (left <= 0 || n <= 0) break;
    const int64_t chunks = (n + pp.chunk - 1) / pp.chunk;
    const int64_t take = n <= left ? chunks : std::min(chunks, std::max<int64_t>(1, left / pp.chunk));
    left -= take == chunks ? n : take * pp.chunk;
    const int blocks = int(std::min<int64_t>(pp.ctas, (take + 63) / 64));
    prefetch_kernel<<<blocks, 64>>>(reinterpret_cast<const char*>(p), uint64_t(n), uint32_t(pp.chunk),
                                    uint32_t(chunks), uint32_t(take));
    CK(cudaGetLastError());
  }
}

void spin(double us) {
  spin_kernel<<<1, 32>>>((long long)(us * g_cycles_per_us));
  CK(cudaGetLastError());
}

// µs of `op` cold and warm (see the file comment).
template <class Op>
void measure(const Mat& m, Op&& op, double d_us, const PrefetchParams& pp, int reps,
             double* cold, double* warm) {
  const double base = 1e3 * probe::time_ms([&](int) { spin(d_us); }, reps);
  const double c_us = 1e3 * probe::time_ms([&](int i) { spin(d_us), op(i % m.copies); }, reps);
  const double pbase = 1e3 * probe::time_ms([&](int i) { prefetch(m, i % m.copies, pp), spin(d_us); }, reps);
  const double w_us = 1e3 * probe::time_ms([&](int i) { prefetch(m, i % m.copies, pp), spin(d_us), op(i % m.copies); }, reps);
  *cold = c_us - base, *warm = w_us - pbase;
}

}  // namespace

int main() {
  int dev = 0, clk = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  g_cycles_per_us = clk / 1e3;
  std::printf("# %s, %d SMs, L2 %.1f MB, SM clock %.0f MHz\n", prop.name, g_sms, l2 / 1e6, g_cycles_per_us);
  CK(cudaMalloc(&g_x, 16 * 8192 * sizeof(float)));
  CK(cudaMalloc(&g_y, 16 * 32768 * sizeof(float)));
  CK(cudaMalloc(&g_sink, 16));
  CK(fc::detail::launch_fill_floats(g_x, 16 * 8192, 7, 1.0f, nullptr));

  std::vector<Mat> mats = {{"wq_a+wkv", 1792, 5120, false}, {"wq_b", 32768, 1280, false},
                           {"wo_b", 5120, 8192, false},     {"shared gate+up", 2304, 5120, true},
                           {"shared down", 5120, 2304, false}};
  uint64_t seed = 1;
  for (Mat& m : mats) {
    m.copies = int(std::max<int64_t>(4, (400ll << 20) / m.bytes() + 1));
    for (int c = 0; c < m.copies; ++c) {
      m.w.push_back(alloc_fill(m.code_bytes(), 1, seed++));
      m.s.push_back(alloc_fill(m.scale_bytes(), 2, seed++));
      if (m.gated) {
        m.wu.push_back(alloc_fill(m.code_bytes(), 1, seed++));
        m.su.push_back(alloc_fill(m.scale_bytes(), 2, seed++));
      }
    }
  }
  CK(cudaDeviceSynchronize());
  const int reps = 40;
  const PrefetchParams all;

  std::printf("\n## cold vs warm, D = 40 us, the prefetch unbounded (16 blocks, 32 KB chunks)\n");
  std::printf("| matrix | MB | op | cold us | warm us | cold GB/s | warm GB/s | warm/cold |\n|---|---|---|---|---|---|---|---|\n");
  for (const Mat& m : mats) {
    const double mb = m.bytes() / 1e6;
    auto row = [&](const char* op, double c, double w, double bytes) {
      std::printf("| %s | %.1f | %s | %.2f | %.2f | %.0f | %.0f | %.2f |\n", m.name.c_str(), mb, op, c, w, bytes / c / 1e3,
                  bytes / w / 1e3, w / c);
    };
    double c = 0, w = 0;
    for (int rows : {1, 6}) {
      measure(m, [&](int cp) { gemv(m, cp, rows); }, 40, all, reps, &c, &w);
      row(rows == 1 ? "gemv m=1" : "gemv m=6", c, w, double(m.bytes()));
    }
    measure(m, [&](int cp) { read(m, cp); }, 40, all, reps, &c, &w);
    row("read (codes)", c, w, double(m.code_bytes()));
  }

  const Mat& q = mats[1];  // wq_b, 42 MB
  const Mat& s = mats[3];  // shared gate + up, 23.6 MB
  std::printf("\n## fill speed: GEMV m=1 after prefetch + spin(D)\n| matrix | D us | cold us | warm us |\n|---|---|---|---|\n");
  for (const Mat* m : {&s, &q}) {
    for (double d : {2.0, 5.0, 10.0, 20.0}) {
      double c = 0, w = 0;
      measure(*m, [&](int cp) { gemv(*m, cp, 1); }, d, all, reps, &c, &w);
      std::printf("| %s | %.0f | %.2f | %.2f |\n", m->name.c_str(), d, c, w);
    }
  }
  std::printf("\n## prefetch shape: shared gate+up GEMV m=1, D = 8 us\n| blocks | chunk KB | warm us |\n|---|---|---|\n");
  for (int ctas : {2, 8, 32, 132}) {
    for (int64_t chunk : {int64_t(8) << 10, int64_t(32) << 10, int64_t(128) << 10}) {
      PrefetchParams pp = all;
      pp.ctas = ctas, pp.chunk = chunk;
      double c = 0, w = 0;
      measure(s, [&](int cp) { gemv(s, cp, 1); }, 8, pp, reps, &c, &w);
      std::printf("| %d | %lld | %.2f |\n", ctas, (long long)(chunk >> 10), w);
    }
  }
  std::printf("\n## budget against wq_b (%.1f MB), GEMV m=1, D = 40 us\n| budget MB | warm us |\n|---|---|\n",
              q.bytes() / 1e6);
  for (int mb : {0, 8, 16, 24, 32, 40, 48}) {
    PrefetchParams pp = all;
    pp.budget = int64_t(mb) << 20;
    double c = 0, w = 0;
    measure(q, [&](int cp) { gemv(q, cp, 1); }, 40, pp, reps, &c, &w);
    std::printf("| %d | %.2f |\n", mb, w);
  }
  return 0;
}
