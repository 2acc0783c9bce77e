// V4 MTP (v4 §3.8) on the GPU, one draft per step: the block itself is Forward::mtp_block
// (forward/flow.cpp, shared with the CPU backend); here are its two CUDA steps (stream_add,
// mtp_attention), the state and the proposal (the CPU's forward/mtp.cpp: CpuOps::mtp_advance,
// CpuModel::mtp_logits). The block predicts token t+2 at position t from the backbone's final
// streams X_t and the embedding of token t+1. Its
// window row of position p needs token p+1, so every forward completes the pairs its tokens close
// (the previous chunk's last position first) and the proposal runs the last pair on demand.
//
// State (GpuSequenceState): mtp_ring [ring_size, Dh] (the block's window KV, slot p % ring_size,
// like the CPU's mtp_ring) and mtp_hist, a ring of kGpuMtpHistRows = 1 + kMaxRollback final-stream
// rows [hc·D] (positions [mtp_lo, len) valid; the CPU keeps the same rows as mtp_hist_x, oldest
// first). Rollback keeps both (spare ring slots; mtp_lo bounds the history); snapshots map them
// to / from the CPU fields.
#include "backends/cuda/gpu_model.h"

#if FLASHSEEK_HAVE_CUDA
#include <algorithm>
#include <cmath>

#include "backends/cuda/gpu_impl.h"
#include "ops/cuda/model/model_kernels.h"

