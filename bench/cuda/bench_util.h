// Helpers shared by the GPU benchmarks (layer_bench.cpp, tp_bench.cpp, ...): device memory
// owned by a scope, FP8 / FP32 weights in rotating copies (so HBM, not L2, is measured), the
// event timer, the copy-bandwidth probe and random expert routings. Not used by the model.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "ops/cuda/runtime/cuda_check.h"
#include "ops/linear_quant.h"

namespace flashseek::ops::cuda::bench {

// Every timed launch goes to this stream (capturable into a graph; the legacy stream is not).
// Thread-local: a multi-GPU benchmark drives one device per thread.
extern thread_local cudaStream_t g_st;

// Device memory owned by the benchmark; freed at scope exit.
class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
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

// FP8 e4m3 weights [n, k] with E8M0 32x32 block scales, in rotating copies.
struct Fp8Mat {
  std::vector<uint8_t*> w, s;  // per copy
  int64_t n = 0, k = 0;
  double bytes() const { return double(n * k + weight_scale_bytes(WeightFormat::kFp8, n, k, 32)); }
};
Status make_fp8(Arena& ar, Fp8Mat& m, int64_t n, int64_t k, int copies, uint64_t seed);

// FP32 weights (the exactness-first model kernels' format) in rotating copies.
struct F32Mat {
  std::vector<float*> w;
  int64_t n = 0, k = 0;
  double bytes() const { return 4.0 * double(n * k); }
  const float* at(int r) const { return w[size_t(r) % w.size()]; }
};

// `copies` copies of random FP32 weights [n, k] (uniform in ±scale, copy c seeded seed + 131·c).
Status make_f32(Arena& ar, F32Mat& m, int64_t n, int64_t k, int copies, uint64_t seed, float scale);

// Copies so that one rotation covers >= 3x the L2 (at least 2).
int copies_for(double bytes, double l2_bytes);

struct Timer {
  cudaEvent_t a = nullptr, b = nullptr;
  ~Timer() { if (a) cudaEventDestroy(a); if (b) cudaEventDestroy(b); }
};

// Median / min over `reps` samples after 3 warm-ups; a sample times `batch` back-to-back
// launches (each on the next weight copy) between two events on g_st and divides, so host
// launch latency and event overhead do not count, but the gaps between dependent kernels do.
Status time_op(const std::function<Status(int)>& fn, int reps, double* med, double* mn, int batch = 10);

// Device-to-device cudaMemcpy of 2 GiB on g_st: bytes read + written per second.
Status measure_copy(double* gbps);

// Per-rep routings of `m` tokens (top-k of `experts`, uniform), grouped by expert, on the device.
struct Routings {
  std::vector<int32_t*> ge, gs, pr;
  std::vector<int64_t> n_groups;
  float* pair_weight = nullptr;
  double mean_distinct = 0;
};
Status make_routings(Arena& ar, Routings& r, int m, int count, uint64_t seed, int64_t experts = 384,
                     int64_t topk = 6);

// y [m, w.n] = x [m, w.k] · W(copy)ᵀ with the FP8 block-scaled GEMV/GEMM on g_st.
// packed: the codes read in the GEMV fragment order (BlockLinearParams::w_packed; the benches'
// weights are random bytes, so one buffer serves either layout for timing).
Status lin(const Fp8Mat& w, int copy, const float* x, float* y, int m, bool packed = false);

}  // namespace flashseek::ops::cuda::bench
