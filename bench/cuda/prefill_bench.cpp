// Prefill layer benchmark (see prefill_bench.h). One Layer holds every weight of one layer (dense
// FP8 parts in rotating copies; all 384 routed experts once, as FP8 e4m3 copies of their FP4
// values, and once more as stored, MXFP4, for the FP4 grouped GEMM rows); each kernel is a
// closure over the rep index that launches it on g_st.
#include "bench/cuda/prefill_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "bench/cuda/bench_util.h"
#include "ops/cuda/runtime/cuda_check.h"
#include "ops/cuda/gemm/gemm_fp8.h"
#include "ops/cuda/model/kernels.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/prefill_kernels.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::ops::cuda {
namespace {
using namespace bench;  // Arena, Fp8Mat, time_op, g_st (bench_util.h)

constexpr int64_t kHidden = 5120, kQLora = 1280, kKv = 512, kHeads = 64, kHeadDim = 512;
constexpr int64_t kQ = kHeads * kHeadDim;  // 32768
constexpr int64_t kOGroups = 8, kORank = 1024, kOIn = kQ / kOGroups;  // wo_a: 8 x [1024, 4096]
constexpr int64_t kInter = 2304, kExperts = 384, kTopK = 6;
constexpr int64_t kWindow = 128, kTopIdx = 512, kPoolRows = 1 << 16;
constexpr int64_t kHc = 4, kMix = (2 + kHc) * kHc, kIdxHeads = 32, kIdxDim = 128;
constexpr int64_t kEngramOut = 25600, kEngramIn = 6144, kEngramRows = 24, kEngramRowBytes = 264;
// Layers per 40-layer step (model-v41.md §1.7): kv sources 2, 8, 14 (ratio 2) and 20 (ratio 1);
// index sources 2, 8, 14, 20 and REINDEX 24, 28, 32, 36; Engram on 1 and 14.
constexpr int kRatio2Sources = 3, kRatio1Sources = 1, kIndexSources = 8, kReindex = 4, kEngram = 2;

struct PinnedHost {
  void* p = nullptr;
  ~PinnedHost() { if (p) cudaFreeHost(p); }
};

struct Streams {
  std::vector<cudaStream_t> s;
  std::vector<cudaEvent_t> ev;  // [0] fork, [1 + i] join of stream i
  ~Streams() {
    for (auto x : s) cudaStreamDestroy(x);
    for (auto e : ev) cudaEventDestroy(e);
  }
};

// Routing of the chunk's M·6 (token, slot) pairs, grouped by expert (uniform top-6 of 384).
struct Routing {
  std::vector<int64_t> start, count;  // per expert, into the grouped pair rows
  int32_t* pair_row = nullptr;        // [M·6] token of each grouped pair
  int32_t* inv = nullptr;             // [M·6] grouped position of pair (t, slot)
  int32_t* row_start = nullptr;       // [experts + 1] device: start ‖ M·6 (the grouped GEMM's table)
  int64_t distinct = 0;
};

Status make_routing(Arena& ar, Routing& r, int64_t m, uint64_t seed) {
  std::mt19937 rng{uint32_t(seed)};
  std::vector<std::vector<int32_t>> by(kExperts);  // pair ids t·6 + slot
  std::vector<int32_t> ids(kExperts);
  for (int64_t t = 0; t < m; ++t) {
    std::iota(ids.begin(), ids.end(), 0);
    for (int64_t i = 0; i < kTopK; ++i) {
      std::swap(ids[size_t(i)], ids[size_t(i + int64_t(rng() % uint32_t(kExperts - i)))]);
      by[size_t(ids[size_t(i)])].push_back(int32_t(t * kTopK + i));
    }
  }
  std::vector<int32_t> rows, inv(size_t(m * kTopK));
  for (int64_t e = 0; e < kExperts; ++e) {
    r.start.push_back(int64_t(rows.size()));
    r.count.push_back(int64_t(by[size_t(e)].size()));
    r.distinct += by[size_t(e)].empty() ? 0 : 1;
    for (int32_t p : by[size_t(e)]) {
      inv[size_t(p)] = int32_t(rows.size());
      rows.push_back(p / int32_t(kTopK));
    }
  }
  std::vector<int32_t> starts(r.start.begin(), r.start.end());
  starts.push_back(int32_t(rows.size()));
  FS_ASSIGN_OR_RETURN(r.row_start, ar.alloc<int32_t>(kExperts + 1));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(r.row_start, starts.data(), starts.size() * 4, cudaMemcpyHostToDevice));
  FS_ASSIGN_OR_RETURN(r.pair_row, ar.alloc<int32_t>(m * kTopK));
  FS_ASSIGN_OR_RETURN(r.inv, ar.alloc<int32_t>(m * kTopK));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(r.pair_row, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
  return cuda_status(cudaMemcpy(r.inv, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice), "routing");
}

// FP8 activation: e4m3 codes [rows, k] + FP32 scales [rows, k/32].
struct Q8 {
  uint8_t* q = nullptr;
  float* s = nullptr;
  int64_t rows = 0, k = 0;
};
Status make_q8(Arena& ar, Q8& a, int64_t rows, int64_t k) {
  a.rows = rows, a.k = k;
  FS_ASSIGN_OR_RETURN(a.q, ar.alloc<uint8_t>(rows * k));
  FS_ASSIGN_OR_RETURN(a.s, ar.alloc<float>(rows * (k / 32)));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(a.q, rows * k, uint64_t(rows + k), 1, nullptr));
  return cuda_status(detail::launch_fill_floats(a.s, rows * (k / 32), uint64_t(rows * 3 + k), 0.01f, nullptr),
                     "fill");
}

Status quant(const float* x, int64_t rows, int64_t k, const Q8& dst, cudaStream_t st) {
  return gemm_fp8_quantize_cuda(x, ActDtype::kF32, rows, k, 32, dst.q, dst.s, st);
}

// y [m, n] = xq · Wᵀ with the FP8 block-scaled GEMM (default kernel).
Status gemm(const uint8_t* xq, const float* xs, const uint8_t* w, const uint8_t* ws, void* y, int64_t m,
            int64_t n, int64_t k, cudaStream_t st) {
  GemmFp8Params p;
  p.xq = xq, p.xs = xs, p.w = w, p.w_scale = ws, p.y = y, p.m = m, p.n = n, p.k = k;
  return gemm_fp8_cuda(p, st);
}
Status gemm(const Q8& x, const Fp8Mat& w, int copy, void* y, int64_t m) {
  const size_t c = size_t(copy) % w.w.size();
  return gemm(x.q, x.s, w.w[c], w.s[c], y, m, w.n, w.k, g_st);
}

// Random floats.
Result<float*> floats(Arena& ar, int64_t n, uint64_t seed, float scale = 1.0f) {
  FS_ASSIGN_OR_RETURN(float* p, ar.alloc<float>(n));
  FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(p, n, seed, scale, nullptr));
  return p;
}

}  // namespace

Status measure_fp8_ceiling(int reps, double* tflops, double* med_us, double* min_us) {
  Arena ca;
  Fp8Mat sq;
  FS_RETURN_IF_ERROR(make_fp8(ca, sq, 8192, 8192, 2, 17));
  Q8 xq;
  FS_RETURN_IF_ERROR(make_q8(ca, xq, 8192, 8192));
  FS_ASSIGN_OR_RETURN(float* y, ca.alloc<float>(8192 * 8192));
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  double med = 0, mn = 0;
  FS_RETURN_IF_ERROR(time_op([&](int r) { return gemm(xq, sq, r, y, 8192); }, std::max(reps, 1), &med, &mn, 3));
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  *tflops = 2.0 * 8192.0 * 8192.0 * 8192.0 / (med * 1e-6) / 1e12;
  if (med_us) *med_us = med;
  if (min_us) *min_us = mn;
  return {};
}

Status measure_device_limits(int device, double* copy_gbps, double* fp8_tflops) {
  int prev = 0;
  FS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&prev));
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  Status st = measure_copy(copy_gbps);
  if (st.ok() && fp8_tflops) st = measure_fp8_ceiling(5, fp8_tflops);
  const cudaError_t back = cudaSetDevice(prev);
  if (!st.ok()) return st;
  return cuda_status(back, "cudaSetDevice (restoring the current device)");
}

