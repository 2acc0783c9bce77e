// Kernel-level layer-slice benchmark at real V4.1 dimensions (hidden 5120, 64×512 heads,
// q_lora 1280, o_groups 8×1024, 384 FP4 experts × 2304 with 6 active + a shared expert), random
// weights made on the GPU. Each kernel is timed with CUDA events (warm-up, median of `reps`),
// cycling through weight copies whose total exceeds the L2 several times, so HBM is measured.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::ops::cuda {

struct LayerBenchOptions {
  std::vector<int> tokens = {1, 6, 8, 32};
  int reps = 40;
  int layers = 40;  // projection
};

struct KernelTiming {
  std::string name;
  int tokens = 0;
  double median_us = 0, min_us = 0;
  double bytes = 0;   // HBM bytes read + written (weights, KV rows, activations)
  double flops = 0;
};

struct LayerBenchReport {
  std::string device;
  int sm_count = 0;
  double l2_mb = 0;
  double copy_gbps = 0;  // device-to-device cudaMemcpy, bytes read + written per second
  std::vector<KernelTiming> kernels;
};

Result<LayerBenchReport> run_layer_bench(const LayerBenchOptions& opt);

// Markdown tables: per kernel, and the per-layer sum projected to opt.layers layers.
std::string format_layer_bench(const LayerBenchReport& r, const LayerBenchOptions& opt);

}  // namespace flashseek::ops::cuda
