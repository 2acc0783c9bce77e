// NCCL collective timings and the tensor/expert-parallel decode projection (tp_bench.h).
#include "bench/cuda/tp_bench.h"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>

#include "ops/cuda/runtime/cuda_check.h"

#if FLASHSEEK_HAVE_NCCL
#include <nccl.h>
#endif

namespace flashseek::ops::cuda {
namespace {

constexpr int64_t kHidden = 5120, kVocab = 129280, kExperts = 384, kTopK = 6;

// How a kernel of the single-GPU layer slice scales on one rank of `world` (backends/cuda/gpu_tp.h):
// heads, output groups and routed experts are split; everything else is replicated.
enum class Split { kReplicated, kHeads, kExperts };
Split split_of(const std::string& name) {
  for (const char* p : {"wq_b", "rope q", "sparse attn", "wo_a", "wo_b"})
    if (name.rfind(p, 0) == 0) return Split::kHeads;
  if (name.rfind("routed", 0) == 0) return Split::kExperts;
  return Split::kReplicated;  // mHC, norms, wq_a+wkv, router, shared expert (rank 0), ...
}

// E[distinct experts on the busiest rank] / E[distinct experts] for m tokens routed uniformly
// top-6 of 384, experts split in `world` contiguous ranges (the time of the routed GEMVs follows
// the expert weights read; the slowest rank sets the step).
double expert_imbalance(int m, int world) {
  std::mt19937 rng(7);
  const int trials = 2000;
  double sum_max = 0, sum_all = 0;
  std::vector<int> ids(kExperts);
  std::vector<char> used(kExperts);
  for (int t = 0; t < trials; ++t) {
    std::fill(used.begin(), used.end(), 0);
    for (int i = 0; i < m; ++i) {
      std::iota(ids.begin(), ids.end(), 0);
      for (int k = 0; k < kTopK; ++k) {
        std::swap(ids[k], ids[k + rng() % (kExperts - k)]);
        used[ids[k]] = 1;
      }
    }
    int mx = 0, all = 0;
    for (int r = 0; r < world; ++r) {
      const int n = int(std::count(used.begin() + r * kExperts / world, used.begin() + (r + 1) * kExperts / world, 1));
      mx = std::max(mx, n);
      all += n;
    }
    sum_max += mx, sum_all += all;
  }
  return sum_all > 0 ? sum_max / sum_all : 1.0;
}

// A kernel of every decode layer (not a role extra such as the indexer of index-source layers).
template <typename K>
bool every_layer(const K& k) {
  if constexpr (requires { k.role; }) {
    return k.role.empty();
  } else {
    return true;
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

#if FLASHSEEK_HAVE_NCCL
namespace {

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  return Status(StatusCode::kInternal, fmt::format("{}: {}", what, ncclGetErrorString(r)));
}

// All ranks driven from this thread in one NCCL group per call; per rep the slowest rank's
// event time over kBatch back-to-back calls (start and end recorded on every rank's stream), / kBatch.
constexpr int kBatch = 10;
Status time_collectives(int world, TpBenchOptions const& opt, std::vector<CollectiveTiming>& out) {
  std::vector<int> devs(static_cast<size_t>(world));
  std::iota(devs.begin(), devs.end(), 0);
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  std::vector<ncclComm_t> comms(static_cast<size_t>(world));
  FS_RETURN_IF_ERROR(nccl_status(ncclCommInitAll(comms.data(), world, devs.data()), "ncclCommInitAll"));
  struct Rank {
    cudaStream_t s = nullptr;
    void *a = nullptr, *b = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
  };
  std::vector<Rank> rk(static_cast<size_t>(world));
  int64_t max_m = 1;
  for (int m : opt.tokens) max_m = std::max<int64_t>(max_m, m);
  const size_t cap = size_t(max_m * std::max(kHidden, kVocab / world + 1)) * 4;
  Status st;
  for (int r = 0; r < world && st.ok(); ++r) {
    st = cuda_status(cudaSetDevice(r), "cudaSetDevice");
    if (st.ok()) st = cuda_status(cudaStreamCreateWithFlags(&rk[r].s, cudaStreamNonBlocking), "stream");
    if (st.ok()) st = cuda_status(cudaMalloc(&rk[r].a, cap), "cudaMalloc");
    if (st.ok()) st = cuda_status(cudaMalloc(&rk[r].b, cap * size_t(world)), "cudaMalloc");
    if (st.ok()) st = cuda_status(cudaMemset(rk[r].a, 0, cap), "cudaMemset");
    if (st.ok()) st = cuda_status(cudaEventCreate(&rk[r].e0), "event");
    if (st.ok()) st = cuda_status(cudaEventCreate(&rk[r].e1), "event");
  }
  auto one = [&](const std::string& op, ncclDataType_t dt, const char* dname, int m, int64_t n, int esize) -> Status {
    std::vector<double> t;
    for (int rep = -5; rep < opt.reps; ++rep) {
      for (int r = 0; r < world; ++r) {
        FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(r));
        FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(rk[r].e0, rk[r].s));
      }
      for (int b = 0; b < kBatch; ++b) {  // back-to-back calls: launch gaps count, host latency does not
        FS_RETURN_IF_ERROR(nccl_status(ncclGroupStart(), "ncclGroupStart"));
        for (int r = 0; r < world; ++r) {
          if (op == "all-reduce")
            FS_RETURN_IF_ERROR(nccl_status(ncclAllReduce(rk[r].a, rk[r].a, size_t(n), dt, ncclSum, comms[r], rk[r].s), "ncclAllReduce"));
          else
            FS_RETURN_IF_ERROR(nccl_status(ncclAllGather(rk[r].a, rk[r].b, size_t(n), dt, comms[r], rk[r].s), "ncclAllGather"));
        }
        FS_RETURN_IF_ERROR(nccl_status(ncclGroupEnd(), "ncclGroupEnd"));
      }
      double worst = 0;
      for (int r = 0; r < world; ++r) {
        FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(r));
        FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(rk[r].e1, rk[r].s));
      }
      for (int r = 0; r < world; ++r) {
        FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(r));
        FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(rk[r].e1));
        float ms = 0;
        FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, rk[r].e0, rk[r].e1));
        worst = std::max(worst, double(ms) * 1e3 / kBatch);
      }
      if (rep >= 0) t.push_back(worst);
    }
    CollectiveTiming c;
    c.op = op, c.dtype = dname, c.world = world, c.tokens = m, c.bytes = double(n) * esize;
    c.median_us = median(t);
    c.min_us = t.empty() ? 0 : *std::min_element(t.begin(), t.end());
    const double algo = op == "all-reduce" ? 2.0 * (world - 1) / world : double(world - 1);
    c.bus_gbps = c.median_us > 0 ? c.bytes * algo / (c.median_us * 1e-6) / 1e9 : 0;
    out.push_back(c);
    return {};
  };
  for (int m : opt.tokens) {
    if (!st.ok()) break;
    st = one("all-reduce", ncclFloat, "fp32", m, m * kHidden, 4);
    if (st.ok()) st = one("all-reduce", ncclBfloat16, "bf16", m, m * kHidden, 2);
  }
  for (int m : opt.layer_tokens)  // LM head: every rank's [M, V/world] slice to every rank
    if (st.ok()) st = one("all-gather (head)", ncclFloat, "fp32", m, m * ((kVocab + world - 1) / world), 4);
  for (int r = 0; r < world; ++r) {
    cudaSetDevice(r);
    if (rk[r].a) cudaFree(rk[r].a);
    if (rk[r].b) cudaFree(rk[r].b);
    if (rk[r].e0) cudaEventDestroy(rk[r].e0);
    if (rk[r].e1) cudaEventDestroy(rk[r].e1);
    if (rk[r].s) cudaStreamDestroy(rk[r].s);
    ncclCommDestroy(comms[r]);
  }
  cudaSetDevice(0);
  return st;
}

}  // namespace
#endif

