// Prefill layer benchmark at real V4.1 dimensions (issue #4): one layer of an M-token chunk
// (M = 8192 by default) on random weights made on the GPU, every kernel the layer needs in order
// (mHC, norms, the dense linears as FP8 block-scaled GEMMs with one activation quantisation per
// shared input, RoPE, sparse attention with sinks over window + top-512 rows, router, the shared
// expert and the 384 routed experts as row-permuted per-expert GEMMs on several streams), plus the
// role extras (compressor, indexer query / scores / top-512 per context, Engram). Attention and
// indexer scores use the prefill kernels of prefill_attn.cu / prefill_index.cu (checked against
// the existing kernels in the run; PrefillBenchOptions::prefill_kernels false: the existing kernels). Reports per
// kernel time, bytes, % of copy bandwidth, TFLOP/s and % of an FP8 GEMM ceiling measured in the
// same run, the 40-layer projection per chunk and the projected time for a long prompt.
// `flashseek bench --prefill 8192 [--contexts ...]`. Not used by the model.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::ops::cuda {

struct PrefillBenchOptions {
  int tokens = 8192;                           // M, the chunk (a multiple of 128, 256..16384)
  std::vector<int> contexts = {4096, 131072};  // tokens already cached before the chunk
  int reps = 5;                                // timed samples per kernel (median reported)
  int layers = 40;                             // projection
  int expert_streams = 8;                      // streams the per-expert GEMMs are spread over
  int index_rows = 1024;                       // query rows the indexer kernels are timed at (<= M)
  double prompt_tokens = 1e6;                  // projection: prompt length
  int gpus = 8;                                // projection: ideal split over this many GPUs
  double anchor_s = 11.7;                      // mission anchor for prompt_tokens on 8 GPUs
  // Routed experts as ONE grouped GEMM (true) or per-expert GEMMs on expert_streams streams.
  bool grouped_experts = true;
  // Attention and indexer scores with the prefill kernels, checked against the decode kernels
  // (true), or with the decode kernels only.
  bool prefill_kernels = true;
};

struct PrefillKernel {
  std::string name;
  std::string role;     // "" = every layer; "info" = not counted; else the role that adds it
  double per_step = 0;  // layers per step that run it (role extras)
  int context = 0;      // context it was timed at (0: none)
  double median_us = 0, min_us = 0;  // per call at M tokens (scaled when timed at fewer rows)
  double bytes = 0, flops = 0;
  double scaled = 1;    // > 1: timed at M / scaled query rows and multiplied by `scaled`
  bool gemm = false;    // FP8 tensor-core GEMM
};

struct PrefillBenchReport {
  std::string device;
  int sm_count = 0;
  double copy_gbps = 0;
  double ceiling_tflops = 0;  // gemm_fp8 (default kernel) at M = N = K = 8192, same run
  double layer_seq_us = 0, layer_seq_min_us = 0;  // every-layer kernels back to back
  double mean_distinct = 0, rows_per_expert = 0;
  std::vector<PrefillKernel> kernels;
  std::string attn_check;  // new prefill kernels vs the existing ones (outputs on their first rows)
};

Result<PrefillBenchReport> run_prefill_bench(const PrefillBenchOptions& opt);

// The FP8 ceiling of the prefill reports: the default gemm_fp8 kernel (e4m3, pre-quantised x, FP32
// out) at M = N = K = 8192, median over `reps` timed batches of 3 launches (weights alternate
// between two copies); TFLOP/s, and the median / min µs per launch when asked. Needs an sm_90a
// device (gemm_fp8_cuda's kUnimplemented otherwise).
Status measure_fp8_ceiling(int reps, double* tflops, double* med_us = nullptr, double* min_us = nullptr);

// The limits the model bench judges its numbers by, measured on `device` before the model takes
// its memory (the current device is restored): the copy bandwidth (measure_copy) and, when
// `fp8_tflops` is given, the FP8 ceiling (measure_fp8_ceiling, 5 reps).
Status measure_device_limits(int device, double* copy_gbps, double* fp8_tflops);

// Markdown: per kernel, per layer, the per-step projection per context, and the prompt projection.
std::string format_prefill_bench(const PrefillBenchReport& r, const PrefillBenchOptions& opt);

}  // namespace flashseek::ops::cuda
