// V4.1 DSpark draft on the GPU (the CUDA twin of draft.cpp, v41 §5): taps of the target forward
// and the per-stage draft rings (written by every target forward), and the block proposal: three
// window-only V4.1 blocks (window attention over the stage's draft ring plus bidirectional
// attention inside the block, their own MoE, mHC), final collapse/norm and the FP32 head on the
// device. The sequential Markov head: its [V, r] GEMV runs on the device per draft token (same dot
// order as the CPU), the row comes to the host for the chooser (which needs host rows anyway) and
// the add of the head logits; the confidence dot runs on the host on the [B, D] hidden rows.
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
    // The draft's linears run through the exactness kernel (same numerics as its FP32 copies).
    for (const auto& [v, name] : {std::pair<Vec*, const char*>{&A.wq_a, "attn.wq_a.weight"},
                                  {&A.wq_b, "attn.wq_b.weight"}, {&A.wkv, "attn.wkv.weight"},
                                  {&A.wo_a, "attn.wo_a.weight"}, {&A.wo_b, "attn.wo_b.weight"}})
      FS_RETURN_IF_ERROR(up_matrix(*v, p + name));
    for (Vec* v : {&A.q_norm, &A.kv_norm, &A.attn_sink, &A.rope_inv_freq}) FS_RETURN_IF_ERROR(up(*v));
    FfnWeights& F = L.ffn;
    FS_RETURN_IF_ERROR(up_matrix(F.gate, p + "ffn.gate.weight"));
    FS_RETURN_IF_ERROR(up(F.bias));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w1, p + "ffn.shared_experts.w1.weight"));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w2, p + "ffn.shared_experts.w2.weight"));
    FS_RETURN_IF_ERROR(up_matrix(F.s_w3, p + "ffn.shared_experts.w3.weight"));
    std::vector<DevArray<float>> stacks;
    FS_RETURN_IF_ERROR(up_experts(F.w1, F.w2, F.w3, p + "ffn.experts.", 0, stacks, dexperts_[s]));
    if (!stacks.empty()) dw1_[s] = std::move(stacks[0]), dw2_[s] = std::move(stacks[1]), dw3_[s] = std::move(stacks[2]);
    if (!F.tid2eid.empty()) FS_RETURN_IF_ERROR(dtid2eid_[s].upload(F.tid2eid.data(), F.tid2eid.size()));
  }
  // The Markov embedding/head run on the device (one [V, r] GEMV per draft token); the confidence
  // dot reads its embedding row from the checkpoint on the host.
  FS_RETURN_IF_ERROR(up_matrix(W.main_proj, "mtp.0.main_proj.weight"));
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

// Tap k (layer = dspark_target_layer_ids[k]): the plain mean of the streams entering the block
// (after its Engram), BF16 in reference numerics; taps [n_taps, T, D]. The mean is an hc collapse
// with weights 1/hc (exactly the CPU's sum / hc when hc is a power of two).
Status GpuModel::append_tap(int layer, GpuChunk& ctx, const float* X, float* taps) {
  const auto& c = config();
  const auto& ids = c.dspark_target_layer_ids;
  const auto it = std::find(ids.begin(), ids.end(), layer);
  if (it == ids.end()) return {};
  const int64_t k = it - ids.begin(), T = ctx.T, hc = c.hc_mult, D = c.hidden_size;
  FS_ASSIGN_OR_RETURN(float* w, scratch<float>("dspark_tap_w", T * hc));
  const std::vector<float> mean(size_t(T * hc), 1.0f / float(hc));
  FS_RETURN_IF_ERROR(upload(w, mean.data(), mean.size() * 4));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse(X, w, taps + k * T * D, T, hc, D, ref(), stream_));
  return {};
}

