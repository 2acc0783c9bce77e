// DSpark cost model on the V4.1 layer slice (spec_bench.h). What is measured and what is assumed:
// * one backbone layer at M = 1, block and block + 1 rows: the layer bench (layer_bench.cpp),
//   every kernel of attention + shared expert + routed experts with uniform random routing;
// * head-sized FP8 GEMVs timed here with the same tensor-core GEMV: LM head [129280, 5120] at
//   M = 1, block, block + 1; Markov head [129280, 256] at M = 1; main_proj [5120, 15360] at
//   M = block + 1. The LM and Markov heads are BF16 in the checkpoint: their times are scaled by
//   the byte ratio BF16 / FP8 (the GEMVs are bandwidth-bound);
// * a draft stage = the layer's kernels at M = block with the routed-expert kernels scaled by the
//   ratio of distinct experts read (top-k_d of E_d vs the target's measured count); its window
//   attention is timed with the backbone's 640 keys (an overestimate: the draft has ≤ 128 + 5);
// * 8 GPUs (projection): every kernel time divided by the GPU count but not below the fastest
//   kernel of the 1-token layer (launch floor), plus an assumed all-reduce cost per collective
//   (2 per layer or stage, 1 per head gather, 1 per Markov row).
#include "bench/cuda/spec_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::ops::cuda {
namespace {

constexpr int64_t kHidden = 5120, kVocab = 129280, kMarkovRank = 256, kTaps = 3;

struct Fp8Copies {
  std::vector<uint8_t*> w, s;
  int64_t n = 0, k = 0;
  ~Fp8Copies() {
    for (auto* p : w) cudaFree(p);
    for (auto* p : s) cudaFree(p);
  }
  double bytes() const { return double(n * k + weight_scale_bytes(WeightFormat::kFp8, n, k, 32)); }
};

Status make_fp8(Fp8Copies& m, int64_t n, int64_t k, double l2_bytes, uint64_t seed) {
  m.n = n, m.k = k;
  const double one = double(n * k);
  const int copies = int(std::clamp(std::ceil(3 * l2_bytes / one), 1.0, 16.0));
  for (int c = 0; c < copies; ++c) {
    uint8_t *w = nullptr, *s = nullptr;
    const int64_t sb = weight_scale_bytes(WeightFormat::kFp8, n, k, 32);
    FS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&w), size_t(n * k)));
    m.w.push_back(w);
    FS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&s), size_t(sb)));
    m.s.push_back(s);
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(w, n * k, seed + c * 7919, 1, nullptr));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(s, sb, seed + c * 7919 + 1, 2, nullptr));
  }
  return {};
}

// Median over `reps` samples of 10 back-to-back launches (each on the next weight copy).
Result<double> time_linear(const Fp8Copies& w, int64_t m, int reps) {
  float *x = nullptr, *y = nullptr;
  FS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&x), size_t(m * w.k) * 4));
  FS_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&y), size_t(m * w.n) * 4));
  struct Free {
    float *a, *b;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    ~Free() {
      cudaFree(a), cudaFree(b);
      if (e0) cudaEventDestroy(e0);
      if (e1) cudaEventDestroy(e1);
    }
  } guard{x, y};
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(x, m * w.k, 77, 1.0f, nullptr));
  auto run = [&](int i) {
    BlockLinearParams p;
    const size_t c = size_t(i) % w.w.size();
    p.x = x, p.w = w.w[c], p.w_scale = w.s[c], p.y = y, p.m = m, p.n = w.n, p.k = w.k;
    return block_linear_cuda(p, nullptr);
  };
  FS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&guard.e0));
  FS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&guard.e1));
  for (int i = 0; i < 3; ++i) FS_RETURN_IF_ERROR(run(i));
  std::vector<double> us;
  int call = 3;
  for (int r = 0; r < reps; ++r) {
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(guard.e0, nullptr));
    for (int b = 0; b < 10; ++b) FS_RETURN_IF_ERROR(run(call++));
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(guard.e1, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(guard.e1));
    float ms = 0;
    FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, guard.e0, guard.e1));
    us.push_back(ms * 100.0);  // per launch: ms · 1000 / 10
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

bool is_routed(const KernelTiming& k) { return k.name.rfind("routed", 0) == 0; }

// Distinct experts of a routed kernel, from its name "... (FP4, 29.3 experts)".
double distinct_of(const KernelTiming& k) {
  const auto at = k.name.find("FP4, ");
  double d = 0;
  if (at == std::string::npos || std::sscanf(k.name.c_str() + at + 5, "%lf", &d) != 1) return 0;
  return d;
}

}  // namespace

