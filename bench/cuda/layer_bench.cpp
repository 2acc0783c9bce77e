// Layer-slice benchmark (see layer_bench.h). Layout: one Slice holds every weight of one decode
// layer in `copies` copies (experts: all 384, so random routing rotates them naturally); each
// kernel is a closure over (copy, rep) that launches one op on the stream.
#include "bench/cuda/layer_bench.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "bench/cuda/bench_util.h"
#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/gemv/gemv_kernels.h"
#include "ops/cuda/model/kernels.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::ops::cuda {
namespace {
using namespace bench;  // Arena, Fp8Mat, time_op, g_st, ... (bench_util.h)

constexpr int64_t kHidden = 5120, kQLora = 1280, kKv = 512, kHeads = 64, kHeadDim = 512;
constexpr int64_t kOGroups = 8, kORank = 1024, kInter = 2304, kExperts = 384, kTopK = 6;
constexpr int64_t kWindow = 128, kTopIdx = 512, kPoolRows = 1 << 16;
constexpr int64_t kHc = 4, kMix = (2 + kHc) * kHc, kIdxHeads = 32, kIdxDim = 128;
constexpr int64_t kCompOut = 2 * kKv;  // compressor wkv + wgate rows (ratio-2 source)
constexpr int64_t kEngramOut = 25600, kEngramIn = 6144, kEngramRows = 24, kEngramRowBytes = 264;
constexpr int kSweepCols = 10;  // GEMV sweep columns: splits 1..8, then chunk 2 and 4
constexpr int kFullSources = 4, kIndexSources = 8, kEngramLayers = 2;  // per 40-layer step

// Every weight of one decode layer (FP8 dense parts in rotating copies, all FP4 experts once).
struct PinnedHost {
  void* p = nullptr;
  ~PinnedHost() { if (p) cudaFreeHost(p); }
};

struct Slice {
  Fp8Mat wqa_wkv, wq_b, wo, wo_b, sh_gate, sh_up, sh_down, idx_wq_b, engram_wkv;
  F32Mat router, hc_fn, comp, idx_wproj;
  float *hc_base = nullptr, *hc_scale = nullptr;
  uint8_t* engram_host = nullptr;  // pinned host rows (freed by the Arena's owner below)
  int64_t engram_host_rows = 0;
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
  FS_RETURN_IF_ERROR(fp8(sl.idx_wq_b, kIdxHeads * kIdxDim, kQLora, 800));
  FS_RETURN_IF_ERROR(fp8(sl.engram_wkv, kEngramOut, kEngramIn, 850));
  auto f32 = [&](F32Mat& m, int64_t n, int64_t k, uint64_t seed, float scale) {
    return make_f32(ar, m, n, k, copies_for(4.0 * double(n * k), l2), seed, scale);
  };
  FS_RETURN_IF_ERROR(f32(sl.router, kExperts, kHidden, 1000, 0.02f));
  FS_RETURN_IF_ERROR(f32(sl.hc_fn, kMix, kHc * kHidden, 1100, 0.01f));
  FS_RETURN_IF_ERROR(f32(sl.comp, kCompOut, kHidden, 1200, 0.02f));
  FS_RETURN_IF_ERROR(f32(sl.idx_wproj, kIdxHeads, kHidden, 1300, 0.02f));
  FS_ASSIGN_OR_RETURN(sl.hc_base, ar.alloc<float>(kMix));
  FS_ASSIGN_OR_RETURN(sl.hc_scale, ar.alloc<float>(3));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(sl.hc_base, kMix, 1400, 0.5f, nullptr));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(sl.hc_scale, 3, 1401, 1.0f, nullptr));
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
  uint8_t* xq;  // the routed GEMVs' pre-quantised inputs (the ring kernel reads them, as in the model)
  float* xs;
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
  const int64_t xq_bytes = m * kTopK * std::max(kHidden, kInter);
  FS_ASSIGN_OR_RETURN(a.xq, ar.alloc<uint8_t>(xq_bytes));
  FS_ASSIGN_OR_RETURN(a.xs, ar.alloc<float>(xq_bytes / 32));
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

// Extra activations of the roles beyond the PR-1 slice (mHC, router, compressor, indexer, Engram).
struct ExtraActs {
  float *X, *pre, *post, *comb, *u, *logits, *rscratch, *rweight, *comp, *iq, *iw, *eo, *erows;
  int32_t* rsel;
};