// ctx = rms_norm(main_proj · [taps of a position]); per stage: kv_norm(wkv ctx), RoPE, FP8 (ref),
// written to the stage's ring at the position (draft.cpp write_draft_rings).
Status GpuModel::write_draft_rings(GpuChunk& ctx, const float* taps) {
  const auto& c = config();
  const DSparkWeights& W = w_.dspark;
  const bool R = ref();
  const int64_t T = ctx.T, D = c.hidden_size, Dh = c.head_dim, nt = int64_t(c.dspark_target_layer_ids.size());
  const float eps = float(c.rms_norm_eps);
  for (const GpuSeg& g : ctx.segs)
    if (g.st->draft_rings.size() != W.stages.size()) return internal_error("GPU state has no DSpark draft rings");
  FS_ASSIGN_OR_RETURN(float* tin, scratch<float>("dspark_tin", T * nt * D));
  FS_ASSIGN_OR_RETURN(float* cx, scratch<float>("dspark_cx", T * D));
  FS_ASSIGN_OR_RETURN(float* kv, scratch<float>("dspark_kv", T * Dh));
  // [n_taps, T, D] → [T, n_taps·D]
  for (int64_t k = 0; k < nt; ++k)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy2d_async(tin + k * D, size_t(nt * D) * 4, taps + k * T * D,
                                                      size_t(D) * 4, size_t(D) * 4, size_t(T),
                                                      cudaMemcpyDeviceToDevice, stream_));
  FS_RETURN_IF_ERROR(linear(tin, d(W.main_proj), T, nt * D, D, cx, act_block_, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(cx, d(W.main_norm), cx, T, D, eps, R, stream_));
  for (size_t s = 0; s < W.stages.size(); ++s) {
    const AttentionWeights& A = W.stages[s].attn;
    FS_RETURN_IF_ERROR(linear(cx, d(A.wkv), T, D, Dh, kv, act_block_, R));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(kv, d(A.kv_norm), kv, T, Dh, eps, R, stream_));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(kv, ctx.d_pos, d(A.rope_inv_freq), T, 1, Dh, c.rope_head_dim, false, R, stream_));
    if (R) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(kv, T, Dh, Dh, 32, cd::QuantSim::kFp8, stream_));
    for (const GpuSeg& g : ctx.segs) {
      const int64_t rs = g.st->ring_size;
      FS_CUDA_RETURN_IF_ERROR(cd::launch_ring_write(g.st->draft_rings[s].get(), kv + g.row0 * Dh, g.d_pos,
                                                    std::max<int64_t>(0, g.T - rs), g.T, rs, Dh, stream_));
    }
  }
  return {};
}

