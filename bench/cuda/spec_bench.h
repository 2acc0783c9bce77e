// `flashseek bench --spec`: DSpark speculative-decoding cost model on the full-width V4.1 layer
// slice (layer_bench.h). Measures one layer at M = 1 (plain decode), 5 (the draft's rows) and 6
// (a verification block [x0, y1..y5]) plus the head-sized GEMVs the step adds (LM head, Markov
// head, main_proj), and projects tokens/s of the 40-layer model at given acceptance lengths on
// one GPU and on 8 GPUs (a stated model, not a measurement).
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "bench/cuda/layer_bench.h"

namespace flashseek::ops::cuda {

struct SpecBenchOptions {
  int reps = 40;
  int layers = 40;
  int block = 5;                                   // dspark_block_size
  int stages = 3;                                  // draft stages
  int draft_experts = 128, draft_topk = 3;         // draft MoE
  std::vector<double> acceptance = {3.0, 4.0, 5.6};  // emitted tokens per verify step
  int gpus = 8;                                    // projection
  double allreduce_us = 10.0;                      // assumed cost of one small all-reduce
};

struct SpecBenchReport {
  LayerBenchReport layer;   // the slice at M = 1, block, block + 1
  double layer_us_1 = 0, layer_us_verify = 0;     // one layer, all kernels
  double head_us_1 = 0, head_us_verify = 0, head_us_draft = 0;  // LM head (BF16 estimate)
  double markov_us = 0;     // one Markov-head row (BF16 estimate)
  double main_proj_us = 0;  // taps → ctx for the verify rows (FP8, measured)
  double draft_stage_us = 0;   // one draft stage on `block` rows
  double draft_routed_scale = 0;  // draft / target distinct experts at M = block
  double draft_us = 0;      // whole draft pass per block
  double step_us_1 = 0, step_us_verify = 0;  // 1 GPU
  double step_us_1_n = 0, step_us_verify_n = 0, draft_us_n = 0;  // opt.gpus GPUs (projection)
};

Result<SpecBenchReport> run_spec_bench(const SpecBenchOptions& opt);
std::string format_spec_bench(const SpecBenchReport& r, const SpecBenchOptions& opt);

}  // namespace flashseek::ops::cuda
