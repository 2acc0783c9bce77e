// V4 MTP (v4 §3.8) on the CPU backend: the block itself is Forward::mtp_block (flow.cpp, shared
// with the CUDA backend); here are its CPU steps (the stream sum, the window attention over the
// host MTP ring) and the state it keeps. The block predicts token t+2 at position t from the
// backbone's final streams X_t (before hc_head) and the embedding of token t+1. Its window row for
// position p can only be computed once token p+1 is known, so every forward fills the rows of the
// pairs it completes (the previous chunk's last position first) and mtp_logits() runs the last
// pair on demand.
#include <algorithm>
#include <cmath>

#include "core/numeric.h"
#include "forward/cpu_backend.h"
#include "forward/flow.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/quant.h"

namespace flashseek::forward {

Status CpuOps::stream_add(const Tensor& f, const Tensor& X, int64_t rows, int64_t hc, int64_t dim, bool bf16) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < hc; ++i)
      for (int64_t d = 0; d < dim; ++d) {
        float& x = X.f32()[(r * hc + i) * dim + d];
        const float v = f.f32()[r * dim + d] + x;
        x = bf16 ? round_bf16(v) : v;
      }
  return {};
}

Status CpuOps::mtp_attention(const SequenceState& state, const Tensor& q, const Tensor& kv,
                             const std::vector<int64_t>& pos, const Vec& sink, const Tensor& out, bool bf16) {
  const auto& st = static_cast<const CpuSequenceState&>(state);
  const int64_t n = int64_t(pos.size()), H = heads(), Dh = c_.head_dim;
  std::vector<const float*> keys;
  for (int64_t r = 0; r < n; ++r) {
    keys.clear();
    for (int64_t p = std::max<int64_t>(0, pos[r] - c_.window + 1); p <= pos[r]; ++p)
      keys.push_back(p >= pos[0] ? kv.f32() + (p - pos[0]) * Dh : st.mtp_ring.data() + (p % st.ring_size) * Dh);
    float* orow = out.f32() + r * H * Dh;
    ops::sparse_attention({q.f32() + r * H * Dh, keys.data(), int64_t(keys.size()), H, Dh, sink.data(),
                           1.0f / std::sqrt(float(Dh)), bf16, orow});
    if (bf16) ops::round_bf16_inplace(orow, H * Dh);
  }
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
    const int64_t n = int64_t(pos.size()), Dh = c_.head_dim;
    FS_ASSIGN_OR_RETURN(Tensor tok, scratch("mtp_tokens", ElemType::kI32, n));
    FS_RETURN_IF_ERROR(upload(tok, next.data(), size_t(n) * 4));
    Forward f(m_.flow_params(), *this);
    FS_ASSIGN_OR_RETURN(Tensor kv, f.mtp_block(st, Tensor{xm.data(), ElemType::kF32, n * c_.hc_mult, c_.hidden_size},
                                               tok, pos, nullptr));
    for (int64_t r = std::max<int64_t>(0, n - st.ring_size); r < n; ++r)
      std::copy_n(kv.f32() + r * Dh, Dh, st.mtp_ring.data() + (pos[r] % st.ring_size) * Dh);
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
  std::vector<float> xm(st->mtp_hist_x.end() - row, st->mtp_hist_x.end());
  CpuOps ops(*this);
  FS_ASSIGN_OR_RETURN(Tensor tok, ops.scratch("mtp_tokens", ElemType::kI32, 1));
  tok.i32()[0] = next_token;
  Forward f(flow_params(), ops);
  Tensor lg;
  FS_RETURN_IF_ERROR(f.mtp_block(*st, Tensor{xm.data(), ElemType::kF32, c.hc_mult, c.hidden_size}, tok,
                                 {st->len - 1}, &lg).status());
  return std::vector<float>(lg.f32(), lg.f32() + c.vocab_size);
}

}  // namespace flashseek::forward
