// The CPU reference implementation of `Model` for V4.1 and V4 (the oracle of every GPU kernel).
// One code path: a prefill chunk of T tokens and a decode step (T = 1) run the same functions,
// and every output element is computed in an order that does not depend on T or on the batch.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "forward/model.h"
#include "forward/state.h"
#include "forward/state_convert.h"
#include "forward/weights.h"
#include "model/checkpoint.h"

namespace flashseek::forward {

// Shared attention data of one forward over one chunk (v41 §3.1): top-k lists published by
// index sources and the candidate masks of the candidate source, per query row.
struct ChunkCtx {
  CpuSequenceState* st = nullptr;
  std::span<const int32_t> tokens;           // [T]
  int64_t start = 0, T = 0;
  std::vector<int64_t> pos;                  // [T]
  std::vector<std::vector<std::vector<int32_t>>> topk;  // [layer][T] compressed rows, ascending
  std::vector<std::vector<uint8_t>> cand;    // [T] candidate mask over compressed positions
  std::vector<int64_t> engram_ids;           // [n_engram_layers, T, n_cols]
};

// Optional record of the sparse-attention selections of the last forward (tests and debugging):
// per layer and query row, the compressed rows attended (ascending), and the candidate masks.
struct ForwardTrace {
  std::vector<std::vector<std::vector<int32_t>>> topk;  // [layer][T] (empty for window-only layers)
  std::vector<std::vector<uint8_t>> cand;               // [T] candidate masks (V4.1)
  std::vector<int64_t> pos;                             // [T] positions of the rows
};

// Options of the CPU backend beyond the numerics, passed down at load.
struct CpuLoadOptions {
  // Sensitivity experiment (docs/cuda.md, "Whole-model parity"): > 0 multiplies the FP32 result
  // of every FP8-activation dot product (the linears that quantise their input to FP8 in
  // `reference` numerics: attention, indexer query, Engram, routed and shared experts, draft
  // projections) by (1 + dot_perturbation·s), before any BF16 rounding of the output, with
  // s = ±1 from a hash of (perturbation_seed, layer, op, expert, row, column), where row is the
  // linear's input row within the forward call (so a seed's pattern depends on the chunking; the
  // experiment runs one chunk). It models the same math summed in another order; the product is
  // computed in double and rounded once to FP32.
  // 0: off, and the backend is bit-identical to one loaded without options. Needs `reference`
  // numerics on a checkpoint with FP8/FP4 weights; at most 1e-3.
  double dot_perturbation = 0;
  uint64_t perturbation_seed = 0;
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

 private:
  CpuModel() = default;
  bool ref() const { return numerics_ == Numerics::kReference; }
  Status forward_one(CpuSequenceState& st, std::span<const int32_t> tokens, bool all_logits,
                     std::vector<float>& logits);
  void compute_engram_ids(ChunkCtx& ctx) const;
  void engram(int layer, ChunkCtx& ctx, std::vector<float>& x) const;
  void attention(int layer, ChunkCtx& ctx, const std::vector<float>& a, std::vector<float>& out);
  void compress(int layer, ChunkCtx& ctx, const std::vector<float>& a);
  void compress_v4_index(int layer, ChunkCtx& ctx, const std::vector<float>& a);
  void index_select(int layer, ChunkCtx& ctx, const std::vector<float>& a,
                    const std::vector<float>& qlat);
  using SublayerFn = std::function<void(const Vec& in, Vec& out)>;
  // One block on X [T, hc, D]: mixes, collapse, attn_norm, attn, post, mixes, collapse, ffn_norm,
  // ffn, post. pre_in [T, hc] is the incoming pre (V4.1 chaining) and becomes this block's pre_f.
  void block(const LayerWeights& L, int64_t T, std::vector<float>& X, std::vector<float>& pre_in,
             const SublayerFn& attn, const SublayerFn& ffn) const;
  void moe(const FfnWeights& F, int64_t n_experts, int64_t k, std::span<const int32_t> tokens,
           const std::vector<float>& m, std::vector<float>& out) const;
  // Query / window-KV projections of an attention (q [T, H, Dh] and kv [T, Dh] RoPE'd at pos).
  void project_qkv(const AttentionWeights& A, const std::vector<float>& a, const std::vector<int64_t>& pos,
                   std::vector<float>& qlat, std::vector<float>& q, std::vector<float>& kv) const;
  // Inverse RoPE of o [T, H, Dh] at pos, grouped wo_a, wo_b → out [T, D].
  void project_out(const AttentionWeights& A, std::vector<float>& o, const std::vector<int64_t>& pos,
                   std::vector<float>& out) const;
  void append_tap(int layer, int64_t T, const std::vector<float>& X, std::vector<float>& taps) const;
  void write_draft_rings(const ChunkCtx& ctx, const std::vector<float>& taps) const;
  // MTP block over pairs (X_p [n, hc, D], token p+1, position p); returns the rows' window KV
  // [n, Dh] and, with `logits`, appends their MTP logits.
  void mtp_block(const CpuSequenceState& st, const std::vector<float>& xmain, std::span<const int32_t> next,
                 const std::vector<int64_t>& pos, std::vector<float>& kv_rows, std::vector<float>* logits) const;
  void mtp_advance(CpuSequenceState& st, const ChunkCtx& ctx, const std::vector<float>& X) const;
  void draft_attention(int stage, const CpuSequenceState& st, const std::vector<int64_t>& pos,
                       const std::vector<float>& a, std::vector<float>& out) const;
  // The FP8-activation linears, named for the dot perturbation's key.
  enum class DotOp : uint64_t {
    kNone, kWqA, kWqB, kWkv, kWoB, kIdxWqB, kEngramWkv, kW1, kW3, kW2, kMainProj, kEProj, kHProj
  };
  // Key of one linear: block (role index), op and routed expert (-1: none / shared expert).
  static uint64_t dot_key(int64_t block, DotOp op, int64_t expert = -1);
  // y = x · wᵀ (ops::linear); with act_block > 0 and the dot perturbation on, every output
  // element is perturbed as CpuLoadOptions describes, keyed by `key`, row and column.
  void linear(const std::vector<float>& x, const Vec& w, int64_t rows, int64_t in, int64_t out,
              std::vector<float>& y, int64_t act_block, bool bf16_out, uint64_t key) const;

  std::unique_ptr<model::Checkpoint> ck_;
  ModelWeights w_;
  Numerics numerics_ = Numerics::kExact;
  int64_t act_block_ = 0;   // FP8 activation block of FP8 linears in reference numerics (0: none)
  int64_t expert_act_block_ = 0;
  double dot_perturbation_ = 0;   // CpuLoadOptions
  uint64_t perturbation_seed_ = 0;
  ForwardTrace* trace_ = nullptr;
};

// Factory used by the engine and tools.
Result<std::unique_ptr<Model>> load_model(const std::string& ckpt_dir, Numerics numerics);

}  // namespace flashseek::forward
