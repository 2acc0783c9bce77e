// Model-level flow of the CPU backend: embedding, the per-layer mHC data flow (V4.1 single-pass,
// V4 classic), the final collapse/norm/head, and Engram (V4.1).
#include "forward/cpu_model.h"

#include <algorithm>
#include <cassert>

#include "core/numeric.h"
#include "core/thread_pool.h"
#include "ops/engram.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/norm.h"

namespace flashseek::forward {

Result<std::unique_ptr<CpuModel>> CpuModel::load(const std::string& dir, Numerics numerics,
                                                 const CpuLoadOptions& opts) {
  // Checked before the (large) weight load: NaN fails both comparisons.
  if (!(opts.dot_perturbation >= 0 && opts.dot_perturbation <= 1e-3))
    return invalid_argument("CPU load options: dot_perturbation {} outside [0, 1e-3]", opts.dot_perturbation);
  if (opts.dot_perturbation > 0 && numerics != Numerics::kReference)
    return invalid_argument("CPU load options: dot_perturbation needs reference numerics (exact has no "
                            "FP8-activation dot products)");
  FS_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(dir));
  std::unique_ptr<CpuModel> m(new CpuModel());
  m->ck_ = std::make_unique<model::Checkpoint>(std::move(ck));
  WeightLoadOptions wo = opts.weights;
  wo.matrices = true;
  FS_ASSIGN_OR_RETURN(m->w_, load_weights(*m->ck_, wo));
  m->numerics_ = numerics;
  const auto& c = m->config();
  // The reference quantises activations only in front of FP8 / FP4 GEMMs (v4 §5.1, v41 §1.4).
  const int64_t blk = c.is_v41() ? 32 : 128;
  if (numerics == Numerics::kReference) {
    m->act_block_ = c.fp8_weights ? blk : 0;
    m->expert_act_block_ = c.fp4_experts || c.fp8_weights ? blk : 0;
  }
  if (opts.dot_perturbation > 0 && m->act_block_ == 0 && m->expert_act_block_ == 0)
    return invalid_argument("{}: dot_perturbation: the checkpoint has no FP8/FP4 linears (nothing "
                            "quantises activations to FP8)", dir);
  m->dot_perturbation_ = opts.dot_perturbation;
  m->perturbation_seed_ = opts.perturbation_seed;
  return m;
}

Result<std::unique_ptr<Model>> load_model(const std::string& ckpt_dir, Numerics numerics) {
  FS_ASSIGN_OR_RETURN(auto m, CpuModel::load(ckpt_dir, numerics));
  return std::unique_ptr<Model>(std::move(m));
}

std::unique_ptr<SequenceState> CpuModel::new_sequence() const {
  const auto& c = config();
  auto st = std::make_unique<CpuSequenceState>();
  st->ring_size = c.window + kMaxRollback;
  st->layers.resize(size_t(c.num_layers));
  for (auto& l : st->layers) {
    l.ring.assign(size_t(st->ring_size * c.head_dim), 0.0f);
    l.ckv.reset(c.head_dim);
    l.ikeys.reset(c.index_head_dim);
  }
  if (w_.has_mtp) st->mtp_ring.assign(size_t(st->ring_size * c.head_dim), 0.0f);
  if (w_.has_dspark)
    st->draft_rings.assign(size_t(c.num_mtp_layers), std::vector<float>(size_t(st->ring_size * c.head_dim), 0.0f));
  return st;
}

namespace {
uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t CpuModel::dot_key(int64_t block, DotOp op, int64_t expert) {
  return mix64(mix64(uint64_t(block)) ^ (uint64_t(op) << 32) ^ uint64_t(expert + 1));
}

void CpuModel::linear(const std::vector<float>& x, const Vec& w, int64_t rows, int64_t in, int64_t out,
                      std::vector<float>& y, int64_t act_block, bool bf16_out, uint64_t key) const {
  y.resize(size_t(rows * out));
  ops::LinearParams p{x.data(), w.data(), y.data(), rows, in, out};
  p.act_block = act_block;
  p.bf16_out = bf16_out;
  const bool perturb = dot_perturbation_ > 0 && act_block > 0;
  if (!perturb) {
    ops::linear(p);
    return;
  }
  // FP32 dots first, then the perturbation, then the BF16 rounding ops::linear would have done.
  p.bf16_out = false;
  ops::linear(p);
  const uint64_t k = mix64(perturbation_seed_ ^ key);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const uint64_t h = mix64(k ^ mix64((uint64_t(r) << 32) ^ uint64_t(o)));
      const double s = (h >> 63) ? -1.0 : 1.0;
      float& v = y[size_t(r * out + o)];
      v = float(double(v) * (1.0 + dot_perturbation_ * s));
      if (bf16_out) v = round_bf16(v);
    }
}

