// V4.1 DSpark draft (v41 §5): target taps and the per-stage window rings of ctx-derived KV
// (written by every target forward), and the block proposal with bidirectional block attention,
// the sequential Markov head and the confidence head.
#include <algorithm>
#include <cmath>

#include "core/numeric.h"
#include "forward/cpu_model.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"
#include "ops/quant.h"
#include "ops/rope.h"

namespace flashseek::forward {

void CpuModel::append_tap(int layer, int64_t T, const std::vector<float>& X, std::vector<float>& taps) const {
  const auto& c = config();
  const auto& ids = c.dspark_target_layer_ids;
  const auto it = std::find(ids.begin(), ids.end(), layer);
  if (it == ids.end()) return;
  const int64_t n_taps = int64_t(ids.size()), k = it - ids.begin(), D = c.hidden_size, hc = c.hc_mult;
  taps.resize(size_t(T * n_taps * D), 0.0f);
  // Plain mean over the streams entering the block (after its Engram), v41 §5.2.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float s = 0;
      for (int64_t i = 0; i < hc; ++i) s += X[(t * hc + i) * D + d];
      const float m = s / float(hc);
      taps[(t * n_taps + k) * D + d] = ref() ? round_bf16(m) : m;
    }
}

void CpuModel::write_draft_rings(const ChunkCtx& ctx, const std::vector<float>& taps) const {
  const auto& c = config();
  const DSparkWeights& W = w_.dspark;
  const bool R = ref();
  const int64_t T = ctx.T, D = c.hidden_size, Dh = c.head_dim, n_in = int64_t(c.dspark_target_layer_ids.size()) * D;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> cx, kv;
  linear(taps, W.main_proj, T, n_in, D, cx, act_block_, R, dot_key(c.num_layers, DotOp::kMainProj));
  ops::rms_norm({cx.data(), W.main_norm.data(), cx.data(), T, D, eps, R});
  const int64_t ring = ctx.st->ring_size;
  for (size_t s = 0; s < W.stages.size(); ++s) {
    const AttentionWeights& A = W.stages[s].attn;
    linear(cx, A.wkv, T, D, Dh, kv, act_block_, R, dot_key(A.block, DotOp::kWkv));
    ops::rms_norm({kv.data(), A.kv_norm.data(), kv.data(), T, Dh, eps, R});
    ops::apply_rope({kv.data(), ctx.pos.data(), A.rope_inv_freq.data(), T, 1, Dh, c.rope_head_dim, false, R});
    if (R) ops::fp8_quant_dequant(kv.data(), T, Dh, 32);
    auto& rg = ctx.st->draft_rings[s];
    for (int64_t t = std::max<int64_t>(0, T - ring); t < T; ++t)
      std::copy_n(kv.data() + t * Dh, Dh, rg.data() + (ctx.pos[t] % ring) * Dh);
  }
}

void CpuModel::draft_attention(int stage, const CpuSequenceState& st, const std::vector<int64_t>& pos,
                               const std::vector<float>& a, std::vector<float>& out) const {
  const auto& c = config();
  const AttentionWeights& A = w_.dspark.stages[size_t(stage)].attn;
  const int64_t B = int64_t(pos.size()), H = c.num_heads, Dh = c.head_dim, ring = st.ring_size;
  const int64_t last = pos[0] - 1;  // a: last committed position
  std::vector<float> qlat, q, kv;
  project_qkv(A, a, pos, qlat, q, kv);
  // Keys: committed ring rows max(0, a−W+1) … a, then every block row (no causal mask).
  std::vector<const float*> keys;
  for (int64_t p = std::max<int64_t>(0, last - c.window + 1); p <= last; ++p)
    keys.push_back(st.draft_rings[size_t(stage)].data() + (p % ring) * Dh);
  for (int64_t j = 0; j < B; ++j) keys.push_back(kv.data() + j * Dh);
  std::vector<float> o(size_t(B * H * Dh));
  for (int64_t i = 0; i < B; ++i) {
    ops::sparse_attention({q.data() + i * H * Dh, keys.data(), int64_t(keys.size()), H, Dh, A.attn_sink.data(),
                           1.0f / std::sqrt(float(Dh)), ref(), o.data() + i * H * Dh});
    if (ref()) ops::round_bf16_inplace(o.data() + i * H * Dh, H * Dh);
  }
  project_out(A, o, pos, out);
}

