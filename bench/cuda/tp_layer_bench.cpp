// Measured tensor/expert-parallel decode layer slice (tp_layer_bench.h). Layout: run_tp_layer_bench
// starts one thread per rank for each world size; a rank thread builds its weight slice, measures
// its copy bandwidth, joins the NCCL communicator, then for each token count builds activations
// and the rank's filtered routings and runs the timed phases. Threads meet at checkpoints (a
// barrier that also shares "some rank failed"), so a rank that fails makes every rank stop at the
// same point instead of leaving the others waiting in a collective.
#include "bench/cuda/tp_layer_bench.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "bench/cuda/bench_util.h"
#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/model/kernels.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"

#if FLASHSEEK_HAVE_NCCL
#include <nccl.h>
#endif

namespace flashseek::ops::cuda {

#if !FLASHSEEK_HAVE_NCCL

Result<TpLayerReport> run_tp_layer_bench(const TpLayerOptions&) {
  return Status(StatusCode::kUnimplemented, "bench --tp: this build has no NCCL (nccl.h / libnccl not found at configure time)");
}

#else

namespace {
using namespace bench;  // Arena, Fp8Mat, F32Mat, g_st, lin, measure_copy, copies_for

constexpr int64_t kHidden = 5120, kQLora = 1280, kKv = 512, kHeads = 64, kHeadDim = 512;
constexpr int64_t kOGroups = 8, kORank = 1024, kInter = 2304, kExperts = 384, kTopK = 6;
constexpr int64_t kWindow = 128, kTopIdx = 512, kPoolRows = 1 << 16;
constexpr int64_t kHc = 4, kMix = (2 + kHc) * kHc;
constexpr int kRoutings = 64;  // routings cycled over the layers (layer i uses i % 64)

Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  return Status(StatusCode::kInternal, fmt::format("{}: {}", what, ncclGetErrorString(r)));
}

// One rank's weights (backends/cuda/gpu_tp.h split); dense FP8/FP32 parts in rotating copies.
struct RankSlice {
  int rank = 0, world = 1;
  int64_t heads = 0, groups = 0, experts = 0, expert0 = 0;
  bool shared = false;
  Fp8Mat wqa_wkv, wq_b, wo, wo_b, sh_gate, sh_up, sh_down;
  F32Mat router, hc_fn;
  float *hc_base = nullptr, *hc_scale = nullptr, *norm_w = nullptr, *inv_freq = nullptr, *sink = nullptr;
  uint8_t *eg = nullptr, *egs = nullptr, *eu = nullptr, *eus = nullptr, *ed = nullptr, *eds = nullptr;
  uint16_t* pool = nullptr;  // BF16 latent rows (replicated KV)

  double fp8_bytes(const Fp8Mat& w, int m) const { return w.bytes() + 4.0 * m * double(w.n + w.k); }
};

Status make_rank_slice(Arena& ar, RankSlice& s, double l2) {
  auto fp8 = [&](Fp8Mat& m, int64_t n, int64_t k, uint64_t seed) {
    return make_fp8(ar, m, n, k, copies_for(double(n * k), l2), seed + 10000 * uint64_t(s.rank));
  };
  FS_RETURN_IF_ERROR(fp8(s.wqa_wkv, kQLora + kKv, kHidden, 100));
  FS_RETURN_IF_ERROR(fp8(s.wq_b, s.heads * kHeadDim, kQLora, 200));
  // wo_a: the rank's groups of [1024, 4096] timed as one [groups·1024, 4096] FP8 GEMV (as layer_bench).
  FS_RETURN_IF_ERROR(fp8(s.wo, s.groups * kORank, kHeads * kHeadDim / kOGroups, 300));
  FS_RETURN_IF_ERROR(fp8(s.wo_b, kHidden, s.groups * kORank, 400));
  if (s.shared) {
    FS_RETURN_IF_ERROR(fp8(s.sh_gate, kInter, kHidden, 500));
    FS_RETURN_IF_ERROR(fp8(s.sh_up, kInter, kHidden, 600));
    FS_RETURN_IF_ERROR(fp8(s.sh_down, kHidden, kInter, 700));
  }
  auto f32 = [&](F32Mat& m, int64_t n, int64_t k, uint64_t seed, float scale) {
    return make_f32(ar, m, n, k, copies_for(4.0 * double(n * k), l2), seed, scale);
  };
  FS_RETURN_IF_ERROR(f32(s.router, kExperts, kHidden, 1000, 0.02f));
  FS_RETURN_IF_ERROR(f32(s.hc_fn, kMix, kHc * kHidden, 1100, 0.01f));
  FS_ASSIGN_OR_RETURN(s.hc_base, ar.alloc<float>(kMix));
  FS_ASSIGN_OR_RETURN(s.hc_scale, ar.alloc<float>(3));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(s.hc_base, kMix, 1400, 0.5f, nullptr));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(s.hc_scale, 3, 1401, 1.0f, nullptr));
  // The rank's routed experts, stacked: gate, up, down codes + E8M0 scales (FP4, 32-blocks).
  const int64_t codes = s.experts * kInter * kHidden / 2, scales = s.experts * kInter * kHidden / 32;
  uint8_t** bufs[6] = {&s.eg, &s.egs, &s.eu, &s.eus, &s.ed, &s.eds};
  for (int i = 0; i < 6; ++i) {
    const int64_t n = i % 2 == 0 ? codes : scales;
    FS_ASSIGN_OR_RETURN(*bufs[i], ar.alloc<uint8_t>(n));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(*bufs[i], n, 900 + i, i % 2 == 0 ? 0 : 2, nullptr));
  }
  FS_ASSIGN_OR_RETURN(s.pool, ar.alloc<uint16_t>(kPoolRows * kHeadDim));
  {
    Arena tmp_ar;
    FS_ASSIGN_OR_RETURN(float* tmp, tmp_ar.alloc<float>(kPoolRows * kHeadDim));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(tmp, kPoolRows * kHeadDim, 77, 1.0f, nullptr));
    // BF16 bits = top half of the float.
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy2D(s.pool, 2, reinterpret_cast<uint8_t*>(tmp) + 2, 4, 2,
                                         size_t(kPoolRows * kHeadDim), cudaMemcpyDeviceToDevice));
  }
  FS_ASSIGN_OR_RETURN(s.norm_w, ar.alloc<float>(kHidden));
  FS_ASSIGN_OR_RETURN(s.inv_freq, ar.alloc<float>(32));
  FS_ASSIGN_OR_RETURN(s.sink, ar.alloc<float>(std::max<int64_t>(s.heads, 1)));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(s.norm_w, kHidden, 1, 1.0f, nullptr));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(s.inv_freq, 32, 2, 0.5f, nullptr));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(s.sink, s.heads, 3, 1.0f, nullptr));
  return cuda_status(cudaDeviceSynchronize(), "tp slice init");
}