Result<PrefillBenchReport> run_prefill_bench(const PrefillBenchOptions& opt) {
  std::string why;
  if (!cuda_device_available(&why)) return Status(StatusCode::kUnavailable, "bench needs a GPU: " + why);
  const int64_t m = opt.tokens;
  if (m < 256 || m > 16384 || m % 128 != 0)
    return invalid_argument("bench --prefill: tokens={} must be a multiple of 128 in 256..16384", m);
  if (opt.reps <= 0 || opt.reps > 100) return invalid_argument("bench --prefill: reps={} must be in 1..100", opt.reps);
  if (opt.expert_streams < 1 || opt.expert_streams > 16)
    return invalid_argument("bench --prefill: expert_streams={} must be in 1..16", opt.expert_streams);
  const int64_t rows = std::min<int64_t>(opt.index_rows, m);  // indexer query rows timed
  if (rows < 128 || m % rows != 0)
    return invalid_argument("bench --prefill: index_rows={} must be >= 128 and divide tokens={}", opt.index_rows, m);
  for (int c : opt.contexts)
    if (c < 0 || c > (1 << 20)) return invalid_argument("bench --prefill: context={} must be in 0..1048576", c);
  PrefillBenchReport rep;
  cudaDeviceProp prop{};
  FS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  rep.device = prop.name, rep.sm_count = prop.multiProcessorCount;
  if (prop.major != 9 || prop.minor != 0)
    return Status(StatusCode::kUnimplemented,
                  fmt::format("bench --prefill: the FP8 GEMM needs an sm_90a device, this one is sm_{}{}",
                              prop.major, prop.minor));
  struct StreamGuard {
    ~StreamGuard() { if (g_st) cudaStreamDestroy(g_st); g_st = nullptr; }
  } guard;
  FS_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&g_st));
  FS_RETURN_IF_ERROR(measure_copy(&rep.copy_gbps));
  const double l2 = double(prop.l2CacheSize);
  Arena ar;

  // ---- timing helper ---------------------------------------------------------------------------
  std::vector<std::function<Status(int)>> layer;  // every-layer kernels, in order
  auto add = [&](PrefillKernel k, const std::function<Status(int)>& fn) -> Status {
    double probe = 0, probe_min = 0;
    FS_RETURN_IF_ERROR(time_op(fn, 1, &probe, &probe_min, 1));
    // Batches of about 2 ms (1..10 launches), so a 10 ms kernel is not launched 80 times.
    const int batch = int(std::clamp(2000.0 / std::max(probe, 1.0), 1.0, 10.0));
    FS_RETURN_IF_ERROR(time_op(fn, opt.reps, &k.median_us, &k.min_us, batch));
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g_st));
    k.median_us *= k.scaled, k.min_us *= k.scaled;
    if (k.role.empty()) layer.push_back(fn);
    rep.kernels.push_back(k);
    return {};
  };
  auto every = [](std::string name, double bytes, double flops, bool is_gemm = false) {
    PrefillKernel k;
    k.name = std::move(name), k.bytes = bytes, k.flops = flops, k.gemm = is_gemm;
    return k;
  };
  auto extra = [](std::string name, std::string role, double per_step, int ctx, double bytes, double flops,
                  bool is_gemm = false) {
    PrefillKernel k;
    k.name = std::move(name), k.role = std::move(role), k.per_step = per_step, k.context = ctx;
    k.bytes = bytes, k.flops = flops, k.gemm = is_gemm;
    return k;
  };
  const double f4 = 4.0 * double(m);  // bytes per FP32 column across the chunk
  auto qbytes = [&](int64_t rows, int64_t k) { return double(rows) * k * (1 + 4.0 / 32); };
  auto gemm_bytes = [&](const Fp8Mat& w, int64_t rows) {
    return w.bytes() + qbytes(rows, w.k) + 4.0 * double(rows) * w.n;
  };
  auto gemm_flops = [&](const Fp8Mat& w, int64_t rows) { return 2.0 * double(rows) * w.n * w.k; };

  // ---- FP8 ceiling: the default gemm_fp8 kernel at M = N = K = 8192 ------------------------------
  {
    double med = 0, mn = 0;
    FS_RETURN_IF_ERROR(measure_fp8_ceiling(std::max(opt.reps, 5), &rep.ceiling_tflops, &med, &mn));
    Fp8Mat sq;  // the shape only (its bytes)
    sq.n = 8192, sq.k = 8192;
    PrefillKernel k = extra("ceiling: gemm_fp8 8192x8192x8192 (pre-quantised x, FP32 out)", "info", 0, 0,
                            gemm_bytes(sq, 8192), 2.0 * 8192.0 * 8192.0 * 8192.0, true);
    k.median_us = med, k.min_us = mn;
    rep.kernels.push_back(k);
  }

  // ---- weights ---------------------------------------------------------------------------------
  auto fp8 = [&](Fp8Mat& w, int64_t n, int64_t k, uint64_t seed) {
    return make_fp8(ar, w, n, k, copies_for(double(n * k), l2), seed);
  };
  Fp8Mat wqa_wkv, wq_b, wo_a, wo_b, sh_gu, sh_down, router, idx_wq_b, idx_wproj, comp2, comp1, engram;
  FS_RETURN_IF_ERROR(fp8(wqa_wkv, kQLora + kKv, kHidden, 100));
  FS_RETURN_IF_ERROR(fp8(wq_b, kQ, kQLora, 200));
  FS_RETURN_IF_ERROR(fp8(wo_a, kOGroups * kORank, kOIn, 300));  // group g = rows [g·1024, (g+1)·1024)
  FS_RETURN_IF_ERROR(fp8(wo_b, kHidden, kOGroups * kORank, 400));
  FS_RETURN_IF_ERROR(fp8(sh_gu, 2 * kInter, kHidden, 500));  // gate ‖ up
  FS_RETURN_IF_ERROR(fp8(sh_down, kHidden, kInter, 700));
  FS_RETURN_IF_ERROR(fp8(router, kExperts, kHidden, 750));
  FS_RETURN_IF_ERROR(fp8(idx_wq_b, kIdxHeads * kIdxDim, kQLora, 800));
  FS_RETURN_IF_ERROR(fp8(idx_wproj, kIdxHeads, kHidden, 810));
  FS_RETURN_IF_ERROR(fp8(comp2, 2 * kKv, kHidden, 820));  // ratio 2: wkv ‖ wgate
  FS_RETURN_IF_ERROR(fp8(comp1, kKv, kHidden, 830));      // ratio 1: wkv
  FS_RETURN_IF_ERROR(fp8(engram, kEngramOut, kEngramIn, 850));
  // Routed experts: FP8 e4m3 copies of the FP4 values (exact), gate ‖ up [4608, 5120], down [5120, 2304].
  const int64_t gu_w = 2 * kInter * kHidden, gu_s = weight_scale_bytes(WeightFormat::kFp8, 2 * kInter, kHidden, 32);
  const int64_t dn_w = kHidden * kInter, dn_s = weight_scale_bytes(WeightFormat::kFp8, kHidden, kInter, 32);
  // kExperts matrices of `code_bytes` random codes (fill mode 1: FP8 without NaN codes, 0: any FP4
  // byte) and `scale_bytes` E8M0 scales near 1 (mode 2), seeds `seed` and `seed + 1`.
  auto experts = [&](int64_t code_bytes, int64_t scale_bytes, int code_mode, uint32_t seed, uint8_t** codes,
                     uint8_t** scales) -> Status {
    FS_ASSIGN_OR_RETURN(*codes, ar.alloc<uint8_t>(kExperts * code_bytes));
    FS_ASSIGN_OR_RETURN(*scales, ar.alloc<uint8_t>(kExperts * scale_bytes));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(*codes, kExperts * code_bytes, seed, code_mode, nullptr));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_bytes(*scales, kExperts * scale_bytes, seed + 1, 2, nullptr));
    return {};
  };
  uint8_t *e_gu = nullptr, *e_gus = nullptr, *e_dn = nullptr, *e_dns = nullptr;
  FS_RETURN_IF_ERROR(experts(gu_w, gu_s, 1, 901, &e_gu, &e_gus));
  FS_RETURN_IF_ERROR(experts(dn_w, dn_s, 1, 903, &e_dn, &e_dns));
  // The same experts as the checkpoint stores them (MXFP4: e2m1 pairs + one E8M0 scale per row and
  // 32-block), for the FP4 grouped GEMM (expanded to e4m3 inside the kernel): half the code bytes.
  const int64_t gu_w4 = weight_code_bytes(WeightFormat::kFp4, 2 * kInter, kHidden),
                gu_s4 = weight_scale_bytes(WeightFormat::kFp4, 2 * kInter, kHidden, 32);
  const int64_t dn_w4 = weight_code_bytes(WeightFormat::kFp4, kHidden, kInter),
                dn_s4 = weight_scale_bytes(WeightFormat::kFp4, kHidden, kInter, 32);
  uint8_t *e4_gu = nullptr, *e4_gus = nullptr, *e4_dn = nullptr, *e4_dns = nullptr;
  FS_RETURN_IF_ERROR(experts(gu_w4, gu_s4, 0, 905, &e4_gu, &e4_gus));
  FS_RETURN_IF_ERROR(experts(dn_w4, dn_s4, 0, 907, &e4_dn, &e4_dns));
  std::vector<float*> hc_fn;
  for (int c = 0; c < 2; ++c) {
    FS_ASSIGN_OR_RETURN(float* f, floats(ar, kMix * kHc * kHidden, 1100 + c, 0.01f));
    hc_fn.push_back(f);
  }
  FS_ASSIGN_OR_RETURN(float* hc_base, floats(ar, kMix, 1400, 0.5f));
  FS_ASSIGN_OR_RETURN(float* hc_scale, floats(ar, 3, 1401, 1.0f));
  FS_ASSIGN_OR_RETURN(float* norm_w, floats(ar, kHidden, 1));
  FS_ASSIGN_OR_RETURN(float* inv_freq, floats(ar, 32, 2, 0.5f));
  FS_ASSIGN_OR_RETURN(float* sink, floats(ar, kHeads, 3));
  FS_ASSIGN_OR_RETURN(uint16_t* pool, ar.alloc<uint16_t>(kPoolRows * kHeadDim));
  {
    Arena tmp_ar;  // BF16 bits = top half of a random float: a strided copy keeps it on the device
    FS_ASSIGN_OR_RETURN(float* tmp, floats(tmp_ar, kPoolRows * kHeadDim, 77));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy2D(pool, 2, reinterpret_cast<uint8_t*>(tmp) + 2, 4, 2,
                                         size_t(kPoolRows * kHeadDim), cudaMemcpyDeviceToDevice));
  }

  // ---- activations -----------------------------------------------------------------------------
  FS_ASSIGN_OR_RETURN(float* X, floats(ar, m * kHc * kHidden, 10));
  FS_ASSIGN_OR_RETURN(float* x, floats(ar, m * kHidden, 11));
  FS_ASSIGN_OR_RETURN(float* qa, floats(ar, m * (kQLora + kKv), 12));
  FS_ASSIGN_OR_RETURN(float* kv, floats(ar, m * kKv, 13));
  FS_ASSIGN_OR_RETURN(float* q, floats(ar, m * kQ, 14));
  FS_ASSIGN_OR_RETURN(float* o, floats(ar, m * kQ, 15));
  FS_ASSIGN_OR_RETURN(float* wa, floats(ar, kOGroups * m * kORank, 16));  // [8, M, 1024]
  FS_ASSIGN_OR_RETURN(float* y, floats(ar, m * kHidden, 17));
  FS_ASSIGN_OR_RETURN(float* pre, floats(ar, m * kHc, 18));
  FS_ASSIGN_OR_RETURN(float* post, floats(ar, m * kHc, 19));
  FS_ASSIGN_OR_RETURN(float* comb, floats(ar, m * kHc * kHc, 20));
  FS_ASSIGN_OR_RETURN(float* logits, floats(ar, m * kExperts, 21));
  FS_ASSIGN_OR_RETURN(float* rscratch, floats(ar, m * 2 * kExperts, 22));
  FS_ASSIGN_OR_RETURN(float* rweight, floats(ar, m * kTopK, 23));
  FS_ASSIGN_OR_RETURN(int32_t* rsel, ar.alloc<int32_t>(m * kTopK));
  FS_ASSIGN_OR_RETURN(float* sgu, floats(ar, m * 2 * kInter, 24));
  FS_ASSIGN_OR_RETURN(float* ys, floats(ar, m * kHidden, 25));
  FS_ASSIGN_OR_RETURN(float* rgu, floats(ar, m * kTopK * 2 * kInter, 26));
  FS_ASSIGN_OR_RETURN(float* ry, floats(ar, m * kTopK * kHidden, 27));
  FS_ASSIGN_OR_RETURN(float* pw, floats(ar, m * kTopK, 28));  // pair weights, grouped order
  FS_ASSIGN_OR_RETURN(float* misc, floats(ar, m * kEngramOut, 29));  // outputs nobody reads
  FS_ASSIGN_OR_RETURN(float* ein, floats(ar, m * kEngramIn, 30));
  FS_ASSIGN_OR_RETURN(float* erows, ar.alloc<float>((m * kEngramRows * kEngramRowBytes + 3) / 4));
  Q8 qx, qqa, qo, qo_g, qwa, qwa_t, qf, qh, qperm, qrh, qe;
  FS_RETURN_IF_ERROR(make_q8(ar, qx, m, kHidden));
  FS_RETURN_IF_ERROR(make_q8(ar, qqa, m, kQLora));
  FS_RETURN_IF_ERROR(make_q8(ar, qo, m * kOGroups, kOIn));     // o as [M·8, 4096] (token-major)
  FS_RETURN_IF_ERROR(make_q8(ar, qo_g, m * kOGroups, kOIn));   // group-major [8, M, 4096]
  FS_RETURN_IF_ERROR(make_q8(ar, qwa, m * kOGroups, kORank));  // wo_a out as [8·M, 1024]
  FS_RETURN_IF_ERROR(make_q8(ar, qwa_t, m, kOGroups * kORank));  // token-major [M, 8192]
  FS_RETURN_IF_ERROR(make_q8(ar, qf, m, kHidden));
  FS_RETURN_IF_ERROR(make_q8(ar, qh, m, kInter));
  FS_RETURN_IF_ERROR(make_q8(ar, qperm, m * kTopK, kHidden));
  FS_RETURN_IF_ERROR(make_q8(ar, qrh, m * kTopK, kInter));
  FS_RETURN_IF_ERROR(make_q8(ar, qe, m, kEngramIn));
  std::vector<int64_t> pos(static_cast<size_t>(m));
  for (int64_t t = 0; t < m; ++t) pos[size_t(t)] = 131072 + t;
  FS_ASSIGN_OR_RETURN(int64_t* dpos, ar.alloc<int64_t>(m));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dpos, pos.data(), size_t(m) * 8, cudaMemcpyHostToDevice));
  const int64_t n_keys = kWindow + kTopIdx;
  std::vector<int32_t> idx(size_t(m * n_keys));
  {
    std::mt19937 rng{7};
    for (auto& v : idx) v = int32_t(rng() % uint32_t(kPoolRows));
  }
  FS_ASSIGN_OR_RETURN(int32_t* didx, ar.alloc<int32_t>(m * n_keys));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(didx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
  const int64_t splits = sparse_attn_auto_splits(m, n_keys, rep.sm_count);
  FS_ASSIGN_OR_RETURN(float* attn_ws, ar.alloc<float>(sparse_attn_workspace_floats(m, splits, kHeads, kHeadDim)));
  std::vector<Routing> routes(4);
  for (size_t i = 0; i < routes.size(); ++i) FS_RETURN_IF_ERROR(make_routing(ar, routes[i], m, 1234 + i));
  for (const auto& r : routes) rep.mean_distinct += double(r.distinct) / double(routes.size());
  rep.rows_per_expert = double(m * kTopK) / rep.mean_distinct;
  Streams ss;
  const int n_streams = std::max(opt.expert_streams, 16);
  for (int i = 0; i < n_streams; ++i) {
    cudaStream_t s = nullptr;
    FS_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ss.s.push_back(s);
  }
  for (int i = 0; i < n_streams + 1; ++i) {
    cudaEvent_t e = nullptr;
    FS_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ss.ev.push_back(e);
  }
  PinnedHost host;
  const int64_t host_rows = int64_t(1) << 20;  // 277 MB of pinned Engram rows
  FS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&host.p, size_t(host_rows * kEngramRowBytes)));
  std::memset(host.p, 0x3c, size_t(host_rows * kEngramRowBytes));
  FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());

  // ---- the layer, in order ---------------------------------------------------------------------
  auto norm = [&](float* v, const float* w, int64_t rows, int64_t dim) {
    RmsNormParams p;
    p.x = v, p.w = w, p.y = v, p.rows = rows, p.dim = dim, p.eps = 1e-6f;
    return rms_norm_cuda(p, g_st);
  };
  auto rope = [&](float* v, int64_t n_vec, int64_t vec_dim, bool inverse) {
    RopeParams p;
    p.x = v, p.pos = dpos, p.inv_freq = inv_freq, p.rows = m, p.n_vec = n_vec, p.vec_dim = vec_dim;
    p.rope_dim = 64, p.inverse = inverse;
    return apply_rope_cuda(p, g_st);
  };
  auto hc_pre = [&](int r) -> Status {
    detail::HcMixArgs h;
    h.x = X, h.fn = hc_fn[size_t(r) % hc_fn.size()], h.base = hc_base, h.scale = hc_scale, h.rows = m;
    h.hc = kHc, h.dim = kHidden, h.sinkhorn_iters = 20, h.norm_eps = 1e-6f, h.hc_eps = 1e-6f;
    h.pre = pre, h.post = post, h.comb = comb;
    FS_CUDA_RETURN_IF_ERROR(detail::launch_hc_mixes(h, g_st));
    return cuda_status(detail::launch_hc_collapse(X, pre, x, m, kHc, kHidden, false, g_st), "hc collapse");
  };
  auto hc_post = [&](int) {
    return cuda_status(detail::launch_hc_post(y, X, post, comb, m, kHc, kHidden, false, g_st), "hc post");
  };
  // Row-block permutation of FP8 codes + scales: src rows [R, G, k] → dst [G, R, k] (to_groups) or back.
  auto permute = [&](const Q8& src, const Q8& dst, int64_t rows, int64_t groups, int64_t k, bool to_groups) -> Status {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t ks = k / 32 * 4;  // scale bytes per row piece
      if (to_groups) {
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst.q + g * rows * k, size_t(k), src.q + g * k, size_t(groups * k),
                                                  size_t(k), size_t(rows), cudaMemcpyDeviceToDevice, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(reinterpret_cast<uint8_t*>(dst.s) + g * rows * ks, size_t(ks),
                                                  reinterpret_cast<uint8_t*>(src.s) + g * ks, size_t(groups * ks),
                                                  size_t(ks), size_t(rows), cudaMemcpyDeviceToDevice, g_st));
      } else {
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(dst.q + g * k, size_t(groups * k), src.q + g * rows * k, size_t(k),
                                                  size_t(k), size_t(rows), cudaMemcpyDeviceToDevice, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(reinterpret_cast<uint8_t*>(dst.s) + g * ks, size_t(groups * ks),
                                                  reinterpret_cast<uint8_t*>(src.s) + g * rows * ks, size_t(ks),
                                                  size_t(ks), size_t(rows), cudaMemcpyDeviceToDevice, g_st));
      }
    }
    return {};
  };
  // Per-expert GEMMs of one routing over `ns` streams (ns == 1: g_st itself).
  auto expert_gemms = [&](const Routing& rt, bool up, int ns) -> Status {
    if (ns > 1) {
      FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ss.ev[0], g_st));
      for (int i = 0; i < ns; ++i) FS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(ss.s[size_t(i)], ss.ev[0], 0));
    }
    int next = 0;
    for (int64_t e = 0; e < kExperts; ++e) {
      const int64_t c = rt.count[size_t(e)], s0 = rt.start[size_t(e)];
      if (c == 0) continue;
      cudaStream_t st = ns > 1 ? ss.s[size_t(next++ % ns)] : g_st;
      if (up) {
        FS_RETURN_IF_ERROR(gemm(qperm.q + s0 * kHidden, qperm.s + s0 * (kHidden / 32), e_gu + e * gu_w,
                                e_gus + e * gu_s, rgu + s0 * 2 * kInter, c, 2 * kInter, kHidden, st));
      } else {
        FS_RETURN_IF_ERROR(gemm(qrh.q + s0 * kInter, qrh.s + s0 * (kInter / 32), e_dn + e * dn_w, e_dns + e * dn_s,
                                ry + s0 * kHidden, c, kHidden, kInter, st));
      }
    }
    if (ns > 1) {
      for (int i = 0; i < ns; ++i) {
        FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(ss.ev[size_t(1 + i)], ss.s[size_t(i)]));
        FS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(g_st, ss.ev[size_t(1 + i)], 0));
      }
    }
    return {};
  };
  // All experts' GEMMs as ONE grouped GEMM (gemm_fp8_grouped_cuda: kernel 6 persistent over every
  // expert's tiles, the routing's row_start table read on the device).
  auto expert_grouped = [&](const Routing& rt, bool up) -> Status {
    GemmFp8GroupedParams gp;
    gp.xq = up ? qperm.q : qrh.q, gp.xs = up ? qperm.s : qrh.s;
    gp.w = up ? e_gu : e_dn, gp.w_scale = up ? e_gus : e_dns, gp.row_start = rt.row_start;
    gp.y = up ? rgu : ry, gp.groups = kExperts, gp.rows = m * kTopK;
    gp.n = up ? 2 * kInter : kHidden, gp.k = up ? kHidden : kInter;
    return gemm_fp8_grouped_cuda(gp, g_st);
  };
  // The same grouped GEMM on the FP4 experts (gemm_fp8_grouped_cuda, w_format kFp4).
  auto expert_grouped_fp4 = [&](const Routing& rt, bool up) -> Status {
    GemmFp8GroupedParams gp;
    gp.xq = up ? qperm.q : qrh.q, gp.xs = up ? qperm.s : qrh.s;
    gp.w = up ? e4_gu : e4_dn, gp.w_scale = up ? e4_gus : e4_dns, gp.row_start = rt.row_start;
    gp.y = up ? rgu : ry, gp.groups = kExperts, gp.rows = m * kTopK;
    gp.n = up ? 2 * kInter : kHidden, gp.k = up ? kHidden : kInter, gp.w_format = WeightFormat::kFp4;
    return gemm_fp8_grouped_cuda(gp, g_st);
  };
  auto route_of = [&](int r) -> const Routing& { return routes[size_t(r) % routes.size()]; };
  const int ns = opt.expert_streams;
  // opt.grouped_experts false: the layer times the per-expert GEMMs on `ns` streams instead.
  const bool grouped = opt.grouped_experts;
  {  // the grouped GEMM against the per-expert GEMMs (routing 0), bitwise, first and last 4096 rows
    std::string line;
    for (const bool up : {true, false}) {
      const int64_t P = m * kTopK, n = up ? 2 * kInter : kHidden, cmp = std::min<int64_t>(4096, P);
      float* out = up ? rgu : ry;
      std::vector<float> a(size_t(2 * cmp * n)), b(a.size());
      auto grab = [&](std::vector<float>& h) -> Status {
        FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(h.data(), out, size_t(cmp * n) * 4, cudaMemcpyDeviceToHost));
        return cuda_status(cudaMemcpy(h.data() + cmp * n, out + (P - cmp) * n, size_t(cmp * n) * 4, cudaMemcpyDeviceToHost),
                           "grouped check copy");
      };
      FS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0xff, size_t(P * n) * 4, g_st));
      FS_RETURN_IF_ERROR(expert_gemms(routes[0], up, ns));
      FS_RETURN_IF_ERROR(grab(a));
      FS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0xff, size_t(P * n) * 4, g_st));
      FS_RETURN_IF_ERROR(expert_grouped(routes[0], up));
      FS_RETURN_IF_ERROR(grab(b));
      int64_t diff = 0;
      for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], 4) != 0;
      line += fmt::format("{}grouped {} GEMM vs {} per-expert GEMMs, rows [0, {}) and [{}, {}): {} of {} outputs differ "
                          "(bitwise)", line.empty() ? "" : "; ", up ? "gate+up" : "down", routes[0].distinct, cmp, P - cmp, P,
                          diff, a.size());
    }
    rep.attn_check += (rep.attn_check.empty() ? "" : "; ") + line;
  }
  {  // row-tiled mHC mixes (automatic at this M) against the row kernel, bitwise, all rows
    std::vector<float> h[2];
    for (int t = 0; t < 2; ++t) {
      detail::HcMixArgs hm;
      hm.x = X, hm.fn = hc_fn[0], hm.base = hc_base, hm.scale = hc_scale, hm.rows = m, hm.hc = kHc, hm.dim = kHidden;
      hm.sinkhorn_iters = 20, hm.norm_eps = 1e-6f, hm.hc_eps = 1e-6f, hm.pre = pre, hm.post = post, hm.comb = comb;
      hm.tiled = t;
      FS_CUDA_RETURN_IF_ERROR(detail::launch_hc_mixes(hm, g_st));
      FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g_st));
      h[t].resize(size_t(m * (2 * kHc + kHc * kHc)));
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(h[t].data(), pre, size_t(m * kHc) * 4, cudaMemcpyDeviceToHost));
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(h[t].data() + m * kHc, post, size_t(m * kHc) * 4, cudaMemcpyDeviceToHost));
      FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(h[t].data() + 2 * m * kHc, comb, size_t(m * kHc * kHc) * 4, cudaMemcpyDeviceToHost));
    }
    int64_t diff = 0;
    for (size_t i = 0; i < h[0].size(); ++i) diff += std::memcmp(&h[0][i], &h[1][i], 4) != 0;
    rep.attn_check += fmt::format("; row-tiled mHC mixes vs the row kernel (8 blocks per row), all {} rows: {} of {} "
                                  "pre/post/comb values differ (bitwise)", m, diff, h[0].size());
  }
  const double pairs = double(m * kTopK);
  const double hc_bytes = 4.0 * kMix * kHc * kHidden + f4 * kHc * kHidden + f4 * kHidden;
  const double hc_flops = 2.0 * double(m) * kMix * kHc * kHidden;

  FS_RETURN_IF_ERROR(add(every("mHC pre, attn (FP32 model kernels: row-tiled mixes + Sinkhorn + collapse)", hc_bytes, hc_flops), hc_pre));
  FS_RETURN_IF_ERROR(add(every("attn_norm", f4 * 2 * kHidden, 0), [&](int) { return norm(x, norm_w, m, kHidden); }));
  FS_RETURN_IF_ERROR(add(every("quantise x [M,5120] (shared: wq_a+wkv, compressor, weights_proj)", f4 * kHidden + qbytes(m, kHidden), 0),
                         [&](int) { return quant(x, m, kHidden, qx, g_st); }));
  FS_RETURN_IF_ERROR(add(every("wq_a+wkv GEMM [1792,5120]", gemm_bytes(wqa_wkv, m), gemm_flops(wqa_wkv, m), true),
                         [&](int r) { return gemm(qx, wqa_wkv, r, qa, m); }));
  FS_RETURN_IF_ERROR(add(every("q_norm [M,1280] + kv_norm [M,512] + RoPE kv", f4 * 2 * (kQLora + kKv) + f4 * 2 * 64, 0), [&](int) -> Status {
    FS_RETURN_IF_ERROR(norm(qa, norm_w, m, kQLora));
    FS_RETURN_IF_ERROR(norm(kv, norm_w, m, kKv));
    return rope(kv, 1, kKv, false);
  }));
  FS_RETURN_IF_ERROR(add(every("quantise q_lora [M,1280] (shared: wq_b, indexer wq_b)", f4 * kQLora + qbytes(m, kQLora), 0),
                         [&](int) { return quant(qa, m, kQLora, qqa, g_st); }));
  FS_RETURN_IF_ERROR(add(every("wq_b GEMM [32768,1280]", gemm_bytes(wq_b, m), gemm_flops(wq_b, m), true),
                         [&](int r) { return gemm(qqa, wq_b, r, q, m); }));
  FS_RETURN_IF_ERROR(add(every("q head norm (64x512, unweighted) + RoPE q", f4 * kQ * 2 + f4 * 2 * kHeads * 64, 0), [&](int) -> Status {
    FS_RETURN_IF_ERROR(norm(q, nullptr, m * kHeads, kHeadDim));
    return rope(q, kHeads, kHeadDim, false);
  }));
  const double attn_bytes = double(m) * n_keys * kHeadDim * 2 + f4 * kQ * 2;
  const double attn_flops = 4.0 * double(m) * n_keys * kHeads * kHeadDim;
  auto attn_pool = [&](float* out) {
    SparseAttnPoolParams p;
    p.q = q, p.kv = pool, p.idx = didx, p.sink = sink, p.out = out, p.m = m, p.n_idx = n_keys, p.n_rows = kPoolRows;
    p.n_heads = kHeads, p.head_dim = kHeadDim, p.scale = 1.0f / std::sqrt(float(kHeadDim));
    p.n_splits = splits, p.workspace = attn_ws;
    return sparse_attention_pool_cuda(p, g_st);
  };
  auto attn_prefill = [&](float* out) {
    detail::PrefillAttnArgs p;
    p.q = q, p.kv = pool, p.idx = didx, p.sink = sink, p.out = out, p.m = m, p.n_idx = int(n_keys);
    p.n_rows = int(kPoolRows), p.heads = int(kHeads), p.dim = int(kHeadDim), p.scale = 1.0f / std::sqrt(float(kHeadDim));
    return cuda_status(detail::launch_prefill_attn(p, g_st), "prefill attention");
  };
  // Default: the layer uses the prefill attention kernel (prefill_attn.cu) and the indexer the
  // tensor-core scores (prefill_index.cu), each checked against the existing kernel on its first
  // rows; the existing kernels become info rows. opt.prefill_kernels false: the existing kernels only.
  const bool new_attn = opt.prefill_kernels;
  const std::string pool_name = fmt::format("sparse attention + sinks, decode kernel ({} keys: window {} + top-{}, BF16 rows, {} splits)",
                                            n_keys, kWindow, kTopIdx, splits);
  const std::string new_name = fmt::format("sparse attention + sinks, prefill kernel ({} keys, 32-key cp.async tiles, 1 block/query)", n_keys);
  if (new_attn) {
    FS_ASSIGN_OR_RETURN(float* o2, ar.alloc<float>(m * kQ));
    FS_RETURN_IF_ERROR(attn_pool(o));
    FS_RETURN_IF_ERROR(attn_prefill(o2));
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g_st));
    const int64_t nq = std::min<int64_t>(64, m) * kQ;
    std::vector<float> h1(static_cast<size_t>(nq)), h2(static_cast<size_t>(nq));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(h1.data(), o, size_t(nq) * 4, cudaMemcpyDeviceToHost));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(h2.data(), o2, size_t(nq) * 4, cudaMemcpyDeviceToHost));
    double dmax = 0, amax = 0;
    int64_t bad = 0;
    for (size_t i = 0; i < h1.size(); ++i) {
      if (!std::isfinite(h2[i]) || !std::isfinite(h1[i])) ++bad;
      dmax = std::max(dmax, double(std::fabs(h1[i] - h2[i])));
      amax = std::max(amax, double(std::fabs(h1[i])));
    }
    rep.attn_check += fmt::format("; prefill attention kernel vs sparse_attention_pool_cuda, first {} queries: max |diff| = "
                                  "{:.3g}, max |out| = {:.3g}, non-finite {}", std::min<int64_t>(64, m), dmax, amax, bad);
    FS_RETURN_IF_ERROR(add(every(new_name, attn_bytes, attn_flops), [&](int) { return attn_prefill(o); }));
  } else {
    FS_RETURN_IF_ERROR(add(every(pool_name, attn_bytes, attn_flops), [&](int) { return attn_pool(o); }));
  }
  FS_RETURN_IF_ERROR(add(every("inverse RoPE o", f4 * 2 * kHeads * 64, 0), [&](int) { return rope(o, kHeads, kHeadDim, true); }));
  FS_RETURN_IF_ERROR(add(every("quantise o [M,32768]", f4 * kQ + qbytes(m, kQ), 0),
                         [&](int) { return quant(o, m * kOGroups, kOIn, qo, g_st); }));
  FS_RETURN_IF_ERROR(add(every("o to group-major [8,M,4096] (16 cudaMemcpy2D, layout glue)", 2 * qbytes(m, kQ), 0),
                         [&](int) { return permute(qo, qo_g, m, kOGroups, kOIn, true); }));
  FS_RETURN_IF_ERROR(add(every("wo_a GEMMs 8 x [1024,4096]", wo_a.bytes() + qbytes(m, kQ) + f4 * kOGroups * kORank,
                               2.0 * double(m) * kOGroups * kORank * kOIn, true), [&](int r) -> Status {
    const size_t c = size_t(r) % wo_a.w.size();
    const int64_t sb = weight_scale_bytes(WeightFormat::kFp8, kORank, kOIn, 32);
    for (int64_t g = 0; g < kOGroups; ++g)
      FS_RETURN_IF_ERROR(gemm(qo_g.q + g * m * kOIn, qo_g.s + g * m * (kOIn / 32), wo_a.w[c] + g * kORank * kOIn,
                              wo_a.s[c] + g * sb, wa + g * m * kORank, m, kORank, kOIn, g_st));
    return {};
  }));
  FS_RETURN_IF_ERROR(add(every("quantise wo_a out [8,M,1024]", f4 * kOGroups * kORank + qbytes(m, kOGroups * kORank), 0),
                         [&](int) { return quant(wa, kOGroups * m, kORank, qwa, g_st); }));
  FS_RETURN_IF_ERROR(add(every("wo_a out to token-major [M,8192] (16 cudaMemcpy2D, layout glue)", 2 * qbytes(m, kOGroups * kORank), 0),
                         [&](int) { return permute(qwa, qwa_t, m, kOGroups, kORank, false); }));
  FS_RETURN_IF_ERROR(add(every("wo_b GEMM [5120,8192]", gemm_bytes(wo_b, m), gemm_flops(wo_b, m), true),
                         [&](int r) { return gemm(qwa_t, wo_b, r, y, m); }));
  FS_RETURN_IF_ERROR(add(every("mHC post, attn", f4 * kHc * kHidden * 2 + f4 * kHidden, 0), hc_post));
  FS_RETURN_IF_ERROR(add(every("mHC pre, ffn (FP32 model kernels, row-tiled mixes)", hc_bytes, hc_flops), [&](int r) { return hc_pre(r + 1); }));
  FS_RETURN_IF_ERROR(add(every("ffn_norm", f4 * 2 * kHidden, 0), [&](int) { return norm(x, norm_w, m, kHidden); }));
  FS_RETURN_IF_ERROR(add(every("quantise ffn x [M,5120] (shared: router, shared + routed experts)", f4 * kHidden + qbytes(m, kHidden), 0),
                         [&](int) { return quant(x, m, kHidden, qf, g_st); }));
  FS_RETURN_IF_ERROR(add(every("router GEMM [384,5120] (FP8 stand-in for BF16) + sqrtsoftplus top-6",
                               gemm_bytes(router, m) + f4 * kExperts * 3, gemm_flops(router, m), true), [&](int r) -> Status {
    FS_RETURN_IF_ERROR(gemm(qf, router, r, logits, m));
    detail::RouteArgs ra;
    ra.logits = logits, ra.scratch = rscratch, ra.T = m, ra.E = kExperts, ra.K = kTopK;
    ra.sqrtsoftplus = true, ra.norm_topk = true, ra.route_scale = 1.5f, ra.sel = rsel, ra.weight = rweight;
    return cuda_status(detail::launch_route(ra, g_st), "route");
  }));
  FS_RETURN_IF_ERROR(add(every("shared expert gate+up GEMM [4608,5120]", gemm_bytes(sh_gu, m), gemm_flops(sh_gu, m), true),
                         [&](int r) { return gemm(qf, sh_gu, r, sgu, m); }));
  FS_RETURN_IF_ERROR(add(every("shared SwiGLU + quantise [M,2304]", f4 * 2 * kInter + qbytes(m, kInter), 0), [&](int) {
    return cuda_status(detail::launch_swiglu_quant_fp8(sgu, nullptr, m, kInter, 10.0f, qh.q, qh.s, g_st), "swiglu quant");
  }));
  FS_RETURN_IF_ERROR(add(every("shared expert down GEMM [5120,2304]", gemm_bytes(sh_down, m), gemm_flops(sh_down, m), true),
                         [&](int r) { return gemm(qh, sh_down, r, ys, m); }));
  FS_RETURN_IF_ERROR(add(every("routed: permute quantised rows by expert (gather M*6 rows)", qbytes(m, kHidden) + qbytes(m * kTopK, kHidden), 0),
                         [&](int r) {
    const Routing& rt = route_of(r);
    return cuda_status(detail::launch_gather_fp8_rows(qf.q, qf.s, rt.pair_row, m * kTopK, kHidden, qperm.q, qperm.s, g_st),
                       "gather");
  }));
  const double e_gu_bytes = rep.mean_distinct * (double(gu_w) + double(gu_s));
  const double e_dn_bytes = rep.mean_distinct * (double(dn_w) + double(dn_s));
  const double r_gu_flops = 2.0 * pairs * 2 * kInter * kHidden, r_dn_flops = 2.0 * pairs * kHidden * kInter;
  const std::string gu_per = fmt::format("routed gate+up: {:.0f} per-expert GEMMs [4608,5120] (FP8 copies of FP4), ~{:.0f} rows each, {} streams",
                                         rep.mean_distinct, rep.rows_per_expert, ns);
  const std::string gu_grp = fmt::format("routed gate+up: ONE grouped GEMM over {} experts [4608,5120] (FP8 copies of FP4), ~{:.0f} rows each",
                                         kExperts, rep.rows_per_expert);
  const std::string dn_per = fmt::format("routed down: {:.0f} per-expert GEMMs [5120,2304], {} streams", rep.mean_distinct, ns);
  const std::string dn_grp = fmt::format("routed down: ONE grouped GEMM over {} experts [5120,2304]", kExperts);
  FS_RETURN_IF_ERROR(add(every(grouped ? gu_grp : gu_per, e_gu_bytes + qbytes(m * kTopK, kHidden) + 4.0 * pairs * 2 * kInter, r_gu_flops, true),
                         [&](int r) { return grouped ? expert_grouped(route_of(r), true) : expert_gemms(route_of(r), true, ns); }));
  FS_RETURN_IF_ERROR(add(every("routed SwiGLU x pair weight + quantise [M*6,2304]", 4.0 * pairs * 2 * kInter + qbytes(m * kTopK, kInter), 0),
                         [&](int) {
    return cuda_status(detail::launch_swiglu_quant_fp8(rgu, pw, m * kTopK, kInter, 10.0f, qrh.q, qrh.s, g_st), "swiglu quant");
  }));
  FS_RETURN_IF_ERROR(add(every(grouped ? dn_grp : dn_per, e_dn_bytes + qbytes(m * kTopK, kInter) + 4.0 * pairs * kHidden, r_dn_flops, true),
                         [&](int r) { return grouped ? expert_grouped(route_of(r), false) : expert_gemms(route_of(r), false, ns); }));
  FS_RETURN_IF_ERROR(add(every("routed combine (un-permute, sum 6 slots + shared)", 4.0 * pairs * kHidden + 2 * f4 * kHidden, 0),
                         [&](int r) {
    return cuda_status(detail::launch_combine_rows(ry, route_of(r).inv, ys, m, kTopK, kHidden, y, g_st), "combine");
  }));
  FS_RETURN_IF_ERROR(add(every("mHC post, ffn", f4 * kHc * kHidden * 2 + f4 * kHidden, 0), hc_post));

  // The layer's kernels back to back (gaps and cache effects between neighbours count).
  FS_RETURN_IF_ERROR(time_op([&](int r) -> Status {
    for (auto& fn : layer) FS_RETURN_IF_ERROR(fn(r));
    return {};
  }, opt.reps, &rep.layer_seq_us, &rep.layer_seq_min_us, 1));

  // mHC pre with the row kernel (no row tiles) at 1 and 8 (its default) blocks per row, and row
  // tiles staging 1 / 4 slices per ring stage (the layer: 2); same bits for all.
  for (const auto& [cl, tl] : {std::pair{1, 0}, std::pair{8, 0}, std::pair{0, 1}, std::pair{0, 4}}) {
    const std::string hname = tl == 0 ? fmt::format("mHC pre, row kernel (no row tiles) with {} block{} per row", cl, cl == 1 ? "" : "s")
                                      : fmt::format("mHC pre, row tiles with {} slice{} per ring stage (layer: 2)", tl, tl == 1 ? "" : "s");
    FS_RETURN_IF_ERROR(add(extra(hname, "info", 0, 0, hc_bytes, hc_flops), [&, cl = cl, tl = tl](int r) -> Status {
      detail::HcMixArgs h;
      h.x = X, h.fn = hc_fn[size_t(r) % hc_fn.size()], h.base = hc_base, h.scale = hc_scale, h.rows = m;
      h.hc = kHc, h.dim = kHidden, h.sinkhorn_iters = 20, h.norm_eps = 1e-6f, h.hc_eps = 1e-6f, h.cluster = cl, h.tiled = tl;
      h.kernel = tl == 0 ? 1 : 0;  // the row kernel itself (automatic would take the decode chunk-split kernel)
      h.pre = pre, h.post = post, h.comb = comb;
      FS_CUDA_RETURN_IF_ERROR(detail::launch_hc_mixes(h, g_st));
      return cuda_status(detail::launch_hc_collapse(X, pre, x, m, kHc, kHidden, false, g_st), "hc collapse");
    }));
  }
  // The parts of mHC pre: the mixes alone (row tiles, 2 slices: dots + per-row sum of squares,
  // scaling and Sinkhorn) and the collapse alone.
  FS_RETURN_IF_ERROR(add(extra("mHC pre part: mixes only (row tiles + per-row Sinkhorn)", "info", 0, 0, 4.0 * kMix * kHc * kHidden + f4 * kHc * kHidden, hc_flops),
                         [&](int r) -> Status {
    detail::HcMixArgs h;
    h.x = X, h.fn = hc_fn[size_t(r) % hc_fn.size()], h.base = hc_base, h.scale = hc_scale, h.rows = m;
    h.hc = kHc, h.dim = kHidden, h.sinkhorn_iters = 20, h.norm_eps = 1e-6f, h.hc_eps = 1e-6f, h.tiled = 2;
    h.pre = pre, h.post = post, h.comb = comb;
    return cuda_status(detail::launch_hc_mixes(h, g_st), "hc mixes");
  }));
  FS_RETURN_IF_ERROR(add(extra("mHC pre part: collapse only", "info", 0, 0, f4 * kHc * kHidden + f4 * kHidden, 0), [&](int) {
    return cuda_status(detail::launch_hc_collapse(X, pre, x, m, kHc, kHidden, false, g_st), "hc collapse");
  }));
  // Expert GEMMs on other stream counts (information: how much the streams buy); with the grouped
  // GEMM in the layer, the per-expert GEMMs on `ns` streams too (gate+up and down).
  if (grouped)
    FS_RETURN_IF_ERROR(add(extra(dn_per, "info", 0, 0, e_dn_bytes + qbytes(m * kTopK, kInter) + 4.0 * pairs * kHidden, r_dn_flops, true),
                           [&](int r) { return expert_gemms(route_of(r), false, ns); }));
  else
    FS_RETURN_IF_ERROR(add(extra(dn_grp, "info", 0, 0, e_dn_bytes + qbytes(m * kTopK, kInter) + 4.0 * pairs * kHidden, r_dn_flops, true),
                           [&](int r) { return expert_grouped(route_of(r), false); }));
  // The grouped GEMMs on the FP4 experts as stored (information: the layer keeps the FP8 copies).
  const double e4_gu_bytes = rep.mean_distinct * (double(gu_w4) + double(gu_s4));
  const double e4_dn_bytes = rep.mean_distinct * (double(dn_w4) + double(dn_s4));
  FS_RETURN_IF_ERROR(add(extra(fmt::format("routed gate+up: ONE grouped GEMM over {} experts [4608,5120], FP4 experts "
                                           "(e2m1 expanded in the kernel)", kExperts), "info", 0, 0,
                               e4_gu_bytes + qbytes(m * kTopK, kHidden) + 4.0 * pairs * 2 * kInter, r_gu_flops, true),
                         [&](int r) { return expert_grouped_fp4(route_of(r), true); }));
  FS_RETURN_IF_ERROR(add(extra(fmt::format("routed down: ONE grouped GEMM over {} experts [5120,2304], FP4 experts "
                                           "(e2m1 expanded in the kernel)", kExperts), "info", 0, 0,
                               e4_dn_bytes + qbytes(m * kTopK, kInter) + 4.0 * pairs * kHidden, r_dn_flops, true),
                         [&](int r) { return expert_grouped_fp4(route_of(r), false); }));
  if (!grouped) {  // the FP8 grouped gate+up too, for the side-by-side
    FS_RETURN_IF_ERROR(add(extra(gu_grp, "info", 0, 0, e_gu_bytes + qbytes(m * kTopK, kHidden) + 4.0 * pairs * 2 * kInter,
                                 r_gu_flops, true),
                           [&](int r) { return expert_grouped(route_of(r), true); }));
  }
  for (int alt : {1, 4, 8, 16}) {
    if (alt == ns && !grouped) continue;
    FS_RETURN_IF_ERROR(add(extra(fmt::format("routed gate+up on {} stream{}", alt, alt == 1 ? "" : "s"), "info", 0, 0,
                                 e_gu_bytes + qbytes(m * kTopK, kHidden) + 4.0 * pairs * 2 * kInter, r_gu_flops, true),
                           [&](int r) { return expert_gemms(route_of(r), true, alt); }));
  }
  FS_RETURN_IF_ERROR(add(extra("routed gate+up as ONE dense GEMM [M*6 rows] (no per-expert split; bound)", "info", 0, 0,
                               double(gu_w) + qbytes(m * kTopK, kHidden) + 4.0 * pairs * 2 * kInter, r_gu_flops, true),
                         [&](int) { return gemm(qperm.q, qperm.s, e_gu, e_gus, rgu, m * kTopK, 2 * kInter, kHidden, g_st); }));

  if (new_attn)
    FS_RETURN_IF_ERROR(add(extra(pool_name, "info", 0, 0, attn_bytes, attn_flops), [&](int) { return attn_pool(o); }));

  // The model's attention of this chunk at position 131,072 over the compact caches (V4.1 ring
  // rows e4m3 + E8M0, compressed rows FP4 + E4M3, top-512 lists, the chunk's FP32 kv rows) as
  // GpuModel::attention runs it: --prefill-attention auto (BF16 pool decode + key lists + the
  // prefill kernel) and staged (the exact-order kernel). Info rows: the layer above times the
  // kernel alone on a ready BF16 pool.
  {
    const CacheRowFormat rf{RowCodec::kFp8E8m0, int32_t(kHeadDim), int32_t(kHeadDim), 32};
    const CacheRowFormat cf{RowCodec::kFp4E4m3, int32_t(kHeadDim), int32_t(kHeadDim), 16};
    const int64_t start = 131072, n_ckv = (start + m) / 4;
    FS_ASSIGN_OR_RETURN(uint8_t* ring, ar.alloc<uint8_t>(kWindow * rf.row_bytes()));
    FS_ASSIGN_OR_RETURN(uint8_t* ckv, ar.alloc<uint8_t>(n_ckv * cf.row_bytes()));
    // 0x22 bytes: finite codes and scales everywhere (values do not matter for the timing).
    FS_CUDA_RETURN_IF_ERROR(cudaMemset(ring, 0x22, size_t(kWindow * rf.row_bytes())));
    FS_CUDA_RETURN_IF_ERROR(cudaMemset(ckv, 0x22, size_t(n_ckv * cf.row_bytes())));
    FS_ASSIGN_OR_RETURN(float* kvc, floats(ar, m * kHeadDim, 31));
    std::vector<int32_t> tk(static_cast<size_t>(m * kTopIdx));
    const std::vector<int32_t> tn(static_cast<size_t>(m), static_cast<int32_t>(kTopIdx));
    for (int64_t t = 0; t < m; ++t) {  // ascending, distinct, visible
      const int64_t step = (start + t + 1) / 4 / kTopIdx;
      for (int64_t j = 0; j < kTopIdx; ++j) tk[size_t(t * kTopIdx + j)] = int32_t(j * step + t % step);
    }
    FS_ASSIGN_OR_RETURN(int32_t* dtk, ar.alloc<int32_t>(m * kTopIdx));
    FS_ASSIGN_OR_RETURN(int32_t* dtn, ar.alloc<int32_t>(m));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dtk, tk.data(), tk.size() * 4, cudaMemcpyHostToDevice));
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dtn, tn.data(), tn.size() * 4, cudaMemcpyHostToDevice));
    detail::ModelAttnArgs a;
    a.q = q, a.kv_chunk = kvc, a.ring = ring, a.ckv = ckv, a.ring_fmt = rf, a.ckv_fmt = cf, a.topk = dtk, a.topk_n = dtn;
    a.topk_stride = kTopIdx, a.ratio = 4, a.sink = sink, a.out = o, a.T = m, a.H = kHeads, a.Dh = kHeadDim;
    a.window = kWindow, a.ring_size = kWindow, a.start = start, a.max_keys = n_keys;
    a.scale = 1.0f / std::sqrt(float(kHeadDim)), a.bf16 = true;
    detail::ModelAttnSeq sq;
    sq.ring = ring, sq.ckv = ckv, sq.start = start, sq.T = m, sq.ring_size = kWindow;
    int64_t pool_rows = 0, n_idx = 0;
    const size_t wsb = detail::model_prefill_attn_workspace(a, &sq, 1, &pool_rows, &n_idx);
    if (wsb == 0) return internal_error("model prefill attention: no workspace layout");
    FS_ASSIGN_OR_RETURN(uint8_t* ws, ar.alloc<uint8_t>(int64_t(wsb)));
    const double decode_bytes = double(kWindow) * rf.row_bytes() + double(n_ckv) * cf.row_bytes() + f4 * kHeadDim +
                                2.0 * double(pool_rows) * kHeadDim + 4.0 * double(m) * n_idx;
    FS_RETURN_IF_ERROR(add(extra(fmt::format("model attention, --prefill-attention auto (BF16 pool of {} rows + key "
                                             "lists + prefill kernel; compact caches at 131,072)", pool_rows),
                                 "info", 0, 0, attn_bytes + decode_bytes, attn_flops),
                           [&](int) {
                             return cuda_status(detail::launch_model_prefill_attention(a, &sq, 1, ws, wsb, g_st),
                                                "model prefill attention");
                           }));
    FS_RETURN_IF_ERROR(add(extra("model attention, --prefill-attention staged (exact-order kernel, same caches)", "info",
                                 0, 0, attn_bytes, attn_flops),
                           [&](int) {
                             return cuda_status(detail::launch_model_attention(a, g_st), "model attention (staged)");
                           }));
  }

  // ---- role extras -----------------------------------------------------------------------------
  FS_RETURN_IF_ERROR(add(extra("compressor wkv+wgate GEMM [1024,5120] (FP8 stand-in for FP32)", "ratio-2 kv source", kRatio2Sources, 0,
                               gemm_bytes(comp2, m), gemm_flops(comp2, m), true), [&](int r) { return gemm(qx, comp2, r, misc, m); }));
  FS_RETURN_IF_ERROR(add(extra("compressor wkv GEMM [512,5120] (FP8 stand-in for BF16)", "ratio-1 kv source", kRatio1Sources, 0,
                               gemm_bytes(comp1, m), gemm_flops(comp1, m), true), [&](int r) { return gemm(qx, comp1, r, misc, m); }));
  FS_RETURN_IF_ERROR(add(extra("indexer wq_b GEMM [4096,1280]", "index source", kIndexSources, 0, gemm_bytes(idx_wq_b, m),
                               gemm_flops(idx_wq_b, m), true), [&](int r) { return gemm(qqa, idx_wq_b, r, misc, m); }));
  FS_RETURN_IF_ERROR(add(extra("indexer weights_proj GEMM [32,5120] (FP8 stand-in for BF16)", "index source", kIndexSources, 0,
                               gemm_bytes(idx_wproj, m), gemm_flops(idx_wproj, m), true),
                         [&](int r) { return gemm(qx, idx_wproj, r, misc, m); }));
  FS_ASSIGN_OR_RETURN(float* iq, floats(ar, rows * kIdxHeads * kIdxDim, 40));
  FS_ASSIGN_OR_RETURN(float* iw, floats(ar, rows * kIdxHeads, 41));
  for (int ctx : opt.contexts) {
    for (int ratio : {2, 1}) {
      Arena ia;
      const int64_t n = (int64_t(ctx) + m) / ratio;  // keys visible to the chunk's last query
      FS_ASSIGN_OR_RETURN(float* keys, floats(ia, n * kIdxDim, 60 + ctx + ratio));
      FS_ASSIGN_OR_RETURN(float* scores, ia.alloc<float>(rows * n));
      FS_ASSIGN_OR_RETURN(float* blocks, ia.alloc<float>(rows * n));
      FS_ASSIGN_OR_RETURN(uint8_t* cand, ia.alloc<uint8_t>(rows * n));
      FS_ASSIGN_OR_RETURN(uint8_t* taken, ia.alloc<uint8_t>(rows * n));
      FS_ASSIGN_OR_RETURN(int32_t* out, ia.alloc<int32_t>(rows * kTopIdx));
      FS_ASSIGN_OR_RETURN(int32_t* out_n, ia.alloc<int32_t>(rows));
      FS_CUDA_RETURN_IF_ERROR(cudaMemset(cand, 1, size_t(rows * n)));
      FS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
      // The timed rows sit in the middle of the chunk: their mean visible keys = the chunk's.
      const int64_t start = ctx + m / 2 - rows / 2;
      const double vis = double(ctx + m / 2) / ratio;
      const double scale = double(m) / double(rows);
      const std::string role = ratio == 2 ? "ratio-2 index source" : "ratio-1 full scan";
      const double per_step = ratio == 2 ? kRatio2Sources : kRatio1Sources + kReindex;
      detail::IndexScoreArgs sa;
      sa.q = iq, sa.w = iw, sa.keys = keys, sa.scores = scores, sa.T = rows, sa.nI = kIdxHeads, sa.dI = kIdxDim;
      sa.start = start, sa.ratio = ratio, sa.stride = n;
      PrefillKernel ks = extra(fmt::format("indexer scores, ratio {} ({} keys at the chunk end; FP32 kernel, {} rows x {:.0f})",
                                           ratio, n, rows, scale),
                               role, per_step, ctx, 4.0 * n * kIdxDim + (4.0 * rows * n + 4.0 * rows * kIdxHeads * (kIdxDim + 1)) * scale,
                               2.0 * double(m) * vis * kIdxHeads * (kIdxDim + 1));
      ks.scaled = scale;
      if (new_attn) {
        detail::IndexScoreMmaArgs ma;
        ma.q = iq, ma.w = iw, ma.keys = keys, ma.scores = scores, ma.T = rows, ma.start = start, ma.ratio = ratio;
        ma.stride = n;
        const int64_t cr = std::min<int64_t>(16, rows);
        std::vector<float> h1(static_cast<size_t>(cr * n)), h2(static_cast<size_t>(cr * n));
        FS_CUDA_RETURN_IF_ERROR(detail::launch_index_scores(sa, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h1.data(), scores, h1.size() * 4, cudaMemcpyDeviceToHost, g_st));
        FS_CUDA_RETURN_IF_ERROR(detail::launch_index_scores_mma(ma, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h2.data(), scores, h2.size() * 4, cudaMemcpyDeviceToHost, g_st));
        FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g_st));
        // Compared on the keys each row can reach (the FP32 kernel leaves the others unwritten).
        double dmax = 0, amax = 0;
        int64_t bad = 0, past = 0;
        for (int64_t i = 0; i < cr; ++i) {
          const int64_t vis = std::min<int64_t>(n, (start + i + 1) / ratio);
          for (int64_t k = 0; k < n; ++k) {
            const float a1 = h1[size_t(i * n + k)], a2 = h2[size_t(i * n + k)];
            if (k >= vis) {
              past += a2 != -INFINITY;
              continue;
            }
            if (!std::isfinite(a1) || !std::isfinite(a2)) {
              ++bad;
              continue;
            }
            dmax = std::max(dmax, double(std::fabs(a1 - a2)));
            amax = std::max(amax, double(std::fabs(a1)));
          }
        }
        rep.attn_check += fmt::format("{}tensor-core indexer scores vs the FP32 kernel (ctx {}, ratio {}, first {} rows x {} keys): "
                                      "max |diff| = {:.3g}, max |score| = {:.3g} over reachable keys; non-finite there {}, "
                                      "unreachable keys not -inf {}",
                                      rep.attn_check.empty() ? "" : "; ", ctx, ratio, cr, n, dmax, amax, bad, past);
        PrefillKernel km = ks;
        km.name = fmt::format("indexer scores, ratio {} ({} keys at the chunk end; BF16 tensor cores, {} rows x {:.0f})", ratio, n,
                              rows, scale);
        FS_RETURN_IF_ERROR(add(km, [&, ma](int) { return cuda_status(detail::launch_index_scores_mma(ma, g_st), "index scores mma"); }));
        ks.role = "info";
      }
      FS_RETURN_IF_ERROR(add(ks, [&](int) { return cuda_status(detail::launch_index_scores(sa, g_st), "index scores"); }));
      if (ctx == opt.contexts.front() && ratio == 1) {
        for (int kern : {1, 2, 3}) {  // forced scores kernel (same bits): 1 thread/key, tiled 1 or 2 keys/thread
          PrefillKernel kv = ks;
          kv.name = fmt::format("indexer scores kernel {} forced ({} keys)", kern, n), kv.role = "info";
          FS_RETURN_IF_ERROR(add(kv, [&, kern](int) {
            detail::IndexScoreArgs sk = sa;
            sk.kernel = kern;
            return cuda_status(detail::launch_index_scores(sk, g_st), "index scores");
          }));
        }
      }
      detail::IndexTopkArgs ta;
      ta.scores = scores, ta.cand = cand, ta.block_scratch = blocks, ta.taken = taken, ta.out = out, ta.out_n = out_n;
      ta.T = rows, ta.start = start, ta.ratio = ratio, ta.stride = n, ta.k = kTopIdx, ta.cand_block = 8;
      ta.cand_top = 2048, ta.mode = 0;
      PrefillKernel kt = extra(fmt::format("indexer top-512 of {} keys ({} rows x {:.0f})", n, rows, scale), role, per_step, ctx,
                               (4.0 * rows * n + 4.0 * rows * kTopIdx) * scale, 0);
      kt.scaled = scale;
      FS_RETURN_IF_ERROR(add(kt, [&](int) { return cuda_status(detail::launch_index_topk(ta, g_st), "index topk"); }));
    }
  }
  FS_RETURN_IF_ERROR(add(extra("Engram: quantise gathered rows [M,6144]", "Engram", kEngram, 0, f4 * kEngramIn + qbytes(m, kEngramIn), 0),
                         [&](int) { return quant(ein, m, kEngramIn, qe, g_st); }));
  FS_RETURN_IF_ERROR(add(extra("Engram wkv GEMM [25600,6144]", "Engram", kEngram, 0, gemm_bytes(engram, m), gemm_flops(engram, m), true),
                         [&](int r) { return gemm(qe, engram, r, misc, m); }));
  const int64_t ebytes = m * kEngramRows * kEngramRowBytes;
  FS_RETURN_IF_ERROR(add(extra(fmt::format("Engram rows H2D (pinned, {} x 24 x 264 B; overlappable)", m), "Engram", kEngram, 0,
                               double(ebytes), 0), [&](int r) {
    const int64_t row = (int64_t(r) * 7919 * kEngramRows) % (host_rows - m * kEngramRows);
    return cuda_status(cudaMemcpyAsync(erows, static_cast<uint8_t*>(host.p) + row * kEngramRowBytes, size_t(ebytes),
                                       cudaMemcpyHostToDevice, g_st), "engram copy");
  }));
  FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(g_st));
  return rep;
}

