// Layer-slice benchmark (see layer_bench.h). Layout: one Slice holds every weight of one decode
// layer in `copies` copies (experts: all 384, so random routing rotates them naturally); each
// kernel is a closure over (copy, rep) that launches one op on the stream.
#include "ops/cuda/layer_bench.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/gemv.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/small_kernels.h"

namespace flashseek::ops::cuda {
namespace {

constexpr int64_t kHidden = 5120, kQLora = 1280, kKv = 512, kHeads = 64, kHeadDim = 512;
constexpr int64_t kOGroups = 8, kORank = 1024, kInter = 2304, kExperts = 384, kTopK = 6;
constexpr int64_t kWindow = 128, kTopIdx = 512, kPoolRows = 1 << 16;

// Device memory owned by the benchmark; freed at scope exit.
class Arena {
 public:
  ~Arena() { for (void* p : ptrs_) cudaFree(p); }
  template <typename T>
  Result<T*> alloc(int64_t n) {
    void* p = nullptr;
    FS_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::vector<void*> ptrs_;
};

struct Fp8Mat {
  std::vector<uint8_t*> w, s;  // per copy
  int64_t n = 0, k = 0;
  double bytes() const { return double(n * k + weight_scale_bytes(WeightFormat::kFp8, n, k, 32)); }
};

Status make_fp8(Arena& ar, Fp8Mat& m, int64_t n, int64_t k, int copies, uint64_t seed) {
  m.n = n, m.k = k;
  for (int c = 0; c < copies; ++c) {
    FS_ASSIGN_OR_RETURN(uint8_t* w, ar.alloc<uint8_t>(n * k));
    const int64_t sb = weight_scale_bytes(WeightFormat::kFp8, n, k, 32);
    FS_ASSIGN_OR_RETURN(uint8_t* s, ar.alloc<uint8_t>(sb));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(w, n * k, seed + c * 7919, 1, nullptr));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(s, sb, seed + c * 7919 + 1, 2, nullptr));
    m.w.push_back(w), m.s.push_back(s);
  }
  return {};
}

// Copies so that one rotation covers >= 3x the L2 (at least 2).
int copies_for(double bytes, double l2_bytes) {
  return int(std::clamp(std::ceil(3 * l2_bytes / bytes), 2.0, 64.0));
}

struct Timer {
  cudaEvent_t a = nullptr, b = nullptr;
  ~Timer() { if (a) cudaEventDestroy(a); if (b) cudaEventDestroy(b); }
};

// Median / min over `reps` samples after 3 warm-ups; a sample times `batch` back-to-back
// launches (each on the next weight copy) between two events and divides, so host launch latency
// and event overhead do not count, but the gaps between dependent kernels in a stream do.
Status time_op(const std::function<Status(int)>& fn, int reps, double* med, double* mn, int batch = 10) {
  Timer t;
  FS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&t.a));
  FS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&t.b));
  for (int i = 0; i < 3; ++i) FS_RETURN_IF_ERROR(fn(i));
  std::vector<double> us;
  int call = 3;
  for (int i = 0; i < reps; ++i) {
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.a, nullptr));
    for (int b = 0; b < batch; ++b) FS_RETURN_IF_ERROR(fn(call++));
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.b, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(t.b));
    float ms = 0;
    FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, t.a, t.b));
    us.push_back(ms * 1000.0 / batch);
  }
  std::sort(us.begin(), us.end());
  *med = us[us.size() / 2];
  *mn = us.front();
  return {};
}

Status measure_copy(double* gbps) {
  const int64_t bytes = int64_t(2) << 30;
  Arena ar;
  FS_ASSIGN_OR_RETURN(uint8_t* src, ar.alloc<uint8_t>(bytes));
  FS_ASSIGN_OR_RETURN(uint8_t* dst, ar.alloc<uint8_t>(bytes));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(src, bytes, 5, 0, nullptr));
  double med = 0, mn = 0;
  FS_RETURN_IF_ERROR(time_op(
      [&](int) { return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr), "memcpy"); },
      10, &med, &mn, 1));
  *gbps = 2.0 * double(bytes) / (med * 1e-6) / 1e9;
  return {};
}

// Per-rep routings of `m` tokens (top-6 of 384, uniform), grouped by expert, on the device.
struct Routings {
  std::vector<int32_t*> ge, gs, pr;
  std::vector<int64_t> n_groups;
  float* pair_weight = nullptr;
  double mean_distinct = 0;
};

