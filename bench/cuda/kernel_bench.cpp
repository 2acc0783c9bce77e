// Kernel micro-benchmarks: device sampling vs the host path, FP8 GEMM kernel variants
// (kernel_bench.h).
#include "bench/cuda/kernel_bench.h"

#include "ops/block_scaled_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "core/numeric.h"
#include "core/rng.h"
#include "bench/cuda/bench_util.h"
#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/gemm/gemm_fp8.h"
#include "ops/cuda/gemm/gemm_fp8_kernels.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/cuda/sampling/sample.h"
#include "ops/gemm_fp8.h"
#include "ops/indexer.h"
#include "ops/sample.h"

namespace flashseek::ops::cuda {
namespace {


// Two events destroyed at scope exit.
struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  Events() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Events() {
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

template <typename T>
Status upload(T* dst, const std::vector<T>& src) {
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
  return {};
}

// ------------------------------------------------------------------ host -> device copy

// The host-to-device copy ceiling that bounds weight loading from a warm page cache: one 256 MB
// pinned buffer copied to the device by one stream, then by two (two DMA engines), median of
// `reps` copies each. Loading from pinned staging can go no faster than this.
Result<std::string> h2d_bench(int reps) {
  constexpr size_t kBytes = size_t(256) << 20;
  void* host = nullptr;
  void* dev = nullptr;
  FS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, kBytes, cudaHostAllocDefault));
  struct Free {
    void* h;
    void** d;
    ~Free() {
      if (h) cudaFreeHost(h);
      if (*d) cudaFree(*d);
    }
  } guard{host, &dev};
  std::memset(host, 1, kBytes);
  FS_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev, kBytes));
  cudaStream_t st[2] = {nullptr, nullptr};
  for (auto& x : st) FS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  std::string out = "### Host -> device copy (pinned, 256 MB per sample)\n\n| streams | GB/s (median) |\n|---|---|\n";
  for (int ns : {1, 2}) {
    std::vector<double> v;
    for (int r = 0; r < std::max(reps, 3); ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const size_t part = kBytes / size_t(ns);
      for (int i = 0; i < ns; ++i)
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(dev) + size_t(i) * part,
                                                static_cast<char*>(host) + size_t(i) * part, part,
                                                cudaMemcpyHostToDevice, st[i]));
      for (int i = 0; i < ns; ++i) FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(st[i]));
      v.push_back(double(kBytes) / 1e9 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(v.begin(), v.end());
    out += fmt::format("| {} | {:.2f} |\n", ns, v[v.size() / 2]);
  }
  for (auto& x : st) cudaStreamDestroy(x);
  return out;
}

// ------------------------------------------------------------------ sampling

Result<std::string> sampling_bench(int reps) {
  const int64_t V = 129280;
  Rng rng(5);
  std::vector<float> row(static_cast<size_t>(V)), flat_row(static_cast<size_t>(V));
  for (auto& x : row) x = float(rng.normal() * 3.0);        // peaked
  for (auto& x : flat_row) x = float(rng.normal() * 0.01);  // flat: top-p keeps many tokens
  FS_ASSIGN_OR_RETURN(size_t ws_bytes, sample_rows_workspace_bytes(V));
  bench::Arena ar;
  FS_ASSIGN_OR_RETURN(float* d_row, ar.alloc<float>(V));
  FS_ASSIGN_OR_RETURN(float* d_flat, ar.alloc<float>(V));
  FS_ASSIGN_OR_RETURN(int32_t* d_out, ar.alloc<int32_t>(1));
  FS_ASSIGN_OR_RETURN(char* ws, ar.alloc<char>(int64_t(ws_bytes)));
  FS_RETURN_IF_ERROR(upload(d_row, row));
  FS_RETURN_IF_ERROR(upload(d_flat, flat_row));
  struct Case {
    const char* name;
    SampleSpec s;
    bool flat;
  };
  std::vector<Case> cases(6);
  cases[0] = {"greedy", {}, false};
  cases[0].s.temperature = 0;
  cases[1] = {"temperature 0.8", {}, false};
  cases[1].s.temperature = 0.8;
  cases[2] = {"top-k 50", {}, false};
  cases[2].s.top_k = 50;
  cases[3] = {"top-p 0.9 peaked", {}, false};
  cases[3].s.top_p = 0.9;
  cases[4] = {"top-p 0.9 flat", {}, true};
  cases[4].s.top_p = 0.9;
  cases[5] = {"min-p 0.05", {}, false};
  cases[5].s.min_p = 0.05;
  Events ev;
  std::string md = fmt::format(
      "### Sampling, one row of V = {} (device: {} launches per sample; host: 5 copies + CPU sampler)\n\n"
      "| sampler | device us/row (launch included) | host copy + CPU sampler us/row | token |\n"
      "|---|---|---|---|\n",
      V, reps);
  std::vector<float> h(static_cast<size_t>(V));
  for (Case& c : cases) {
    c.s.u = 0.37;
    SampleRowsParams g;
    g.logits = c.flat ? d_flat : d_row, g.rows = 1, g.vocab = V, g.specs = &c.s;
    g.out = d_out, g.workspace = ws, g.workspace_bytes = ws_bytes;
    FS_RETURN_IF_ERROR(sample_rows_cuda(g, nullptr));  // warm-up
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.a, nullptr));
    for (int i = 0; i < reps; ++i) FS_RETURN_IF_ERROR(sample_rows_cuda(g, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.b, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.b));
    float ms = 0;
    FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.a, ev.b));
    // Host path: copy the row to pageable memory and run the CPU sampler.
    const auto t0 = std::chrono::steady_clock::now();
    int32_t tok = 0;
    for (int i = 0; i < 5; ++i) {
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(h.data(), g.logits, size_t(V) * 4, cudaMemcpyDeviceToHost));
      FS_ASSIGN_OR_RETURN(tok, sample_row(h, c.s));
    }
    const double host_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 5;
    md += fmt::format("| {} | {:.1f} | {:.1f} | {} |\n", c.name, 1000.0 * ms / reps, host_us, tok);
  }
  return md;
}

