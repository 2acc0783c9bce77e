// Measured tensor/expert-parallel decode layer slice on W GPUs of this host (`flashseek bench
// --tp N`, issue #8). One host thread per GPU, one NCCL communicator per rank
// (ncclCommInitRank, the unique id shared in-process). Each rank allocates ITS slice of a V4.1
// decode layer at real size, split as backends/cuda/gpu_tp.h splits the model: heads 64/W (wq_b rows,
// RoPE, sparse attention), output groups 8/W (wo_a rows, wo_b columns), routed experts 384/W
// (FP4, stacked; the random top-6 routing, the same on every rank, filtered to the rank's
// experts), the shared expert on rank 0, everything else (mHC, norms, wq_a+wkv, router, MoE
// combine) in full, and two BF16 all-reduces of [M, 5120] per layer on the rank's stream. W = 1 is
// the same slice on one GPU without collectives (the baseline of this harness).
//
// Per (W, M) it times L layers (a) eager: launched back to back by every rank's thread, (b) as one
// CUDA graph per rank that captures the L layers INCLUDING the ncclAllReduce calls (each rank's
// stream captured in its own thread, cudaStreamCaptureModeThreadLocal), replayed on all ranks at
// once; plus (c) a graph of the same layers without the all-reduces (compute alone, per rank) and
// (d) a graph of only the 2·L all-reduces (collectives alone; BF16 and FP32). Timing: every sample
// starts with a host barrier and a one-element all-reduce (aligns the GPUs), then CUDA events on
// each rank's stream around the work; the sample's time is the slowest rank's; the median of the
// samples is reported. Weights are random (made on the GPU); dense FP8 weights rotate over copies
// totalling >= 3x L2 per rank, so HBM is measured. Not used by the model.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::ops::cuda {

struct TpLayerOptions {
  std::vector<int> worlds = {1, 2};      // GPU counts (devices 0..W-1); 1 = no collectives
  std::vector<int> tokens = {1, 6, 8, 32};
  int reps = 20;
  int layers = 40;             // layers per timed step (eager loop and each captured graph)
  int prefill_tokens = 8192;   // all-reduce-only graph at this M as well (0: skip)
  double anchor_ms = 2.71;     // 6-token step on 8xB300 (the project's reference point)
};

struct TpLayerTiming {
  int world = 0, tokens = 0;
  // Per step of `layers` layers, slowest rank, median over samples (us).
  double eager_us = 0, graph_us = 0, graph_min_us = 0;
  double compute_max_us = 0, compute_min_us = 0;  // compute-only graph: slowest / fastest rank
  double comm_bf16_us = 0, comm_fp32_us = 0;      // all-reduce-only graph (2·layers all-reduces)
  double rank_bytes = 0;      // bytes moved per layer by the busiest rank (rank 0), expected
  double local_experts = 0;   // mean distinct routed experts per layer on rank 0
  double copy_gbps = 0;       // D2D copy rate, slowest rank
};

struct TpPrefillComm {
  int world = 0, tokens = 0, layers = 0;
  double bf16_us = 0;  // 2·layers BF16 all-reduces of [tokens, 5120], one graph, slowest rank
};

struct TpLayerReport {
  std::string device, nccl_version;
  std::vector<TpLayerTiming> rows;
  std::vector<TpPrefillComm> prefill;
  std::string error;  // a world size that failed (the rows before it are kept); "" when all ran
};

Result<TpLayerReport> run_tp_layer_bench(const TpLayerOptions& opt);
std::string format_tp_layer_bench(const TpLayerReport& r, const TpLayerOptions& opt);

}  // namespace flashseek::ops::cuda