// One stage's attention over B block rows (positions a+1 … a+B, a = last committed): keys are
// the ring rows max(0, a−W+1) … a then every block row (no causal mask), as the CPU. Runs the
// model attention kernel with a one-key "window" (the oldest ring row, replicated per query row)
// and the remaining keys as a gathered "compressed" list selected in full.
Status GpuModel::draft_attention(int stage, GpuChunk& ctx, const float* a, float* out) {
  const auto& c = config();
  const AttentionWeights& A = w_.dspark.stages[size_t(stage)].attn;
  const bool R = ref();
  const int64_t B = ctx.T, D = c.hidden_size, H = c.num_heads, Dh = c.head_dim, Dr = c.rope_head_dim;
  const GpuSeg& g = ctx.segs.at(0);  // a proposal is one sequence's block
  const int64_t Rq = c.q_lora_rank, ring = g.st->ring_size, last = g.start - 1;
  const float eps = float(c.rms_norm_eps);
  const float* inv_freq = d(A.rope_inv_freq);
  FS_ASSIGN_OR_RETURN(float* qlat, scratch<float>("dr_qlat", B * Rq));
  FS_ASSIGN_OR_RETURN(float* q, scratch<float>("dr_q", B * H * Dh));
  FS_ASSIGN_OR_RETURN(float* kv, scratch<float>("dr_kv", B * Dh));
  FS_RETURN_IF_ERROR(linear(a, d(A.wq_a), B, D, Rq, qlat, act_block_, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(qlat, d(A.q_norm), qlat, B, Rq, eps, R, stream_));
  FS_RETURN_IF_ERROR(linear(qlat, d(A.wq_b), B, Rq, H * Dh, q, act_block_, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(q, ctx.d_pos, inv_freq, B, H, Dh, Dr, false, R, stream_));
  FS_RETURN_IF_ERROR(linear(a, d(A.wkv), B, D, Dh, kv, act_block_, R));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(kv, d(A.kv_norm), kv, B, Dh, eps, R, stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_rope(kv, ctx.d_pos, inv_freq, B, 1, Dh, Dr, false, R, stream_));
  if (R) FS_CUDA_RETURN_IF_ERROR(cd::launch_quant_sim(kv, B, Dh, Dh, 32, cd::QuantSim::kFp8, stream_));

  const int64_t nw = std::min(last + 1, c.window), first = last - nw + 1, n = nw + B;
  const float* rg = g.st->draft_rings[size_t(stage)].get();
  FS_ASSIGN_OR_RETURN(float* keys, scratch<float>("dr_keys", n * Dh));     // ring rows first+1 … a, block rows
  FS_ASSIGN_OR_RETURN(float* k0, scratch<float>("dr_k0", B * Dh));         // ring row `first`, per query row
  FS_ASSIGN_OR_RETURN(int32_t* sel, scratch<int32_t>("dr_sel", B * n));
  FS_ASSIGN_OR_RETURN(int32_t* sel_n, scratch<int32_t>("dr_sel_n", B));
  for (int64_t j = 0; j < B; ++j)
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(k0 + j * Dh, rg + (first % ring) * Dh, size_t(Dh) * 4, cudaMemcpyDeviceToDevice, stream_));
  for (int64_t p = first + 1; p <= last;) {  // at most two contiguous runs of the ring
    const int64_t slot = p % ring, cnt = std::min(last + 1 - p, ring - slot);
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(keys + (p - first - 1) * Dh, rg + slot * Dh, size_t(cnt * Dh) * 4,
                                            cudaMemcpyDeviceToDevice, stream_));
    p += cnt;
  }
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(keys + (nw - 1) * Dh, kv, size_t(B * Dh) * 4, cudaMemcpyDeviceToDevice, stream_));
  std::vector<int32_t> hsel(size_t(B * (n - 1))), hn(size_t(B), int32_t(n - 1));
  for (int64_t j = 0; j < B; ++j)
    for (int64_t i = 0; i < n - 1; ++i) hsel[size_t(j * (n - 1) + i)] = int32_t(i);
  FS_RETURN_IF_ERROR(upload(sel, hsel.data(), hsel.size() * 4));
  FS_RETURN_IF_ERROR(upload(sel_n, hn.data(), hn.size() * 4));

  FS_ASSIGN_OR_RETURN(float* o, scratch<float>("dr_o", B * H * Dh));
  cd::ModelAttnArgs p;
  p.q = q, p.kv_chunk = k0, p.ring = k0, p.ckv = keys, p.topk = sel, p.topk_n = sel_n, p.topk_stride = n - 1;
  p.ratio = 1, p.sink = d(A.attn_sink), p.out = o;
  p.T = B, p.H = H, p.Dh = Dh, p.window = 1, p.ring_size = B, p.start = g.start, p.max_keys = n;
  p.scale = 1.0f / std::sqrt(float(Dh));
  p.bf16 = R;
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_attention(p, stream_));

  return output_projection(A, "dr_z", ctx.d_pos, B, H, c.o_groups, o, out, R);
}

// The stage's MoE (gpu_moe.cpp with the draft's expert count and top-k).
Status GpuModel::draft_moe(int stage, GpuChunk& ctx, const float* m, float* out) {
  const auto& c = config();
  const FfnWeights& F = w_.dspark.stages[size_t(stage)].ffn;
  const bool R = ref();
  const int64_t T = ctx.T, D = c.hidden_size, I = c.moe_inter_dim;
  const int64_t E = c.dspark_n_routed_experts, K = c.dspark_n_experts_per_tok, TK = T * K;
  const size_t s = size_t(stage);
  int32_t* sel = nullptr;
  float* wt = nullptr;
  FS_RETURN_IF_ERROR(route(F, dtid2eid_[s].get(), "dr_moe_", ctx, m, E, K, sel, wt));
  FS_ASSIGN_OR_RETURN(float* g, scratch<float>("dr_moe_g", TK * I));
  FS_ASSIGN_OR_RETURN(float* u, scratch<float>("dr_moe_u", TK * I));
  FS_ASSIGN_OR_RETURN(float* h, scratch<float>("dr_moe_h", TK * I));
  auto expert = [&](int64_t rows, const float* w1, const float* w3, const float* w2, const int32_t* sl, int64_t div,
                    const float* weights, int64_t act, float* y) -> Status {
    FS_RETURN_IF_ERROR(linear(m, w1, rows, D, I, g, act, R, false, sl, div));
    FS_RETURN_IF_ERROR(linear(m, w3, rows, D, I, u, act, R, false, sl, div));
    FS_CUDA_RETURN_IF_ERROR(cd::launch_swiglu(g, u, h, weights, rows, I, float(c.swiglu_limit), R, stream_));
    return linear(h, w2, rows, I, D, y, act, R, false, sl, 1);
  };
  FS_ASSIGN_OR_RETURN(float* ybuf, scratch<float>("dr_moe_y", TK * D));
  FS_ASSIGN_OR_RETURN(float* ys, scratch<float>("dr_moe_ys", T * D));
  const auto& ek = dexperts_[s];  // w1, w2, w3: FP32 stacks or as stored
  FS_RETURN_IF_ERROR(expert(TK, ek[0], ek[2], ek[1], sel, K, wt, expert_act_block_, ybuf));
  FS_RETURN_IF_ERROR(expert(T, d(F.s_w1), d(F.s_w3), d(F.s_w2), nullptr, 1, nullptr, act_block_, ys));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_moe_combine(ybuf, ys, out, T, K, D, R, stream_));
  return {};
}

