// MoE of one layer over one chunk (v4 §3.6, v41 §2 item 7): FP32 router, selection-only bias or
// V4 hash routing, clamped SwiGLU routed experts (routing weight applied before w2) and the
// shared expert; routed outputs summed in ascending expert id, then the shared output.
#include <algorithm>

#include "core/numeric.h"
#include "forward/cpu_model.h"
#include "ops/linear.h"
#include "ops/moe.h"
#include "ops/quant.h"

namespace flashseek::forward {

void CpuModel::moe(const FfnWeights& F, int64_t E, int64_t K, std::span<const int32_t> tokens,
                   const std::vector<float>& m, std::vector<float>& out) const {
  const auto& c = config();
  const bool R = ref(), v41 = c.is_v41();
  const int64_t T = int64_t(tokens.size()), D = c.hidden_size;
  const int64_t I = c.moe_inter_dim;
  const float limit = float(c.swiglu_limit);

  std::vector<float> logits;
  linear(m, F.gate, T, D, E, logits, 0, false, 0);  // FP32 router: never perturbed
  std::vector<int32_t> sel(size_t(T * K));
  std::vector<float> wt(size_t(T * K));
  for (int64_t t = 0; t < T; ++t) {
    ops::RouteParams p{logits.data() + t * E, F.bias.empty() ? nullptr : F.bias.data(), nullptr, E, K};
    if (!F.tid2eid.empty()) p.hash_ids = F.tid2eid.data() + int64_t(tokens[t]) * K;
    p.gate_temp = float(c.gate_temp);
    p.sqrtsoftplus = c.scoring_func == "sqrtsoftplus";
    p.norm_topk = c.norm_topk_prob;
    p.renorm_eps = v41;
    p.route_scale = float(c.route_scale);
    p.sel = sel.data() + t * K;
    p.weight = wt.data() + t * K;
    ops::route(p);
  }

  // One expert's SwiGLU over its rows: y = w2 · bf16?(silu(min(w1 x, L)) · clamp(w3 x) · weight).
  auto expert = [&](const std::vector<float>& x, int64_t rows, const Vec& w1, const Vec& w3, const Vec& w2,
                    const float* weights, int64_t act, int64_t id, std::vector<float>& y) {
    std::vector<float> g, u, h(size_t(rows * I));
    linear(x, w1, rows, D, I, g, act, R, dot_key(F.block, DotOp::kW1, id));
    linear(x, w3, rows, D, I, u, act, R, dot_key(F.block, DotOp::kW3, id));
    for (int64_t r = 0; r < rows; ++r)
      ops::swiglu(g.data() + r * I, u.data() + r * I, h.data() + r * I, I, limit, weights ? weights[r] : 1.0f);
    if (R) ops::round_bf16_inplace(h.data(), rows * I);
    linear(h, w2, rows, I, D, y, act, R, dot_key(F.block, DotOp::kW2, id));
  };

  // Routed experts: gather each expert's rows; ybuf[t, slot] keeps outputs in selection slots,
  // which are in ascending expert id, so the final sum order is fixed per token.
  std::vector<float> ybuf(size_t(T * K * D), 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < T * K; ++i)
      if (sel[i] == e) slots.push_back(i);
    if (slots.empty()) continue;
    const int64_t n = int64_t(slots.size());
    std::vector<float> x(static_cast<size_t>(n * D)), wv(static_cast<size_t>(n)), y;
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(m.data() + (slots[r] / K) * D, D, x.data() + r * D);
      wv[r] = wt[slots[r]];
    }
    expert(x, n, F.w1[e], F.w3[e], F.w2[e], wv.data(), expert_act_block_, e, y);
    for (int64_t r = 0; r < n; ++r) std::copy_n(y.data() + r * D, D, ybuf.data() + slots[r] * D);
  }
  std::vector<float> ys;
  expert(m, T, F.s_w1, F.s_w3, F.s_w2, nullptr, act_block_, -1, ys);
  out.assign(size_t(T * D), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += ybuf[(t * K + k) * D + d];
      s += ys[t * D + d];
      out[t * D + d] = R ? round_bf16(s) : s;
    }
}

}  // namespace flashseek::forward