Status make_routings(Arena& ar, Routings& r, int m, int count, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::vector<int32_t> ids(kExperts);
  for (int c = 0; c < count; ++c) {
    std::vector<std::vector<int32_t>> by(kExperts);
    for (int t = 0; t < m; ++t) {
      std::iota(ids.begin(), ids.end(), 0);
      for (int i = 0; i < kTopK; ++i) {
        std::swap(ids[i], ids[i + rng() % (kExperts - i)]);
        by[ids[i]].push_back(t);
      }
    }
    std::vector<int32_t> ge, gs{0}, pr;
    for (int e = 0; e < kExperts; ++e) {
      if (by[e].empty()) continue;
      ge.push_back(e);
      pr.insert(pr.end(), by[e].begin(), by[e].end());
      gs.push_back(int32_t(pr.size()));
    }
    r.mean_distinct += double(ge.size()) / count;
    for (auto* v : {&ge, &gs, &pr}) {
      FS_ASSIGN_OR_RETURN(int32_t* d, ar.alloc<int32_t>(int64_t(v->size())));
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(d, v->data(), v->size() * 4, cudaMemcpyHostToDevice));
      (v == &ge ? r.ge : v == &gs ? r.gs : r.pr).push_back(d);
    }
    r.n_groups.push_back(int64_t(ge.size()));
  }
  FS_ASSIGN_OR_RETURN(r.pair_weight, ar.alloc<float>(m * kTopK));
  return cuda_status(detail::launch_fill_floats(r.pair_weight, m * kTopK, seed, 1.0f, nullptr), "fill");
}

// Every weight of one decode layer (FP8 dense parts in rotating copies, all FP4 experts once).
struct Slice {
  Fp8Mat wqa_wkv, wq_b, wo, wo_b, sh_gate, sh_up, sh_down;
  uint8_t *eg = nullptr, *egs = nullptr, *eu = nullptr, *eus = nullptr, *ed = nullptr, *eds = nullptr;
  uint16_t* pool = nullptr;  // BF16 latent rows for attention
  float *norm_w = nullptr, *inv_freq = nullptr, *sink = nullptr;
};

Status make_slice(Arena& ar, Slice& sl, double l2) {
  auto fp8 = [&](Fp8Mat& m, int64_t n, int64_t k, uint64_t seed) {
    return make_fp8(ar, m, n, k, copies_for(double(n * k), l2), seed);
  };
  FS_RETURN_IF_ERROR(fp8(sl.wqa_wkv, kQLora + kKv, kHidden, 100));
  FS_RETURN_IF_ERROR(fp8(sl.wq_b, kHeads * kHeadDim, kQLora, 200));
  // wo_a: 8 groups of [1024, 4096] benchmarked as one [8192, 4096] FP8 GEMV (same bytes/FLOPs).
  FS_RETURN_IF_ERROR(fp8(sl.wo, kOGroups * kORank, kHeads * kHeadDim / kOGroups, 300));
  FS_RETURN_IF_ERROR(fp8(sl.wo_b, kHidden, kOGroups * kORank, 400));
  FS_RETURN_IF_ERROR(fp8(sl.sh_gate, kInter, kHidden, 500));
  FS_RETURN_IF_ERROR(fp8(sl.sh_up, kInter, kHidden, 600));
  FS_RETURN_IF_ERROR(fp8(sl.sh_down, kHidden, kInter, 700));
  const int64_t up_b = kExperts * kInter * kHidden / 2, up_s = kExperts * kInter * kHidden / 32;
  uint8_t** bufs[6] = {&sl.eg, &sl.egs, &sl.eu, &sl.eus, &sl.ed, &sl.eds};
  for (int i = 0; i < 6; ++i) {
    const int64_t n = i % 2 == 0 ? up_b : up_s;  // down has the same totals as gate/up
    FS_ASSIGN_OR_RETURN(*bufs[i], ar.alloc<uint8_t>(n));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(*bufs[i], n, 900 + i, i % 2 == 0 ? 0 : 2, nullptr));
  }
  FS_ASSIGN_OR_RETURN(sl.pool, ar.alloc<uint16_t>(kPoolRows * kHeadDim));
  FS_ASSIGN_OR_RETURN(float* tmp, ar.alloc<float>(kPoolRows * kHeadDim));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(tmp, kPoolRows * kHeadDim, 77, 1.0f, nullptr));
  // BF16 bits = top half of the float: a strided copy keeps it on the device.
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy2D(sl.pool, 2, reinterpret_cast<uint8_t*>(tmp) + 2, 4, 2,
                                       size_t(kPoolRows * kHeadDim), cudaMemcpyDeviceToDevice));
  FS_ASSIGN_OR_RETURN(sl.norm_w, ar.alloc<float>(kHidden));
  FS_ASSIGN_OR_RETURN(sl.inv_freq, ar.alloc<float>(32));
  FS_ASSIGN_OR_RETURN(sl.sink, ar.alloc<float>(kHeads));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(sl.norm_w, kHidden, 1, 1.0f, nullptr));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(sl.inv_freq, 32, 2, 0.5f, nullptr));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(sl.sink, kHeads, 3, 1.0f, nullptr));
  return cuda_status(cudaDeviceSynchronize(), "slice init");
}