// Activations of one token count on one rank, and the routings filtered to the rank's experts.
struct RankActs {
  float *X = nullptr, *x = nullptr, *qa = nullptr, *q = nullptr, *o = nullptr, *y = nullptr;
  float *h = nullptr, *hp = nullptr, *ys = nullptr, *ws = nullptr, *pre = nullptr, *post = nullptr;
  float *comb = nullptr, *logits = nullptr, *rscratch = nullptr, *rweight = nullptr;
  float *y32 = nullptr, *one = nullptr, *pair_weight = nullptr;
  uint16_t* y16 = nullptr;  // the all-reduced [m, 5120] BF16 buffer
  int32_t *rsel = nullptr, *sh_ge = nullptr, *sh_gs = nullptr, *sh_pr = nullptr, *idx = nullptr;
  int64_t* pos = nullptr;
  int64_t splits = 1;
  std::vector<int32_t*> ge, gs, pr;  // per routing: local expert id, group starts, token rows
  std::vector<int64_t> n_groups, n_pairs;
  double mean_local = 0;  // distinct local experts per routing
};

Status make_rank_acts(Arena& ar, RankActs& a, const RankSlice& s, int m, int sms) {
  const int64_t hq = m * std::max<int64_t>(s.heads, 1) * kHeadDim;
  float** fs[] = {&a.X, &a.x, &a.qa, &a.q, &a.o, &a.y, &a.h, &a.hp, &a.ys, &a.pre, &a.post, &a.comb,
                  &a.logits, &a.rscratch, &a.rweight, &a.y32, &a.one};
  const int64_t sizes[] = {m * kHc * kHidden, m * kHidden, m * (kQLora + kKv), std::max(hq, m * kOGroups * kORank),
                           hq, m * kHidden, m * kTopK * kInter, m * kTopK * kHidden, m * kHidden, m * kHc,
                           m * kHc, m * kHc * kHc, m * kExperts, m * 2 * kExperts, m * kTopK, m * kHidden, 1};
  for (size_t i = 0; i < std::size(fs); ++i) {
    FS_ASSIGN_OR_RETURN(*fs[i], ar.alloc<float>(sizes[i]));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(*fs[i], sizes[i], 10 + i, 0.5f, nullptr));
  }
  FS_ASSIGN_OR_RETURN(a.y16, ar.alloc<uint16_t>(m * kHidden));
  FS_CUDA_RETURN_IF_ERROR(cudaMemset(a.y16, 0, size_t(m * kHidden) * 2));
  // The all-reduced buffers start at zero (repeated in-place sums stay finite).
  FS_CUDA_RETURN_IF_ERROR(cudaMemset(a.y32, 0, size_t(m * kHidden) * 4));
  FS_CUDA_RETURN_IF_ERROR(cudaMemset(a.one, 0, 4));
  FS_ASSIGN_OR_RETURN(a.rsel, ar.alloc<int32_t>(m * kTopK));
  a.splits = sparse_attn_auto_splits(m, kWindow + kTopIdx, sms);
  FS_ASSIGN_OR_RETURN(a.ws, ar.alloc<float>(sparse_attn_workspace_floats(m, a.splits, std::max<int64_t>(s.heads, 1), kHeadDim)));
  std::vector<int64_t> pos(static_cast<size_t>(m));
  std::vector<int32_t> idx(static_cast<size_t>(m * (kWindow + kTopIdx)));
  std::mt19937 rng{uint32_t(m)};
  for (int t = 0; t < m; ++t) pos[size_t(t)] = 100000 + t;
  for (auto& v : idx) v = int32_t(rng() % kPoolRows);
  FS_ASSIGN_OR_RETURN(a.pos, ar.alloc<int64_t>(m));
  FS_ASSIGN_OR_RETURN(a.idx, ar.alloc<int32_t>(int64_t(idx.size())));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(a.pos, pos.data(), pos.size() * 8, cudaMemcpyHostToDevice));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(a.idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  auto upload = [&](const std::vector<int32_t>& v, int32_t** dst) -> Status {
    FS_ASSIGN_OR_RETURN(*dst, ar.alloc<int32_t>(int64_t(v.size())));
    if (v.empty()) return {};  // a rank without pairs of this routing: never read
    return cuda_status(cudaMemcpy(*dst, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload");
  };
  {  // shared expert: one group of every token
    std::vector<int32_t> ge{0}, gs{0, m}, pr(static_cast<size_t>(m));
    std::iota(pr.begin(), pr.end(), 0);
    FS_RETURN_IF_ERROR(upload(ge, &a.sh_ge));
    FS_RETURN_IF_ERROR(upload(gs, &a.sh_gs));
    FS_RETURN_IF_ERROR(upload(pr, &a.sh_pr));
  }
  // Uniform top-6 of 384 per token, the same on every rank (same seed), then only the rank's
  // experts [expert0, expert0 + experts), renumbered from 0 (expert parallel: the other ranks'
  // pairs are not computed here).
  std::mt19937 rr{uint32_t(4321 + m)};
  std::vector<int32_t> ids(kExperts);
  for (int c = 0; c < kRoutings; ++c) {
    std::vector<std::vector<int32_t>> by(kExperts);
    for (int t = 0; t < m; ++t) {
      std::iota(ids.begin(), ids.end(), 0);
      for (int i = 0; i < kTopK; ++i) {
        std::swap(ids[size_t(i)], ids[size_t(i + int64_t(rr() % uint32_t(kExperts - i)))]);
        by[size_t(ids[size_t(i)])].push_back(t);
      }
    }
    std::vector<int32_t> ge, gs{0}, pr;
    for (int64_t e = s.expert0; e < s.expert0 + s.experts; ++e) {
      if (by[size_t(e)].empty()) continue;
      ge.push_back(int32_t(e - s.expert0));
      pr.insert(pr.end(), by[size_t(e)].begin(), by[size_t(e)].end());
      gs.push_back(int32_t(pr.size()));
    }
    a.mean_local += double(ge.size()) / kRoutings;
    a.n_groups.push_back(int64_t(ge.size()));
    a.n_pairs.push_back(int64_t(pr.size()));
    int32_t *dge = nullptr, *dgs = nullptr, *dpr = nullptr;
    FS_RETURN_IF_ERROR(upload(ge, &dge));
    FS_RETURN_IF_ERROR(upload(gs, &dgs));
    FS_RETURN_IF_ERROR(upload(pr, &dpr));
    a.ge.push_back(dge), a.gs.push_back(dgs), a.pr.push_back(dpr);
  }
  FS_ASSIGN_OR_RETURN(a.pair_weight, ar.alloc<float>(m * kTopK));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(a.pair_weight, m * kTopK, 5, 1.0f, nullptr));
  return cuda_status(cudaDeviceSynchronize(), "tp acts init");
}

// Bytes one rank moves per layer (weights + scales + activations + KV rows), the layer_bench
// conventions; the routed experts at the rank's mean distinct local experts.
double rank_layer_bytes(const RankSlice& s, const RankActs& a, int m) {
  const double act = 4.0 * m;
  const double exp_bytes = double(kInter) * kHidden / 2 * 1.0625;  // one FP4 matrix + scales
  double b = 0;
  b += 2 * (s.hc_fn.bytes() + act * kHc * kHidden * 2 + act * kHidden);  // mHC pre x2
  b += 2 * (act * kHc * kHidden * 2 + act * kHidden);                    // mHC post x2
  b += act * 2 * kHidden * 2 + act * 2 * kQLora;                         // norms
  b += s.fp8_bytes(s.wqa_wkv, m) + s.fp8_bytes(s.wq_b, m) + s.fp8_bytes(s.wo, m) + s.fp8_bytes(s.wo_b, m);
  b += act * 2 * double(s.heads) * 64;                                   // rope q
  b += m * double(kWindow + kTopIdx) * kHeadDim * 2 + act * 2 * double(s.heads) * kHeadDim;  // attention
  b += s.router.bytes() + act * double(kExperts + kHidden);              // router
  if (s.shared) b += 2 * s.fp8_bytes(s.sh_gate, m) + s.fp8_bytes(s.sh_down, m);
  b += 3 * a.mean_local * exp_bytes + act * kTopK * (2 * kHidden + 2 * kInter);  // routed
  b += act * kTopK * kHidden + act * 2 * kHidden;                        // combine
  return b;
}

// Per (token count, phase, rank): the samples of that rank (us).
enum Phase { kEager, kGraph, kCompute, kComm16, kComm32, kPrefill, kPhases };

struct Shared {
  explicit Shared(int world) : bar(world) {}
  std::barrier<> bar;
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first_error;
  ncclUniqueId id{};
  // samples[token index][phase][rank]
  std::vector<std::vector<std::vector<std::vector<double>>>> samples;
  std::vector<double> copy_gbps, rank_bytes, local_experts;  // per token index (rank 0) / per rank
  std::vector<double> rank_copy;
};

// Every rank calls it the same number of times: records a failure, waits for all ranks, and
// says whether every rank is still fine.
bool checkpoint(Shared& sh, const Status& st) {
  if (!st.ok()) {
    std::lock_guard<std::mutex> lock(sh.mu);
    if (sh.first_error.ok()) sh.first_error = st;
    sh.failed = true;
  }
  sh.bar.arrive_and_wait();
  return !sh.failed.load();
}

struct Events {
  cudaEvent_t a = nullptr, b = nullptr;
  ~Events() { if (a) cudaEventDestroy(a); if (b) cudaEventDestroy(b); }
};

struct GraphExec {
  cudaGraphExec_t g = nullptr;
  ~GraphExec() { if (g) cudaGraphExecDestroy(g); }
};

void rank_main(Shared& sh, const TpLayerOptions& opt, int world, int rank) {
  Status st = cuda_status(cudaSetDevice(rank), "cudaSetDevice");
  struct StreamGuard {
    ~StreamGuard() { if (g_st) cudaStreamDestroy(g_st); g_st = nullptr; }
  } guard;
  if (st.ok()) st = cuda_status(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking), "stream");
  cudaDeviceProp prop{};
  if (st.ok()) st = cuda_status(cudaGetDeviceProperties(&prop, rank), "props");
  if (st.ok()) st = measure_copy(&sh.rank_copy[size_t(rank)]);
  Arena ar;
  RankSlice s;
  s.rank = rank, s.world = world;
  s.heads = kHeads / world, s.groups = kOGroups / world, s.experts = kExperts / world;
  s.expert0 = rank * s.experts, s.shared = rank == 0;
  if (st.ok()) st = make_rank_slice(ar, s, double(prop.l2CacheSize));
  Events ev;
  if (st.ok()) st = cuda_status(cudaEventCreate(&ev.a), "event");
  if (st.ok()) st = cuda_status(cudaEventCreate(&ev.b), "event");
  if (!checkpoint(sh, st)) return;  // before ncclCommInitRank: every rank must join it

  ncclComm_t comm = nullptr;
  if (world > 1) st = nccl_status(ncclCommInitRank(&comm, world, sh.id, rank), "ncclCommInitRank");
  struct CommGuard {
    ncclComm_t& c;
    ~CommGuard() { if (c) ncclCommDestroy(c); }
  } comm_guard{comm};
  if (!checkpoint(sh, st)) return;

  const int L = opt.layers;
  for (size_t ti = 0; ti < opt.tokens.size(); ++ti) {
    const int m = opt.tokens[ti];
    Arena aa;
    RankActs a;
    st = make_rank_acts(aa, a, s, m, prop.multiProcessorCount);
    if (rank == 0 && st.ok()) {
      sh.rank_bytes[ti] = rank_layer_bytes(s, a, m);
      sh.local_experts[ti] = a.mean_local;
    }
    if (!checkpoint(sh, st)) return;

    auto norm = [&](float* x, int64_t dim) {
      RmsNormParams p;
      p.x = x, p.w = s.norm_w, p.y = x, p.rows = m, p.dim = dim, p.eps = 1e-20f;
      return rms_norm_cuda(p, g_st);
    };
    auto hc_pre = [&](int r) -> Status {
      detail::HcMixArgs h;
      h.x = a.X, h.fn = s.hc_fn.at(r), h.base = s.hc_base, h.scale = s.hc_scale, h.rows = m;
      h.hc = kHc, h.dim = kHidden, h.sinkhorn_iters = 20, h.norm_eps = 1e-6f, h.hc_eps = 1e-6f;
      h.pre = a.pre, h.post = a.post, h.comb = a.comb;
      FS_CUDA_RETURN_IF_ERROR(detail::launch_hc_mixes(h, g_st));
      return cuda_status(detail::launch_hc_collapse(a.X, a.pre, a.x, m, kHc, kHidden, false, g_st), "hc collapse");
    };
    auto hc_post = [&]() {
      return cuda_status(detail::launch_hc_post(a.y, a.X, a.post, a.comb, m, kHc, kHidden, false, g_st), "hc post");
    };
    auto allreduce = [&](void* buf, int64_t n, ncclDataType_t dt) -> Status {
      return nccl_status(ncclAllReduce(buf, buf, size_t(n), dt, ncclSum, comm, g_st), "ncclAllReduce");
    };
    auto routed = [&](bool gated, int r) -> Status {
      const size_t c = size_t(r % kRoutings);
      if (a.n_groups[c] == 0) return {};  // none of this token set's experts lives on this rank
      ExpertGemvParams p;
      p.format = WeightFormat::kFp4, p.n_experts = s.experts, p.swiglu_limit = 10.0f;
      p.n = gated ? kInter : kHidden, p.k = gated ? kHidden : kInter;
      p.expert_stride = p.n * p.k / 2, p.expert_scale_stride = p.n * p.k / 32;
      p.x = gated ? a.y : a.h, p.y = gated ? a.h : a.hp;
      p.w = gated ? s.eg : s.ed, p.w_scale = gated ? s.egs : s.eds;
      p.w_up = gated ? s.eu : nullptr, p.w_up_scale = gated ? s.eus : nullptr;
      p.group_expert = a.ge[c], p.group_start = a.gs[c], p.n_groups = a.n_groups[c], p.n_pairs = a.n_pairs[c];
      p.pair_row = gated ? a.pr[c] : nullptr, p.pair_weight = gated ? a.pair_weight : nullptr;
      return expert_gemv_cuda(p, g_st);
    };
    auto shared_expert = [&](int r) -> Status {
      if (!s.shared) return {};
      const int c = r % int(s.sh_gate.w.size());
      ExpertGemvParams p;
      p.format = WeightFormat::kFp8, p.n_experts = 1, p.n_groups = 1, p.n_pairs = m, p.swiglu_limit = 10.0f;
      p.x = a.y, p.y = a.h, p.n = kInter, p.k = kHidden;
      p.w = s.sh_gate.w[size_t(c)], p.w_scale = s.sh_gate.s[size_t(c)];
      p.w_up = s.sh_up.w[size_t(c)], p.w_up_scale = s.sh_up.s[size_t(c)];
      p.group_expert = a.sh_ge, p.group_start = a.sh_gs, p.pair_row = a.sh_pr;
      FS_RETURN_IF_ERROR(expert_gemv_cuda(p, g_st));
      return lin(s.sh_down, r, a.h, a.ys, m);
    };
    // Decode layer `i` (weight copy i, routing i) on g_st: the compute kernels and/or the two
    // BF16 all-reduces of [m, 5120], in the model's order.
    auto layer = [&](int i, bool compute, bool comm_on) -> Status {
      if (compute) {
        FS_RETURN_IF_ERROR(hc_pre(i));
        FS_RETURN_IF_ERROR(norm(a.x, kHidden));
        FS_RETURN_IF_ERROR(lin(s.wqa_wkv, i, a.x, a.qa, m));
        FS_RETURN_IF_ERROR(norm(a.qa, kQLora));
        FS_RETURN_IF_ERROR(lin(s.wq_b, i, a.qa, a.q, m));
        RopeParams rp;
        rp.x = a.q, rp.pos = a.pos, rp.inv_freq = s.inv_freq, rp.rows = m, rp.n_vec = s.heads;
        rp.vec_dim = kHeadDim, rp.rope_dim = 64;
        FS_RETURN_IF_ERROR(apply_rope_cuda(rp, g_st));
        SparseAttnPoolParams ap;
        ap.q = a.q, ap.kv = s.pool, ap.idx = a.idx, ap.sink = s.sink, ap.out = a.o, ap.m = m;
        ap.n_idx = kWindow + kTopIdx, ap.n_rows = kPoolRows, ap.n_heads = s.heads, ap.head_dim = kHeadDim;
        ap.scale = 1.0f / std::sqrt(float(kHeadDim)), ap.n_splits = a.splits, ap.workspace = a.ws;
        FS_RETURN_IF_ERROR(sparse_attention_pool_cuda(ap, g_st));
        FS_RETURN_IF_ERROR(lin(s.wo, i, a.o, a.q, m));
        FS_RETURN_IF_ERROR(lin(s.wo_b, i, a.q, a.y, m));
      }
      if (comm_on && world > 1) FS_RETURN_IF_ERROR(allreduce(a.y16, m * kHidden, ncclBfloat16));
      if (compute) {
        FS_RETURN_IF_ERROR(hc_post());
        FS_RETURN_IF_ERROR(hc_pre(i + 1));
        FS_RETURN_IF_ERROR(norm(a.y, kHidden));
        detail::LinearArgs la;
        la.x = a.y, la.w = s.router.at(i), la.y = a.logits, la.rows = m, la.in = kHidden, la.out = kExperts;
        FS_CUDA_RETURN_IF_ERROR(detail::launch_linear(la, g_st));
        detail::RouteArgs ra;
        ra.logits = a.logits, ra.scratch = a.rscratch, ra.T = m, ra.E = kExperts, ra.K = kTopK;
        ra.sqrtsoftplus = true, ra.norm_topk = true, ra.route_scale = 1.5f, ra.sel = a.rsel, ra.weight = a.rweight;
        FS_CUDA_RETURN_IF_ERROR(detail::launch_route(ra, g_st));
        FS_RETURN_IF_ERROR(shared_expert(i));
        FS_RETURN_IF_ERROR(routed(true, i));
        FS_RETURN_IF_ERROR(routed(false, i));
        FS_CUDA_RETURN_IF_ERROR(detail::launch_moe_combine(a.hp, a.ys, a.y, m, kTopK, kHidden, true, g_st));
      }
      if (comm_on && world > 1) FS_RETURN_IF_ERROR(allreduce(a.y16, m * kHidden, ncclBfloat16));
      if (compute) FS_RETURN_IF_ERROR(hc_post());
      return {};
    };
    auto layers = [&](bool compute, bool comm_on) -> Status {
      for (int i = 0; i < L; ++i) FS_RETURN_IF_ERROR(layer(i, compute, comm_on));
      return {};
    };
    auto comm_only = [&](void* buf, int64_t n, ncclDataType_t dt) -> Status {
      for (int i = 0; i < 2 * L; ++i) FS_RETURN_IF_ERROR(allreduce(buf, n, dt));
      return {};
    };
    // One sample: align the ranks (host barrier at the checkpoint, then a one-element all-reduce
    // that every GPU leaves at about the same time), events around `batch` x work.
    auto sample = [&](const std::function<Status()>& work, int batch, Phase ph) -> bool {
      for (int rep = -2; rep < opt.reps; ++rep) {  // two warm-up samples
        Status ss = [&]() -> Status {
          if (world > 1) FS_RETURN_IF_ERROR(allreduce(a.one, 1, ncclFloat));
          FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.a, g_st));
          for (int b = 0; b < batch; ++b) FS_RETURN_IF_ERROR(work());
          FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.b, g_st));
          FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.b));
          float ms = 0;
          FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.a, ev.b));
          if (rep >= 0) sh.samples[ti][ph][size_t(rank)].push_back(double(ms) * 1e3 / batch);
          return {};
        }();
        if (!checkpoint(sh, ss)) return false;
      }
      return true;
    };
    // A graph per rank of `body` (captured in this thread only), replayed `batch` times a sample.
    auto graph = [&](const std::function<Status()>& body, Phase ph) -> bool {
      GraphExec ex;
      Status gs = [&]() -> Status {
        cudaGraph_t g = nullptr;
        FS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal));
        const Status cap = body();
        const cudaError_t end = cudaStreamEndCapture(g_st, &g);
        FS_RETURN_IF_ERROR(cap);
        FS_CUDA_RETURN_IF_ERROR(end);
        const cudaError_t inst = cudaGraphInstantiate(&ex.g, g, 0);
        cudaGraphDestroy(g);
        return cuda_status(inst, "cudaGraphInstantiate");
      }();
      if (!checkpoint(sh, gs)) return false;
      return sample([&]() { return cuda_status(cudaGraphLaunch(ex.g, g_st), "cudaGraphLaunch"); }, 2, ph);
    };

    if (!sample([&]() { return layers(true, true); }, 1, kEager)) return;
    if (!graph([&]() { return layers(true, true); }, kGraph)) return;
    if (world > 1) {
      if (!graph([&]() { return layers(true, false); }, kCompute)) return;
      if (!graph([&]() { return comm_only(a.y16, m * kHidden, ncclBfloat16); }, kComm16)) return;
      if (!graph([&]() { return comm_only(a.y32, m * kHidden, ncclFloat); }, kComm32)) return;
    }
  }
  if (world > 1 && opt.prefill_tokens > 0) {  // collectives alone at prefill size
    const int64_t n = int64_t(opt.prefill_tokens) * kHidden;
    Arena pa;
    auto buf = pa.alloc<uint16_t>(n);
    st = buf.ok() ? cuda_status(cudaMemset(*buf, 0, size_t(n) * 2), "memset") : buf.status();
    auto one = pa.alloc<float>(1);
    if (st.ok() && !one.ok()) st = one.status();
    if (st.ok()) st = cuda_status(cudaMemset(*one, 0, 4), "memset");
    if (!checkpoint(sh, st)) return;
    GraphExec ex;
    st = [&]() -> Status {
      cudaGraph_t g = nullptr;
      FS_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(g_st, cudaStreamCaptureModeThreadLocal));
      Status cap;
      for (int i = 0; i < 2 * L && cap.ok(); ++i)
        cap = nccl_status(ncclAllReduce(*buf, *buf, size_t(n), ncclBfloat16, ncclSum, comm, g_st), "ncclAllReduce");
      const cudaError_t end = cudaStreamEndCapture(g_st, &g);
      FS_RETURN_IF_ERROR(cap);
      FS_CUDA_RETURN_IF_ERROR(end);
      const cudaError_t inst = cudaGraphInstantiate(&ex.g, g, 0);
      cudaGraphDestroy(g);
      return cuda_status(inst, "cudaGraphInstantiate");
    }();
    if (!checkpoint(sh, st)) return;
    for (int rep = -1; rep < std::max(3, opt.reps / 4); ++rep) {
      Status ss = [&]() -> Status {
        FS_RETURN_IF_ERROR(nccl_status(ncclAllReduce(*one, *one, 1, ncclFloat, ncclSum, comm, g_st), "ncclAllReduce"));
        FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.a, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(ex.g, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.b, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(ev.b));
        float ms = 0;
        FS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, ev.a, ev.b));
        if (rep >= 0) sh.samples.back()[kPrefill][size_t(rank)].push_back(double(ms) * 1e3);
        return {};
      }();
      if (!checkpoint(sh, ss)) return;
    }
  }
  cudaStreamSynchronize(g_st);
}