// ------------------------------------------------------------------ index top-k

// Top-512 of 131,072 keys at M = 1 and 6 (rows of n - M + 1 .. n keys, as in a decode step), every
// path of launch_index_topk, two score sets: distinct normals (the cluster kernel usually stops
// after 2 radix levels) and ~20 distinct values (ties: 3 levels and the index tie-break). Each
// path is probed against ops::topk_indices first: a wrong result is an error, not a time.
Result<std::string> topk_bench(int reps) {
  const int64_t n = 131072, k = 512;
  struct Path {
    const char* name;
    int path, cluster;
  };
  const Path paths[] = {{"one block per row (path 1)", 1, 0},
                        {"over blocks, 4 launches (path 2)", 2, 0},
                        {"one cluster per row (path 3, automatic size)", 3, 0},
                        {"one cluster of 8 per row (path 3)", 3, 8},
                        {"one cluster of 16 per row (path 3)", 3, 16}};
  Events ev;
  std::string md = fmt::format(
      "### Index top-{} of {} keys (`launch_index_topk`, mode 0, {} launches per sample; GB/s = score bytes "
      "read + indices written per us)\n\n| scores | M | path | cluster | us | GB/s |\n|---|---|---|---|---|---|\n",
      k, n, reps);
  for (const bool coarse : {false, true}) {
    for (const int64_t M : {int64_t(1), int64_t(6)}) {
      const int64_t start = n - M, stride = n;
      Rng rng(uint64_t(17 + M + 100 * coarse));
      std::vector<float> sc(static_cast<size_t>(M * stride));
      for (auto& x : sc) {
        x = float(rng.normal());
        if (coarse) x = std::round(x * 3.0f) / 3.0f;
      }
      bench::Arena ar;
      FS_ASSIGN_OR_RETURN(float* d_sc, ar.alloc<float>(M * stride));
      FS_ASSIGN_OR_RETURN(float* d_bs, ar.alloc<float>(M * stride));
      FS_ASSIGN_OR_RETURN(uint8_t* d_cand, ar.alloc<uint8_t>(M * stride));
      FS_ASSIGN_OR_RETURN(uint8_t* d_taken, ar.alloc<uint8_t>(M * stride));
      FS_ASSIGN_OR_RETURN(int32_t* d_out, ar.alloc<int32_t>(M * k));
      FS_ASSIGN_OR_RETURN(int32_t* d_n, ar.alloc<int32_t>(M));
      FS_RETURN_IF_ERROR(upload(d_sc, sc));
      std::vector<std::vector<int32_t>> ref(static_cast<size_t>(M));
      for (int64_t t = 0; t < M; ++t) ref[size_t(t)] = topk_indices(sc.data() + t * stride, start + t + 1, k);
      for (const Path& p : paths) {
        detail::IndexTopkArgs a;
        a.scores = d_sc, a.cand = d_cand, a.block_scratch = d_bs, a.taken = d_taken, a.out = d_out, a.out_n = d_n;
        a.T = M, a.start = start, a.ratio = 1, a.stride = stride, a.k = k, a.cand_block = 8, a.cand_top = 2048;
        a.mode = 0, a.path = p.path, a.cluster = p.cluster;
        const int used = p.path == 3 ? detail::index_topk_cluster_size(a) : 0;
        const std::string cl = p.path == 3 ? std::to_string(used) : "-";
        if (p.path == 3 && used == 0) {
          md += fmt::format("| {} | {} | {} | not available on this device | | |\n", coarse ? "~20 values" : "distinct", M, p.name);
          continue;
        }
        FS_CUDA_RETURN_IF_ERROR(cudaMemset(d_out, 0xFF, size_t(M * k) * sizeof(int32_t)));
        FS_CUDA_RETURN_IF_ERROR(detail::launch_index_topk(a, nullptr));
        FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
        std::vector<int32_t> out(static_cast<size_t>(M * k)), cnt(static_cast<size_t>(M));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(), d_out, out.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(cnt.data(), d_n, cnt.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
        for (int64_t t = 0; t < M; ++t) {
          const auto& r = ref[size_t(t)];
          if (cnt[size_t(t)] != int32_t(r.size()) ||
              !std::equal(r.begin(), r.end(), out.begin() + t * k))
            return internal_error("topk bench: {} differs from ops::topk_indices (M {}, row {})", p.name, M, t);
        }
        FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.a, nullptr));
        for (int i = 0; i < reps; ++i) FS_CUDA_RETURN_IF_ERROR(detail::launch_index_topk(a, nullptr));
        FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.b, nullptr));
        FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.b));
        float ms = 0;
        FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.a, ev.b));
        const double us = 1000.0 * ms / reps, bytes = 4.0 * M * n + 4.0 * M * k;
        md += fmt::format("| {} | {} | {} | {} | {:.1f} | {:.0f} |\n", coarse ? "~20 values" : "distinct", M, p.name, cl,
                          us, bytes / us / 1e3);
      }
    }
  }
  return md;
}

// ------------------------------------------------------------------ FP8 GEMM variants

