// Attention of one layer over one chunk (v4 §3.5, v41 §2 items 2–6 and §3.2): query and window
// KV, the compressor (kv sources), the indexer (index sources), sparse attention over
// [window ‖ selected compressed rows] with sinks, inverse RoPE and the grouped output projection.
#include <algorithm>
#include <cmath>

#include "core/numeric.h"
#include "core/thread_pool.h"
#include "forward/cpu_model.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/quant.h"
#include "ops/rope.h"

namespace flashseek::forward {

namespace {
void rope_rows(float* x, const int64_t* pos, int64_t rows, int64_t n_vec, int64_t vec, int64_t rope_dim,
               const Vec& inv_freq, bool inverse, bool bf16) {
  ops::RopeParams p{x, pos, inv_freq.data(), rows, n_vec, vec, rope_dim, inverse, bf16};
  ops::apply_rope(p);
}
}  // namespace

void CpuModel::project_qkv(const AttentionWeights& A, const std::vector<float>& a, const std::vector<int64_t>& pos,
                           std::vector<float>& qlat, std::vector<float>& q, std::vector<float>& kv) const {
  const auto& c = config();
  const bool R = ref(), v41 = c.is_v41();
  const int64_t T = int64_t(pos.size()), D = c.hidden_size, H = c.num_heads, Dh = c.head_dim;
  const int64_t Dr = c.rope_head_dim, Rq = c.q_lora_rank;
  const float eps = float(c.rms_norm_eps);
  // Query: q = RoPE(wq_b(q_norm(wq_a a))) (+ V4's per-head norm before RoPE).
  linear(a, A.wq_a, T, D, Rq, qlat, act_block_, R, dot_key(A.block, DotOp::kWqA));
  ops::rms_norm({qlat.data(), A.q_norm.data(), qlat.data(), T, Rq, eps, R});
  linear(qlat, A.wq_b, T, Rq, H * Dh, q, act_block_, R, dot_key(A.block, DotOp::kWqB));
  if (!v41) {
    if (R) ops::rms_norm_bf16_heads(q.data(), T * H, Dh, eps);
    else ops::rms_norm({q.data(), nullptr, q.data(), T * H, Dh, eps, false});
  }
  rope_rows(q.data(), pos.data(), T, H, Dh, Dr, A.rope_inv_freq, false, R);
  // Window KV: kv_norm(wkv a), RoPE, FP8 simulation (reference numerics).
  linear(a, A.wkv, T, D, Dh, kv, act_block_, R, dot_key(A.block, DotOp::kWkv));
  ops::rms_norm({kv.data(), A.kv_norm.data(), kv.data(), T, Dh, eps, R});
  rope_rows(kv.data(), pos.data(), T, 1, Dh, Dr, A.rope_inv_freq, false, R);
  if (R && v41) ops::fp8_quant_dequant(kv.data(), T, Dh, 32);  // whole vector, RoPE tail included
  if (R && !v41)
    for (int64_t t = 0; t < T; ++t) ops::fp8_quant_dequant(kv.data() + t * Dh, 1, Dh - Dr, 64);
}

void CpuModel::project_out(const AttentionWeights& A, std::vector<float>& o, const std::vector<int64_t>& pos,
                           std::vector<float>& out) const {
  const auto& c = config();
  const bool R = ref();
  const int64_t T = int64_t(pos.size()), D = c.hidden_size, H = c.num_heads, Dh = c.head_dim;
  rope_rows(o.data(), pos.data(), T, H, Dh, c.rope_head_dim, A.rope_inv_freq, true, R);
  // Grouped output projection: group g = heads [g·H/G, (g+1)·H/G), z_g = wo_a[g] · o_g (BF16 GEMM
  // in the reference), then wo_b.
  const int64_t G = c.o_groups, Ro = c.o_lora_rank, in_g = H * Dh / G;
  std::vector<float> z(size_t(T * G * Ro)), og(size_t(T * in_g)), zg(size_t(T * Ro));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t t = 0; t < T; ++t) std::copy_n(o.data() + t * H * Dh + g * in_g, in_g, og.data() + t * in_g);
    ops::LinearParams p{og.data(), A.wo_a.data() + g * Ro * in_g, zg.data(), T, in_g, Ro};
    p.bf16_in = p.bf16_out = R;
    ops::linear(p);
    for (int64_t t = 0; t < T; ++t) std::copy_n(zg.data() + t * Ro, Ro, z.data() + t * G * Ro + g * Ro);
  }
  linear(z, A.wo_b, T, G * Ro, D, out, act_block_, R, dot_key(A.block, DotOp::kWoB));
}

void CpuModel::attention(int l, ChunkCtx& ctx, const std::vector<float>& a, std::vector<float>& out) {
  const auto& c = config();
  const auto& role = c.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool R = ref();
  const int64_t T = ctx.T, H = c.num_heads, Dh = c.head_dim, W = c.window;
  std::vector<float> qlat, q, kv;
  project_qkv(A, a, ctx.pos, qlat, q, kv);
  if (A.has_compressor) compress(l, ctx, a);
  if (A.has_idx_compressor) compress_v4_index(l, ctx, a);
  if (A.has_indexer) index_select(l, ctx, a, qlat);

  // Key list of each query: window (oldest first) then compressed rows (ascending).
  LayerState& LS = ctx.st->layers[size_t(l)];
  const int64_t ring = ctx.st->ring_size;
  const PagedRows* ckv = role.ratio > 0 ? &ctx.st->layers[size_t(role.kv_src)].ckv : nullptr;
  const std::vector<std::vector<int32_t>>* sel = nullptr;
  if (role.ratio > 0 && role.idx_src >= 0) sel = &ctx.topk[size_t(role.idx_src)];
  if (trace_) {
    trace_->topk.resize(size_t(c.num_layers));
    trace_->topk[size_t(l)] = sel ? *sel : std::vector<std::vector<int32_t>>{};
    trace_->pos = ctx.pos;
    if (role.candidate_source) trace_->cand = ctx.cand;
  }
  std::vector<float> o(size_t(T * H * Dh));
  const float scale = 1.0f / std::sqrt(float(Dh));
  ThreadPool::global().parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<const float*> keys;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t p = ctx.pos[t];
      keys.clear();
      for (int64_t s = std::max<int64_t>(0, p - W + 1); s <= p; ++s)
        keys.push_back(s >= ctx.start ? kv.data() + (s - ctx.start) * Dh : LS.ring.data() + (s % ring) * Dh);
      if (sel) {
        for (int32_t i : (*sel)[t]) keys.push_back(ckv->row(i));
      } else if (ckv) {  // V4 HCA: every visible compressed entry
        for (int64_t i = 0; i < (p + 1) / role.ratio; ++i) keys.push_back(ckv->row(i));
      }
      ops::sparse_attention({q.data() + t * H * Dh, keys.data(), int64_t(keys.size()), H, Dh,
                             A.attn_sink.data(), scale, R, o.data() + t * H * Dh});
      if (R) ops::round_bf16_inplace(o.data() + t * H * Dh, H * Dh);
    }
  });
  project_out(A, o, ctx.pos, out);

  // Only now publish this chunk's window rows (the queries above read older ones from the ring).
  for (int64_t t = std::max<int64_t>(0, T - ring); t < T; ++t)
    std::copy_n(kv.data() + t * Dh, Dh, LS.ring.data() + (ctx.pos[t] % ring) * Dh);
}

}  // namespace flashseek::forward