Result<SpecBenchReport> run_spec_bench(const SpecBenchOptions& opt) {
  if (opt.block < 1 || opt.block > 64) return invalid_argument("bench --spec: block {} must be in 1..64", opt.block);
  if (opt.layers < 1 || opt.stages < 1 || opt.gpus < 1 || opt.reps < 1)
    return invalid_argument("bench --spec: layers, stages, gpus and reps must be positive");
  if (opt.draft_topk < 1 || opt.draft_topk > opt.draft_experts)
    return invalid_argument("bench --spec: draft top-k {} of {} experts", opt.draft_topk, opt.draft_experts);
  const int B = opt.block, M = opt.block + 1;
  SpecBenchReport r;
  LayerBenchOptions lo;
  lo.tokens = {1, B, M};
  lo.reps = opt.reps;
  lo.layers = opt.layers;
  FS_ASSIGN_OR_RETURN(r.layer, run_layer_bench(lo));
  const double l2 = r.layer.l2_mb * 1e6;

  // Head-sized GEMVs (FP8 timed, BF16 heads scaled by bytes).
  Fp8Copies head, markov, main_proj;
  FS_RETURN_IF_ERROR(make_fp8(head, kVocab, kHidden, l2, 501));
  const double bf16_ratio = 2.0 * double(kVocab * kHidden) / head.bytes();
  FS_ASSIGN_OR_RETURN(double h1, time_linear(head, 1, opt.reps));
  FS_ASSIGN_OR_RETURN(double hb, time_linear(head, B, opt.reps));
  FS_ASSIGN_OR_RETURN(double hm, time_linear(head, M, opt.reps));
  r.head_us_1 = h1 * bf16_ratio, r.head_us_draft = hb * bf16_ratio, r.head_us_verify = hm * bf16_ratio;
  FS_RETURN_IF_ERROR(make_fp8(markov, kVocab, kMarkovRank, l2, 601));
  FS_ASSIGN_OR_RETURN(double mk, time_linear(markov, 1, opt.reps));
  r.markov_us = mk * 2.0 * double(kVocab * kMarkovRank) / markov.bytes();
  FS_RETURN_IF_ERROR(make_fp8(main_proj, kHidden, kTaps * kHidden, l2, 701));
  FS_ASSIGN_OR_RETURN(r.main_proj_us, time_linear(main_proj, M, opt.reps));

  // Per-layer sums; the draft stage from the M = block layer.
  double floor_us = 1e30, routed_b = 0, dense_b = 0, dist_b = 0;
  for (const auto& k : r.layer.kernels) {
    if (!k.role.empty()) continue;  // role extras (compressor, indexer, Engram) run in some layers only
    if (k.tokens == 1) r.layer_us_1 += k.median_us, floor_us = std::min(floor_us, k.median_us);
    if (k.tokens == M) r.layer_us_verify += k.median_us;
    if (k.tokens == B) {
      if (is_routed(k)) routed_b += k.median_us, dist_b = std::max(dist_b, distinct_of(k));
      else dense_b += k.median_us;
    }
  }
  const double Ed = opt.draft_experts, kd = opt.draft_topk;
  const double dist_draft = Ed * (1.0 - std::pow(1.0 - kd / Ed, B));
  r.draft_routed_scale = dist_b > 0 ? dist_draft / dist_b : 1.0;
  r.draft_stage_us = dense_b + routed_b * r.draft_routed_scale;
  r.draft_us = opt.stages * r.draft_stage_us + r.head_us_draft + B * r.markov_us;
  r.step_us_1 = opt.layers * r.layer_us_1 + r.head_us_1;
  r.step_us_verify = opt.layers * r.layer_us_verify + r.head_us_verify + r.main_proj_us;

  // N GPUs: kernel time / N, not below the launch floor; plus all-reduces.
  const double n = opt.gpus, ar = n > 1 ? opt.allreduce_us : 0.0;
  auto split = [&](double us) { return n > 1 ? std::max(us / n, floor_us) : us; };
  double l1 = 0, lv = 0, stage = 0;
  for (const auto& k : r.layer.kernels) {
    if (!k.role.empty()) continue;
    if (k.tokens == 1) l1 += split(k.median_us);
    if (k.tokens == M) lv += split(k.median_us);
    if (k.tokens == B) stage += split(is_routed(k) ? k.median_us * r.draft_routed_scale : k.median_us);
  }
  r.step_us_1_n = opt.layers * (l1 + 2 * ar) + split(r.head_us_1) + ar;
  r.step_us_verify_n = opt.layers * (lv + 2 * ar) + split(r.head_us_verify) + ar + split(r.main_proj_us);
  r.draft_us_n = opt.stages * (stage + 2 * ar) + split(r.head_us_draft) + ar + B * (split(r.markov_us) + ar);
  return r;
}

