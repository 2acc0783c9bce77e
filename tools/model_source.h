// Where `run` and `serve` get their weights: a checkpoint directory (--load-format auto) or
// weights generated in memory from a config and a seed (--load-format dummy, model/dummy.h),
// with --num-layers keeping a role-complete subset of the layers.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "forward/model.h"
#include "model/config.h"

namespace flashseek::tools {

struct ModelSourceCli {
  std::string ckpt, load_format = "auto", config;
  int64_t num_layers = 0;  // 0: all
  int threads = 0;         // dummy generation threads (0: all cores)
};

// --ckpt, --load-format, --config, --num-layers (the caller adds --seed).
void add_model_source_options(CLI::App* cmd, ModelSourceCli& o);

// A built-in config name (tiny-v4, tiny-v41, demo), a checkpoint directory or a config.json.
Result<model::ModelConfig> resolve_config(const std::string& name);

struct ModelSource {
  std::string name;         // what Checkpoint::open / load_model_for take
  model::ModelConfig config;
  bool dummy = false;
};

// Checks the options and resolves the config (for dummy weights: reduced by --num-layers, which
// prints what was kept on stderr). Nothing is generated yet.
Result<ModelSource> resolve_model_source(const ModelSourceCli& o, uint64_t seed);

// For dummy weights: generates them and registers the checkpoint under `src.name` (one line on
// stderr: tensors, bytes, time); nothing for a checkpoint directory.
Status materialize_model_source(const ModelSource& src, const ModelSourceCli& o, uint64_t seed);

// Both steps.
Result<ModelSource> prepare_model_source(const ModelSourceCli& o, uint64_t seed);

// A GpuLoadOptions::load_progress callback (every backend): a progress line on stderr with
// percent, bytes and GB/s since the callback was made, at most every 200 ms and once at 100 %.
// Thread-safe (the loader calls it from its threads).
std::function<void(uint64_t done, uint64_t total)> load_progress_printer(int threads);

// One stderr line after a model loaded from `src`: the bytes of its checkpoint (the safetensors
// files of a directory; the generated tensors of dummy weights), the seconds since `t0` and the
// GB/s (what scripts/load-bench.sh compares with dd).
void print_load_summary(const ModelSource& src, std::chrono::steady_clock::time_point t0);

struct MemoryPlanCli {
  double gpu_memory_utilization = 0.9;
  uint64_t memory_limit = 0;  // bytes available to the plan (0: ask the backend)
};

// --gpu-memory-utilization, --memory-limit.
void add_memory_plan_options(CLI::App* cmd, MemoryPlanCli& o);

// The start-up memory plan (forward/memory_plan.h) for `src` on `gpus` ("" = CPU) with max_batch
// sequences of max_context tokens (0: the config's): printed on stderr; an error naming the
// bytes needed and available when it does not fit. Runs before dummy weights are generated.
// `native_weights` (--gpu-weights native): one GPU keeps every matrix as stored, as the CUDA
// backend's loader does; `engram_on_device` (--engram-tables device): the Engram tables count
// against every GPU's memory instead of host memory; `numerics` sets the GPU caches' row formats;
// `step_tokens` is the engine's step budget (--max-step-tokens), which sizes the step's workspace;
// `prefill_weight_expansion` (--prefill-gemm-operands bf16-expanded / bf16-direct) adds the GEMMs' BF16 weight
// scratch to it.
Status check_memory_plan_for(const ModelSource& src, const MemoryPlanCli& o, const std::string& gpus,
                             int64_t max_batch, int64_t max_context, bool native_weights,
                             bool engram_on_device = false,
                             forward::Numerics numerics = forward::Numerics::kReference, int64_t step_tokens = 256,
                             bool prefill_weight_expansion = false);

}  // namespace flashseek::tools