constexpr int kLastKernel = 9;  // kernels 1..9 (GemmFp8Params::kernel)

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Median over `reps` event-timed calls after 3 warm-ups, in microseconds.
template <typename F>
Result<double> time_us(F&& f, int reps) {
  Events ev;
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.a, nullptr));
    f();
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.b, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.b));
    float ms = 0;
    FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.a, ev.b));
    t.push_back(ms * 1000.0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Relative Frobenius error of every variant against the twin on one 128x128x256 case; the
// unswizzled variant once more with its descriptor byte offsets swapped, which must be far off
// (shows the probe can fail).
Result<std::string> gemm_probe(const std::string& skip) {
  std::mt19937 rng(5);
  const int64_t m = 128, n = 128, k = 256;
  const std::vector<uint8_t> w = random_fp8_codes(rng, size_t(n * k)), ws = random_e8m0_scales(rng, 4 * 8);
  const std::vector<float> x = random_block_activations(rng, m, k);
  std::vector<float> ref(size_t(m * n));
  GemmFp8Params p;
  p.m = m, p.n = n, p.k = k, p.x = x.data(), p.w = w.data(), p.w_scale = ws.data(), p.y = ref.data();
  FS_RETURN_IF_ERROR(gemm_fp8_ref(p));
  bench::Arena ar;
  FS_ASSIGN_OR_RETURN(float* dx, ar.alloc<float>(m * k));
  FS_ASSIGN_OR_RETURN(float* dy, ar.alloc<float>(m * n));
  FS_ASSIGN_OR_RETURN(float* dxs, ar.alloc<float>(m * k / 32));
  FS_ASSIGN_OR_RETURN(uint8_t* dw, ar.alloc<uint8_t>(n * k));
  FS_ASSIGN_OR_RETURN(uint8_t* dws, ar.alloc<uint8_t>(int64_t(ws.size())));
  FS_ASSIGN_OR_RETURN(uint8_t* dxq, ar.alloc<uint8_t>(m * k));
  FS_RETURN_IF_ERROR(upload(dx, x));
  FS_RETURN_IF_ERROR(upload(dw, w));
  FS_RETURN_IF_ERROR(upload(dws, ws));
  FS_RETURN_IF_ERROR(gemm_fp8_quantize_cuda(dx, ActDtype::kF32, m, k, 32, dxq, dxs, nullptr));
  std::string md = "### FP8 GEMM variant probe (128x128x256 vs the CPU twin)\n\n"
                   "| variant | relative Frobenius error |\n|---|---|\n";
  std::vector<float> got(ref.size());
  for (int variant = 1; variant <= kLastKernel + 1; ++variant) {
    const bool swap = variant == kLastKernel + 1;
    if (!swap && skip.find(char('0' + variant)) != std::string::npos) continue;
    detail::GemmFp8Args a{};
    a.xq = dxq, a.xs = dxs, a.w = dw, a.ws = dws, a.y = dy;
    a.m = int(m), a.n = int(n), a.k = int(k), a.w_block = 32;
    a.variant = swap ? 1 : variant, a.desc_swap = swap;
    FS_CUDA_RETURN_IF_ERROR(detail::launch_gemm_fp8(a, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = double(got[i]) - ref[i];
      num += std::isfinite(d) ? d * d : 1e30;
      den += double(ref[i]) * ref[i];
    }
    const double err = std::sqrt(num / den);
    md += fmt::format("| {}{} | {:.3g} |\n", a.variant, swap ? " (descriptor offsets swapped)" : "", err);
    if (!swap && !(err < 1e-3))
      return internal_error("gemm bench: variant {} is off by {:.3g} (relative Frobenius) on the probe; "
                            "not timing a wrong kernel (see tests/ops_cuda)", a.variant, err);
  }
  return md;
}

// A random FP8 weight [n, k] for the GEMM benchmarks: e4m3 codes without NaN (|v| <= 240) and
// E8M0 scales 2^-7 .. 2^0 per 32 × 32 block.
void random_fp8_weight(uint64_t& seed, int64_t n, int64_t k, std::vector<uint8_t>& w, std::vector<uint8_t>& ws) {
  w.resize(size_t(n * k));
  for (size_t i = 0; i < w.size(); i += 8) {
    uint64_t r = splitmix(seed) & 0x7e7e7e7e7e7e7e7eull;
    std::memcpy(w.data() + i, &r, std::min<size_t>(8, w.size() - i));
  }
  ws.resize(size_t(n / 32 * (k / 32)));
  for (auto& v : ws) v = uint8_t(120 + splitmix(seed) % 8);
}

Result<std::string> gemm_bench(const std::string& skip) {
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  FS_ASSIGN_OR_RETURN(std::string md, gemm_probe(skip));
  struct Shape {
    const char* name;
    int64_t m, n, k;
  };
  const Shape shapes[] = {
      {"wq_a+wkv [1792,5120]", 8192, 1792, 5120},
      {"wq_b [32768,1280]", 8192, 32768, 1280},
      {"wo_b [5120,8192]", 8192, 5120, 8192},
      {"shared gate+up [4608,5120]", 8192, 4608, 5120},
      {"shared down [5120,2304]", 8192, 5120, 2304},
      {"routed gate+up, 1 expert (m=128)", 128, 4608, 5120},
      {"routed down, 1 expert (m=128)", 128, 5120, 2304},
      {"routed gate+up, all pairs dense proxy", 49152, 4608, 5120},
      {"square 8192^3", 8192, 8192, 8192},
  };
  // Columns: TFLOP/s of kernels 1..9 (GEMM only, pre-quantised input), then kernels 4, 6 and 7
  // without promotion (diagnostic: the cost of the FP32 promotion), the quantisation kernel.
  constexpr int kNoPromote[] = {4, 6, 7};
  constexpr int kCols = kLastKernel + 3;
  md += fmt::format("\n### FP8 GEMM kernel variants, TFLOP/s ({}, {} SMs)\n\n| shape | m | n | k |", prop.name,
                    prop.multiProcessorCount);
  for (int v = 1; v <= kLastKernel; ++v) md += fmt::format(" k{} |", v);
  for (int v : kNoPromote) md += fmt::format(" k{} no-promote |", v);
  md += " best GEMM | best GEMM us | quant us (bf16 in) | best GEMM+quant TFLOP/s |\n|";
  for (int i = 0; i < 4 + kCols + 4; ++i) md += "---|";
  md += "\n";
  for (const auto& s : shapes) {
    uint64_t seed = 0x1234 + uint64_t(s.n) * 31 + uint64_t(s.k);
    std::vector<uint8_t> w, ws;
    random_fp8_weight(seed, s.n, s.k, w, ws);
    std::vector<uint16_t> xb(size_t(s.m * s.k));
    for (auto& v : xb) v = f32_to_bf16(float(int64_t(splitmix(seed) % 2001) - 1000) * 1e-3f);
    bench::Arena ar;
    FS_ASSIGN_OR_RETURN(uint16_t* dx, ar.alloc<uint16_t>(s.m * s.k));
    FS_ASSIGN_OR_RETURN(uint16_t* dy, ar.alloc<uint16_t>(s.m * s.n));
    FS_ASSIGN_OR_RETURN(uint8_t* dw, ar.alloc<uint8_t>(int64_t(w.size())));
    FS_ASSIGN_OR_RETURN(uint8_t* dws, ar.alloc<uint8_t>(int64_t(ws.size())));
    FS_ASSIGN_OR_RETURN(uint8_t* dxq, ar.alloc<uint8_t>(s.m * s.k));
    FS_ASSIGN_OR_RETURN(float* dxs, ar.alloc<float>(s.m * s.k / 32));
    FS_RETURN_IF_ERROR(upload(dx, xb));
    FS_RETURN_IF_ERROR(upload(dw, w));
    FS_RETURN_IF_ERROR(upload(dws, ws));
    FS_RETURN_IF_ERROR(gemm_fp8_quantize_cuda(dx, ActDtype::kBf16, s.m, s.k, 32, dxq, dxs, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    const int reps = flop > 1e12 ? 10 : 30;
    double tf[kCols], best_us = 1e30;
    int best = 0;
    for (int v = 0; v < kCols; ++v) {
      detail::GemmFp8Args a{};
      a.xq = dxq, a.xs = dxs, a.w = dw, a.ws = dws, a.y = dy;
      a.m = int(s.m), a.n = int(s.n), a.k = int(s.k), a.w_block = 32, a.bf16_out = true;
      a.variant = v < kLastKernel ? v + 1 : kNoPromote[v - kLastKernel];
      a.skip_promote = v >= kLastKernel;
      if (skip.find(char('0' + a.variant)) != std::string::npos) {
        tf[v] = 0;
        continue;
      }
      FS_CUDA_RETURN_IF_ERROR(detail::launch_gemm_fp8(a, nullptr));
      FS_ASSIGN_OR_RETURN(const double us, time_us([&] { (void)detail::launch_gemm_fp8(a, nullptr); }, reps));
      tf[v] = flop / us * 1e-6;
      if (v < kLastKernel && us < best_us) best_us = us, best = v + 1;
    }
    FS_ASSIGN_OR_RETURN(const double qus, time_us(
        [&] { (void)gemm_fp8_quantize_cuda(dx, ActDtype::kBf16, s.m, s.k, 32, dxq, dxs, nullptr); }, reps));
    FS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    md += fmt::format("| {} | {} | {} | {} |", s.name, s.m, s.n, s.k);
    for (int v = 0; v < kCols; ++v) md += fmt::format(" {:.0f} |", tf[v]);
    if (best == 0) {
      md += " - | - | " + fmt::format("{:.1f}", qus) + " | - |\n";
    } else {
      md += fmt::format(" k{} | {:.1f} | {:.1f} | {:.0f} |\n", best, best_us, qus, flop / (best_us + qus) * 1e-6);
    }
  }
  return md;
}

// The prefill GEMM's operand modes (GemmFp8Params::x_f16 / x_bf16) against kernel 6's e4m3 mode
// on the serving path's shapes, TFLOP/s, and two timing diagnostics (wrong results, cost split only): without the FP32 promotion (skip_promote
// 1) and without the converter warps' expansion of W (skip_promote 2). "bf16 exp." columns: W
// expanded to BF16 once (w_bf16, the serving path's bf16-expanded), block-summed or, "direct", the
// whole of k summed on the tensor core (bf16_direct, bf16-direct).
Result<std::string> gemm16_bench() {
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  struct Shape {
    const char* name;
    int64_t m, n, k;
  };
  const Shape shapes[] = {
      {"wq_a+wkv [1792,5120]", 8192, 1792, 5120}, {"wq_b [32768,1280]", 8192, 32768, 1280},
      {"wo_b [5120,8192]", 8192, 5120, 8192},     {"shared gate+up [4608,5120]", 8192, 4608, 5120},
      {"square 8192^3", 8192, 8192, 8192},
  };
  struct Col {
    const char* name;
    int mode;  // 0 e4m3, 1 f16, 2 bf16
    int skip;
    bool wexp = false, direct = false;
  };
  const Col cols[] = {{"e4m3 (k6)", 0, 0},      {"f16", 1, 0},          {"f16 no-promote", 1, 1},
                      {"f16 no-convert", 1, 2}, {"f16 neither", 1, 3},  {"bf16", 2, 0},
                      {"bf16 no-convert", 2, 2}, {"bf16 direct", 2, 0, false, true},
                      {"bf16 exp.", 2, 0, true, false}, {"bf16 exp. direct", 2, 0, true, true}};
  std::string md = fmt::format("\n### Prefill GEMM operand modes, TFLOP/s ({}, {} SMs)\n\n| shape | m | n | k |",
                               prop.name, prop.multiProcessorCount);
  for (const auto& c : cols) md += fmt::format(" {} |", c.name);
  md += "\n|---|---|---|---|";
  for (size_t i = 0; i < std::size(cols); ++i) md += "---|";
  md += "\n";
  for (const auto& s : shapes) {
    uint64_t seed = 0x4321 + uint64_t(s.n) * 31 + uint64_t(s.k);
    std::vector<uint8_t> w, ws;
    random_fp8_weight(seed, s.n, s.k, w, ws);
    std::vector<float> x(size_t(s.m * s.k));
    for (auto& v : x) v = float(int64_t(splitmix(seed) % 2001) - 1000) * 1e-3f;
    bench::Arena ar;
    FS_ASSIGN_OR_RETURN(float* dx, ar.alloc<float>(s.m * s.k));
    FS_ASSIGN_OR_RETURN(float* dy, ar.alloc<float>(s.m * s.n));
    FS_ASSIGN_OR_RETURN(uint8_t* dw, ar.alloc<uint8_t>(int64_t(w.size())));
    FS_ASSIGN_OR_RETURN(uint8_t* dws, ar.alloc<uint8_t>(int64_t(ws.size())));
    FS_ASSIGN_OR_RETURN(uint8_t* dq8, ar.alloc<uint8_t>(s.m * s.k));
    FS_ASSIGN_OR_RETURN(uint8_t* dq16, ar.alloc<uint8_t>(2 * s.m * s.k));
    FS_ASSIGN_OR_RETURN(uint8_t* dqb, ar.alloc<uint8_t>(2 * s.m * s.k));
    FS_ASSIGN_OR_RETURN(float* dxs, ar.alloc<float>(s.m * s.k / 32));
    FS_ASSIGN_OR_RETURN(uint16_t* dwe, ar.alloc<uint16_t>(s.n * s.k));
    FS_RETURN_IF_ERROR(upload(dx, x));
    FS_RETURN_IF_ERROR(upload(dw, w));
    FS_RETURN_IF_ERROR(upload(dws, ws));
    GemmExpandBf16Params ep;
    ep.w = dw, ep.w_scale = dws, ep.y = dwe, ep.n = s.n, ep.k = s.k, ep.w_block = 32;
    FS_RETURN_IF_ERROR(gemm_expand_bf16_cuda(ep, nullptr));
    FS_RETURN_IF_ERROR(gemm_fp8_quantize_cuda(dx, ActDtype::kF32, s.m, s.k, 32, dq8, dxs, nullptr));
    FS_RETURN_IF_ERROR(gemm_fp8_quantize_cuda(dx, ActDtype::kF32, s.m, s.k, 32, dq16, dxs, nullptr, true));
    FS_RETURN_IF_ERROR(gemm_fp8_quantize_cuda(dx, ActDtype::kF32, s.m, s.k, 32, dqb, dxs, nullptr, false, false, true));
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    md += fmt::format("| {} | {} | {} | {} |", s.name, s.m, s.n, s.k);
    for (const auto& c : cols) {
      detail::GemmFp8Args a{};
      a.xq = c.mode == 0 ? dq8 : c.mode == 1 ? dq16 : dqb, a.xs = dxs, a.w = dw, a.ws = dws, a.y = dy;
      a.m = int(s.m), a.n = int(s.n), a.k = int(s.k), a.w_block = 32, a.variant = 6;
      a.x_f16 = c.mode == 1, a.x_bf16 = c.mode == 2;
      a.skip_promote = c.skip;  // bit 0: no promotion, bit 1: no expansion
      a.bf16_direct = c.direct;
      if (c.wexp) a.w = reinterpret_cast<const uint8_t*>(dwe), a.ws = nullptr, a.w_bf16 = true;
      auto launch = [&] { return detail::launch_gemm_fp8(a, nullptr); };
      FS_CUDA_RETURN_IF_ERROR(launch());
      FS_ASSIGN_OR_RETURN(const double us, time_us([&] { (void)launch(); }, 10));
      md += fmt::format(" {:.0f} |", flop / us * 1e-6);
    }
    md += "\n";
    FS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return md;
}

// The routed experts' grouped GEMM at the release's 384 experts (top-6 of uniform random routing,
// as an 8k or 32k prefill chunk gives them: ~128 or ~512 rows per expert), the serving path's
// bf16-direct modes: W expanded inside the kernel (FP4 → BF16 per tile; `--moe-expand-min-rows`),
// into shared memory or, operands swapped, into the wgmma's register fragments
// (w_in_registers), against W expanded once by gemm_expand_bf16 (the expansion and the GEMM timed apart and
// together), plus a timing diagnostic (wrong results, cost split only): the in-kernel mode
// without the expansion (skip_promote 2). "tiles": the 128-row tiles the groups need over the
// rows' own count (the tensor-core work of part-filled tail tiles).
Result<std::string> moe_gemm_bench() {
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  constexpr int64_t kExperts = 384, kTopK = 6;
  struct Shape {
    const char* name;
    int64_t n, k;
  };
  const Shape shapes[] = {{"routed gate (or up) [2304,5120]", 2304, 5120}, {"routed down [5120,2304]", 5120, 2304}};
  std::string md = fmt::format(
      "\n### Routed-expert grouped GEMM, {} experts, top-{} ({}, {} SMs), TFLOP/s (ms)\n\n"
      "| shape | tokens | rows/expert | tiles | in-kernel | in-kernel no-convert | W in registers | W in registers "
      "no-convert | expansion alone | pre-expanded GEMM | pre-expanded + expansion |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n",
      kExperts, kTopK, prop.name, prop.multiProcessorCount);
  for (const int64_t tokens : {int64_t(8192), int64_t(32768)})
    for (const auto& sh : shapes) {
      uint64_t seed = 0x6e0e + uint64_t(tokens) * 3 + uint64_t(sh.n);
      // Each token's top-6 distinct experts, uniform: the groups' row counts.
      std::vector<int32_t> count(kExperts, 0), ids(kExperts);
      for (int64_t t = 0; t < tokens; ++t) {
        std::iota(ids.begin(), ids.end(), 0);
        for (int64_t i = 0; i < kTopK; ++i) {
          std::swap(ids[size_t(i)], ids[size_t(i + int64_t(splitmix(seed) % uint64_t(kExperts - i)))]);
          ++count[size_t(ids[size_t(i)])];
        }
      }
      std::vector<int32_t> starts(kExperts + 1, 0);
      int64_t tiled = 0;
      for (int64_t e = 0; e < kExperts; ++e) {
        starts[size_t(e + 1)] = starts[size_t(e)] + count[size_t(e)];
        tiled += (count[size_t(e)] + 127) / 128 * 128;
      }
      const int64_t rows = tokens * kTopK, n = sh.n, k = sh.k;
      // W codes: random bytes made on the device (every byte is two valid e2m1 codes); scales in
      // 2^-3 .. 2^0 (the conversion's common one-multiply path); X: a block of BF16 values in ±1
      // repeated over the rows.
      std::vector<uint8_t> s4(size_t(kExperts * n * (k / 32)));
      for (auto& v : s4) v = uint8_t(124 + splitmix(seed) % 4);
      const int64_t xblock = std::min<int64_t>(rows * k, int64_t(1) << 22);
      std::vector<uint16_t> xb(static_cast<size_t>(xblock));
      for (auto& v : xb) v = f32_to_bf16(float(int64_t(splitmix(seed) % 2001) - 1000) * 1e-3f);
      bench::Arena ar;
      FS_ASSIGN_OR_RETURN(uint8_t* dw4, ar.alloc<uint8_t>(kExperts * n * k / 2));
      FS_ASSIGN_OR_RETURN(uint8_t* ds4, ar.alloc<uint8_t>(int64_t(s4.size())));
      FS_ASSIGN_OR_RETURN(uint16_t* dx, ar.alloc<uint16_t>(rows * k));
      FS_ASSIGN_OR_RETURN(uint16_t* dwe, ar.alloc<uint16_t>(kExperts * n * k));
      FS_ASSIGN_OR_RETURN(int32_t* dst, ar.alloc<int32_t>(kExperts + 1));
      FS_ASSIGN_OR_RETURN(float* dy, ar.alloc<float>(rows * n));
      FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(dw4, kExperts * n * k / 2, seed, 0, nullptr));
      FS_RETURN_IF_ERROR(upload(ds4, s4));
      FS_RETURN_IF_ERROR(upload(dx, xb));
      for (int64_t at = xblock; at < rows * k; at += xblock)
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dx + at, dx, size_t(std::min(xblock, rows * k - at)) * 2, cudaMemcpyDeviceToDevice));
      FS_RETURN_IF_ERROR(upload(dst, starts));
      GemmExpandBf16Params ep;
      ep.w = dw4, ep.w_scale = ds4, ep.y = dwe, ep.count = kExperts, ep.n = n, ep.k = k, ep.w_block = 32;
      ep.w_format = WeightFormat::kFp4;
      auto grouped = [&](bool pre, int skip, bool regs = false) {
        detail::GemmFp8Args a{};
        a.xq = reinterpret_cast<const uint8_t*>(dx), a.w = pre ? reinterpret_cast<const uint8_t*>(dwe) : dw4;
        a.ws = pre ? nullptr : ds4, a.y = dy, a.m = int(rows), a.n = int(n), a.k = int(k), a.w_block = 32;
        a.variant = 6, a.skip_promote = skip, a.row_start = dst, a.groups = int(kExperts);
        a.w_fp4 = !pre, a.x_bf16 = true, a.w_bf16 = pre, a.bf16_direct = true, a.w_in_registers = regs;
        return detail::launch_gemm_fp8(a, nullptr);
      };
      FS_RETURN_IF_ERROR(gemm_expand_bf16_cuda(ep, nullptr));
      FS_CUDA_RETURN_IF_ERROR(grouped(false, 0));
      FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      FS_ASSIGN_OR_RETURN(const double t_in, time_us([&] { (void)grouped(false, 0); }, 10));
      FS_ASSIGN_OR_RETURN(const double t_nc, time_us([&] { (void)grouped(false, 2); }, 10));
      FS_ASSIGN_OR_RETURN(const double t_rg, time_us([&] { (void)grouped(false, 0, true); }, 10));
      FS_ASSIGN_OR_RETURN(const double t_rn, time_us([&] { (void)grouped(false, 2, true); }, 10));
      FS_ASSIGN_OR_RETURN(const double t_ex, time_us([&] { (void)gemm_expand_bf16_cuda(ep, nullptr); }, 10));
      FS_ASSIGN_OR_RETURN(const double t_pre, time_us([&] { (void)grouped(true, 0); }, 10));
      FS_ASSIGN_OR_RETURN(const double t_both, time_us([&] {
                            (void)gemm_expand_bf16_cuda(ep, nullptr);
                            (void)grouped(true, 0);
                          }, 10));
      FS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      const double flop = 2.0 * double(rows) * double(n) * double(k);
      auto cell = [&](double us) { return fmt::format("{:.0f} ({:.2f})", flop / us * 1e-6, us * 1e-3); };
      md += fmt::format("| {} | {} | {:.0f} | {:.2f}x | {} | {} | {} | {} | {:.2f} ms | {} | {} |\n", sh.name, tokens,
                        double(rows) / double(kExperts), double(tiled) / double(rows), cell(t_in), cell(t_nc),
                        cell(t_rg), cell(t_rn), t_ex * 1e-3, cell(t_pre), cell(t_both));
    }
  return md;
}

// The prefill attention (launch_prefill_attn) at the V4.1 shape, 64 heads of 512, for an 8k
// chunk: its warpgroup kernel against the m16n8k16 one (PrefillAttnArgs::mma_sync) on the same
// inputs, time and the outputs with equal bits; key lists of 640 slots (the window's 128 and
// the top-k's 512) and of 128 (a window-only layer), a tenth of the slots padding.
Result<std::string> attn_bench() {
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  constexpr int64_t kM = 8192, kH = 64, kD = 512, kRows = 16384;
  std::string md = fmt::format(
      "\n### Prefill attention, {} rows x {} heads x {} dims ({}, {} SMs), µs (TFLOP/s)\n\n"
      "| key slots | m16n8k16 | wgmma | speedup | equal outputs |\n|---|---|---|---|---|\n",
      kM, kH, kD, prop.name, prop.multiProcessorCount);
  for (const int n_idx : {640, 128}) {
    uint64_t seed = 0xa77e + uint64_t(n_idx);
    std::vector<float> q(static_cast<size_t>(kM * kH * kD)), sink(static_cast<size_t>(kH));
    for (auto& v : q) v = float(int64_t(splitmix(seed) % 2001) - 1000) * 3e-4f;
    for (auto& v : sink) v = float(int64_t(splitmix(seed) % 2001) - 1000) * 2e-3f;
    std::vector<uint16_t> kv(size_t(kRows * kD));
    for (auto& v : kv) v = f32_to_bf16(float(int64_t(splitmix(seed) % 2001) - 1000) * 1e-3f);
    std::vector<int32_t> idx(size_t(kM * n_idx));
    for (auto& v : idx) v = splitmix(seed) % 10 == 0 ? -1 : int32_t(splitmix(seed) % uint64_t(kRows));
    bench::Arena ar;
    FS_ASSIGN_OR_RETURN(float* dq, ar.alloc<float>(int64_t(q.size())));
    FS_ASSIGN_OR_RETURN(float* dsink, ar.alloc<float>(kH));
    FS_ASSIGN_OR_RETURN(uint16_t* dkv, ar.alloc<uint16_t>(int64_t(kv.size())));
    FS_ASSIGN_OR_RETURN(int32_t* didx, ar.alloc<int32_t>(int64_t(idx.size())));
    FS_ASSIGN_OR_RETURN(float* dout_a, ar.alloc<float>(int64_t(q.size())));
    FS_ASSIGN_OR_RETURN(float* dout_b, ar.alloc<float>(int64_t(q.size())));
    FS_RETURN_IF_ERROR(upload(dq, q));
    FS_RETURN_IF_ERROR(upload(dsink, sink));
    FS_RETURN_IF_ERROR(upload(dkv, kv));
    FS_RETURN_IF_ERROR(upload(didx, idx));
    detail::PrefillAttnArgs a;
    a.q = dq, a.kv = dkv, a.idx = didx, a.sink = dsink, a.m = kM, a.n_idx = n_idx, a.n_rows = int(kRows);
    a.heads = int(kH), a.dim = int(kD), a.scale = 1.0f / std::sqrt(float(kD)), a.bf16_out = true;
    detail::PrefillAttnArgs b = a;
    a.out = dout_a, a.mma_sync = true;
    b.out = dout_b;
    FS_CUDA_RETURN_IF_ERROR(detail::launch_prefill_attn(a, nullptr));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_prefill_attn(b, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    std::vector<float> ha(q.size()), hb(q.size());
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(ha.data(), dout_a, ha.size() * 4, cudaMemcpyDeviceToHost));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(hb.data(), dout_b, hb.size() * 4, cudaMemcpyDeviceToHost));
    int64_t equal = 0;
    for (size_t i = 0; i < ha.size(); ++i) equal += std::memcmp(&ha[i], &hb[i], 4) == 0;
    FS_ASSIGN_OR_RETURN(const double t_a, time_us([&] { (void)detail::launch_prefill_attn(a, nullptr); }, 5));
    FS_ASSIGN_OR_RETURN(const double t_b, time_us([&] { (void)detail::launch_prefill_attn(b, nullptr); }, 5));
    FS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const double flop = 4.0 * double(kM) * double(kH) * double(n_idx) * double(kD);
    md += fmt::format("| {} | {:.0f} ({:.0f}) | {:.0f} ({:.0f}) | {:.2f}x | {} / {} |\n", n_idx, t_a,
                      flop / t_a * 1e-6, t_b, flop / t_b * 1e-6, t_a / t_b, equal, ha.size());
  }
  return md;
}

}  // namespace