Result<TpBenchReport> run_tp_bench(const TpBenchOptions& opt) {
#if !FLASHSEEK_HAVE_NCCL
  return Status(StatusCode::kUnimplemented, "bench --tp: this build has no NCCL (nccl.h / libnccl not found at configure time)");
#else
  std::string why;
  if (!cuda_device_available(&why)) return Status(StatusCode::kUnavailable, "bench --tp: " + why);
  int n = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&n));
  if (opt.world < 2) return invalid_argument("bench --tp {}: needs at least 2 GPUs", opt.world);
  if (opt.world > n) return invalid_argument("bench --tp {}: this machine has {} CUDA device(s)", opt.world, n);
  TpBenchReport rep;
  rep.world = opt.world;
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  rep.device = prop.name;
  FS_RETURN_IF_ERROR(time_collectives(opt.world, opt, rep.collectives));
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  if (opt.slice) {  // measured per-rank slices: 1 GPU, then 2, 4, 8 up to opt.world
    TpLayerOptions so;
    so.worlds = {1};
    for (int w : {2, 4, 8})
      if (w <= opt.world) so.worlds.push_back(w);
    so.tokens = opt.slice_tokens, so.reps = opt.reps, so.layers = opt.layers;
    so.prefill_tokens = opt.prefill_tokens, so.anchor_ms = opt.anchor_ms;
    FS_ASSIGN_OR_RETURN(rep.slice, run_tp_layer_bench(so));
    FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  }
  LayerBenchOptions lo;
  lo.tokens = opt.layer_tokens, lo.reps = opt.reps, lo.layers = opt.layers;
  lo.contexts = {4096};  // the projection uses every-layer kernels only
  FS_ASSIGN_OR_RETURN(rep.layer, run_layer_bench(lo));
  return rep;
