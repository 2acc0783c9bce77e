// V4.1 DSpark draft on the GPU (v41 §5): the draft's weights on the device, and proposals through
// the model flow (forward/flow.cpp Forward::propose; the draft's ops in gpu_ops.cpp). V4's MTP
// draft: gpu_mtp.cpp (GpuModel::propose dispatches to it).
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>
#include <cmath>

#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/model/model_kernels.h"
#include "ops/cuda/model/small_kernels.h"
#include "ops/linear.h"

namespace flashseek::forward::gpu {
namespace cd = ops::cuda::detail;

Status GpuModel::upload_draft_weights() {
  DSparkWeights& W = w_.dspark;
  const size_t ns = W.stages.size();
  // As the backbone's layers and V4's MTP block: the linears with FP8 activations (act_block_,
  // reference numerics) may run through the block-scaled GEMVs (GpuLinearRole::kDraft), the
  // grouped wo_a and the router through the exactness kernel.
  using R = GpuLinearRole;
  const auto fa = [&](R r) { return fast_act(r, act_block_); };
  dw1_.resize(ns), dw2_.resize(ns), dw3_.resize(ns), dtid2eid_.resize(ns), dexperts_.resize(ns);
  for (size_t s = 0; s < ns; ++s) {
    LayerWeights& L = W.stages[s];
    const std::string p = fmt::format("mtp.{}.", s);
    FS_RETURN_IF_ERROR(up_f32_matrix(L.hc_attn_fn, p + "hc_attn_fn"));
    FS_RETURN_IF_ERROR(up_f32_matrix(L.hc_ffn_fn, p + "hc_ffn_fn"));
    for (Vec* v : {&L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_base, &L.hc_ffn_scale, &L.attn_norm, &L.ffn_norm})
      FS_RETURN_IF_ERROR(up(*v));
    AttentionWeights& A = L.attn;
    if (A.has_compressor || A.has_indexer) return internal_error("DSpark stage {}: expected a window-only block", s);
    for (const auto& [v, name] : {std::pair<Vec*, const char*>{&A.wq_a, "attn.wq_a.weight"},
                                  {&A.wq_b, "attn.wq_b.weight"}, {&A.wkv, "attn.wkv.weight"},
                                  {&A.wo_b, "attn.wo_b.weight"}})
      FS_RETURN_IF_ERROR(up_matrix(*v, p + name, fa(R::kDraft)));
    FS_RETURN_IF_ERROR(up_matrix(A.wo_a, p + "attn.wo_a.weight"));
    for (Vec* v : {&A.q_norm, &A.kv_norm, &A.attn_sink, &A.rope_inv_freq}) FS_RETURN_IF_ERROR(up(*v));
    FfnWeights& F = L.ffn;
    FS_RETURN_IF_ERROR(up_matrix(F.gate, p + "ffn.gate.weight"));
    FS_RETURN_IF_ERROR(up(F.bias));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w1, p + "ffn.shared_experts.w1.weight", fa(R::kDraft)));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w2, p + "ffn.shared_experts.w2.weight", fa(R::kDraft)));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w3, p + "ffn.shared_experts.w3.weight", fa(R::kDraft)));
    std::vector<DevArray<float>> stacks;
    FS_RETURN_IF_ERROR(up_experts(F.w1, F.w2, F.w3, p + "ffn.experts.", fast_act(R::kDraft, expert_act_block_), stacks,
                                  dexperts_[s]));
    if (!stacks.empty()) dw1_[s] = std::move(stacks[0]), dw2_[s] = std::move(stacks[1]), dw3_[s] = std::move(stacks[2]);
    if (!F.tid2eid.empty()) FS_RETURN_IF_ERROR(dtid2eid_[s].upload(F.tid2eid.data(), F.tid2eid.size()));
  }
  // The Markov embedding/head run on the device (one [V, r] GEMV per draft token); the confidence
  // dot reads its embedding row from the checkpoint on the host.
  FS_RETURN_IF_ERROR(up_matrix(W.main_proj, "mtp.0.main_proj.weight", fa(R::kDraft)));
  for (Vec* v : {&W.main_norm, &W.norm}) FS_RETURN_IF_ERROR(up(*v));
  const std::string last = fmt::format("mtp.{}.markov_head.", ns - 1);
  if (native_) {
    FS_RETURN_IF_ERROR(up_matrix(W.markov_embed, last + "embed.weight"));
    FS_RETURN_IF_ERROR(up_matrix(W.markov_head, last + "head.weight"));
    markov_embed_key_ = d(W.markov_embed);
    markov_head_key_ = d(W.markov_head);
  } else {
    FS_RETURN_IF_ERROR(markov_embed_.upload(W.markov_embed.data(), W.markov_embed.size()));
    FS_RETURN_IF_ERROR(markov_head_.upload(W.markov_head.data(), W.markov_head.size()));
    report_.fp32_matrices += 2;
    report_.fp32_bytes += int64_t((markov_embed_.capacity() + markov_head_.capacity()) * sizeof(float));
    markov_embed_key_ = markov_embed_.get();
    markov_head_key_ = markov_head_.get();
    Vec().swap(W.markov_embed);
    Vec().swap(W.markov_head);
  }
  if (!markov_embed_key_ || !markov_head_key_) return internal_error("DSpark: Markov head tables missing on the device");
  return {};
}

Result<DraftBlock> GpuModel::propose(const SequenceState& state, int32_t x0, const DraftChooser& choose) const {
  const auto* st = dynamic_cast<const GpuSequenceState*>(&state);
  if (!st) return invalid_argument("propose: not a GPU sequence state");
  if (!w_.has_dspark && !w_.has_mtp) return invalid_argument("propose: the checkpoint has no draft (mtp.*)");
  if (!has_draft())
    return Status(StatusCode::kUnimplemented, "propose: only rank 0 of a tensor-parallel model runs the draft");
  if (!st->error.ok()) return st->error;
  if (st->len < 1) return invalid_argument("propose: the sequence has no committed token yet");
  if (x0 < 0 || x0 >= config().vocab_size)
    return invalid_argument("propose: anchor token {} outside [0, {})", x0, config().vocab_size);
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  // Scratch buffers are model-owned (like forward, propose is not thread-safe); the flow only
  // reads the state (the draft rings).
  auto* self = const_cast<GpuModel*>(this);
  Forward f(flow_params(), *self);
  // V4: the MTP block's one draft (gpu_mtp.cpp); V4.1: the DSpark block through the flow.
  Result<DraftBlock> out = w_.has_dspark ? f.propose(*const_cast<GpuSequenceState*>(st), x0, choose)
                                         : self->propose_mtp(*st, x0, choose);
  Status r = self->staging_.rewind();  // every upload has completed (the proposal synchronised)
  if (!out.ok()) return out;
  if (!r.ok()) return r;
  return out;
}

}  // namespace flashseek::forward::gpu
#endif