// Activations of one token count.
struct Acts {
  float *x, *qa, *q, *o, *y, *h, *hp, *ws;
  int32_t *sh_ge, *sh_gs, *sh_pr;  // shared expert: one group of all tokens
  int64_t* pos;
  int32_t* idx;
  int64_t splits;
};

Status make_acts(Arena& ar, Acts& a, int m, int sms) {
  const int64_t big = m * kHeads * kHeadDim;
  float** fs[] = {&a.x, &a.qa, &a.q, &a.o, &a.y, &a.h, &a.hp};
  const int64_t sizes[] = {m * kHidden, m * (kQLora + kKv), big, big, m * kHidden,
                           m * kTopK * kInter, m * kTopK * kHidden};
  for (int i = 0; i < 7; ++i) {
    FS_ASSIGN_OR_RETURN(*fs[i], ar.alloc<float>(sizes[i]));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(*fs[i], sizes[i], 10 + i, 1.0f, nullptr));
  }
  a.splits = sparse_attn_auto_splits(m, kWindow + kTopIdx, sms);
  FS_ASSIGN_OR_RETURN(a.ws, ar.alloc<float>(sparse_attn_workspace_floats(m, a.splits, kHeads, kHeadDim)));
  std::vector<int64_t> pos(static_cast<size_t>(m));
  std::vector<int32_t> idx(static_cast<size_t>(m * (kWindow + kTopIdx)));
  std::mt19937 rng{uint32_t(m)};
  for (int t = 0; t < m; ++t) pos[size_t(t)] = 100000 + t;
  for (auto& v : idx) v = int32_t(rng() % kPoolRows);
  FS_ASSIGN_OR_RETURN(a.pos, ar.alloc<int64_t>(m));
  FS_ASSIGN_OR_RETURN(a.idx, ar.alloc<int32_t>(int64_t(idx.size())));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(a.pos, pos.data(), pos.size() * 8, cudaMemcpyHostToDevice));
  std::vector<int32_t> ge{0}, gs{0, m}, pr(static_cast<size_t>(m));
  std::iota(pr.begin(), pr.end(), 0);
  for (auto [dst, src] : {std::pair<int32_t**, std::vector<int32_t>*>{&a.sh_ge, &ge}, {&a.sh_gs, &gs}, {&a.sh_pr, &pr}}) {
    FS_ASSIGN_OR_RETURN(*dst, ar.alloc<int32_t>(int64_t(src->size())));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(*dst, src->data(), src->size() * 4, cudaMemcpyHostToDevice));
  }
  return cuda_status(cudaMemcpy(a.idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice), "idx");
}

Status lin(const Fp8Mat& w, int copy, const float* x, float* y, int m) {
  BlockLinearParams p;
  const int c = copy % int(w.w.size());
  p.x = x, p.w = w.w[c], p.w_scale = w.s[c], p.y = y, p.m = m, p.n = w.n, p.k = w.k;
  return block_linear_cuda(p, nullptr);
}