// Whether the wgmma GEMM's whole-k BF16 steps (bf16_direct) and mma.sync m16n8k16 steps in the
// same order (launch_mma_steps: the attention kernels' S = Q·Kᵀ sequence) give the same bits: the
// question a wgmma attention that must keep the mma.sync kernels' bits turns on. BF16 data of
// two kinds (uniform in ±1; signs and exponents spread over 2^±12, so that the tensor core's
// alignment of products to the largest shows), both GEMMs and the block-summed BF16 mode against
// mma.sync (outputs with equal bits, largest distance in ulp), and each against the exact dot in
// double (|err| / Σ|x·w|, a check that every fragment layout is right).
Result<std::string> mma_order_bench() {
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  struct Shape {
    int m, n, k;
  };
  const Shape shapes[] = {{128, 128, 128}, {128, 128, 512}, {256, 256, 4096}, {128, 64, 7168}};
  std::string md = fmt::format(
      "\n### wgmma (bf16_direct) vs mma.sync m16n8k16 step order, BF16 ({})\n\n"
      "| m | n | k | data | direct == mma.sync | max ulp | block-summed == mma.sync | max ulp | |err|/Σ direct | "
      "mma.sync | block |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
      prop.name);
  auto ulp = [](float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4), std::memcpy(&ib, &b, 4);
    if ((ia < 0) != (ib < 0)) return int64_t(std::abs(int64_t(ia & 0x7fffffff)) + std::abs(int64_t(ib & 0x7fffffff)));
    return std::abs(int64_t(ia) - int64_t(ib));
  };
  for (const auto& sh : shapes)
    for (int spread = 0; spread < 2; ++spread) {
      uint64_t seed = 0x51ed + uint64_t(sh.k) * 7 + uint64_t(spread);
      auto value = [&]() -> uint16_t {
        const uint64_t r = splitmix(seed);
        const float v = spread ? std::ldexp(1.0f + float(r % 128) / 128.0f, int((r >> 8) % 25) - 12) * ((r >> 16) & 1 ? -1.0f : 1.0f)
                               : float(int64_t(r % 2001) - 1000) * 1e-3f;
        return f32_to_bf16(v);
      };
      std::vector<uint16_t> x(size_t(sh.m) * sh.k), w(size_t(sh.n) * sh.k);
      for (auto& v : x) v = value();
      for (auto& v : w) v = value();
      bench::Arena ar;
      FS_ASSIGN_OR_RETURN(uint16_t* dx, ar.alloc<uint16_t>(int64_t(x.size())));
      FS_ASSIGN_OR_RETURN(uint16_t* dw, ar.alloc<uint16_t>(int64_t(w.size())));
      FS_ASSIGN_OR_RETURN(float* dy, ar.alloc<float>(int64_t(sh.m) * sh.n * 3));
      FS_RETURN_IF_ERROR(upload(dx, x));
      FS_RETURN_IF_ERROR(upload(dw, w));
      const int64_t mn = int64_t(sh.m) * sh.n;
      FS_CUDA_RETURN_IF_ERROR(detail::launch_mma_steps(dx, dw, dy, sh.m, sh.n, sh.k, nullptr));
      for (int direct = 0; direct < 2; ++direct) {
        GemmFp8Params p;
        p.xq = reinterpret_cast<const uint8_t*>(dx), p.x_bf16 = true;
        p.w = reinterpret_cast<const uint8_t*>(dw), p.w_bf16 = true, p.bf16_direct = direct == 1;
        p.y = dy + (direct ? 1 : 2) * mn, p.m = sh.m, p.n = sh.n, p.k = sh.k, p.w_block = 32, p.act_block = 32;
        FS_RETURN_IF_ERROR(gemm_fp8_cuda(p, nullptr));
      }
      FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      std::vector<float> y(size_t(mn) * 3);
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
      int64_t same[2] = {0, 0}, far[2] = {0, 0};
      double err[3] = {0, 0, 0};
      for (int64_t i = 0; i < mn; ++i) {
        const int64_t r = i / sh.n, col = i % sh.n;
        double exact = 0, mag = 0;
        for (int64_t kk = 0; kk < sh.k; ++kk) {
          const double t = double(bf16_to_f32(x[size_t(r * sh.k + kk)])) * double(bf16_to_f32(w[size_t(col * sh.k + kk)]));
          exact += t, mag += std::fabs(t);
        }
        const float ym = y[size_t(i)];
        for (int j = 0; j < 3; ++j) err[j] = std::max(err[j], std::fabs(double(y[size_t(j * mn + i)]) - exact) / (mag + 1e-300));
        for (int j = 0; j < 2; ++j) {
          const float yj = y[size_t((j + 1) * mn + i)];
          const int64_t u = ulp(yj, ym);
          same[j] += u == 0, far[j] = std::max(far[j], u);
        }
      }
      md += fmt::format("| {} | {} | {} | {} | {} / {} | {} | {} / {} | {} | {:.1e} | {:.1e} | {:.1e} |\n", sh.m, sh.n,
                        sh.k, spread ? "spread 2^±12" : "uniform ±1", same[0], mn, far[0], same[1], mn, far[1], err[1],
                        err[0], err[2]);
    }
  return md;
}