Status make_extra(Arena& ar, ExtraActs& e, int m) {
  float** fs[] = {&e.X, &e.pre, &e.post, &e.comb, &e.u, &e.logits, &e.rscratch, &e.rweight,
                  &e.comp, &e.iq, &e.iw, &e.eo, &e.erows};
  const int64_t sizes[] = {m * kHc * kHidden, m * kHc, m * kHc, m * kHc * kHc, m * kHidden,
                           m * kExperts, m * 2 * kExperts, m * kTopK, m * kCompOut,
                           m * kIdxHeads * kIdxDim, m * kIdxHeads, m * kEngramOut,
                           (m * kEngramRows * kEngramRowBytes + 3) / 4};
  for (int i = 0; i < 13; ++i) {
    FS_ASSIGN_OR_RETURN(*fs[i], ar.alloc<float>(sizes[i]));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(*fs[i], sizes[i], 50 + i, 0.5f, nullptr));
  }
  FS_ASSIGN_OR_RETURN(e.rsel, ar.alloc<int32_t>(m * kTopK));
  return {};
}

// Indexer state for one context: FP32 keys (the exact kernels' format), score rows, top-k.
struct IndexActs {
  float *keys = nullptr, *scores = nullptr, *blocks = nullptr;
  uint8_t *cand = nullptr, *taken = nullptr;
  int32_t *out = nullptr, *out_n = nullptr;
};