// A draft stage is a V4.1 mHC block (the draft only exists in V4.1 checkpoints) with the draft's
// attention and MoE.
Status GpuModel::draft_block(int stage, GpuChunk& ctx, float* X, float* pre_in) {
  return mhc_block(
      w_.dspark.stages[size_t(stage)], "dr_", ctx.T, X, pre_in,
      [&](const float* a, float* f) { return draft_attention(stage, ctx, a, f); },
      [&](const float* a, float* f) { return draft_moe(stage, ctx, a, f); });
}

Result<DraftBlock> GpuModel::propose(const SequenceState& state, int32_t x0, const DraftChooser& choose) const {
  const auto* st = dynamic_cast<const GpuSequenceState*>(&state);
  if (!st) return invalid_argument("propose: not a GPU sequence state");
  if (!w_.has_dspark) return invalid_argument("propose: the checkpoint has no DSpark draft (mtp.*)");
  if (!has_draft()) return Status(StatusCode::kUnimplemented, "propose: not on a tensor-parallel rank");
  if (!st->error.ok()) return st->error;
  if (st->len < 1) return invalid_argument("propose: the sequence has no committed token yet");
  if (x0 < 0 || x0 >= config().vocab_size)
    return invalid_argument("propose: anchor token {} outside [0, {})", x0, config().vocab_size);
  // Scratch buffers are model-owned (like forward, propose is not thread-safe); the state is
  // only read.
  return const_cast<GpuModel*>(this)->propose_impl(*st, x0, choose);
}