// Per sample the slowest rank; median over samples (and the minimum).
void step_stats(const std::vector<std::vector<double>>& per_rank, double* med, double* mn) {
  std::vector<double> worst;
  for (size_t s = 0; !per_rank.empty() && s < per_rank[0].size(); ++s) {
    double w = 0;
    for (const auto& r : per_rank) w = std::max(w, s < r.size() ? r[s] : 0.0);
    worst.push_back(w);
  }
  std::sort(worst.begin(), worst.end());
  *med = worst.empty() ? 0 : worst[worst.size() / 2];
  if (mn) *mn = worst.empty() ? 0 : worst.front();
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

Result<TpLayerReport> run_tp_layer_bench(const TpLayerOptions& opt) {
  std::string why;
  if (!cuda_device_available(&why)) return Status(StatusCode::kUnavailable, "bench --tp: " + why);
  int n = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&n));
  if (opt.tokens.empty()) return invalid_argument("bench --tp: no token counts");
  for (int m : opt.tokens)
    if (m <= 0 || m > 256) return invalid_argument("bench --tp: tokens={} must be in 1..256", m);
  for (int w : opt.worlds) {
    if (w < 1 || kHeads % w != 0 || kOGroups % w != 0 || kExperts % w != 0)
      return invalid_argument("bench --tp: {} GPUs do not divide 64 heads, 8 output groups and 384 experts", w);
    if (w > n) return invalid_argument("bench --tp: {} GPUs asked, this machine has {} CUDA device(s)", w, n);
  }
  if (opt.reps <= 0 || opt.layers <= 0 || opt.layers > 128)
    return invalid_argument("bench --tp: reps={} must be positive and layers={} in 1..128", opt.reps, opt.layers);
  if (opt.prefill_tokens < 0 || opt.prefill_tokens > 65536)
    return invalid_argument("bench --tp: prefill tokens={} must be in 0..65536", opt.prefill_tokens);
  ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  TpLayerReport rep;
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  rep.device = prop.name;
  int ver = 0;
  if (ncclGetVersion(&ver) == ncclSuccess)
    rep.nccl_version = fmt::format("{}.{}.{}", ver / 10000, (ver / 100) % 100, ver % 100);
  for (int w : opt.worlds) {
    Shared sh(w);
    if (w > 1) FS_RETURN_IF_ERROR(nccl_status(ncclGetUniqueId(&sh.id), "ncclGetUniqueId"));
    const size_t nt = opt.tokens.size() + 1;  // + the prefill slot
    sh.samples.assign(nt, std::vector<std::vector<std::vector<double>>>(kPhases, std::vector<std::vector<double>>(size_t(w))));
    sh.rank_bytes.assign(nt, 0), sh.local_experts.assign(nt, 0), sh.rank_copy.assign(size_t(w), 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < w; ++r) threads.emplace_back(rank_main, std::ref(sh), std::cref(opt), w, r);
    for (auto& t : threads) t.join();
    FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
    if (!sh.first_error.ok()) {  // keep the world sizes that ran; say which one failed
      rep.error = fmt::format("{} GPUs: {}", w, sh.first_error.to_string());
      break;
    }
    const double copy = *std::min_element(sh.rank_copy.begin(), sh.rank_copy.end());
    for (size_t ti = 0; ti < opt.tokens.size(); ++ti) {
      TpLayerTiming t;
      t.world = w, t.tokens = opt.tokens[ti];
      const auto& s = sh.samples[ti];
      step_stats(s[kEager], &t.eager_us, nullptr);
      step_stats(s[kGraph], &t.graph_us, &t.graph_min_us);
      if (w > 1) {
        std::vector<double> per;
        for (const auto& r : s[kCompute]) per.push_back(median_of(r));
        t.compute_max_us = *std::max_element(per.begin(), per.end());
        t.compute_min_us = *std::min_element(per.begin(), per.end());
        step_stats(s[kComm16], &t.comm_bf16_us, nullptr);
        step_stats(s[kComm32], &t.comm_fp32_us, nullptr);
      } else {
        t.compute_max_us = t.compute_min_us = t.graph_us;
      }
      t.rank_bytes = sh.rank_bytes[ti], t.local_experts = sh.local_experts[ti], t.copy_gbps = copy;
      rep.rows.push_back(t);
    }
    if (w > 1 && opt.prefill_tokens > 0) {
      TpPrefillComm p;
      p.world = w, p.tokens = opt.prefill_tokens, p.layers = opt.layers;
      step_stats(sh.samples.back()[kPrefill], &p.bf16_us, nullptr);
      rep.prefill.push_back(p);
    }
  }
  return rep;
}

