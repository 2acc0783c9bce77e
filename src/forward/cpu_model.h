// The CPU reference implementation of `Model` for V4.1 and V4 (the oracle of every GPU kernel):
// the model flow (forward/flow.h) over the CPU backend ops (forward/cpu_backend.h, the kernels of
// src/ops/cpu). A prefill chunk of T tokens and a decode step (T = 1) run the same functions, and
// every output element is computed in an order that does not depend on T or on the batch.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "forward/flow.h"
#include "forward/model.h"
#include "forward/state.h"
#include "forward/state_convert.h"
#include "forward/weights.h"
#include "model/checkpoint.h"

namespace flashseek::forward {

// Optional record of the sparse-attention selections of the last forward (tests and debugging):
// per layer and query row, the compressed rows attended (ascending), and the candidate masks.
struct ForwardTrace {
  std::vector<std::vector<std::vector<int32_t>>> topk;  // [layer][T] (empty for window-only layers)
  std::vector<std::vector<uint8_t>> cand;               // [T] candidate masks (V4.1)
  std::vector<int64_t> pos;                             // [T] positions of the rows
};

// How CpuLoadOptions::dot_perturbation perturbs one FP8-activation dot y = Σ_i x_i·w_i (the
// terms are the products the linear sums: FP8-rounded activations times dequantised weights).
enum class DotPerturbationMode {
  // y · (1 + ε·s): relative to the result. Under-models a reordered sum whose terms cancel.
  kRelative,
  // y + s·ε·Σ_i |x_i·w_i|: every product term perturbed by a relative ε with aligned signs, the
  // backward-error model of the same sum in another order (a reordered K-term FP32 dot differs by
  // at most γ_K·Σ|x_i·w_i|). Σ|x_i·w_i| comes from ops::linear_abs_terms.
  kTermMagnitude,
};

// Options of the CPU backend beyond the numerics, passed down at load.
struct CpuLoadOptions {
  // Sensitivity experiment (docs/cuda.md, "Whole-model parity"): > 0 perturbs the FP32 result
  // of every FP8-activation dot product (the linears that quantise their input to FP8 in
  // `reference` numerics: attention, indexer query, Engram, routed and shared experts, draft
  // projections) by ε = dot_perturbation as `perturbation_mode` says, before any BF16 rounding of
  // the output, with the sign s = ±1 from a hash of (perturbation_seed, layer, op, expert, row,
  // column), where row is the linear's input row within the forward call (so a seed's pattern
  // depends on the chunking; the experiment runs one chunk). It models the same math summed in
  // another order; the perturbed value is computed in double and rounded once to FP32.
  // 0: off, and the backend is bit-identical to one loaded without options. Needs `reference`
  // numerics on a checkpoint with FP8/FP4 weights; at most 1e-3.
  double dot_perturbation = 0;
  uint64_t perturbation_seed = 0;
  DotPerturbationMode perturbation_mode = DotPerturbationMode::kRelative;
  // With dot_perturbation > 0: only the dots whose key this accepts are perturbed (empty: every
  // FP8-activation dot). One op family's share of the sensitivity (gpu_parity_diag_test.cpp).
  std::function<bool(const LinearKey&)> perturbation_filter;
  // Loading threads and progress (the matrices are dequantised in parallel; `matrices` is ignored:
  // the CPU backend always loads them).
  WeightLoadOptions weights;
};

class CpuModel final : public Model {
 public:
  static Result<std::unique_ptr<CpuModel>> load(const std::string& ckpt_dir, Numerics numerics,
                                                const CpuLoadOptions& opts = {});

  const model::ModelConfig& config() const override { return ck_->config(); }
  std::unique_ptr<SequenceState> new_sequence() const override;
  Status forward(std::span<BatchItem> batch, std::vector<float>& logits) override;
  // Up to kMaxRollback tokens (src/forward/rollback.cpp).
  Status rollback(SequenceState& state, int64_t new_length) const override;

  // Engram row ids [T, n_engram_layers, n_cols] of `tokens` continuing `state` (state unchanged).
  Result<std::vector<int64_t>> engram_hash_ids(const SequenceState& state,
                                               std::span<const int32_t> tokens) const;
  Numerics numerics() const { return numerics_; }
  // A draft for speculative decoding: V4.1's DSpark (a block of dspark_block_size drafts) or V4's
  // MTP block (one draft per step).
  bool has_draft() const override { return w_.has_dspark || w_.has_mtp; }
  int64_t draft_block_size() const override {
    return w_.has_dspark ? config().dspark_block_size : w_.has_mtp ? 1 : 0;
  }
  bool has_mtp() const { return w_.has_mtp; }
  // V4 MTP logits [V] for token a+2 at the last committed position a, given token a+1.
  Result<std::vector<float>> mtp_logits(const SequenceState& state, int32_t next_token) const;
  // Draft proposal after the committed tokens of `state` (last position a = length − 1), with
  // anchor `x0` (the target's token for position a + 1, not yet fed). State is unchanged.
  // DSpark: dspark_block_size drafts; V4 MTP: one draft from mtp_logits(state, x0).
  Result<DraftBlock> propose(const SequenceState& state, int32_t x0,
                             const DraftChooser& choose = {}) const override;
  // Snapshots (state_convert.cpp): export = a copy (sealed pages shared); import = the geometry
  // check of state_convert.h, then a copy.
  Result<std::unique_ptr<CpuSequenceState>> export_state(const SequenceState& state) const override;
  Result<std::unique_ptr<SequenceState>> import_state(const CpuSequenceState& state) const override;
  // What this checkpoint's states hold beyond the config (DSpark rings, MTP, Engram ids).
  StateGeometry state_geometry() const;
  // Records selections of subsequent forwards into `trace` (nullptr: off). Not thread-safe.
  void set_trace(ForwardTrace* trace) { trace_ = trace; }
  // The flow's parameters for this model (a Forward over CpuOps, or over a backend that wraps
  // them: tests/forward/branch_hazard_test.cpp).
  FlowParams flow_params() const;

 private:
  friend class CpuOps;  // the backend ops (cpu_backend.h) read the weights and options
  CpuModel() = default;
  bool ref() const { return numerics_ == Numerics::kReference; }

  std::unique_ptr<model::Checkpoint> ck_;
  ModelWeights w_;
  Numerics numerics_ = Numerics::kExact;
  int64_t act_block_ = 0;   // FP8 activation block of FP8 linears in reference numerics (0: none)
  int64_t expert_act_block_ = 0;
  double dot_perturbation_ = 0;   // CpuLoadOptions
  uint64_t perturbation_seed_ = 0;
  DotPerturbationMode perturbation_mode_ = DotPerturbationMode::kRelative;
  std::function<bool(const LinearKey&)> perturbation_filter_;
  ForwardTrace* trace_ = nullptr;
};

// Factory used by the engine and tools.
Result<std::unique_ptr<Model>> load_model(const std::string& ckpt_dir, Numerics numerics);

}  // namespace flashseek::forward
