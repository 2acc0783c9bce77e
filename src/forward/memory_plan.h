// The memory plan checked at start (`run`, `serve`): weights + workspace + per-sequence state for
// max_batch sequences of max_context tokens, against a fraction of the memory the backend has
// (CUDA: free device memory; CPU: MemAvailable or the cgroup limit). What does not fit is refused
// before anything big is allocated, with the bytes needed and available.
#pragma once
#include <cstdint>
#include <string>

#include "core/status.h"
#include "forward/state_io.h"
#include "model/config.h"

namespace flashseek::forward {

// A GPU forward's indexer scratch per (query row, visible position): scores and block maxima
// (FP32) and kept-block flags (a byte), filled in row slices of at most kGpuIndexScratchBytes
// (GpuModel::index_topk); the memory plan counts the same.
inline constexpr int64_t kGpuIndexEntryBytes = 9;
inline constexpr int64_t kGpuIndexScratchBytes = int64_t(2) << 30;

// A GPU forward's tensor-core row attention (GpuLoadOptions::decode_attention_tensor) decodes the
// key rows of at most this many bytes of query rows at a time, plus their key-slot lists (at most
// 1/32 of it: 4 bytes per 2·head_dim >= 128 bytes of keys) and, for up to 32 rows, per-tile
// partials of at most this many bytes again (the split form); the memory plan counts all three.
inline constexpr int64_t kGpuDecodeAttnPoolBytes = int64_t(64) << 20;

// The BF16 scratch of a prefill GEMM's weight expansion (GpuLoadOptions::prefill_gemm_expand_w):
// the routed experts are expanded in chunks of whole matrices of at most this many bytes.
inline constexpr int64_t kMoeExpandChunkBytes = int64_t(1) << 30;

struct MemoryPlanOptions {
  int64_t max_batch = 1;       // concurrent sequences
  int64_t max_context = 0;     // tokens per sequence (0: the config's max_position_embeddings)
  int64_t step_tokens = 256;   // tokens in one forward call (the engine's step budget)
  double utilization = 0.9;    // fraction of the available memory the plan may use
  bool gpu = false;            // weights and state on a CUDA device (else host memory)
  int tensor_parallel = 1;     // GPUs sharing the weights (the plan is per GPU: rank 0's slices)
  // GPU: every matrix stays as stored (--gpu-weights native; a rank: its slices); otherwise every
  // weight is an FP32 copy.
  bool native_weights = false;
  // Checkpoint bytes that stay resident in host memory besides the backend's own copies (dummy
  // weights live in an anonymous image); 0 for a checkpoint on disk (mapped, reclaimable).
  uint64_t resident_checkpoint_bytes = 0;
  // GPU (--engram-tables device): the Engram tables are uploaded as stored to every GPU and count
  // against its memory; otherwise they stay in host memory (the checkpoint) and rows are gathered.
  bool engram_on_device = false;
  // GPU: the caches are stored in the row formats of these numerics (forward/cache_format.h).
  Numerics numerics = Numerics::kReference;
  // GPU (--prefill-gemm-operands bf16-expanded): the prefill GEMMs expand their weights to BF16
  // in scratch; the workspace counts the largest FP8 matrix (this rank's share) plus one chunk of
  // routed-expert matrices (kMoeExpandChunkBytes), both as BF16.
  bool prefill_weight_expansion = false;
};

struct MemoryPlan {
  std::string where;               // "host memory" / "GPU memory (per GPU)"
  uint64_t weights = 0;            // what the backend allocates where the plan is checked
  uint64_t host_weights = 0;       // GPU backend: what stays on the host (Engram tables, dummy image)
  StateBytes state;                // one sequence of max_context tokens, as allocated (CPU: FP32;
                                   // GPU: the caches in their row formats)
  StateBytes state_compact;        // the same in the compact formats (planned)
  uint64_t workspace = 0;          // activations of one step (an estimate)
  int64_t max_batch = 0, max_context = 0;
  uint64_t total = 0;              // weights + workspace + max_batch * state
  uint64_t available = 0;          // what the backend reports
  double utilization = 0;
  uint64_t budget() const { return uint64_t(double(available) * utilization); }
  bool fits() const { return total <= budget(); }
};

// `geometry` is the model's state geometry (its draft rings included when the weights carry a
// draft); `has_draft` says whether draft weights are loaded.
MemoryPlan plan_memory(const model::ModelConfig& cfg, const SnapshotGeometry& geometry, bool has_draft,
                       const MemoryPlanOptions& opt, uint64_t available);

// Lines for the log: weights / state per sequence (FP32 and compact (planned)) / workspace /
// total vs available.
std::string format_memory_plan(const MemoryPlan& plan);

// OK when the plan fits, else an error naming the bytes needed and available.
Status check_memory_plan(const MemoryPlan& plan);

// Host memory this process may still use: MemAvailable of /proc/meminfo, lowered to the cgroup
// limit minus usage when one is set.
Result<uint64_t> host_memory_available();

}  // namespace flashseek::forward