Status bench_tokens(const Slice& sl, const LayerBenchOptions& opt, int sms, int m,
                    LayerBenchReport& rep) {
  std::vector<KernelTiming>& out = rep.kernels;
  // The dense FP8 GEMVs, in the fragment order with opt.fp8_fragments (hides bench::lin).
  auto lin = [&](const Fp8Mat& w, int copy, const float* x, float* y, int rows) {
    return bench::lin(w, copy, x, y, rows, opt.fp8_fragments);
  };
  Arena ar;
  Acts a{};
  FS_RETURN_IF_ERROR(make_acts(ar, a, m, sms));
  ExtraActs e{};
  FS_RETURN_IF_ERROR(make_extra(ar, e, m));
  Routings rt;
  const int n_rout = 64;  // routings cycled by the timed launches
  FS_RETURN_IF_ERROR(make_routings(ar, rt, m, n_rout, 1234 + m));
  const double act = 4.0 * m;  // bytes per activation element across the tokens
  const double exp_bytes = double(kInter) * kHidden / 2 * 1.0625;  // one FP4 matrix + scales
  std::vector<std::function<Status(int)>> layer;  // every-layer kernels in order (graph)
  double layer_sum = 0;
  auto add_k = [&](const std::string& name, double bytes, double flops, const std::function<Status(int)>& fn,
                   const std::string& role, double per_step, int ctx) -> Status {
    KernelTiming k;
    k.name = name, k.tokens = m, k.bytes = bytes, k.flops = flops;
    k.role = role, k.per_step = per_step, k.context = ctx;
    k.reference = name.find("FP32") != std::string::npos || name.find("indexer scores") == 0 ||
                  name.find("indexer top") == 0;
    // Slow kernels (the exactness-first indexer top-k at 128k takes tens of ms) get single
    // launches and fewer samples, so the whole bench stays within a couple of minutes.
    double probe = 0, probe_min = 0;
    FS_RETURN_IF_ERROR(time_op(fn, 1, &probe, &probe_min, 1));
    if (probe > 2000) {
      FS_RETURN_IF_ERROR(time_op(fn, std::min(opt.reps, 5), &k.median_us, &k.min_us, 1));
    } else {
      FS_RETURN_IF_ERROR(time_op(fn, opt.reps, &k.median_us, &k.min_us));
    }
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g_st));
    if (role.empty()) layer.push_back(fn), layer_sum += k.median_us;
    out.push_back(k);
    return {};
  };
  auto add = [&](const std::string& name, double bytes, double flops, const std::function<Status(int)>& fn) {
    return add_k(name, bytes, flops, fn, "", 0, 0);
  };
  auto norm = [&](float* x, int64_t dim) {
    RmsNormParams p;
    p.x = x, p.w = sl.norm_w, p.y = x, p.rows = m, p.dim = dim, p.eps = 1e-20f;
    return rms_norm_cuda(p, g_st);
  };
  auto fl = [&](const Fp8Mat& w) { return 2.0 * m * w.n * w.k; };
  auto wb = [&](const Fp8Mat& w) { return w.bytes() + act * (w.n + w.k); };
  auto f32lin = [&](const F32Mat& w, int r, const float* x, float* y) {
    detail::LinearArgs la;
    la.x = x, la.w = w.at(r), la.y = y, la.rows = m, la.in = w.k, la.out = w.n;
    return cuda_status(detail::launch_linear(la, g_st), "linear");
  };
  auto f32b = [&](const F32Mat& w) { return w.bytes() + act * (w.n + w.k); };
  // mHC around a sublayer: mixes (RMS over the 4x5120 state, 24 mixes, sinkhorn) + collapse; post.
  auto hc_pre = [&](int r) -> Status {
    detail::HcMixArgs h;
    h.x = e.X, h.fn = sl.hc_fn.at(r), h.base = sl.hc_base, h.scale = sl.hc_scale, h.rows = m;
    h.hc = kHc, h.dim = kHidden, h.sinkhorn_iters = 20, h.norm_eps = 1e-6f, h.hc_eps = 1e-6f;
    h.pre = e.pre, h.post = e.post, h.comb = e.comb;
    FS_CUDA_RETURN_IF_ERROR(detail::launch_hc_mixes(h, g_st));
    return cuda_status(detail::launch_hc_collapse(e.X, e.pre, a.x, m, kHc, kHidden, false, g_st), "hc collapse");
  };
  auto hc_post = [&](int) {
    return cuda_status(detail::launch_hc_post(a.y, e.X, e.post, e.comb, m, kHc, kHidden, false, g_st), "hc post");
  };
  const double hc_bytes = sl.hc_fn.bytes() + act * kHc * kHidden * 2 + act * kHidden;
  FS_RETURN_IF_ERROR(add("mHC pre, attn (FP32 mixes+sinkhorn+collapse)", hc_bytes, 2.0 * m * kMix * kHc * kHidden, hc_pre));
  FS_RETURN_IF_ERROR(add("attn_norm", act * 2 * kHidden, 0, [&](int) { return norm(a.x, kHidden); }));
  FS_RETURN_IF_ERROR(add("wq_a+wkv (FP8)", wb(sl.wqa_wkv), fl(sl.wqa_wkv), [&](int r) { return lin(sl.wqa_wkv, r, a.x, a.qa, m); }));
  FS_RETURN_IF_ERROR(add("q_norm", act * 2 * kQLora, 0, [&](int) { return norm(a.qa, kQLora); }));
  FS_RETURN_IF_ERROR(add("wq_b (FP8)", wb(sl.wq_b), fl(sl.wq_b), [&](int r) { return lin(sl.wq_b, r, a.qa, a.q, m); }));
  FS_RETURN_IF_ERROR(add("rope q", act * 2 * kHeads * 64, 0, [&](int) {
    RopeParams p;
    p.x = a.q, p.pos = a.pos, p.inv_freq = sl.inv_freq, p.rows = m, p.n_vec = kHeads;
    p.vec_dim = kHeadDim, p.rope_dim = 64;
    return apply_rope_cuda(p, g_st);
  }));
  const double keys = double(kWindow + kTopIdx);
  FS_RETURN_IF_ERROR(add("sparse attn (BF16 rows)", m * keys * kHeadDim * 2 + act * 2 * kHeads * kHeadDim,
                         4.0 * m * keys * kHeads * kHeadDim, [&](int) {
    SparseAttnPoolParams p;
    p.q = a.q, p.kv = sl.pool, p.idx = a.idx, p.sink = sl.sink, p.out = a.o, p.m = m;
    p.n_idx = int64_t(keys), p.n_rows = kPoolRows, p.n_heads = kHeads, p.head_dim = kHeadDim;
    p.scale = 1.0f / std::sqrt(float(kHeadDim)), p.n_splits = a.splits, p.workspace = a.ws;
    return sparse_attention_pool_cuda(p, g_st);
  }));
  FS_RETURN_IF_ERROR(add("wo_a as FP8 [8192,4096]", wb(sl.wo), fl(sl.wo), [&](int r) { return lin(sl.wo, r, a.o, a.q, m); }));
  FS_RETURN_IF_ERROR(add("wo_b (FP8)", wb(sl.wo_b), fl(sl.wo_b), [&](int r) { return lin(sl.wo_b, r, a.q, a.y, m); }));
  FS_RETURN_IF_ERROR(add("mHC post, attn", act * kHc * kHidden * 2 + act * kHidden, 0, hc_post));
  FS_RETURN_IF_ERROR(add("mHC pre, ffn (FP32 mixes+sinkhorn+collapse)", hc_bytes, 2.0 * m * kMix * kHc * kHidden,
                         [&](int r) { return hc_pre(r + 1); }));
  FS_RETURN_IF_ERROR(add("ffn_norm", act * 2 * kHidden, 0, [&](int) { return norm(a.y, kHidden); }));
  FS_RETURN_IF_ERROR(add("router (FP32 linear [384,5120] + sqrtsoftplus top-6)", f32b(sl.router),
                         2.0 * m * kExperts * kHidden, [&](int r) -> Status {
    FS_RETURN_IF_ERROR(f32lin(sl.router, r, a.y, e.logits));
    detail::RouteArgs ra;
    ra.logits = e.logits, ra.scratch = e.rscratch, ra.T = m, ra.E = kExperts, ra.K = kTopK;
    ra.sqrtsoftplus = true, ra.norm_topk = true, ra.route_scale = 1.5f, ra.sel = e.rsel, ra.weight = e.rweight;
    return cuda_status(detail::launch_route(ra, g_st), "route");
  }));
  auto experts = [&](const uint8_t* w, const uint8_t* ws, const uint8_t* wu, const uint8_t* wus,
                     int64_t n, int64_t k, const float* x, float* y, int r, bool shared) {
    ExpertGemvParams p;
    p.x = x, p.w = w, p.w_scale = ws, p.w_up = wu, p.w_up_scale = wus, p.y = y, p.n = n, p.k = k;
    p.swiglu_limit = 10.0f;
    if (shared) {  // one group holding every token
      p.format = WeightFormat::kFp8, p.n_experts = 1, p.n_groups = 1, p.n_pairs = m, p.w_packed = opt.fp8_fragments;
      p.group_expert = a.sh_ge, p.group_start = a.sh_gs, p.pair_row = a.sh_pr;
    } else {
      const int c = r % int(rt.ge.size());
      p.format = WeightFormat::kFp4, p.n_experts = kExperts, p.n_pairs = m * kTopK;
      p.expert_stride = n * k / 2, p.expert_scale_stride = n * k / 32;
      p.group_expert = rt.ge[c], p.group_start = rt.gs[c], p.n_groups = rt.n_groups[c];
      p.pair_row = wu ? rt.pr[c] : nullptr, p.pair_weight = wu ? rt.pair_weight : nullptr;
      p.w_packed = opt.fp4_fragments;
      p.ring_stages = opt.gemv_ring_stages;
      if (p.ring_stages > 0) {  // the ring reads pre-quantised x: one quantise launch first, as in the model
        const int64_t rows = wu ? m : m * kTopK;
        FS_RETURN_IF_ERROR(gemv_quantize_cuda(x, rows, k, p.act_block, false, a.xq, a.xs, g_st));
        p.xq = a.xq, p.xs = a.xs;
      }
    }
    return expert_gemv_cuda(p, g_st);
  };
  auto shared_gu = [&](int r) {
    const int c = r % int(sl.sh_gate.w.size());
    return experts(sl.sh_gate.w[c], sl.sh_gate.s[c], sl.sh_up.w[c], sl.sh_up.s[c], kInter, kHidden,
                   a.y, a.h, r, true);
  };
  auto routed_gu = [&](int r) { return experts(sl.eg, sl.egs, sl.eu, sl.eus, kInter, kHidden, a.y, a.h, r, false); };
  auto routed_d = [&](int r) { return experts(sl.ed, sl.eds, nullptr, nullptr, kHidden, kInter, a.h, a.hp, r, false); };
  FS_RETURN_IF_ERROR(add("shared gate+up+swiglu (FP8)", wb(sl.sh_gate) * 2, fl(sl.sh_gate) * 2, shared_gu));
  FS_RETURN_IF_ERROR(add("shared down (FP8)", wb(sl.sh_down), fl(sl.sh_down), [&](int r) { return lin(sl.sh_down, r, a.h, a.x, m); }));
  const double dist = rt.mean_distinct;
  const double rgu_bytes = 2 * dist * exp_bytes + act * (kHidden + kTopK * kInter);
  const double rd_bytes = dist * exp_bytes + act * kTopK * (kHidden + kInter);
  FS_RETURN_IF_ERROR(add(fmt::format("routed gate+up+swiglu (FP4, {:.1f} experts)", dist), rgu_bytes,
                         4.0 * m * kTopK * kInter * kHidden, routed_gu));
  FS_RETURN_IF_ERROR(add(fmt::format("routed down (FP4, {:.1f} experts)", dist), rd_bytes,
                         2.0 * m * kTopK * kInter * kHidden, routed_d));
  FS_RETURN_IF_ERROR(add("mHC post, ffn", act * kHc * kHidden * 2 + act * kHidden, 0, hc_post));

  // CUDA graph of `graph_layers` layers: layer i launches every kernel with rep index i, so the
  // weight copies and routings rotate across the captured layers as in the timed loops.
  if (opt.graph_layers > 0) {
    GraphTiming gt;
    gt.tokens = m, gt.layers = opt.graph_layers, gt.kernel_sum_us = layer_sum;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    FS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeRelaxed));
    Status cap;
    for (int i = 0; i < opt.graph_layers && cap.ok(); ++i)
      for (auto& fn : layer) {
        cap = fn(i);
        if (!cap.ok()) break;
      }
    const cudaError_t end = cudaStreamEndCapture(g_st, &graph);
    FS_RETURN_IF_ERROR(cap);
    FS_CUDA_RETURN_IF_ERROR(end);
    FS_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    double med = 0, mn = 0;
    Status st = time_op([&](int) { return cuda_status(cudaGraphLaunch(exec, g_st), "graph launch"); },
                        std::max(10, opt.reps / 2), &med, &mn, 2);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    FS_RETURN_IF_ERROR(st);
    gt.replay_us_per_layer = med / opt.graph_layers, gt.replay_min_us_per_layer = mn / opt.graph_layers;
    rep.graphs.push_back(gt);
  }

  // Role extras (not in every layer): compressor, indexer query/scores/top-k, Engram.
  FS_RETURN_IF_ERROR(add_k("compressor wkv+wgate (FP32 linear [1024,5120])", f32b(sl.comp), 2.0 * m * kCompOut * kHidden,
                           [&](int r) { return f32lin(sl.comp, r, a.x, e.comp); }, "FULL source", kFullSources, 0));
  FS_RETURN_IF_ERROR(add_k("indexer wq_b (FP8 [4096,1280])", wb(sl.idx_wq_b), fl(sl.idx_wq_b),
                           [&](int r) { return lin(sl.idx_wq_b, r, a.qa, e.iq, m); }, "index source", kIndexSources, 0));
  FS_RETURN_IF_ERROR(add_k("indexer weights_proj (FP32 linear [32,5120])", f32b(sl.idx_wproj), 2.0 * m * kIdxHeads * kHidden,
                           [&](int r) { return f32lin(sl.idx_wproj, r, a.x, e.iw); }, "index source", kIndexSources, 0));
  for (int ctx : opt.contexts) {
    if (ctx < m) continue;
    Arena ia;
    IndexActs ix;
    const int64_t n = ctx;  // ratio 1: one compressed entry per position
    FS_ASSIGN_OR_RETURN(ix.keys, ia.alloc<float>(n * kIdxDim));
    FS_ASSIGN_OR_RETURN(ix.scores, ia.alloc<float>(m * n));
    FS_ASSIGN_OR_RETURN(ix.blocks, ia.alloc<float>(m * n));
    FS_ASSIGN_OR_RETURN(ix.cand, ia.alloc<uint8_t>(m * n));
    FS_ASSIGN_OR_RETURN(ix.taken, ia.alloc<uint8_t>(m * n));
    FS_ASSIGN_OR_RETURN(ix.out, ia.alloc<int32_t>(m * kTopIdx));
    FS_ASSIGN_OR_RETURN(ix.out_n, ia.alloc<int32_t>(m));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(ix.keys, n * kIdxDim, 60 + ctx, 1.0f, nullptr));
    FS_CUDA_RETURN_IF_ERROR(cudaMemset(ix.cand, 1, size_t(m * n)));
    FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    detail::IndexScoreArgs sa;
    sa.q = e.iq, sa.w = e.iw, sa.keys = ix.keys, sa.scores = ix.scores, sa.T = m, sa.nI = kIdxHeads;
    sa.dI = kIdxDim, sa.start = ctx - m, sa.ratio = 1, sa.stride = ctx;
    FS_RETURN_IF_ERROR(add_k(fmt::format("indexer scores ({} keys, FP32 rows)", n),
                             4.0 * n * kIdxDim + act * n + act * kIdxHeads * (kIdxDim + 1),
                             2.0 * m * n * kIdxHeads * (kIdxDim + 1),
                             [&](int) { return cuda_status(detail::launch_index_scores(sa, g_st), "index scores"); },
                             "index source", kIndexSources, ctx));
    detail::IndexTopkArgs ta;
    ta.scores = ix.scores, ta.cand = ix.cand, ta.block_scratch = ix.blocks, ta.taken = ix.taken;
    ta.out = ix.out, ta.out_n = ix.out_n, ta.T = m, ta.start = ctx - m, ta.ratio = 1, ta.stride = ctx;
    ta.k = kTopIdx, ta.cand_block = 8, ta.cand_top = 2048, ta.mode = 0;
    FS_RETURN_IF_ERROR(add_k(fmt::format("indexer top-512 of {}", n), act * n + 2.0 * m * n, 0,
                             [&](int) { return cuda_status(detail::launch_index_topk(ta, g_st), "index topk"); },
                             "index source", kIndexSources, ctx));
    detail::IndexTopkArgs t2 = ta;  // the previous multi-block path (4 launches), for comparison
    t2.path = 2;
    if (n > 2056)  // the path's scratch header
      FS_RETURN_IF_ERROR(add_k(fmt::format("indexer top-512 of {}, over blocks (path 2)", n), act * n + 2.0 * m * n, 0,
                               [&](int) { return cuda_status(detail::launch_index_topk(t2, g_st), "index topk"); },
                               "index source (info)", 0, ctx));
    detail::IndexTopkArgs t3 = ta;  // the cluster kernel forced (path 0 picks it from 8192 keys)
    t3.path = 3;
    if (detail::index_topk_cluster_size(t3) > 0)
      FS_RETURN_IF_ERROR(add_k(fmt::format("indexer top-512 of {}, one cluster of {} per row (path 3)", n,
                                           detail::index_topk_cluster_size(t3)),
                               act * n + 2.0 * m * n, 0,
                               [&](int) { return cuda_status(detail::launch_index_topk(t3, g_st), "index topk"); },
                               "index source (info)", 0, ctx));
    detail::IndexTopkArgs t1 = ta;  // the one-block-per-row kernel, for comparison
    t1.path = 1;
    FS_RETURN_IF_ERROR(add_k(fmt::format("indexer top-512 of {}, one block per row", n), act * n + 2.0 * m * n, 0,
                             [&](int) { return cuda_status(detail::launch_index_topk(t1, g_st), "index topk"); },
                             "index source (info)", 0, ctx));
  }
  FS_RETURN_IF_ERROR(add_k("Engram wkv (FP8 [25600,6144])", wb(sl.engram_wkv), fl(sl.engram_wkv),
                           [&](int r) { return lin(sl.engram_wkv, r, e.X, e.eo, m); }, "Engram", kEngramLayers, 0));
  const int64_t ebytes = m * kEngramRows * kEngramRowBytes;
  FS_RETURN_IF_ERROR(add_k(fmt::format("Engram rows H2D (pinned, {}x24x264 B, one copy)", m), double(ebytes), 0,
                           [&](int r) {
    const int64_t row = (int64_t(r) * 7919 * kEngramRows) % (sl.engram_host_rows - m * kEngramRows);
    return cuda_status(cudaMemcpyAsync(e.erows, sl.engram_host + row * kEngramRowBytes, size_t(ebytes),
                                       cudaMemcpyHostToDevice, g_st), "engram copy");
  }, "Engram", kEngramLayers, 0));

  if (opt.gemv_sweep && (m == 1 || m == 6)) {
    struct Case { const char* name; double bytes; std::function<Status(int)> fn; };
    const Case cases[] = {
        {"wq_a+wkv (FP8)", wb(sl.wqa_wkv), [&](int r) { return lin(sl.wqa_wkv, r, a.x, a.qa, m); }},
        {"wq_b (FP8)", wb(sl.wq_b), [&](int r) { return lin(sl.wq_b, r, a.qa, a.q, m); }},
        {"wo_a as FP8", wb(sl.wo), [&](int r) { return lin(sl.wo, r, a.o, a.q, m); }},
        {"wo_b (FP8)", wb(sl.wo_b), [&](int r) { return lin(sl.wo_b, r, a.q, a.y, m); }},
        {"shared gate+up (FP8)", wb(sl.sh_gate) * 2, shared_gu},
        {"shared down (FP8)", wb(sl.sh_down), [&](int r) { return lin(sl.sh_down, r, a.h, a.x, m); }},
        {"routed gate+up (FP4)", rgu_bytes, routed_gu},
        {"routed down (FP4)", rd_bytes, routed_d},
    };
    for (const auto& c : cases) {
      // Splits 1..8 (automatic chunk), then chunk 2 / 4 with the automatic split.
      for (int s = 1; s <= kSweepCols; ++s) {
        if (s <= 8) detail::set_gemv_tuning(s, 0);
        else detail::set_gemv_tuning(0, s == 9 ? 2 : 4);
        SweepTiming t;
        t.name = c.name, t.tokens = m, t.split = s, t.bytes = c.bytes;
        double mn = 0;
        const Status st = time_op(c.fn, std::max(10, opt.reps / 2), &t.median_us, &mn);
        detail::set_gemv_tuning(0, 0);
        FS_RETURN_IF_ERROR(st);
        rep.sweep.push_back(t);
      }
    }
  }
  return cuda_status(cudaStreamSynchronize(g_st), "bench sync");
}

}  // namespace