#endif
}

std::string format_tp_bench(const TpBenchReport& r, const TpBenchOptions& opt) {
  std::string s;
  if (opt.slice) {
    TpLayerOptions so;
    so.reps = opt.reps, so.layers = opt.layers, so.anchor_ms = opt.anchor_ms;
    s += format_tp_layer_bench(r.slice, so);
  }
  s += fmt::format(
      "### NCCL collectives, {} x {} (NCCL_NVLS_ENABLE=0; one thread drives every rank in an NCCL group; per rep the "
      "slowest rank's CUDA-event time over 10 back-to-back calls / 10, median of the reps)\n\n",
      r.world, r.device);
  s += "| op | dtype | M | bytes/rank | median us | min us | bus GB/s |\n|---|---|---|---|---|---|---|\n";
  for (const auto& c : r.collectives)
    s += fmt::format("| {} | {} | {} | {:.0f} | {:.1f} | {:.1f} | {:.1f} |\n", c.op, c.dtype, c.tokens, c.bytes,
                     c.median_us, c.min_us, c.bus_gbps);
  auto coll = [&](const char* op, const char* dt, int m) -> double {
    for (const auto& c : r.collectives)
      if (c.op == op && c.dtype == dt && c.tokens == m) return c.median_us;
    return -1;
  };
  s += fmt::format(
      "\n### PROJECTION (not measured): tensor/expert-parallel decode step from single-GPU kernel times ({} layers)\n\n"
      "Kept for GPU counts this machine does not have (8 GPUs are not lent); the measured slice above replaces it\n"
      "where it ran.\n"
      "Per-rank layer time = replicated kernels (mHC, norms, wq_a+wkv, router, shared expert on rank 0) at their\n"
      "single-GPU medians + head-split kernels (wq_b, rope q, sparse attention, wo_a, wo_b) / world + routed-expert\n"
      "kernels x (distinct experts on the busiest rank / all distinct experts) + 2 bf16 all-reduces of [M, 5120].\n"
      "Kernel times: measured on one GPU at full V4.1 size (the layer-bench table below), scaled, not re-measured at\n"
      "the reduced sizes. All-reduce: measured on {} GPUs; for other GPU counts the {}-GPU time is reused (not\n"
      "measured). The LM head and Engram are outside the layer and not counted.\n\n",
      opt.layers, r.world, r.world);
  s += "| M | GPUs | replicated us | head-split us | experts us | 2 all-reduce us | layer us | step ms | vs 2.71 ms anchor |\n";
  s += "|---|---|---|---|---|---|---|---|---|\n";
  for (int m : opt.layer_tokens) {
    double rep_us = 0, head_us = 0, exp_us = 0;
    for (const auto& k : r.layer.kernels) {
      if (k.tokens != m || !every_layer(k)) continue;
      switch (split_of(k.name)) {
        case Split::kReplicated: rep_us += k.median_us; break;
        case Split::kHeads: head_us += k.median_us; break;
        case Split::kExperts: exp_us += k.median_us; break;
      }
    }
    const double ar = coll("all-reduce", "bf16", m) >= 0 ? coll("all-reduce", "bf16", m) : coll("all-reduce", "bf16", 1);
    for (int w : std::vector<int>{1, 2, 4, 8}) {
      if (w != 1 && std::find(opt.project_worlds.begin(), opt.project_worlds.end(), w) == opt.project_worlds.end()) continue;
      const double h = head_us / w, e = w == 1 ? exp_us : exp_us * expert_imbalance(m, w);
      const double comm = w == 1 ? 0 : 2 * ar;
      const double layer = rep_us + h + e + comm;
      const double step_ms = layer * opt.layers / 1e3;
      s += fmt::format("| {} | {}{} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {:.2f}x |\n", m, w,
                       w == r.world ? " (projected, all-reduce measured)" : w == 1 ? " (projected, no comm)" : " (projected)", rep_us, h, e,
                       comm, layer, step_ms, step_ms / opt.anchor_ms);
    }
  }
  s += "\nReplicated kernels over 100 us (every rank runs them in full; TP cannot hide them):";
  for (const auto& k : r.layer.kernels)
    if (every_layer(k) && k.median_us > 100 && split_of(k.name) == Split::kReplicated)
      s += fmt::format(" {} (M={}: {:.0f} us);", k.name, k.tokens, k.median_us);
  s += "\n\n";
  LayerBenchOptions lo;
  lo.tokens = opt.layer_tokens, lo.reps = opt.reps, lo.layers = opt.layers;
  s += format_layer_bench(r.layer, lo);
  return s;
}

}  // namespace flashseek::ops::cuda
