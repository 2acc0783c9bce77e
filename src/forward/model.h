// The engine-facing interface of a loaded model (CPU or CUDA backend). The engine owns
// sequences and scheduling; the model owns the math and the per-sequence state layout
// (DESIGN.md §3: window rings, compressed KV / index-key pages, compressor partials, Engram history).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "ops/sample.h"

namespace flashseek::forward {

class CpuSequenceState;  // forward/state.h: the canonical host format of a sequence state

enum class Numerics {
  kExact,      // fp32 everywhere on dequantised weights (compared with transformers / official fp32)
  kReference,  // the official reference's FP8/FP4 simulations and BF16 rounding points
};

// Everything a sequence needs to continue from its current length. Copyable (snapshot/restore).
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  // Tokens processed so far (the next token gets this position).
  virtual int64_t length() const = 0;
  // Deep copy at the current token boundary (snapshot); restoring = keep using the copy.
  virtual std::unique_ptr<SequenceState> clone() const = 0;
};

// One sequence's slice of a batched forward call.
struct BatchItem {
  SequenceState* state = nullptr;     // advanced by tokens.size()
  std::span<const int32_t> tokens;    // [T] new token ids at positions state->length() ...
  bool all_logits = false;            // true: logits for every token; false: only the last one
  // Sampling on the model's device (samples_on_device()): with `sample` set (never together with
  // all_logits) the backend draws the token after the item's last row by the rule of
  // ops/sample.h, writes it to `sampled` (-1: the row had no finite logit) and appends no
  // logits row for the item.
  const ops::SampleSpec* sample = nullptr;
  int32_t sampled = -1;
};

// One DSpark proposal (v41 §5.4): block_size draft tokens, their Markov-corrected logits and
// raw confidence logits.
struct DraftBlock {
  std::vector<int32_t> tokens;     // [B]
  std::vector<float> logits;       // [B, V]
  std::vector<float> confidence;   // [B]
};
// Picks draft token i (1-based) from its logits; default: argmax, lower id at ties.
using DraftChooser = std::function<int32_t(int64_t i, std::span<const float> logits)>;

class Model {
 public:
  virtual ~Model() = default;
  virtual const model::ModelConfig& config() const = 0;
  virtual std::unique_ptr<SequenceState> new_sequence() const = 0;
  // Runs the tokens of every item (a ragged batch: prefill chunks and decode steps mixed) and
  // appends fp32 logits rows [rows, vocab] to `logits`, items in order, rows per item = T if
  // all_logits else 1 (0 for an item sampled on the device). Results for an item do not depend
  // on the other items (batch invariance).
  virtual Status forward(std::span<BatchItem> batch, std::vector<float>& logits) = 0;
  // True when forward() honours BatchItem::sample (the last row never leaves the device).
  virtual bool samples_on_device() const { return false; }
  // Discards the last state.length() − new_length tokens (rejected speculative drafts) so that the
  // state equals one that never saw them. Backends may bound how far back this reaches.
  virtual Status rollback(SequenceState& state, int64_t new_length) const {
    return {StatusCode::kUnimplemented, "rollback: not supported by this model"};
  }
  // Speculative decoding (V4.1 DSpark v41 §5; V4 MTP v4 §3.8). has_draft(): the checkpoint
  // carries draft weights and this backend can propose. propose(): one block of
  // draft_block_size() drafts after the committed tokens of `state` with anchor `x0` (not yet
  // fed); the state is unchanged.
  virtual bool has_draft() const { return false; }
  virtual int64_t draft_block_size() const { return config().dspark_block_size; }
  virtual Result<DraftBlock> propose(const SequenceState& state, int32_t x0,
                                     const DraftChooser& choose = {}) const {
    return Status{StatusCode::kUnimplemented, "propose: this model backend has no DSpark draft"};
  }
  // Snapshots (state cache, kvshare; docs/kvshare.md "Backends"): the canonical host format of a
  // sequence state is CpuSequenceState (forward/state.h), whatever the backend. export_state
  // copies `state` (a state of this model) into it; import_state validates the geometry of
  // `state` against this model (forward/state_convert.h) before copying anything, then builds a
  // sequence state of this backend that continues exactly like the exported one. Both leave
  // their argument unchanged. Defaults (state_convert.cpp): kUnimplemented.
  virtual Result<std::unique_ptr<CpuSequenceState>> export_state(const SequenceState& state) const;
  virtual Result<std::unique_ptr<SequenceState>> import_state(const CpuSequenceState& state) const;
  // Which backend numerics produce this model's states: "cpu" (the CPU reference), "cuda" (one
  // GPU, FP32 weights), "cuda-native" (one GPU, block-scaled weights), "cuda[-native]-tpN[-host]"
  // (N tensor-parallel ranks; backends/cuda/gpu_tp.h cuda_backend_kind). States of one
  // checkpoint are not bit-identical across kinds, so the kind enters the snapshot fingerprint
  // (state_fingerprint).
  virtual std::string backend_kind() const { return "cpu"; }
};

// Opens a release-format checkpoint directory (V4 or V4.1, detected from its config) on the CPU
// reference backend (forward/cpu_model.h, the flow over CpuOps). Errors name the file / tensor / field.
Result<std::unique_ptr<Model>> load_model(const std::string& ckpt_dir, Numerics numerics);

}  // namespace flashseek::forward
