// V4 MTP block (v4 §3.8) on the CPU backend: predicts token t+2 at position t from the backbone's
// final streams X_t (before hc_head) and the embedding of token t+1, through the flow's block,
// projections and MoE. Its window row for position p can only be computed once token p+1 is
// known, so every forward fills the rows of the pairs it completes (the previous chunk's last
// position first) and mtp_logits() runs the last pair on demand.
#include <algorithm>
#include <cmath>

#include "core/numeric.h"
#include "forward/cpu_backend.h"
#include "forward/flow.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/quant.h"

namespace flashseek::forward {

Status CpuOps::mtp_block(const CpuSequenceState& st, const float* xmain, std::span<const int32_t> next,
                         const std::vector<int64_t>& pos, std::vector<float>& kv_rows, std::vector<float>* logits) {
  Forward f(m_.flow_params(), *this);
  const MtpWeights& M = w_.mtp;
  const AttentionWeights& A = M.block.attn;
  const bool R = m_.ref();
  const int64_t n = int64_t(pos.size()), D = c_.hidden_size, hc = c_.hc_mult, H = c_.num_heads, Dh = c_.head_dim;
  const int64_t act = m_.act_block_;
  const float eps = float(c_.rms_norm_eps);
  FS_ASSIGN_OR_RETURN(Tensor tok, scratch("mtp_tokens", ElemType::kI32, n));
  FS_ASSIGN_OR_RETURN(Tensor pd, scratch("mtp_pos", ElemType::kI64, n));
  FS_RETURN_IF_ERROR(upload(tok, next.data(), size_t(n) * 4));
  FS_RETURN_IF_ERROR(upload(pd, pos.data(), size_t(n) * 8));
  // X = e_proj(enorm(embed[next])) broadcast + h_proj(hnorm(X_p)) per stream, summed in BF16 (ref).
  FS_ASSIGN_OR_RETURN(Tensor e, scratch("mtp_e", ElemType::kF32, n, D));
  FS_ASSIGN_OR_RETURN(Tensor hh, scratch("mtp_hh", ElemType::kF32, n * hc, D));
  FS_ASSIGN_OR_RETURN(Tensor ep, scratch("mtp_ep", ElemType::kF32, n, D));
  FS_ASSIGN_OR_RETURN(Tensor hp, scratch("mtp_hp", ElemType::kF32, n * hc, D));
  FS_ASSIGN_OR_RETURN(Tensor X, scratch("mtp_X", ElemType::kF32, n * hc, D));
  FS_ASSIGN_OR_RETURN(Tensor pre, scratch("mtp_pre", ElemType::kF32, n, hc));
  FS_RETURN_IF_ERROR(embed(w_.embed, tok, e, n, 1, D));
  FS_RETURN_IF_ERROR(rms_norm(e, &M.enorm, e, n, D, eps, R));
  const Tensor xm{const_cast<float*>(xmain), ElemType::kF32, n * hc, D};
  FS_RETURN_IF_ERROR(rms_norm(xm, &M.hnorm, hh, n * hc, D, eps, R));
  linear_raw(e.f32(), M.e_proj, n, D, D, ep.f32(), act, R, false, {A.block, DotOp::kEProj});
  linear_raw(hh.f32(), M.h_proj, n * hc, D, D, hp.f32(), act, R, false, {A.block, DotOp::kHProj});
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < hc; ++i)
      for (int64_t d = 0; d < D; ++d) {
        const float v = ep.f32()[r * D + d] + hp.f32()[(r * hc + i) * D + d];
        X.f32()[(r * hc + i) * D + d] = R ? round_bf16(v) : v;
      }
  FS_RETURN_IF_ERROR(zero(pre));
  // Window attention over the MTP ring and the block's own rows (causal).
  auto attn = [&](const Tensor& a, const Tensor& out) -> Status {
    Tensor qlat, q, kv;
    FS_RETURN_IF_ERROR(f.project_qkv(A, "mtp_", a, pd, n, H, qlat, q, kv));
    kv_rows.assign(kv.f32(), kv.f32() + n * Dh);
    FS_ASSIGN_OR_RETURN(Tensor o, scratch("mtp_o", ElemType::kF32, n, H * Dh));
    std::vector<const float*> keys;
    for (int64_t r = 0; r < n; ++r) {
      keys.clear();
      for (int64_t p = std::max<int64_t>(0, pos[r] - c_.window + 1); p <= pos[r]; ++p)
        keys.push_back(p >= pos[0] ? kv_rows.data() + (p - pos[0]) * Dh : st.mtp_ring.data() + (p % st.ring_size) * Dh);
      float* orow = o.f32() + r * H * Dh;
      ops::sparse_attention({q.f32() + r * H * Dh, keys.data(), int64_t(keys.size()), H, Dh, A.attn_sink.data(),
                             1.0f / std::sqrt(float(Dh)), R, orow});
      if (R) ops::round_bf16_inplace(orow, H * Dh);
    }
    return f.output_projection(A, "mtp_z", pd, n, H, c_.o_groups, o, out, R);
  };
  FS_RETURN_IF_ERROR(f.block(M.block, "mtp_", n, X, pre, attn, [&](const Tensor& m, const Tensor& out) {
    return f.moe(M.block.ffn, "mtp_moe_", tok, n, c_.n_routed_experts, c_.n_experts_per_tok, m, out);
  }));
  if (!logits) return {};
  FS_ASSIGN_OR_RETURN(Tensor y, scratch("mtp_y", ElemType::kF32, n, D));
  HcMixCall hm;
  hm.x = X, hm.fn = &M.hc_head_fn, hm.base = &M.hc_head_base, hm.scale = &M.hc_head_scale;
  hm.rows = n, hm.hc = hc, hm.dim = D, hm.norm_eps = eps, hm.hc_eps = float(c_.hc_eps), hm.pre = pre;
  FS_RETURN_IF_ERROR(hc_head_pre(hm));
  FS_RETURN_IF_ERROR(hc_collapse(X, pre, y, n, hc, D, R));
  FS_RETURN_IF_ERROR(rms_norm(y, &M.norm, y, n, D, eps, R));
  const size_t off = logits->size();
  logits->resize(off + size_t(n * c_.vocab_size));
  ops::linear({y.f32(), w_.head.data(), logits->data() + off, n, D, c_.vocab_size});
  return {};
}