Status bench_tokens(const Slice& sl, const LayerBenchOptions& opt, int sms, int m,
                    std::vector<KernelTiming>& out) {
  Arena ar;
  Acts a{};
  FS_RETURN_IF_ERROR(make_acts(ar, a, m, sms));
  Routings rt;
  const int n_rout = 64;  // routings cycled by the timed launches
  FS_RETURN_IF_ERROR(make_routings(ar, rt, m, n_rout, 1234 + m));
  const double act = 4.0 * m;  // bytes per activation element across the tokens
  const double exp_bytes = double(kInter) * kHidden / 2 * 1.0625;  // one FP4 matrix + scales
  auto add = [&](const std::string& name, double bytes, double flops, const std::function<Status(int)>& fn) -> Status {
    KernelTiming k;
    k.name = name, k.tokens = m, k.bytes = bytes, k.flops = flops;
    FS_RETURN_IF_ERROR(time_op(fn, opt.reps, &k.median_us, &k.min_us));
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    out.push_back(k);
    return {};
  };
  auto norm = [&](float* x, int64_t dim) {
    RmsNormParams p;
    p.x = x, p.w = sl.norm_w, p.y = x, p.rows = m, p.dim = dim, p.eps = 1e-20f;
    return rms_norm_cuda(p, nullptr);
  };
  auto fl = [&](const Fp8Mat& w) { return 2.0 * m * w.n * w.k; };
  auto wb = [&](const Fp8Mat& w) { return w.bytes() + act * (w.n + w.k); };
  FS_RETURN_IF_ERROR(add("attn_norm", act * 2 * kHidden, 0, [&](int) { return norm(a.x, kHidden); }));
  FS_RETURN_IF_ERROR(add("wq_a+wkv (FP8)", wb(sl.wqa_wkv), fl(sl.wqa_wkv), [&](int r) { return lin(sl.wqa_wkv, r, a.x, a.qa, m); }));
  FS_RETURN_IF_ERROR(add("q_norm", act * 2 * kQLora, 0, [&](int) { return norm(a.qa, kQLora); }));
  FS_RETURN_IF_ERROR(add("wq_b (FP8)", wb(sl.wq_b), fl(sl.wq_b), [&](int r) { return lin(sl.wq_b, r, a.qa, a.q, m); }));
  FS_RETURN_IF_ERROR(add("rope q", act * 2 * kHeads * 64, 0, [&](int) {
    RopeParams p;
    p.x = a.q, p.pos = a.pos, p.inv_freq = sl.inv_freq, p.rows = m, p.n_vec = kHeads;
    p.vec_dim = kHeadDim, p.rope_dim = 64;
    return apply_rope_cuda(p, nullptr);
  }));
  const double keys = double(kWindow + kTopIdx);
  FS_RETURN_IF_ERROR(add("sparse attn (BF16 rows)", m * keys * kHeadDim * 2 + act * 2 * kHeads * kHeadDim,
                         4.0 * m * keys * kHeads * kHeadDim, [&](int) {
    SparseAttnPoolParams p;
    p.q = a.q, p.kv = sl.pool, p.idx = a.idx, p.sink = sl.sink, p.out = a.o, p.m = m;
    p.n_idx = int64_t(keys), p.n_rows = kPoolRows, p.n_heads = kHeads, p.head_dim = kHeadDim;
    p.scale = 1.0f / std::sqrt(float(kHeadDim)), p.n_splits = a.splits, p.workspace = a.ws;
    return sparse_attention_pool_cuda(p, nullptr);
  }));
  FS_RETURN_IF_ERROR(add("wo_a as FP8 [8192,4096]", wb(sl.wo), fl(sl.wo), [&](int r) { return lin(sl.wo, r, a.o, a.q, m); }));
  FS_RETURN_IF_ERROR(add("wo_b (FP8)", wb(sl.wo_b), fl(sl.wo_b), [&](int r) { return lin(sl.wo_b, r, a.q, a.y, m); }));
  FS_RETURN_IF_ERROR(add("ffn_norm", act * 2 * kHidden, 0, [&](int) { return norm(a.y, kHidden); }));
  auto experts = [&](const uint8_t* w, const uint8_t* ws, const uint8_t* wu, const uint8_t* wus,
                     int64_t n, int64_t k, const float* x, float* y, int r, bool shared) {
    ExpertGemvParams p;
    p.x = x, p.w = w, p.w_scale = ws, p.w_up = wu, p.w_up_scale = wus, p.y = y, p.n = n, p.k = k;
    p.swiglu_limit = 10.0f;
    if (shared) {  // one group holding every token
      p.format = WeightFormat::kFp8, p.n_experts = 1, p.n_groups = 1, p.n_pairs = m;
      p.group_expert = a.sh_ge, p.group_start = a.sh_gs, p.pair_row = a.sh_pr;
    } else {
      const int c = r % int(rt.ge.size());
      p.format = WeightFormat::kFp4, p.n_experts = kExperts, p.n_pairs = m * kTopK;
      p.expert_stride = n * k / 2, p.expert_scale_stride = n * k / 32;
      p.group_expert = rt.ge[c], p.group_start = rt.gs[c], p.n_groups = rt.n_groups[c];
      p.pair_row = wu ? rt.pr[c] : nullptr, p.pair_weight = wu ? rt.pair_weight : nullptr;
    }
    return expert_gemv_cuda(p, nullptr);
  };
  FS_RETURN_IF_ERROR(add("shared gate+up+swiglu (FP8)", wb(sl.sh_gate) * 2, fl(sl.sh_gate) * 2, [&](int r) {
    const int c = r % int(sl.sh_gate.w.size());
    return experts(sl.sh_gate.w[c], sl.sh_gate.s[c], sl.sh_up.w[c], sl.sh_up.s[c], kInter, kHidden,
                   a.y, a.h, r, true);
  }));
  FS_RETURN_IF_ERROR(add("shared down (FP8)", wb(sl.sh_down), fl(sl.sh_down), [&](int r) { return lin(sl.sh_down, r, a.h, a.x, m); }));
  const double dist = rt.mean_distinct;
  FS_RETURN_IF_ERROR(add(fmt::format("routed gate+up+swiglu (FP4, {:.1f} experts)", dist),
                         2 * dist * exp_bytes + act * (kHidden + kTopK * kInter),
                         4.0 * m * kTopK * kInter * kHidden, [&](int r) {
    return experts(sl.eg, sl.egs, sl.eu, sl.eus, kInter, kHidden, a.y, a.h, r, false);
  }));
  FS_RETURN_IF_ERROR(add(fmt::format("routed down (FP4, {:.1f} experts)", dist),
                         dist * exp_bytes + act * kTopK * (kHidden + kInter),
                         2.0 * m * kTopK * kInter * kHidden, [&](int r) {
    return experts(sl.ed, sl.eds, nullptr, nullptr, kHidden, kInter, a.h, a.hp, r, false);
  }));
  return {};
}

}  // namespace