Status CpuModel::forward(std::span<BatchItem> batch, std::vector<float>& logits) {
  // Items run one after the other: every kernel is row-wise, so an item's result does not
  // depend on its neighbours (batch invariance by construction).
  for (auto& item : batch) {
    auto* st = dynamic_cast<CpuSequenceState*>(item.state);
    if (!st) return invalid_argument("forward: batch item has no CPU sequence state");
    FS_RETURN_IF_ERROR(forward_one(*st, item.tokens, item.all_logits, logits));
  }
  return {};
}

Status CpuModel::forward_one(CpuSequenceState& st, std::span<const int32_t> tokens, bool all_logits,
                             std::vector<float>& logits) {
  const auto& c = config();
  const int64_t T = int64_t(tokens.size()), D = c.hidden_size, hc = c.hc_mult, V = c.vocab_size;
  if (T == 0) return invalid_argument("forward: a batch item has no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= V) return invalid_argument("forward: token id {} outside the vocabulary [0, {})", t, V);
  const bool v41 = c.is_v41(), R = ref();
  ChunkCtx ctx;
  ctx.st = &st;
  ctx.tokens = tokens;
  ctx.start = st.len;
  ctx.T = T;
  for (int64_t t = 0; t < T; ++t) ctx.pos.push_back(st.len + t);
  ctx.topk.resize(size_t(c.num_layers));
  if (v41 && !c.engram_layer_ids.empty()) compute_engram_ids(ctx);

  std::vector<float> X(size_t(T * hc * D));  // [T, hc, D] residual streams
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hc; ++i)
      std::copy_n(w_.embed.data() + int64_t(tokens[t]) * D, D, X.data() + (t * hc + i) * D);
  std::vector<float> pre_in(size_t(T * hc), 0.0f);  // V4.1: one-hot for layer 0
  for (int64_t t = 0; t < T; ++t) pre_in[t * hc] = 1.0f;
  std::vector<float> taps;  // [T, n_taps·D] DSpark taps (v41 §5.2)
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerWeights& L = w_.layers[size_t(l)];
    if (L.has_engram) engram(l, ctx, X);
    if (w_.has_dspark) append_tap(l, T, X, taps);
    block(L, T, X, pre_in, [&](const Vec& a, Vec& f) { attention(l, ctx, a, f); },
          [&](const Vec& m, Vec& f) { moe(L.ffn, c.n_routed_experts, c.n_experts_per_tok, tokens, m, f); });
  }
  if (w_.has_dspark) write_draft_rings(ctx, taps);
  const std::vector<float>& pre_f = pre_in;
  // Final collapse (V4.1: the last FFN pre; V4: hc_head), norm, FP32 head.
  const int64_t r0 = all_logits ? 0 : T - 1, nr = T - r0;
  std::vector<float> pre(size_t(nr * hc)), y(size_t(nr * D));
  const float* Xr = X.data() + r0 * hc * D;
  if (v41) {
    std::copy(pre_f.begin() + r0 * hc, pre_f.end(), pre.begin());
  } else {
    ops::hc_head_pre(Xr, w_.hc_head_fn.data(), w_.hc_head_base.data(), w_.hc_head_scale.data(), pre.data(),
                     nr, hc, D, float(c.rms_norm_eps), float(c.hc_eps));
  }
  ops::hc_collapse(Xr, pre.data(), y.data(), nr, hc, D, R);
  ops::rms_norm({y.data(), w_.norm.data(), y.data(), nr, D, float(c.rms_norm_eps), R});
  const size_t off = logits.size();
  (void)R;
  logits.resize(off + size_t(nr * V));
  ops::linear({y.data(), w_.head.data(), logits.data() + off, nr, D, V});

  if (w_.has_mtp) mtp_advance(st, ctx, X);
  // Advance the sequence: Engram look-back keeps the last N−1 compressed ids.
  if (v41 && !c.engram_layer_ids.empty()) {
    for (int32_t t : tokens) st.engram_hist.push_back(w_.engram_token_map[size_t(t)]);
    const size_t keep = size_t(c.engram_max_ngram_size - 1 + kMaxRollback);
    if (st.engram_hist.size() > keep) st.engram_hist.erase(st.engram_hist.begin(), st.engram_hist.end() - keep);
  }
  st.len += T;
  return {};
}