Result<LayerBenchReport> run_layer_bench(const LayerBenchOptions& opt) {
  std::string why;
  if (!cuda_device_available(&why)) return Status(StatusCode::kUnavailable, "bench needs a GPU: " + why);
  for (int m : opt.tokens) {
    if (m <= 0 || m > 256) return invalid_argument("bench: tokens={} must be in 1..256", m);
  }
  if (opt.reps <= 0) return invalid_argument("bench: reps={} must be positive", opt.reps);
  for (int c : opt.contexts) {
    if (c <= 0 || c > (1 << 20)) return invalid_argument("bench: context={} must be in 1..1048576", c);
  }
  if (opt.graph_layers < 0 || opt.graph_layers > 64)
    return invalid_argument("bench: graph_layers={} must be in 0..64", opt.graph_layers);
  LayerBenchReport rep;
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  rep.device = prop.name, rep.sm_count = prop.multiProcessorCount, rep.l2_mb = prop.l2CacheSize / 1e6;
  struct StreamGuard {
    ~StreamGuard() { if (g_st) cudaStreamDestroy(g_st); g_st = nullptr; }
  } guard;
  FS_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&g_st));
  FS_RETURN_IF_ERROR(measure_copy(&rep.copy_gbps));
  Arena ar;
  Slice sl;
  FS_RETURN_IF_ERROR(make_slice(ar, sl, double(prop.l2CacheSize)));
  PinnedHost host;
  sl.engram_host_rows = int64_t(1) << 18;
  FS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&host.p, size_t(sl.engram_host_rows * kEngramRowBytes)));
  std::memset(host.p, 0x3c, size_t(sl.engram_host_rows * kEngramRowBytes));
  sl.engram_host = static_cast<uint8_t*>(host.p);
  for (int m : opt.tokens) FS_RETURN_IF_ERROR(bench_tokens(sl, opt, rep.sm_count, m, rep));
  return rep;
}

