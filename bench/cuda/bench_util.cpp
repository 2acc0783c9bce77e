// Shared GPU benchmark helpers (bench_util.h).
#include "bench/cuda/bench_util.h"

#include <cmath>
#include <numeric>
#include <random>

#include "ops/cuda/gemv/gemv.h"
#include "ops/cuda/model/small_kernels.h"

namespace flashseek::ops::cuda::bench {

thread_local cudaStream_t g_st = nullptr;

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

Status make_f32(Arena& ar, F32Mat& m, int64_t n, int64_t k, int copies, uint64_t seed, float scale) {
  m.n = n, m.k = k;
  for (int c = 0; c < copies; ++c) {
    FS_ASSIGN_OR_RETURN(float* w, ar.alloc<float>(n * k));
    FS_CUDA_RETURN_IF_ERROR(detail::launch_fill_floats(w, n * k, seed + uint64_t(c) * 131, scale, nullptr));
    m.w.push_back(w);
  }
  return {};
}

int copies_for(double bytes, double l2_bytes) {
  return int(std::clamp(std::ceil(3 * l2_bytes / bytes), 2.0, 64.0));
}

Status time_op(const std::function<Status(int)>& fn, int reps, double* med, double* mn, int batch) {
  Timer t;
  FS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&t.a));
  FS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&t.b));
  for (int i = 0; i < 3; ++i) FS_RETURN_IF_ERROR(fn(i));
  std::vector<double> us;
  int call = 3;
  for (int i = 0; i < reps; ++i) {
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.a, g_st));
    for (int b = 0; b < batch; ++b) FS_RETURN_IF_ERROR(fn(call++));
    FS_CUDA_RETURN_IF_ERROR(cudaEventRecord(t.b, g_st));
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
      [&](int) { return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_st), "memcpy"); },
      10, &med, &mn, 1));
  *gbps = 2.0 * double(bytes) / (med * 1e-6) / 1e9;
  return {};
}

Status make_routings(Arena& ar, Routings& r, int m, int count, uint64_t seed, int64_t experts, int64_t topk) {
  std::mt19937 rng{uint32_t(seed)};
  std::vector<int32_t> ids(experts);
  for (int c = 0; c < count; ++c) {
    std::vector<std::vector<int32_t>> by(experts);
    for (int t = 0; t < m; ++t) {
      std::iota(ids.begin(), ids.end(), 0);
      for (int i = 0; i < topk; ++i) {
        std::swap(ids[i], ids[i + rng() % (experts - i)]);
        by[ids[i]].push_back(t);
      }
    }
    std::vector<int32_t> ge, gs{0}, pr;
    for (int e = 0; e < experts; ++e) {
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
  FS_ASSIGN_OR_RETURN(r.pair_weight, ar.alloc<float>(m * topk));
  return cuda_status(detail::launch_fill_floats(r.pair_weight, m * topk, seed, 1.0f, nullptr), "fill");
}

Status lin(const Fp8Mat& w, int copy, const float* x, float* y, int m, bool packed) {
  BlockLinearParams p;
  const int c = copy % int(w.w.size());
  p.x = x, p.w = w.w[c], p.w_scale = w.s[c], p.y = y, p.m = m, p.n = w.n, p.k = w.k, p.w_packed = packed;
  return block_linear_cuda(p, g_st);
}

}  // namespace flashseek::ops::cuda::bench