std::string format_spec_bench(const SpecBenchReport& r, const SpecBenchOptions& opt) {
  const int B = opt.block, M = opt.block + 1;
  std::string s = fmt::format(
      "DSpark step cost on {} ({} SMs), full-width V4.1 layer slice, {} layers, block {} (verify {} rows), "
      "draft {} stages with top-{} of {} experts\n\n",
      r.layer.device, r.layer.sm_count, opt.layers, B, M, opt.stages, opt.draft_topk, opt.draft_experts);
  s += "| quantity | rows | us |\n|---|---|---|\n";
  s += fmt::format("| one layer (all kernels), plain decode | 1 | {:.1f} |\n", r.layer_us_1);
  s += fmt::format("| one layer (all kernels), verify block | {} | {:.1f} |\n", M, r.layer_us_verify);
  s += fmt::format("| verify / 1-token layer time | | **{:.2f}x** |\n", r.layer_us_verify / r.layer_us_1);
  s += fmt::format("| LM head [129280, 5120] BF16 (FP8 time x bytes) | 1 / {} / {} | {:.1f} / {:.1f} / {:.1f} |\n", B,
                   M, r.head_us_1, r.head_us_draft, r.head_us_verify);
  s += fmt::format("| main_proj [5120, 15360] FP8 (taps of the verify rows) | {} | {:.1f} |\n", M, r.main_proj_us);
  s += fmt::format("| Markov head row [129280, 256] BF16 (FP8 time x bytes) | 1 | {:.1f} |\n", r.markov_us);
  s += fmt::format("| draft stage (layer at M={}, routed x {:.2f} for top-{} of {}) | {} | {:.1f} |\n", B,
                   r.draft_routed_scale, opt.draft_topk, opt.draft_experts, B, r.draft_stage_us);
  s += fmt::format("| draft pass: {} stages + LM head ({} rows) + {} Markov rows | {} | **{:.1f}** |\n", opt.stages, B,
                   B, B, r.draft_us);
  s += fmt::format("| step without speculation: {} layers + head | 1 | **{:.1f}** |\n", opt.layers, r.step_us_1);
  s += fmt::format("| verify step: {} layers + head + main_proj | {} | **{:.1f}** |\n", opt.layers, M,
                   r.step_us_verify);
  s += fmt::format("| speculative step = verify + draft | | **{:.1f}** |\n\n", r.step_us_verify + r.draft_us);
  s += fmt::format(
      "Projected decode tok/s at batch 1 (acceptance = tokens emitted per verify step; {} GPUs: a projection, "
      "per-GPU kernel time / {} floored at the fastest 1-token kernel ({}), plus {:.0f} us per all-reduce, "
      "assumed, not measured)\n\n",
      opt.gpus, opt.gpus, "launch floor", opt.allreduce_us);
  s += fmt::format("| acceptance | 1 GPU tok/s | speed-up | {} GPUs tok/s | speed-up |\n|---|---|---|---|---|\n",
                   opt.gpus);
  const double base1 = 1e6 / r.step_us_1, basen = 1e6 / r.step_us_1_n;
  s += fmt::format("| none (plain decode) | {:.0f} | 1.00x | {:.0f} | 1.00x |\n", base1, basen);
  for (double a : opt.acceptance) {
    const double t1 = a * 1e6 / (r.step_us_verify + r.draft_us);
    const double tn = a * 1e6 / (r.step_us_verify_n + r.draft_us_n);
    s += fmt::format("| {:.1f} | {:.0f} | {:.2f}x | {:.0f} | {:.2f}x |\n", a, t1, t1 / base1, tn, tn / basen);
  }
  s += fmt::format("\n{} GPUs: plain step {:.1f} us, verify step {:.1f} us, draft pass {:.1f} us (projection)\n",
                   opt.gpus, r.step_us_1_n, r.step_us_verify_n, r.draft_us_n);
  return s;
}

}  // namespace flashseek::ops::cuda