Result<DraftBlock> GpuModel::propose_impl(const GpuSequenceState& st, int32_t x0, const DraftChooser& choose) {
  FS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const auto& c = config();
  const int64_t V = c.vocab_size, D = c.hidden_size, hc = c.hc_mult, B = c.dspark_block_size;
  const int64_t r = c.dspark_markov_rank;
  const DSparkWeights& W = w_.dspark;
  std::vector<int32_t> ids(size_t(B), int32_t(c.dspark_noise_token_id));
  ids[0] = x0;
  GpuChunk ctx;
  GpuSeg g;
  g.st = const_cast<GpuSequenceState*>(&st);  // draft_attention reads the draft rings only
  g.tokens = ids;
  g.start = st.len;
  g.T = B;
  for (int64_t j = 0; j < B; ++j) g.pos.push_back(st.len + j);
  FS_ASSIGN_OR_RETURN(int32_t* d_tok, scratch<int32_t>("dr_tokens", B));
  FS_ASSIGN_OR_RETURN(int64_t* d_pos, scratch<int64_t>("dr_pos", B));
  FS_RETURN_IF_ERROR(upload(d_tok, ids.data(), size_t(B) * 4));
  FS_RETURN_IF_ERROR(upload(d_pos, g.pos.data(), size_t(B) * 8));
  g.d_tokens = ctx.d_tokens = d_tok;
  g.d_pos = ctx.d_pos = d_pos;
  ctx.T = B;
  ctx.segs.push_back(std::move(g));
  FS_ASSIGN_OR_RETURN(float* X, scratch<float>("dr_X", B * hc * D));
  FS_RETURN_IF_ERROR(embed_rows(d(w_.embed), d_tok, X, B, hc, D));
  std::vector<float> pre_h(size_t(B * hc), 0.0f);
  for (int64_t j = 0; j < B; ++j) pre_h[size_t(j * hc)] = 1.0f;
  FS_ASSIGN_OR_RETURN(float* pre, scratch<float>("dr_pre_in", B * hc));
  FS_RETURN_IF_ERROR(upload(pre, pre_h.data(), pre_h.size() * 4));
  for (int s = 0; s < int(W.stages.size()); ++s) FS_RETURN_IF_ERROR(draft_block(s, ctx, X, pre));
  FS_ASSIGN_OR_RETURN(float* hf, scratch<float>("dr_hf", B * D));
  FS_ASSIGN_OR_RETURN(float* y, scratch<float>("dr_y", B * D));
  FS_ASSIGN_OR_RETURN(float* U, scratch<float>("dr_U", B * V));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_hc_collapse(X, pre, hf, B, hc, D, ref(), stream_));
  FS_CUDA_RETURN_IF_ERROR(cd::launch_model_rms_norm(hf, d(W.norm), y, B, D, float(c.rms_norm_eps), ref(), stream_));
  FS_RETURN_IF_ERROR(linear(y, d(w_.head), B, D, V, U, 0, false));
  std::vector<float> hU(size_t(B * V)), hhf(size_t(B * D));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(hU.data(), U, hU.size() * 4, cudaMemcpyDeviceToHost, stream_));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(hhf.data(), hf, hhf.size() * 4, cudaMemcpyDeviceToHost, stream_));
  FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  FS_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  FS_RETURN_IF_ERROR(staging_.rewind());  // the uploads above have completed

  // Sequential Markov correction: ℓ_i = U_{i−1} + Hm · E[y_{i−1}] (the GEMV on the device, the
  // same dot order as ops::linear; the chooser needs the row on the host anyway); confidence on
  // [hf_{i−1} ‖ e_i] (draft.cpp).
  DraftBlock out;
  out.logits.resize(size_t(B * V));
  int32_t prev = x0;
  std::vector<float> cin(size_t(D + r));
  FS_ASSIGN_OR_RETURN(float* ml, scratch<float>("dr_markov", V));
  FS_ASSIGN_OR_RETURN(float* me, scratch<float>("dr_markov_e", r));
  FS_ASSIGN_OR_RETURN(int32_t* zero, scratch<int32_t>("dr_zero", 1));
  FS_CUDA_RETURN_IF_ERROR(ops::cuda::memset_async(zero, 0, 4, stream_));
  const NativeMatrix* me_stored = native(markov_embed_key_);
  const std::string me_name = fmt::format("mtp.{}.markov_head.embed.weight", W.stages.size() - 1);
  std::vector<float> e(static_cast<size_t>(r));
  for (int64_t i = 1; i <= B; ++i) {
    FS_RETURN_IF_ERROR(ck_->dequant_rows(me_name, prev, prev + 1, e));  // the confidence dot's row
    float* l = out.logits.data() + (i - 1) * V;
    const float* x = me;
    if (me_stored) {  // as stored: row `prev` expanded into `me` (the embedding kernel, token 0 + row0)
      FS_CUDA_RETURN_IF_ERROR(cd::launch_embed_w(me_stored->ref(prev), zero, me, 1, 1, r, stream_));
    } else {  // FP32 copy: the row itself
      x = markov_embed_key_ + int64_t(prev) * r;
    }
    FS_RETURN_IF_ERROR(linear(x, markov_head_key_, 1, r, V, ml, 0, false));
    FS_CUDA_RETURN_IF_ERROR(ops::cuda::memcpy_async(l, ml, size_t(V) * 4, cudaMemcpyDeviceToHost, stream_));
    FS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    for (int64_t v = 0; v < V; ++v) l[v] += hU[size_t((i - 1) * V + v)];
    std::copy_n(hhf.data() + (i - 1) * D, D, cin.data());
    std::copy_n(e.data(), r, cin.data() + D);
    out.confidence.push_back(ops::dot_f32(W.confidence.data(), cin.data(), D + r));
    const std::span<const float> row(l, size_t(V));
    prev = choose ? choose(i, row) : int32_t(std::max_element(l, l + V) - l);
    if (prev < 0 || prev >= V) return invalid_argument("propose: chooser returned token {} outside [0, {})", prev, V);
    out.tokens.push_back(prev);
  }
  return out;
}

}  // namespace flashseek::forward::gpu
#endif