std::string format_prefill_bench(const PrefillBenchReport& r, const PrefillBenchOptions& opt) {
  const double ceil = r.ceiling_tflops, spec_ceil = 1449.0;
  std::string s = fmt::format(
      "device: {} ({} SMs); copy bandwidth (D2D memcpy, read+write): {:.0f} GB/s; FP8 ceiling: gemm_fp8 "
      "8192x8192x8192 in this run = {:.0f} TFLOP/s (\"% ceil\"); perf-budget's torch per-tensor FP8 = {:.0f} "
      "TFLOP/s (\"% torch\", not measured here)\n\n",
      r.device, r.sm_count, r.copy_gbps, ceil, spec_ceil);
  s += fmt::format("Prefill chunk M = {} tokens; routed experts: {:.1f} distinct of 384 per layer, ~{:.0f} rows each.\n\n",
                   opt.tokens, r.mean_distinct, r.rows_per_expert);
  if (!r.attn_check.empty()) s += r.attn_check + "\n\n";
  s += "| kernel | role (layers/step) | context | median us | min us | MB moved | % of copy BW | TFLOP/s | % ceil | % torch |\n"
       "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& k : r.kernels) {
    const double gbps = k.bytes / (k.median_us * 1e-6) / 1e9;
    const double tf = k.flops / (k.median_us * 1e-6) / 1e12;
    const std::string role = k.role.empty() ? "every" : k.role == "info" ? "info (not counted)"
                                                                          : fmt::format("{} ({:.0f})", k.role, k.per_step);
    s += fmt::format("| {} | {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.0f}% | {} | {} | {} |\n", k.name, role,
                     k.context ? std::to_string(k.context) : "-", k.median_us, k.min_us, k.bytes / 1e6,
                     100.0 * gbps / r.copy_gbps, k.flops > 0 ? fmt::format("{:.0f}", tf) : "-",
                     k.flops > 0 ? fmt::format("{:.0f}%", 100.0 * tf / ceil) : "-",
                     k.flops > 0 ? fmt::format("{:.0f}%", 100.0 * tf / spec_ceil) : "-");
  }
  // One layer (every-layer kernels).
  double us = 0, flops = 0, bytes = 0, gemm_us = 0, gemm_flops = 0;
  for (const auto& k : r.kernels) {
    if (!k.role.empty()) continue;
    us += k.median_us, flops += k.flops, bytes += k.bytes;
    if (k.gemm) gemm_us += k.median_us, gemm_flops += k.flops;
  }
  const double layer_us = r.layer_seq_us;
  s += fmt::format(
      "\n### One layer (every-layer kernels, 8k chunk)\n\n"
      "| | us | TFLOP | TFLOP/s | % ceil | % torch | MB moved | % of copy BW |\n|---|---|---|---|---|---|---|---|\n"
      "| sum of kernel medians | {:.0f} | {:.2f} | {:.0f} | {:.0f}% | {:.0f}% | {:.0f} | {:.0f}% |\n"
      "| the same kernels back to back (one timed sequence) | {:.0f} | {:.2f} | {:.0f} | {:.0f}% | {:.0f}% | {:.0f} | {:.0f}% |\n"
      "| of which FP8 GEMMs (sum) | {:.0f} | {:.2f} | {:.0f} | {:.0f}% | {:.0f}% | | |\n"
      "| everything else (sum) | {:.0f} | {:.2f} | | | | | |\n",
      us, flops / 1e12, flops / (us * 1e-6) / 1e12, 100.0 * flops / (us * 1e-6) / 1e12 / ceil,
      100.0 * flops / (us * 1e-6) / 1e12 / spec_ceil, bytes / 1e6, 100.0 * bytes / (us * 1e-6) / 1e9 / r.copy_gbps,
      layer_us, flops / 1e12, flops / (layer_us * 1e-6) / 1e12, 100.0 * flops / (layer_us * 1e-6) / 1e12 / ceil,
      100.0 * flops / (layer_us * 1e-6) / 1e12 / spec_ceil, bytes / 1e6,
      100.0 * bytes / (layer_us * 1e-6) / 1e9 / r.copy_gbps, gemm_us, gemm_flops / 1e12,
      gemm_flops / (gemm_us * 1e-6) / 1e12, 100.0 * gemm_flops / (gemm_us * 1e-6) / 1e12 / ceil,
      100.0 * gemm_flops / (gemm_us * 1e-6) / 1e12 / spec_ceil, us - gemm_us, (flops - gemm_flops) / 1e12);
  // Where the time goes: the largest every-layer kernels.
  std::vector<const PrefillKernel*> top;
  for (const auto& k : r.kernels)
    if (k.role.empty()) top.push_back(&k);
  std::sort(top.begin(), top.end(), [](auto* a, auto* b) { return a->median_us > b->median_us; });
  s += "\nLargest shares of the layer (sum of medians): ";
  for (size_t i = 0; i < top.size() && i < 6; ++i)
    s += fmt::format("{}{} {:.0f}%", i ? "; " : "", top[i]->name, 100.0 * top[i]->median_us / us);
  s += ".\n";
  // Per step (40 layers) per context, and the prompt projection.
  s += fmt::format(
      "\n### Per {}-token chunk, {} layers (layer = back-to-back time; role extras x their layers per step)\n\n"
      "| context before the chunk | step ms | of which extras ms | TFLOP | TFLOP/s | % ceil | % torch | tokens/s (1 GPU) |\n"
      "|---|---|---|---|---|---|---|---|\n", opt.tokens, opt.layers);
  auto step = [&](int ctx, double* ext_us, double* fl) {
    double u = layer_us * opt.layers, f = flops * opt.layers, e = 0;
    for (const auto& k : r.kernels) {
      if (k.role.empty() || k.role == "info") continue;
      if (k.context != 0 && k.context != ctx) continue;
      e += k.median_us * k.per_step, f += k.flops * k.per_step;
    }
    *ext_us = e, *fl = f;
    return u + e;
  };
  std::vector<std::pair<double, double>> pts;  // (context, step us)
  for (int ctx : opt.contexts) {
    double e = 0, f = 0;
    const double u = step(ctx, &e, &f);
    pts.push_back({double(ctx), u});
    s += fmt::format("| {} | {:.1f} | {:.1f} | {:.1f} | {:.0f} | {:.0f}% | {:.0f}% | {:.0f} |\n", ctx, u / 1000.0, e / 1000.0,
                     f / 1e12, f / (u * 1e-6) / 1e12, 100.0 * f / (u * 1e-6) / 1e12 / ceil,
                     100.0 * f / (u * 1e-6) / 1e12 / spec_ceil, opt.tokens / (u * 1e-6));
  }
  if (!pts.empty()) {
    // Chunks of a prompt see contexts 0, M, 2M, ...: the context-dependent part is linear in the
    // keys, so the step time is fitted as a + b·context through the measured contexts.
    double a = pts[0].second, b = 0;
    if (pts.size() >= 2 && pts.back().first != pts.front().first) {
      b = (pts.back().second - pts.front().second) / (pts.back().first - pts.front().first);
      a = pts.front().second - b * pts.front().first;
    }
    const double chunks = std::ceil(opt.prompt_tokens / opt.tokens);
    const double mean_ctx = (chunks - 1) / 2.0 * opt.tokens;
    const double total_s = chunks * (a + b * mean_ctx) * 1e-6;
    const double layers_s = chunks * layer_us * opt.layers * 1e-6;
    s += fmt::format(
        "\nProjection for a {:.0f}-token prompt ({:.0f} chunks, mean context before a chunk {:.0f}; step time fitted "
        "linearly in the context through the measured contexts: {:.1f} ms + {:.3f} ms per 1k context):\n"
        "1 GPU: **{:.1f} s** ({:.0f} tokens/s). {} GPUs (projection: 1-GPU time / {}, no collectives, no EP dispatch, no "
        "pipeline bubbles): **{:.2f} s** vs the mission anchor {:.1f} s ({:.1f}x).\n",
        opt.prompt_tokens, chunks, mean_ctx, a / 1000.0, b * 1.024, total_s, opt.prompt_tokens / total_s, opt.gpus, opt.gpus,
        total_s / opt.gpus, opt.anchor_s, total_s / opt.gpus / opt.anchor_s);
    s += fmt::format(
        "Of the 1-GPU time: {} x the every-layer kernels {:.1f} s ({:.2f} s on {} GPUs), role extras (compressor, "
        "indexer query / scores / top-k, Engram) {:.1f} s. No CED layer skipping (perf-budget §4.2) and no "
        "overlap between layers assumed.\n",
        opt.layers, layers_s, layers_s / opt.gpus, opt.gpus, total_s - layers_s);
  }
  return s;
}

}  // namespace flashseek::ops::cuda
