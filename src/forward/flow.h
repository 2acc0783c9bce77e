// The V4 / V4.1 model written once (DESIGN.md §6): embedding, Engram, the mHC blocks (V4.1
// single-pass chaining, V4 classic), attention with the compressors and the indexer, MoE, the
// final collapse / norm / head, the DSpark taps, rings and proposals. Every op goes through a
// `Backend` (forward/backend.h); the CPU oracle and the CUDA serving path run this same code.
#pragma once
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "forward/backend.h"
#include "forward/model.h"
#include "forward/weights.h"
#include "model/config.h"

namespace flashseek::forward {

// Per-call view of a model: config, weights (the host descriptions; backends map them to their
// copies), numerics and the activation block of the reference's FP8 linears (routed experts: the
// backend's routed_experts op knows its own).
struct FlowParams {
  const model::ModelConfig* config = nullptr;
  const ModelWeights* weights = nullptr;
  bool reference = false;        // Numerics::kReference
  int64_t act_block = 0;         // FP8 activation block of FP8 linears (0: none)
};

// The reference quantises activations only in front of FP8 / FP4 GEMMs (v4 §5.1, v41 §1.4): the
// activation block of FP8 linears and of routed experts in `numerics` (0: none; always 0 in exact).
struct ActBlocks {
  int64_t linear = 0, experts = 0;
};
inline ActBlocks reference_act_blocks(const model::ModelConfig& c, Numerics numerics) {
  if (numerics != Numerics::kReference) return {};
  const int64_t blk = c.is_v41() ? 32 : 128;
  return {c.fp8_weights ? blk : 0, c.fp4_experts || c.fp8_weights ? blk : 0};
}

inline FlowParams make_flow_params(const model::ModelConfig& c, const ModelWeights& w, Numerics numerics) {
  FlowParams p;
  p.config = &c;
  p.weights = &w;
  p.reference = numerics == Numerics::kReference;
  p.act_block = reference_act_blocks(c, numerics).linear;
  return p;
}

class Forward {
 public:
  Forward(const FlowParams& p, Backend& b) : p_(p), c_(*p.config), w_(*p.weights), b_(b) {}

  // Every item of `batch` in one pass over the layers; appends logits rows (or samples) per item
  // as Model::forward describes, and advances each item's state. Items are checked by the caller
  // (tokens in range, states of this backend).
  Status forward(std::span<BatchItem> batch, std::vector<float>& logits);

  // DSpark proposal (Model::propose) after the committed tokens of `st` with anchor x0. The
  // state is only read.
  Result<DraftBlock> propose(ModelState& st, int32_t x0, const DraftChooser& choose);