std::string format_layer_bench(const LayerBenchReport& r, const LayerBenchOptions& opt) {
  std::string s = fmt::format("device: {} ({} SMs, L2 {:.0f} MB); copy bandwidth (D2D memcpy, read+write): {:.0f} GB/s\n\n",
                              r.device, r.sm_count, r.l2_mb, r.copy_gbps);
  s += "| M | kernel | role (layers/step) | median us | min us | MB moved | GB/s | % of copy BW | TFLOP/s |\n"
       "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& k : r.kernels) {
    const double gbps = k.bytes / (k.median_us * 1e-6) / 1e9;
    const std::string role = k.role.empty() ? "every" : fmt::format("{} ({:.0f})", k.role, k.per_step);
    s += fmt::format("| {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.0f} | {:.0f}% | {:.2f} |\n", k.tokens, k.name, role,
                     k.median_us, k.min_us, k.bytes / 1e6, gbps, 100.0 * gbps / r.copy_gbps,
                     k.flops / (k.median_us * 1e-6) / 1e12);
  }
  s += fmt::format("\nEvery-layer kernels (one decode layer, no role extras). Graph: {} layers captured, "
                   "replayed; per layer = replay / {}. Reference-numerics kernels: the whole-model path's "
                   "exactness-first FP32 kernels (mHC mixes, router, compressor, indexer).\n\n",
                   opt.graph_layers, opt.graph_layers);
  s += fmt::format("| M | kernel sum us | graph replay us/layer | graph/sum | layer MB | % of copy BW (graph) | x{} layers ms (graph) "
                   "| sum without reference-numerics kernels us | its % of copy BW |\n|---|---|---|---|---|---|---|---|---|\n",
                   opt.layers);
  for (int m : opt.tokens) {
    double us = 0, bytes = 0, fus = 0, fbytes = 0;
    for (const auto& k : r.kernels) {
      if (k.tokens != m || !k.role.empty()) continue;
      us += k.median_us, bytes += k.bytes;
      if (!k.reference) fus += k.median_us, fbytes += k.bytes;
    }
    double g = us;
    for (const auto& gt : r.graphs)
      if (gt.tokens == m) g = gt.replay_us_per_layer;
    const double gbps = bytes / (g * 1e-6) / 1e9, fgbps = fbytes / (fus * 1e-6) / 1e9;
    s += fmt::format("| {} | {:.1f} | {:.1f} | {:.2f} | {:.1f} | {:.0f}% | {:.2f} | {:.1f} | {:.0f}% |\n", m, us, g, g / us,
                     bytes / 1e6, 100.0 * gbps / r.copy_gbps, g * opt.layers / 1000.0, fus, 100.0 * fgbps / r.copy_gbps);
  }
  s += fmt::format("\nStep projection: {} x (graph layer) + role extras x their layer count (FULL source {}, index "
                   "source {}, Engram {}); LM head not included.\n\n", opt.layers, kFullSources, kIndexSources, kEngramLayers);
  s += "| M | context | step ms | step MB | % of copy BW | ms per token |\n|---|---|---|---|---|---|\n";
  for (int m : opt.tokens) {
    double lus = 0, lbytes = 0;
    for (const auto& k : r.kernels)
      if (k.tokens == m && k.role.empty()) lus += k.median_us, lbytes += k.bytes;
    for (const auto& gt : r.graphs)
      if (gt.tokens == m) lus = gt.replay_us_per_layer;
    for (int ctx : opt.contexts) {
      double us = lus * opt.layers, bytes = lbytes * opt.layers;
      for (const auto& k : r.kernels)
        if (k.tokens == m && !k.role.empty() && (k.context == 0 || k.context == ctx))
          us += k.median_us * k.per_step, bytes += k.bytes * k.per_step;
      const double gbps = bytes / (us * 1e-6) / 1e9;
      s += fmt::format("| {} | {} | {:.2f} | {:.0f} | {:.0f}% | {:.3f} |\n", m, ctx, us / 1000.0, bytes / 1e6,
                       100.0 * gbps / r.copy_gbps, us / 1000.0 / m);
    }
  }
  if (!r.sweep.empty()) {
    s += "\nGEMV sweep: forced k split s (cluster size, automatic chunk), then forced k blocks per warp "
         "iteration c (automatic split)\n\n| M | kernel |";
    for (int sp = 1; sp <= 8; ++sp) s += fmt::format(" s={} |", sp);
    s += " c=2 | c=4 |\n|---|---|";
    for (int sp = 1; sp <= kSweepCols; ++sp) s += "---|";
    s += "\n";
    for (size_t i = 0; i < r.sweep.size(); i += kSweepCols) {
      s += fmt::format("| {} | {} |", r.sweep[i].tokens, r.sweep[i].name);
      for (size_t j = i; j < i + kSweepCols && j < r.sweep.size(); ++j) {
        const double gbps = r.sweep[j].bytes / (r.sweep[j].median_us * 1e-6) / 1e9;
        s += fmt::format(" {:.1f} us {:.0f}% |", r.sweep[j].median_us, 100.0 * gbps / r.copy_gbps);
      }
      s += "\n";
    }
  }
  return s;
}

}  // namespace flashseek::ops::cuda