Result<std::string> run_kernel_bench(const KernelBenchOptions& opt) {
  std::string why;
  if (!cuda_device_available(&why)) return Status(StatusCode::kUnavailable, "bench: " + why);
  if (opt.reps < 1) return invalid_argument("bench: --reps must be >= 1");
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  std::string out;
  for (const std::string& k : opt.kernels) {
    if (k == "sampling") {
      FS_ASSIGN_OR_RETURN(std::string md, sampling_bench(opt.reps));
      out += md + "\n";
    } else if (k == "gemm16") {
      FS_ASSIGN_OR_RETURN(std::string md, gemm16_bench());
      out += md;
    } else if (k == "moe") {
      FS_ASSIGN_OR_RETURN(std::string md, moe_gemm_bench());
      out += md;
    } else if (k == "attn") {
      FS_ASSIGN_OR_RETURN(std::string md, attn_bench());
      out += md;
    } else if (k == "mma-order") {
      FS_ASSIGN_OR_RETURN(std::string md, mma_order_bench());
      out += md;
    } else if (k == "gemm") {
      FS_ASSIGN_OR_RETURN(std::string md, gemm_bench(opt.skip_variants));
      out += md + "\n";
    } else if (k == "topk") {
      FS_ASSIGN_OR_RETURN(std::string md, topk_bench(opt.reps));
      out += md + "\n";
    } else if (k == "h2d") {
      FS_ASSIGN_OR_RETURN(std::string md, h2d_bench(opt.reps));
      out += md + "\n";
    } else if (k == "exact") {
      FS_ASSIGN_OR_RETURN(std::string md, exact_kernels_bench(opt.reps));
      FS_ASSIGN_OR_RETURN(std::string pack, cache_pack_bench(opt.reps));
      out += md + "\n" + pack + "\n";
    } else {
      return invalid_argument("bench: --kernels: unknown benchmark '{}' (sampling, gemm, gemm16, moe, attn, mma-order, topk, exact, h2d)", k);
    }
  }
  return out;
}

}  // namespace flashseek::ops::cuda
