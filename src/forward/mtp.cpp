// V4 MTP block (v4 §3.8): predicts token t+2 at position t from the backbone's final streams X_t
// (before hc_head) and the embedding of token t+1. Its window row for position p can only be
// computed once token p+1 is known, so every forward fills the rows of the pairs it completes
// (the previous chunk's last position first) and mtp_logits() runs the last pair on demand.
#include <algorithm>
#include <cmath>

#include "core/numeric.h"
#include "forward/cpu_model.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"
#include "ops/quant.h"

namespace flashseek::forward {

void CpuModel::mtp_block(const CpuSequenceState& st, const std::vector<float>& xmain, std::span<const int32_t> next,
                         const std::vector<int64_t>& pos, std::vector<float>& kv_rows,
                         std::vector<float>* logits) const {
  const auto& c = config();
  const MtpWeights& M = w_.mtp;
  const bool R = ref();
  const int64_t n = int64_t(pos.size()), D = c.hidden_size, hc = c.hc_mult, H = c.num_heads, Dh = c.head_dim;
  const float eps = float(c.rms_norm_eps);
  // X = e_proj(enorm(embed[next])) broadcast + h_proj(hnorm(X_p)) per stream, summed in BF16 (ref).
  std::vector<float> e(size_t(n * D)), hh(size_t(n * hc * D)), ep, hp;
  for (int64_t r = 0; r < n; ++r) std::copy_n(w_.embed.data() + int64_t(next[r]) * D, D, e.data() + r * D);
  ops::rms_norm({e.data(), M.enorm.data(), e.data(), n, D, eps, R});
  ops::rms_norm({xmain.data(), M.hnorm.data(), hh.data(), n * hc, D, eps, R});
  linear(e, M.e_proj, n, D, D, ep, act_block_, R, dot_key(M.block.attn.block, DotOp::kEProj));
  linear(hh, M.h_proj, n * hc, D, D, hp, act_block_, R, dot_key(M.block.attn.block, DotOp::kHProj));
  std::vector<float> X(size_t(n * hc * D)), pre(size_t(n * hc), 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < hc; ++i)
      for (int64_t d = 0; d < D; ++d) {
        const float v = ep[r * D + d] + hp[(r * hc + i) * D + d];
        X[(r * hc + i) * D + d] = R ? round_bf16(v) : v;
      }
  auto attn = [&](const Vec& a, Vec& f) {
    std::vector<float> qlat, q;
    project_qkv(M.block.attn, a, pos, qlat, q, kv_rows);
    std::vector<float> o(size_t(n * H * Dh));
    std::vector<const float*> keys;
    for (int64_t r = 0; r < n; ++r) {
      keys.clear();
      for (int64_t p = std::max<int64_t>(0, pos[r] - c.window + 1); p <= pos[r]; ++p)
        keys.push_back(p >= pos[0] ? kv_rows.data() + (p - pos[0]) * Dh : st.mtp_ring.data() + (p % st.ring_size) * Dh);
      ops::sparse_attention({q.data() + r * H * Dh, keys.data(), int64_t(keys.size()), H, Dh,
                             M.block.attn.attn_sink.data(), 1.0f / std::sqrt(float(Dh)), R, o.data() + r * H * Dh});
      if (R) ops::round_bf16_inplace(o.data() + r * H * Dh, H * Dh);
    }
    project_out(M.block.attn, o, pos, f);
  };
  block(M.block, n, X, pre, attn,
        [&](const Vec& m, Vec& f) { moe(M.block.ffn, c.n_routed_experts, c.n_experts_per_tok, next, m, f); });
  if (!logits) return;
  std::vector<float> y(size_t(n * D));
  ops::hc_head_pre(X.data(), M.hc_head_fn.data(), M.hc_head_base.data(), M.hc_head_scale.data(), pre.data(), n,
                   hc, D, eps, float(c.hc_eps));
  ops::hc_collapse(X.data(), pre.data(), y.data(), n, hc, D, R);
  ops::rms_norm({y.data(), M.norm.data(), y.data(), n, D, eps, R});
  const size_t off = logits->size();
  logits->resize(off + size_t(n * c.vocab_size));
  ops::linear({y.data(), w_.head.data(), logits->data() + off, n, D, c.vocab_size});
}

void CpuModel::mtp_advance(CpuSequenceState& st, const ChunkCtx& ctx, const std::vector<float>& X) const {
  const auto& c = config();
  const int64_t D = c.hidden_size, hc = c.hc_mult, row = hc * D, T = ctx.T;
  // Pairs completed by this chunk: (start−1, tokens[0]) if start > 0, then (p, token p+1) inside.
  std::vector<float> xm;
  std::vector<int32_t> next;
  std::vector<int64_t> pos;
  if (ctx.start > 0) {
    xm.assign(st.mtp_hist_x.end() - row, st.mtp_hist_x.end());
    next.push_back(ctx.tokens[0]);
    pos.push_back(ctx.start - 1);
  }
  for (int64_t t = 0; t + 1 < T; ++t) {
    xm.insert(xm.end(), X.begin() + t * row, X.begin() + (t + 1) * row);
    next.push_back(ctx.tokens[size_t(t + 1)]);
    pos.push_back(ctx.pos[size_t(t)]);
  }
  if (!pos.empty()) {
    std::vector<float> kv;
    mtp_block(st, xm, next, pos, kv, nullptr);
    const int64_t n = int64_t(pos.size()), Dh = c.head_dim;
    for (int64_t r = std::max<int64_t>(0, n - st.ring_size); r < n; ++r)
      std::copy_n(kv.data() + r * Dh, Dh, st.mtp_ring.data() + (pos[r] % st.ring_size) * Dh);
  }
  st.mtp_hist_x.insert(st.mtp_hist_x.end(), X.begin(), X.end());
  const int64_t keep = (1 + kMaxRollback) * row;
  if (int64_t(st.mtp_hist_x.size()) > keep)
    st.mtp_hist_x.erase(st.mtp_hist_x.begin(), st.mtp_hist_x.end() - keep);
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
  mtp_block(*st, xm, tok, {st->len - 1}, kv, &logits);
  return logits;
}

}  // namespace flashseek::forward