  // One mHC block around two sublayers (attention, then FFN) on X [T, hc, D]; pre_in [T, hc] is
  // the incoming pre (V4.1 chaining) and becomes this block's FFN pre. `tag` prefixes the scratch
  // names (drafts keep their own buffers).
  // `ffn_combine` (optional): where the FFN sublayer may leave its MoE combine (moe()'s `defer`),
  // which the block then runs with its stream update (Backend::moe_combine_post).
  using Sublayer = std::function<Status(const Tensor& a, const Tensor& out)>;
  // attn_mixed: the attention's mixes already ran (the previous block's last stream update formed
  // them); next_layer (optional, where the backend fuses_post_mixes): the next block's weights, whose
  // attention mixes this block's last update forms.
  Status block(const LayerWeights& L, const std::string& tag, int64_t T, const Tensor& X, const Tensor& pre_in,
               const Sublayer& attn, const Sublayer& ffn, std::optional<MoeCombineCall>* ffn_combine = nullptr,
               bool attn_mixed = false, const LayerWeights* next_layer = nullptr);
  // Query and window KV of an attention: qlat [T, Rq], q [T, H, Dh] and kv [T, Dh] RoPE'd at pos.
  // `beside` (optional): more work that reads only `a` (the layer's compressors), issued on the
  // main branch after the window KV, concurrently with the query. `published` (optional, with
  // `ctx` and `layer`): the window KV rows go through Backend::window_kv_rows, and *published
  // says whether the backend also wrote them to the layer's ring.
  Status project_qkv(const AttentionWeights& A, const std::string& tag, const Tensor& a, const Tensor& pos, int64_t T,
                     int64_t H, Tensor& qlat, Tensor& q, Tensor& kv, const std::function<Status()>& beside = {},
                     FwdChunk* ctx = nullptr, int layer = -1, bool* published = nullptr);
  // Inverse RoPE of o [T, H·Dh] at pos (unless `unroped`: o has it already), grouped wo_a, wo_b
  // into out [T, D] (BF16 when bf16_out).
  Status output_projection(const AttentionWeights& A, const std::string& tag, const Tensor& pos, int64_t T, int64_t H,
                           int64_t G, const Tensor& o, const Tensor& out, bool bf16_out, bool unroped = false);
  // Engram row ids of every row (hashes of each sequence's look-back and tokens) into
  // ctx.engram_ids [n_engram_layers, T, n_cols].
  void engram_ids(FwdChunk& ctx) const;
  // MoE of F over T rows m [T, D] (tokens for V4 hash routing) into out [T, D]. `sharded`: the
  // backbone's experts, split across tensor-parallel ranks (remapped, combine all-reduced); false
  // for the drafts (DSpark stages, the MTP block), whose weights are whole on the one rank that
  // runs them.
  // `defer` (optional; not with a split combine, which is all-reduced): the combine is not run but
  // stored there for the caller, which runs it (block(): with the stream update).
  Status moe(const FfnWeights& F, const std::string& tag, const Tensor& tokens, int64_t T, int64_t E, int64_t K,
             const Tensor& m, const Tensor& out, bool sharded = true, std::optional<MoeCombineCall>* defer = nullptr);
  // side() on a side branch of `lane` and main_part() on the main branch, then the join
  // (Backend::side_begin): the two must be independent (neither writes what the other reads or
  // writes). The join is issued whatever fails, so the backend never keeps an open branch. Lane 0
  // for branches within a sublayer; lane 1 for a sublayer's mixes beside the sublayer (block).
  template <class Side, class Main>
  Status branches(Side&& side, Main&& main_part, int lane = 0) {
    Status s = b_.side_begin(lane);
    if (s.ok()) s = side();
    Status e = b_.side_end(lane);
    if (s.ok() && e.ok()) s = main_part();
    Status j = b_.side_join(lane);
    return !s.ok() ? s : !e.ok() ? e : j;
  }
  // V4 MTP block (v4 §3.8) over n pairs: xm [n, hc, D] the backbone's final streams at the
  // consecutive positions pos, tok [n] (I32) the next tokens. Returns the block's window KV rows
  // [n, Dh] (scratch "mtp_kv_rows": the caller writes them to its MTP ring) and, when logits is
  // given, the draft logits [n, V] (scratch "mtp_logits"). The state is only read.
  Result<Tensor> mtp_block(const SequenceState& st, const Tensor& xm, const Tensor& tok, const std::vector<int64_t>& pos,
                           Tensor* logits);

 private:
  bool R() const { return p_.reference; }
  Status engram(int layer, FwdChunk& ctx, const Tensor& X);
  Status attention(int layer, FwdChunk& ctx, const Tensor& a, const Tensor& out);
  Status compress(int layer, FwdChunk& ctx, const Tensor& a);
  // Norm, RoPE and quantisation of rows a compressor just pooled for every sequence (and V4.1's
  // index keys from them): groups [n] of the rows, seg_n [segments] rows per sequence.
  Status finish_entries(int layer, FwdChunk& ctx, Compressor which, const Tensor& e, const std::vector<int64_t>& groups,
                        std::span<const int64_t> seg_n);
  Status index_select(int layer, FwdChunk& ctx, const Tensor& a, const Tensor& qlat);
  Status write_draft_rings(FwdChunk& ctx, const Tensor& taps);
  // The window KV rows' chain on kv [T, head_dim] (attention A's kv_norm): RMS norm, RoPE, and in
  // reference numerics the FP8 simulation (V4.1: every dim in blocks of 32; V4: the non-RoPE dims
  // in blocks of 64).
  NormRopeQuantCall kv_rows(const AttentionWeights& A, const Tensor& kv, const Tensor& pos, int64_t T) const;
  Status draft_attention(int stage, FwdSeg& seg, const Tensor& pos, const Tensor& a, const Tensor& out);
  Result<Tensor> scratch_f(const std::string& name, int64_t rows, int64_t cols = 1) {
    return b_.scratch(name, ElemType::kF32, rows, cols);
  }

  FlowParams p_;
  const model::ModelConfig& c_;
  const ModelWeights& w_;
  Backend& b_;
};

}  // namespace flashseek::forward
