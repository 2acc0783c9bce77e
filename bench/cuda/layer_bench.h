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
  std::vector<int> contexts = {4096, 131072};  // indexer candidates (ratio 1: one per position)
  int reps = 40;
  int layers = 40;        // projection
  int graph_layers = 8;   // decode layers captured per CUDA graph (weights rotate across them)
  bool gemv_sweep = false;  // also time the GEMVs at every forced k split (1..8)
  // The routed experts' FP4 matrices read in the GEMV fragment order (ops/fp4_fragments.h;
  // ExpertGemvParams::w_packed). The weights are random bytes, so one buffer serves either layout.
  bool fp4_fragments = false;
  // With fp4_fragments: the routed GEMVs' ring stages (ExpertGemvParams::ring_stages; 0 off).
  int gemv_ring_stages = 0;
  // The dense FP8 matrices and the shared expert read in the FP8 fragment order (the same trick).
  bool fp8_fragments = false;
};

struct KernelTiming {
  std::string name;
  int tokens = 0;
  double median_us = 0, min_us = 0;
  double bytes = 0;   // HBM bytes read + written (weights, KV rows, activations)
  double flops = 0;
  std::string role;     // "" = every layer; else the layer role that adds it (extras table)
  double per_step = 0;  // layers per step that run it (0: every layer = options.layers)
  int context = 0;      // context length it depends on (0: none)
  bool reference = false;  // an exactness-first model kernel (FP32 weights, CPU operation order)
};

// One CUDA graph holding `layers` consecutive decode layers (every-layer kernels, in order).
struct GraphTiming {
  int tokens = 0, layers = 0;
  double kernel_sum_us = 0;           // sum of the kernel medians of one layer
  double replay_us_per_layer = 0, replay_min_us_per_layer = 0;
};

// Forced-split GEMV timings (options.gemv_sweep).
struct SweepTiming {
  std::string name;
  int tokens = 0, split = 0;
  double median_us = 0, bytes = 0;
};

struct LayerBenchReport {
  std::string device;
  int sm_count = 0;
  double l2_mb = 0;
  double copy_gbps = 0;  // device-to-device cudaMemcpy, bytes read + written per second
  std::vector<KernelTiming> kernels;
  std::vector<GraphTiming> graphs;
  std::vector<SweepTiming> sweep;
};

Result<LayerBenchReport> run_layer_bench(const LayerBenchOptions& opt);

// Markdown tables: per kernel, the per-layer sum projected to opt.layers layers, graph replay vs
// kernel sum, role extras and the per-step projection per context, and the split sweep.
std::string format_layer_bench(const LayerBenchReport& r, const LayerBenchOptions& opt);

}  // namespace flashseek::ops::cuda
