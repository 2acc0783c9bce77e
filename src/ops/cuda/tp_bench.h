// `flashseek bench --tp N`: NCCL collective timings on N GPUs of this host and a projection of
// the tensor/expert-parallel decode step (forward/gpu_tp.h split) from single-GPU kernel timings
// (layer_bench.h). See docs/multigpu.md for what is measured and what is projected.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "ops/cuda/layer_bench.h"

namespace flashseek::ops::cuda {

struct TpBenchOptions {
  int world = 2;                              // GPUs for the collectives (devices 0..world-1)
  std::vector<int> tokens = {1, 6, 8192};     // rows M of the [M, hidden] all-reduce
  std::vector<int> layer_tokens = {1, 6};     // decode steps for the layer projection
  std::vector<int> project_worlds = {2, 4, 8};
  int reps = 40;
  int layers = 40;
  double anchor_ms = 2.71;  // 6-token step on 8xB300 (the project's reference point)
};

struct CollectiveTiming {
  std::string op, dtype;
  int world = 0, tokens = 0;
  double bytes = 0;  // per-rank buffer
  double median_us = 0, min_us = 0;
  double bus_gbps = 0;  // NCCL's bus bandwidth convention: bytes·2(n−1)/n / time (all-reduce)
};

struct TpBenchReport {
  std::string device;
  int world = 0;
  std::vector<CollectiveTiming> collectives;
  LayerBenchReport layer;  // single-GPU kernel timings at full V4.1 dimensions
};

Result<TpBenchReport> run_tp_bench(const TpBenchOptions& opt);
std::string format_tp_bench(const TpBenchReport& r, const TpBenchOptions& opt);

}  // namespace flashseek::ops::cuda
