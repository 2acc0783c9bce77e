// `flashseek bench --tp N`: the measured tensor/expert-parallel layer slice on 1, 2, 4, ... N GPUs
// of this host (eager and CUDA graphs with the NCCL all-reduces inside, tp_layer_bench.h), NCCL
// collective timings on N GPUs, and the older projection of the decode step (backends/cuda/gpu_tp.h
// split) from single-GPU kernel timings (layer_bench.h), kept for GPU counts that are not lent.
// See docs/multigpu.md for what is measured and what is projected.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "bench/cuda/layer_bench.h"
#include "bench/cuda/tp_layer_bench.h"

namespace flashseek::ops::cuda {

struct TpBenchOptions {
  int world = 2;                              // GPUs for the collectives (devices 0..world-1)
  std::vector<int> tokens = {1, 6, 8192};     // rows M of the [M, hidden] all-reduce
  std::vector<int> layer_tokens = {1, 6};     // decode steps for the layer projection
  std::vector<int> project_worlds = {2, 4, 8};
  std::vector<int> slice_tokens = {1, 6, 8, 32};  // measured layer slice (tp_layer_bench.h)
  bool slice = true;                               // run the measured slice
  int prefill_tokens = 8192;                       // all-reduce-only graph at prefill size
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
  TpLayerReport slice;     // measured per-rank layer slice, W = 1, 2, 4, ... world
  LayerBenchReport layer;  // single-GPU kernel timings at full V4.1 dimensions (projection)
};

Result<TpBenchReport> run_tp_bench(const TpBenchOptions& opt);
std::string format_tp_bench(const TpBenchReport& r, const TpBenchOptions& opt);

}  // namespace flashseek::ops::cuda