Status CpuOps::mtp_advance(FwdSeg& seg, const Tensor& X_seg) {
  auto& st = *static_cast<CpuSequenceState*>(seg.st);
  const int64_t D = c_.hidden_size, hc = c_.hc_mult, row = hc * D, T = seg.T;
  const float* X = X_seg.f32();
  // Pairs completed by this chunk: (start−1, tokens[0]) if start > 0, then (p, token p+1) inside.
  std::vector<float> xm;
  std::vector<int32_t> next;
  std::vector<int64_t> pos;
  if (seg.start > 0) {
    xm.assign(st.mtp_hist_x.end() - row, st.mtp_hist_x.end());
    next.push_back(seg.tokens[0]);
    pos.push_back(seg.start - 1);
  }
  for (int64_t t = 0; t + 1 < T; ++t) {
    xm.insert(xm.end(), X + t * row, X + (t + 1) * row);
    next.push_back(seg.tokens[size_t(t + 1)]);
    pos.push_back(seg.pos[size_t(t)]);
  }
  if (!pos.empty()) {
    std::vector<float> kv;
    FS_RETURN_IF_ERROR(mtp_block(st, xm.data(), next, pos, kv, nullptr));
    const int64_t n = int64_t(pos.size()), Dh = c_.head_dim;
    for (int64_t r = std::max<int64_t>(0, n - st.ring_size); r < n; ++r)
      std::copy_n(kv.data() + r * Dh, Dh, st.mtp_ring.data() + (pos[r] % st.ring_size) * Dh);
  }
  st.mtp_hist_x.insert(st.mtp_hist_x.end(), X, X + T * row);
  const int64_t keep = (1 + kMaxRollback) * row;
  if (int64_t(st.mtp_hist_x.size()) > keep) st.mtp_hist_x.erase(st.mtp_hist_x.begin(), st.mtp_hist_x.end() - keep);
  return {};
}

Result<std::vector<float>> CpuModel::mtp_logits(const SequenceState& state, int32_t next_token) const {
  const auto* st = dynamic_cast<const CpuSequenceState*>(&state);
  if (!st) return invalid_argument("mtp_logits: not a CPU sequence state");
  if (!w_.has_mtp) return invalid_argument("mtp_logits: the checkpoint has no MTP block (mtp.0.*)");
  if (st->len < 1) return invalid_argument("mtp_logits: the sequence has no committed token yet");
  const auto& c = config();
  if (next_token < 0 || next_token >= c.vocab_size)
    return invalid_argument("mtp_logits: token {} outside [0, {})", next_token, c.vocab_size);
  const int64_t row = c.hc_mult * c.hidden_size;
  std::vector<float> xm(st->mtp_hist_x.end() - row, st->mtp_hist_x.end()), kv, logits;
  const int32_t tok[1] = {next_token};
  CpuOps ops(*this);
  FS_RETURN_IF_ERROR(ops.mtp_block(*st, xm.data(), tok, {st->len - 1}, kv, &logits));
  return logits;
}

}  // namespace flashseek::forward