Result<DraftBlock> CpuModel::propose(const SequenceState& state, int32_t x0, const DraftChooser& choose) const {
  const auto* st = dynamic_cast<const CpuSequenceState*>(&state);
  if (!st) return invalid_argument("propose: not a CPU sequence state");
  if (st->len < 1) return invalid_argument("propose: the sequence has no committed token yet");
  const auto& c = config();
  if (!w_.has_dspark && w_.has_mtp) {  // V4 MTP: the draft for position a + 2 from (X_a, x0)
    if (x0 < 0 || x0 >= c.vocab_size)
      return invalid_argument("propose: anchor token {} outside [0, {})", x0, c.vocab_size);
    DraftBlock out;
    FS_ASSIGN_OR_RETURN(out.logits, mtp_logits(state, x0));
    const std::span<const float> row(out.logits);
    const int32_t y = choose ? choose(1, row)
                             : int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    if (y < 0 || y >= c.vocab_size)
      return invalid_argument("propose: chooser returned token {} outside [0, {})", y, c.vocab_size);
    out.tokens.push_back(y);
    out.confidence.push_back(0.0f);  // MTP has no confidence head
    return out;
  }
  if (!w_.has_dspark) return invalid_argument("propose: the checkpoint has no draft (mtp.*)");
  const int64_t V = c.vocab_size, D = c.hidden_size, hc = c.hc_mult, B = c.dspark_block_size;
  const int64_t r = c.dspark_markov_rank;
  if (x0 < 0 || x0 >= V) return invalid_argument("propose: anchor token {} outside [0, {})", x0, V);
  const DSparkWeights& W = w_.dspark;
  std::vector<int32_t> ids(size_t(B), int32_t(c.dspark_noise_token_id));
  ids[0] = x0;
  std::vector<int64_t> pos(static_cast<size_t>(B));
  for (int64_t j = 0; j < B; ++j) pos[j] = st->len + j;
  std::vector<float> X(size_t(B * hc * D)), pre(size_t(B * hc), 0.0f);
  for (int64_t j = 0; j < B; ++j) {
    pre[j * hc] = 1.0f;
    for (int64_t i = 0; i < hc; ++i) std::copy_n(w_.embed.data() + int64_t(ids[j]) * D, D, X.data() + (j * hc + i) * D);
  }
  for (int s = 0; s < int(W.stages.size()); ++s)
    block(W.stages[size_t(s)], B, X, pre, [&](const Vec& a, Vec& f) { draft_attention(s, *st, pos, a, f); },
          [&](const Vec& m, Vec& f) {
            moe(W.stages[size_t(s)].ffn, c.dspark_n_routed_experts, c.dspark_n_experts_per_tok, ids, m, f);
          });
  std::vector<float> hf(size_t(B * D)), y(size_t(B * D)), U(size_t(B * V));
  ops::hc_collapse(X.data(), pre.data(), hf.data(), B, hc, D, ref());
  ops::rms_norm({hf.data(), W.norm.data(), y.data(), B, D, float(c.rms_norm_eps), ref()});
  ops::linear({y.data(), w_.head.data(), U.data(), B, D, V});
  // Sequential Markov correction: ℓ_i = U_{i−1} + Hm · E[y_{i−1}]; confidence on [hf_{i−1} ‖ e_i].
  DraftBlock out;
  out.logits.resize(size_t(B * V));
  int32_t prev = x0;
  std::vector<float> cin(size_t(D + r));
  for (int64_t i = 1; i <= B; ++i) {
    const float* e = W.markov_embed.data() + int64_t(prev) * r;
    float* l = out.logits.data() + (i - 1) * V;
    ops::linear({e, W.markov_head.data(), l, 1, r, V});
    for (int64_t v = 0; v < V; ++v) l[v] += U[(i - 1) * V + v];
    std::copy_n(hf.data() + (i - 1) * D, D, cin.data());
    std::copy_n(e, r, cin.data() + D);
    out.confidence.push_back(ops::dot_f32(W.confidence.data(), cin.data(), D + r));
    const std::span<const float> row(l, size_t(V));
    prev = choose ? choose(i, row) : int32_t(std::max_element(l, l + V) - l);
    if (prev < 0 || prev >= V) return invalid_argument("propose: chooser returned token {} outside [0, {})", prev, V);
    out.tokens.push_back(prev);
  }
  return out;
}

}  // namespace flashseek::forward