Result<LayerBenchReport> run_layer_bench(const LayerBenchOptions& opt) {
  std::string why;
  if (!cuda_device_available(&why)) return Status(StatusCode::kUnavailable, "bench needs a GPU: " + why);
  for (int m : opt.tokens) {
    if (m <= 0 || m > 256) return invalid_argument("bench: tokens={} must be in 1..256", m);
  }
  if (opt.reps <= 0) return invalid_argument("bench: reps={} must be positive", opt.reps);
  LayerBenchReport rep;
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  rep.device = prop.name, rep.sm_count = prop.multiProcessorCount, rep.l2_mb = prop.l2CacheSize / 1e6;
  FS_RETURN_IF_ERROR(measure_copy(&rep.copy_gbps));
  Arena ar;
  Slice sl;
  FS_RETURN_IF_ERROR(make_slice(ar, sl, double(prop.l2CacheSize)));
  for (int m : opt.tokens) FS_RETURN_IF_ERROR(bench_tokens(sl, opt, rep.sm_count, m, rep.kernels));
  return rep;
}

std::string format_layer_bench(const LayerBenchReport& r, const LayerBenchOptions& opt) {
  std::string s = fmt::format("device: {} ({} SMs, L2 {:.0f} MB); copy bandwidth (D2D memcpy, read+write): {:.0f} GB/s\n\n",
                              r.device, r.sm_count, r.l2_mb, r.copy_gbps);
  s += "| M | kernel | median us | min us | MB moved | GB/s | % of copy BW |\n|---|---|---|---|---|---|---|\n";
  for (const auto& k : r.kernels) {
    const double gbps = k.bytes / (k.median_us * 1e-6) / 1e9;
    s += fmt::format("| {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.0f} | {:.0f}% |\n", k.tokens, k.name,
                     k.median_us, k.min_us, k.bytes / 1e6, gbps, 100.0 * gbps / r.copy_gbps);
  }
  s += fmt::format("\n| M | layer sum us | layer MB | layer GB/s | % of copy BW | x{} layers ms |\n|---|---|---|---|---|---|\n", opt.layers);
  for (int m : opt.tokens) {
    double us = 0, bytes = 0;
    for (const auto& k : r.kernels)
      if (k.tokens == m) us += k.median_us, bytes += k.bytes;
    const double gbps = bytes / (us * 1e-6) / 1e9;
    s += fmt::format("| {} | {:.1f} | {:.1f} | {:.0f} | {:.0f}% | {:.2f} |\n", m, us, bytes / 1e6, gbps,
                     100.0 * gbps / r.copy_gbps, us * opt.layers / 1000.0);
  }
  return s;
}

}  // namespace flashseek::ops::cuda