#endif  // FLASHSEEK_HAVE_NCCL

std::string format_tp_layer_bench(const TpLayerReport& r, const TpLayerOptions& opt) {
  std::string s = fmt::format(
      "### Measured tensor/expert-parallel layer slice, {} ({} layers per step; NCCL {}, NCCL_NVLS_ENABLE=0)\n\n"
      "One host thread per GPU, one NCCL communicator per rank. Each rank holds its slice at real V4.1 size: heads 64/W\n"
      "(wq_b, RoPE, sparse attention), output groups 8/W (wo_a, wo_b), routed FP4 experts 384/W (uniform top-6 routing,\n"
      "the same on every rank, filtered to the rank's experts), the shared expert on rank 0, mHC / norms / wq_a+wkv /\n"
      "FP32 router / MoE combine in full, and two BF16 all-reduces of [M, 5120] per layer. W = 1: the same slice on one\n"
      "GPU without collectives. Eager: {} layers launched back to back by each rank's thread. Graph: one CUDA graph per\n"
      "rank of the {} layers including the ncclAllReduce calls, replayed on every rank at once. Every sample starts\n"
      "with a host barrier and a one-element all-reduce; the sample's time is the slowest rank's (CUDA events); median\n"
      "of {} samples. Compute-only: the same graph without the all-reduces (slowest / fastest rank). All-reduce-only:\n"
      "a graph of the 2x{} all-reduces alone (BF16; FP32 is what the model's TP path sums in today). Bytes: the busiest\n"
      "rank (rank 0: shared expert) per layer; % of copy BW against the slowest rank's D2D copy rate.\n\n",
      r.device, opt.layers, r.nccl_version.empty() ? "?" : r.nccl_version, opt.layers, opt.layers, opt.reps, opt.layers);
  s += "| M | GPUs | eager ms/step | graph ms/step | graph us/layer | eager/graph | compute-only ms (slowest / fastest rank) "
       "| all-reduce-only ms bf16 (fp32) | all-reduce share of graph step | graph − compute ms | rank-0 MB/layer | "
       "% of copy BW (graph) | speed-up vs 1 GPU (graph) | x 2.71 ms anchor |\n"
       "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& t : r.rows) {
    double one = 0;
    for (const auto& u : r.rows)
      if (u.world == 1 && u.tokens == t.tokens) one = u.graph_us;
    const double gbps = t.rank_bytes * opt.layers / (t.graph_us * 1e-6) / 1e9;
    const bool multi = t.world > 1;
    s += fmt::format("| {} | {} | {:.2f} | {:.2f} | {:.1f} | {:.2f} | {} | {} | {} | {} | {:.1f} ({:.1f} local experts) | {:.0f}% | {} | {:.2f}x |\n",
                     t.tokens, t.world, t.eager_us / 1e3, t.graph_us / 1e3, t.graph_us / opt.layers,
                     t.graph_us > 0 ? t.eager_us / t.graph_us : 0.0,
                     multi ? fmt::format("{:.2f} / {:.2f}", t.compute_max_us / 1e3, t.compute_min_us / 1e3) : "-",
                     multi ? fmt::format("{:.2f} ({:.2f})", t.comm_bf16_us / 1e3, t.comm_fp32_us / 1e3) : "-",
                     multi ? fmt::format("{:.0f}%", 100.0 * t.comm_bf16_us / t.graph_us) : "-",
                     multi ? fmt::format("{:.2f}", (t.graph_us - t.compute_max_us) / 1e3) : "-",
                     t.rank_bytes / 1e6, t.local_experts, 100.0 * gbps / t.copy_gbps,
                     one > 0 ? fmt::format("{:.2f}x", one / t.graph_us) : "-", t.graph_us / 1e3 / opt.anchor_ms);
  }
  if (!r.prefill.empty()) {
    s += fmt::format("\nPrefill collectives (graph of 2x{} BF16 all-reduces of [M, 5120], slowest rank, median):\n\n"
                     "| GPUs | M | ms per step | us per all-reduce | bus GB/s |\n|---|---|---|---|---|\n", opt.layers);
    for (const auto& p : r.prefill) {
      const double per = p.bf16_us / (2.0 * p.layers);
      const double bytes = double(p.tokens) * 5120 * 2;
      s += fmt::format("| {} | {} | {:.2f} | {:.1f} | {:.1f} |\n", p.world, p.tokens, p.bf16_us / 1e3, per,
                       bytes * 2.0 * (p.world - 1) / p.world / (per * 1e-6) / 1e9);
    }
  }
  if (!r.error.empty()) s += fmt::format("\n**Failed, rows above are the world sizes that ran: {}**\n", r.error);
  s += "\n";
  return s;
}

}  // namespace flashseek::ops::cuda