void CpuModel::block(const LayerWeights& L, int64_t T, std::vector<float>& X, std::vector<float>& pre_in,
                     const SublayerFn& attn, const SublayerFn& ffn) const {
  const auto& c = config();
  const bool v41 = c.is_v41(), R = ref();
  const int64_t hc = c.hc_mult, D = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> pre_a(T * hc), post(T * hc), comb(T * hc * hc), pre_f(T * hc);
  std::vector<float> u(size_t(T * D)), a(size_t(T * D)), f;
  auto mixes = [&](const Vec& fn, const Vec& base, const Vec& scale, float* pre) {
    ops::hc_mixes({X.data(), fn.data(), base.data(), scale.data(), T, hc, D, eps, float(c.hc_eps),
                   c.hc_sinkhorn_iters, pre, post.data(), comb.data()});
  };
  mixes(L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, pre_a.data());
  // V4.1 applies the previous sublayer's pre weights to the current stream (v41 §2 item 1).
  ops::hc_collapse(X.data(), v41 ? pre_in.data() : pre_a.data(), u.data(), T, hc, D, R);
  ops::rms_norm({u.data(), L.attn_norm.data(), a.data(), T, D, eps, R});
  attn(a, f);
  ops::hc_post(f.data(), X.data(), post.data(), comb.data(), X.data(), T, hc, D, R);
  mixes(L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, pre_f.data());
  ops::hc_collapse(X.data(), v41 ? pre_a.data() : pre_f.data(), u.data(), T, hc, D, R);
  ops::rms_norm({u.data(), L.ffn_norm.data(), a.data(), T, D, eps, R});
  ffn(a, f);
  ops::hc_post(f.data(), X.data(), post.data(), comb.data(), X.data(), T, hc, D, R);
  pre_in = pre_f;
}

void CpuModel::compute_engram_ids(ChunkCtx& ctx) const {
  const auto& c = config();
  const auto& hist = ctx.st->engram_hist;
  const int64_t T = ctx.T, n_back = std::min<int64_t>(int64_t(hist.size()), c.engram_max_ngram_size - 1);
  std::vector<int64_t> cids(hist.end() - n_back, hist.end());
  for (int32_t t : ctx.tokens) cids.push_back(w_.engram_token_map[size_t(t)]);
  ctx.engram_ids.clear();
  for (int layer : c.engram_layer_ids) {
    const auto& lay = w_.layers[size_t(layer)].engram.layout;
    std::vector<int64_t> ids(size_t(T * lay.n_cols()));
    ops::engram_hash(lay, cids.data(), n_back, T, ctx.start, w_.engram_pad_c, ids.data());
    ctx.engram_ids.insert(ctx.engram_ids.end(), ids.begin(), ids.end());
  }
}

Result<std::vector<int64_t>> CpuModel::engram_hash_ids(const SequenceState& state,
                                                       std::span<const int32_t> tokens) const {
  const auto* st = dynamic_cast<const CpuSequenceState*>(&state);
  if (!st) return invalid_argument("engram_hash_ids: not a CPU sequence state");
  const auto& c = config();
  if (!c.is_v41() || c.engram_layer_ids.empty()) return std::vector<int64_t>{};
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size) return invalid_argument("engram_hash_ids: token id {} out of range", t);
  ChunkCtx ctx;
  CpuSequenceState copy = *st;
  ctx.st = &copy;
  ctx.tokens = tokens;
  ctx.start = st->len;
  ctx.T = int64_t(tokens.size());
  compute_engram_ids(ctx);
  // Reorder [layer, T, cols] -> [T, layer, cols].
  const int64_t nl = int64_t(c.engram_layer_ids.size()), T = ctx.T;
  const int64_t nc = w_.layers[size_t(c.engram_layer_ids[0])].engram.layout.n_cols();
  std::vector<int64_t> out(size_t(T * nl * nc));
  for (int64_t l = 0; l < nl; ++l)
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(ctx.engram_ids.data() + (l * T + t) * nc, nc, out.data() + (t * nl + l) * nc);
  return out;
}

void CpuModel::engram(int layer, ChunkCtx& ctx, std::vector<float>& X) const {
  const auto& c = config();
  const EngramWeights& E = w_.layers[size_t(layer)].engram;
  const int64_t T = ctx.T, D = c.hidden_size, hc = c.hc_mult, de = c.engram_head_dim;
  const int64_t nc = E.layout.n_cols();
  int64_t li = 0;
  while (c.engram_layer_ids[size_t(li)] != layer) ++li;
  const int64_t* ids = ctx.engram_ids.data() + li * T * nc;
  // Gather the rows of every position in column order: e [T, nc·de] (dequantised, exact in BF16).
  std::vector<float> e(size_t(T * nc * de));
  for (int64_t i = 0; i < T * nc; ++i) {
    const Status s = ck_->dequant_rows(E.table, ids[i], ids[i] + 1, std::span<float>(e.data() + i * de, size_t(de)));
    assert(s.ok() && "engram row gather");
    (void)s;
  }
  std::vector<float> kv;
  linear(e, E.wkv, T, nc * de, (hc + 1) * D, kv, act_block_, ref(), dot_key(layer, DotOp::kEngramWkv));
  ThreadPool::global().parallel_for(T, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      ops::engram_gate({X.data() + t * hc * D, kv.data() + t * (hc + 1) * D, E.wqk.data(), hc, D,
                        float(c.rms_norm_eps), false, ref()});
  });
}

}  // namespace flashseek::forward
