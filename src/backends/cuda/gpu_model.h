// The CUDA backend of `forward::Model` (`--gpus N`): the same math as the CPU reference backend
// (cpu_model.h), with the weights and every sequence's state (window rings, compressed KV, index
// keys, compressor partial groups) in GPU memory and every op a GPU kernel (ops/cuda/
// model_kernels.h). Engram tables stay in the checkpoint (host) and only the rows a chunk needs
// are copied up. Available when the build has CUDA (FLASHSEEK_HAVE_CUDA); otherwise the factory
// returns an error.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "forward/model.h"

namespace flashseek::forward {

// True when this build contains the CUDA backend.
bool gpu_backend_built();

// How the CUDA backend keeps the weights (docs/cuda.md, "Weights on the device").
struct GpuLoadOptions {
  // Reference numerics: keep FP8 linears and FP4/FP8 routed experts in the checkpoint's format and
  // run the block-scaled kernels (true), or dequantise every matrix to FP32 (false). Unset: the
  // environment FLASHSEEK_GPU_WEIGHTS=native|fp32, else FP32 (native is opt-in until it meets
  // the parity criteria on a GPU, see docs/cuda.md). Exact numerics and multi-GPU ranks always
  // use FP32.
  std::optional<bool> native_weights;
};

// CUDA graphs of decode-sized forwards (docs/cuda.md, "CUDA graphs"): a GpuModel::forward call
// whose items all have at most kGpuGraphMaxTokens tokens runs as a CUDA graph on the model's
// stream. On one GPU a step replays a cached executable of the same op sequence, with only the
// changed node parameters patched (ops/cuda/launch.cuh launch tape); a new op sequence is recorded
// once. On by default (FLASHSEEK_GPU_GRAPHS=0 at load time: eager; FLASHSEEK_GPU_GRAPH_PATCH=0:
// record every step), on one GPU and on multi-GPU NCCL ranks (their all-reduces are tape markers,
// never patched; the ranks vote each step); the host-staged communicator never uses them. Counters since load
// (a multi-GPU model: summed over its ranks).
inline constexpr int64_t kGpuGraphMaxTokens = 8;
struct GpuGraphStats {
  int64_t forwards = 0;        // GpuModel::forward calls
  int64_t eligible = 0;        // of which decode-sized with graphs on
  int64_t launches = 0;        // graph launches (one per eligible forward that did not fall back)
  int64_t patched = 0;         // of which replayed by patching changed nodes, without recording
  int64_t patched_nodes = 0;   // node parameters set by those patches
  int64_t patch_misses = 0;    // patch attempts that found no matching executable (then recorded)
  int64_t instantiations = 0;  // new executables (first use of a key, or a topology change)
  int64_t updates = 0;         // executables updated in place (cudaGraphExecUpdate)
  int64_t update_failures = 0; // updates refused (counted in instantiations as well)
  int64_t recaptures = 0;      // captures discarded because a buffer had to grow first
  int64_t eager_fallbacks = 0; // eligible forwards that ran without a graph
  // Decode-sized forwards (graphs on or off): how many, host time until the final stream sync
  // (host code, launches or recording or patching) and time waiting in that sync, in ns.
  int64_t timed = 0, host_ns = 0, wait_ns = 0;
};
// The counters of a CUDA model (one GPU or tensor-parallel); an error for other models.
Result<GpuGraphStats> gpu_graph_stats(const Model& m);

// Opens a release-format checkpoint on CUDA device `device` (numerics as load_model). Errors name
// the file / tensor / device (no device, out of memory, ...).
Result<std::unique_ptr<Model>> load_model_gpu(const std::string& ckpt_dir, Numerics numerics, int device,
                                              const GpuLoadOptions& opts = {});

// Free memory of CUDA device `device` (cudaMemGetInfo) for the start-up memory plan; an error
// without a CUDA backend or device.
Result<uint64_t> gpu_memory_free(int device);

// The CLI/engine hook: `gpus` empty → the CPU backend (load_model); "N" → the CUDA backend on
// device N; a list "0,1,..." → the tensor/expert-parallel model over those devices (gpu_tp.h).
Result<std::unique_ptr<Model>> load_model_for(const std::string& ckpt_dir, Numerics numerics,
                                              const std::string& gpus);

}  // namespace flashseek::forward