namespace flashseek::forward::gpu {
namespace cd = ops::cuda::detail;

Status GpuModel::upload_mtp_weights() {
  MtpWeights& M = w_.mtp;
  LayerWeights& L = M.block;
  AttentionWeights& A = L.attn;
  const std::string p = "mtp.0.";
  if (A.has_compressor || A.has_indexer) return internal_error("V4 MTP block: expected a window-only block");
  // As the backbone's layers (upload_weights): linears with FP8 activations may run through the
  // block-scaled GEMV (act_block_), the grouped wo_a and the router through the exactness kernel.
  using R = GpuLinearRole;  // GpuLoadOptions::fast_linears: the roles that may use the GEMVs
  const auto fa = [&](R r) { return fast_act(r, act_block_); };
  FS_RETURN_IF_ERROR(up_f32_matrix(L.hc_attn_fn, p + "hc_attn_fn"));
  FS_RETURN_IF_ERROR(up_f32_matrix(L.hc_ffn_fn, p + "hc_ffn_fn"));
  FS_RETURN_IF_ERROR(up_matrix(A.wq_a, p + "attn.wq_a.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_matrix(A.wq_b, p + "attn.wq_b.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_matrix(A.wkv, p + "attn.wkv.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_matrix(A.wo_a, p + "attn.wo_a.weight"));
  FS_RETURN_IF_ERROR(up_matrix(A.wo_b, p + "attn.wo_b.weight", fa(R::kDraft)));
  for (Vec* v : {&L.hc_attn_base, &L.hc_attn_scale, &L.hc_ffn_base, &L.hc_ffn_scale, &L.attn_norm, &L.ffn_norm,
                 &A.q_norm, &A.kv_norm, &A.attn_sink, &A.rope_inv_freq})
    FS_RETURN_IF_ERROR(up(*v));
  FfnWeights& F = L.ffn;
  FS_RETURN_IF_ERROR(up_matrix(F.gate, p + "ffn.gate.weight"));
  FS_RETURN_IF_ERROR(up(F.bias));
  FS_RETURN_IF_ERROR(up_matrix(F.s_w1, p + "ffn.shared_experts.w1.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_matrix(F.s_w2, p + "ffn.shared_experts.w2.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_matrix(F.s_w3, p + "ffn.shared_experts.w3.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_experts(F.w1, F.w2, F.w3, p + "ffn.experts.", fast_act(R::kDraft, expert_act_block_),
                                mexpert_stacks_, mexperts_));
  if (!F.tid2eid.empty()) FS_RETURN_IF_ERROR(mtid2eid_.upload(F.tid2eid.data(), F.tid2eid.size()));
  if (!mexperts_[0] || !mexperts_[1] || !mexperts_[2]) return internal_error("V4 MTP block: routed experts missing");
  FS_RETURN_IF_ERROR(up_matrix(M.e_proj, p + "e_proj.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_matrix(M.h_proj, p + "h_proj.weight", fa(R::kDraft)));
  FS_RETURN_IF_ERROR(up_f32_matrix(M.hc_head_fn, p + "hc_head_fn"));
  for (Vec* v : {&M.enorm, &M.hnorm, &M.norm, &M.hc_head_base, &M.hc_head_scale}) FS_RETURN_IF_ERROR(up(*v));
  return {};
}

// X += f per stream with one rounding: the mHC post kernel with post = 1 and comb = I computes
// bf16?(1·f + X) exactly (for finite values the zero products add nothing; only the sign of an
// exact zero may differ), the CPU's bf16?(f + X). post and comb are uploaded on every call: a
// call may be recorded into a CUDA graph whose recording is discarded, so "uploaded once" could
// not be known here.
Status GpuModel::stream_add(const Tensor& f, const Tensor& X, int64_t rows, int64_t hc, int64_t dim, bool bf16) {
  std::vector<float> ones(size_t(rows * hc), 1.0f), eye(size_t(rows * hc * hc), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < hc; ++i) eye[size_t((r * hc + i) * hc + i)] = 1.0f;
  FS_ASSIGN_OR_RETURN(Tensor post, scratch("mtp_sum_post", ElemType::kF32, rows, hc));
  FS_ASSIGN_OR_RETURN(Tensor comb, scratch("mtp_sum_comb", ElemType::kF32, rows, hc * hc));
  FS_RETURN_IF_ERROR(upload(post, ones.data(), ones.size() * 4));
  FS_RETURN_IF_ERROR(upload(comb, eye.data(), eye.size() * 4));
  return hc_post(f, X, post, comb, rows, hc, dim, bf16);
}

// The MTP block's window attention (the backbone's window-layer kernel): key s of row r is
// kv[s − pos[0]] when s >= pos[0], else mtp_ring[s % ring_size]. Every head: the block is whole
// on the rank that runs it (rank 0 of a tensor-parallel model).
Status GpuModel::mtp_attention(const SequenceState& state, const Tensor& q, const Tensor& kv,
                               const std::vector<int64_t>& pos, const Vec& sink, const Tensor& out, bool bf16) {
  const auto& st = static_cast<const GpuSequenceState&>(state);
  if (!st.mtp_ring.get()) return internal_error("mtp_attention: the GPU state has no MTP ring");
  const auto& c = config();
  cd::ModelAttnArgs p;
  p.q = q.f32(), p.kv_chunk = kv.f32(), p.ring = st.mtp_ring.get(), p.sink = d(sink), p.out = out.f32();
  p.T = int64_t(pos.size()), p.H = c.num_heads, p.Dh = c.head_dim, p.window = c.window, p.ring_size = st.ring_size;
  p.start = pos[0];
  p.max_keys = c.window;
  p.scale = 1.0f / std::sqrt(float(c.head_dim));
  p.bf16 = bf16;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_attention(p, stream_));
  return {};
}

Status GpuModel::mtp_advance(FwdSeg& seg, const Tensor& X_seg) {
  auto& st = *static_cast<GpuSequenceState*>(seg.st);
  const auto& c = config();
  const int64_t D = c.hidden_size, hc = c.hc_mult, row = hc * D, T = seg.T, Dh = c.head_dim;
  const int64_t HR = kGpuMtpHistRows, rs = st.ring_size;
  if (!st.mtp_hist.get() || st.mtp_hist.capacity() < size_t(HR * row))
    return internal_error("mtp_advance: the GPU state has no MTP history");
  // Pairs this chunk completes: (start−1, tokens[0]) when start > 0, then (p, token p+1) inside.
  const int64_t s0 = seg.start > 0 ? 0 : 1, n = T - s0;
  if (n > 0) {
    if (s0 == 0 && seg.start - 1 < st.mtp_lo)
      return internal_error("mtp_advance: MTP history starts at {}, position {} needed", st.mtp_lo, seg.start - 1);
    FS_ASSIGN_OR_RETURN(Tensor xm, scratch("mtp_xm", ElemType::kF32, n * hc, D));
    if (s0 == 0)  // read before this chunk's rows overwrite the history slots
      FS_RETURN_IF_ERROR(copy(xm, Tensor{st.mtp_hist.get() + ((seg.start - 1) % HR) * row, ElemType::kF32, hc, D},
                              size_t(row) * 4));
    if (T > 1) FS_RETURN_IF_ERROR(copy(xm.rows_from((1 - s0) * hc), X_seg, size_t((T - 1) * row) * 4));
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) pos[size_t(j)] = seg.start - 1 + s0 + j;
    Forward f(flow_params(), *this);
    FS_ASSIGN_OR_RETURN(Tensor kv, f.mtp_block(st, xm, seg.tokens_d.rows_from(s0, n), pos, nullptr));
    FS_ASSIGN_OR_RETURN(Tensor pd, scratch("mtp_pos", ElemType::kI64, n));  // the block's positions
    FS_CUDA_RETURN_IF_ERROR(cd::launch_ring_write(st.mtp_ring.get(), kv.f32(), pd.i64(), std::max<int64_t>(0, n - rs),
                                                  n, rs, Dh, stream_));
  }
  FS_CUDA_RETURN_IF_ERROR(cd::launch_ring_write(st.mtp_hist.get(), X_seg.f32(), seg.pos_d.i64(),
                                                std::max<int64_t>(0, T - HR), T, HR, row, stream_));
  st.mtp_lo = std::max(st.mtp_lo, seg.start + T - HR);
  return {};
}

Result<DraftBlock> GpuModel::propose_mtp(const GpuSequenceState& st, int32_t x0, const DraftChooser& choose) {
  const auto& c = config();
  const int64_t D = c.hidden_size, hc = c.hc_mult, row = hc * D, V = c.vocab_size, a = st.len - 1;
  if (!st.mtp_hist.get() || a < st.mtp_lo)
    return internal_error("propose: MTP history starts at {}, position {} needed", st.mtp_lo, a);
  FS_ASSIGN_OR_RETURN(Tensor xm, scratch("mtp_xm", ElemType::kF32, hc, D));
  FS_RETURN_IF_ERROR(copy(xm, Tensor{st.mtp_hist.get() + (a % kGpuMtpHistRows) * row, ElemType::kF32, hc, D},
                          size_t(row) * 4));
  FS_ASSIGN_OR_RETURN(Tensor tok, scratch("mtp_tokens", ElemType::kI32, 1));
  FS_RETURN_IF_ERROR(upload(tok, &x0, 4));
  Tensor lg;
  Forward f(flow_params(), *this);
  FS_RETURN_IF_ERROR(f.mtp_block(st, xm, tok, {a}, &lg).status());
  DraftBlock out;
  out.logits.resize(size_t(V));
  FS_RETURN_IF_ERROR(download_now(out.logits.data(), lg, size_t(V) * 4));
  const std::span<const float> r(out.logits);
  const int32_t y = choose ? choose(1, r) : int32_t(std::max_element(r.begin(), r.end()) - r.begin());
  if (y < 0 || y >= V) return invalid_argument("propose: chooser returned token {} outside [0, {})", y, V);
  out.tokens.push_back(y);
  out.confidence.push_back(0.0f);  // MTP has no confidence head
  return out;
}

Status GpuModel::mtp_new_sequence(GpuSequenceState& st) const {
  const auto& c = config();
  FS_RETURN_IF_ERROR(st.mtp_ring.zeros(size_t(st.ring_size * c.head_dim)));
  FS_RETURN_IF_ERROR(st.mtp_hist.zeros(size_t(kGpuMtpHistRows * c.hc_mult * c.hidden_size)));
  st.mtp_lo = 0;
  return {};
}

// The CPU's rule (forward/rollback.cpp): the kept positions' history must hold position L − 1.
Status GpuModel::mtp_check_rollback(const GpuSequenceState& st, int64_t L) const {
  if (!st.mtp_hist.get()) return {};
  if (L > 0 && st.mtp_lo >= L) return out_of_range("rollback: MTP history too short");
  return {};
}

Status GpuModel::mtp_export(const GpuSequenceState& st, CpuSequenceState& out) const {
  if (!mtp_state()) return {};
  const auto& c = config();
  const int64_t row = c.hc_mult * c.hidden_size, ring = st.ring_size * c.head_dim, len = st.len;
  const int64_t lo = std::max<int64_t>(st.mtp_lo, 0);
  if (!st.mtp_ring.get() || st.mtp_ring.capacity() < size_t(ring) || !st.mtp_hist.get() ||
      st.mtp_hist.capacity() < size_t(kGpuMtpHistRows * row) || lo > len || len - lo > kGpuMtpHistRows)
    return internal_error("export_state: MTP state with history from {} (length {})", st.mtp_lo, len);
  out.mtp_ring.resize(size_t(ring));
  FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.mtp_ring.data(), st.mtp_ring.get(), size_t(ring) * 4,
                                          cudaMemcpyDeviceToHost, stream_));
  out.mtp_hist_x.resize(size_t((len - lo) * row));
  for (int64_t p = lo; p < len;) {  // at most two contiguous runs of the history ring
    const int64_t slot = p % kGpuMtpHistRows, k = std::min(len - p, kGpuMtpHistRows - slot);
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.mtp_hist_x.data() + (p - lo) * row, st.mtp_hist.get() + slot * row,
                                            size_t(k * row) * 4, cudaMemcpyDeviceToHost, stream_));
    p += k;
  }
  return {};
}

// After check_state_geometry: mtp_ring is [ring_size, Dh], mtp_hist_x holds 1 … kGpuMtpHistRows
// rows (0 when empty) of positions [len − n, len).
Status GpuModel::mtp_import(const CpuSequenceState& s, GpuSequenceState& st) const {
  if (!mtp_state()) return {};
  const auto& c = config();
  const int64_t row = c.hc_mult * c.hidden_size, ring = st.ring_size * c.head_dim;
  const int64_t n = int64_t(s.mtp_hist_x.size()) / row;
  if (int64_t(s.mtp_ring.size()) != ring || n > kGpuMtpHistRows || n > s.len || int64_t(s.mtp_hist_x.size()) != n * row)
    return invalid_argument("import_state: MTP state of {} ring floats and {} history floats", s.mtp_ring.size(),
                            s.mtp_hist_x.size());
  FS_RETURN_IF_ERROR(mtp_new_sequence(st));
  FS_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(st.mtp_ring.get(), s.mtp_ring.data(), size_t(ring) * 4, cudaMemcpyHostToDevice));
  const int64_t lo = s.len - n;
  for (int64_t p = lo; p < s.len;) {
    const int64_t slot = p % kGpuMtpHistRows, k = std::min(s.len - p, kGpuMtpHistRows - slot);
    FS_CUDA_RETURN_IF_ERROR(cudaMemcpy(st.mtp_hist.get() + slot * row, s.mtp_hist_x.data() + (p - lo) * row,
                                       size_t(k * row) * 4, cudaMemcpyHostToDevice));
    p += k;
  }
  st.mtp_lo = lo;
  return {};
}

}  // namespace flashseek::forward::gpu
#endif
