// The CPU backend ops (cpu_backend.h): each op is the oracle kernel of src/ops/cpu on host
// memory; the state ops keep CpuSequenceState (window rings, paged compressed KV / index keys,
// compressor partial groups with their rollback history).
#include "forward/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/numeric.h"
#include "core/thread_pool.h"
#include "ops/attention.h"
#include "ops/compressor.h"
#include "ops/engram.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/mhc.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/quant.h"
#include "ops/rope.h"

namespace flashseek::forward {

namespace {
uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Key of one linear for the dot perturbation: block (role index), op and routed expert.
uint64_t dot_key(const LinearKey& k) {
  return mix64(mix64(uint64_t(k.block)) ^ (uint64_t(k.op) << 32) ^ uint64_t(k.expert + 1));
}
const float* cf(const Tensor& t) { return t.f32(); }
}  // namespace

CpuOps::CpuOps(const CpuModel& m) : m_(m), c_(m.config()), w_(m.w_) {}

// ---- memory ----

Result<Tensor> CpuOps::scratch(const std::string& name, ElemType type, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) return invalid_argument("scratch {}: negative shape [{}, {}]", name, rows, cols);
  auto& buf = scratch_[name];
  const size_t words = (size_t(std::max<int64_t>(rows * cols, 1)) * elem_size(type) + 7) / 8;
  if (buf.size() < words) buf.resize(words);
  return Tensor{buf.data(), type, rows, cols};
}

Status CpuOps::upload(const Tensor& dst, const void* host, size_t bytes) {
  if (bytes) std::memcpy(dst.data, host, bytes);
  return {};
}

Status CpuOps::copy(const Tensor& dst, const Tensor& src, size_t bytes) {
  if (bytes && dst.data != src.data) std::memmove(dst.data, src.data, bytes);
  return {};
}

Status CpuOps::copy_rows(const Tensor& dst, int64_t dst_stride, const Tensor& src, int64_t src_stride, int64_t rows,
                         int64_t cols) {
  const size_t es = elem_size(dst.type);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst.data) + size_t(r * dst_stride) * es,
                static_cast<const char*>(src.data) + size_t(r * src_stride) * es, size_t(cols) * es);
  return {};
}

Status CpuOps::zero(const Tensor& t) {
  std::memset(t.data, 0, t.bytes());
  return {};
}

Status CpuOps::download_now(void* host, const Tensor& src, size_t bytes) {
  if (bytes) std::memcpy(host, src.data, bytes);
  return {};
}

// ---- row-wise math ----

Status CpuOps::embed(const Vec& table, const Tensor& tokens, const Tensor& X, int64_t T, int64_t hc, int64_t D) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hc; ++i)
      std::copy_n(table.data() + int64_t(tokens.i32()[t]) * D, D, X.f32() + (t * hc + i) * D);
  return {};
}

void CpuOps::linear_raw(const float* x, const Vec& w, int64_t rows, int64_t in, int64_t out, float* y,
                        int64_t act_block, bool bf16_out, bool bf16_in, const LinearKey& key) const {
  ops::LinearParams p{x, w.data(), y, rows, in, out};
  p.act_block = act_block;
  p.bf16_in = bf16_in;
  p.bf16_out = bf16_out;
  const double eps = m_.dot_perturbation_;
  if (!(eps > 0 && act_block > 0) || (m_.perturbation_filter_ && !m_.perturbation_filter_(key))) {
    ops::linear(p);
    return;
  }
  // FP32 dots first, then the perturbation, then the BF16 rounding ops::linear would have done.
  p.bf16_out = false;
  ops::linear(p);
  const bool terms = m_.perturbation_mode_ == DotPerturbationMode::kTermMagnitude;
  std::vector<float> mag;  // Σ|x_i·w_i| per output (kTermMagnitude)
  if (terms) {
    mag.resize(size_t(rows * out));
    p.y = mag.data();
    ops::linear_abs_terms(p);
  }
  const uint64_t k = mix64(m_.perturbation_seed_ ^ dot_key(key));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      const uint64_t h = mix64(k ^ mix64((uint64_t(r) << 32) ^ uint64_t(o)));
      const double s = (h >> 63) ? -1.0 : 1.0;
      const size_t i = size_t(r * out + o);
      float& v = y[i];
      v = terms ? float(double(v) + eps * s * double(mag[i])) : float(double(v) * (1.0 + eps * s));
      if (bf16_out) v = round_bf16(v);
    }
}

Status CpuOps::linear(const LinearCall& c) {
  linear_raw(cf(c.x), *c.w, c.rows, c.in, c.out, c.y.f32(), c.act_block, c.bf16_out, c.bf16_in, c.key);
  return {};
}

Status CpuOps::grouped_linear(const Tensor& x, const Vec& w, int64_t rows, int64_t groups, int64_t in, int64_t out,
                              const Tensor& z, bool bf16) {
  const int64_t width = groups * in;
  std::vector<float> xg(size_t(rows * in)), zg(size_t(rows * out));
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t t = 0; t < rows; ++t) std::copy_n(cf(x) + t * width + g * in, in, xg.data() + t * in);
    ops::LinearParams p{xg.data(), w.data() + g * out * in, zg.data(), rows, in, out};
    p.bf16_in = p.bf16_out = bf16;
    ops::linear(p);
    for (int64_t t = 0; t < rows; ++t) std::copy_n(zg.data() + t * out, out, z.f32() + t * groups * out + g * out);
  }
  return {};
}

Status CpuOps::rms_norm(const Tensor& x, const Vec* w, const Tensor& y, int64_t rows, int64_t dim, float eps,
                        bool bf16) {
  ops::rms_norm({cf(x), w && !w->empty() ? w->data() : nullptr, y.f32(), rows, dim, eps, bf16});
  return {};
}

Status CpuOps::rms_norm_bf16_heads(const Tensor& x, int64_t rows, int64_t dim, float eps) {
  ops::rms_norm_bf16_heads(x.f32(), rows, dim, eps);
  return {};
}

Status CpuOps::rope(const Tensor& x, const Tensor& pos, const Vec& inv_freq, int64_t rows, int64_t n_vec, int64_t vec,
                    int64_t rope_dim, bool inverse, bool bf16) {
  ops::apply_rope({x.f32(), pos.i64(), inv_freq.data(), rows, n_vec, vec, rope_dim, inverse, bf16});
  return {};
}

Status CpuOps::quant_sim(const Tensor& x, int64_t rows, int64_t cols, int64_t prefix, int64_t block, QuantSim kind) {
  float* p = x.f32();
  switch (kind) {
    case QuantSim::kBf16:
      if (prefix == cols) ops::round_bf16_inplace(p, rows * cols);
      else for (int64_t r = 0; r < rows; ++r) ops::round_bf16_inplace(p + r * cols, prefix);
      return {};
    case QuantSim::kFp8:
      if (prefix == cols) ops::fp8_quant_dequant(p, rows, cols, block);
      else for (int64_t r = 0; r < rows; ++r) ops::fp8_quant_dequant(p + r * cols, 1, prefix, block);
      return {};
    case QuantSim::kFp4E8m0:
    case QuantSim::kFp4E4m3:
      if (prefix != cols) return invalid_argument("quant_sim: FP4 simulation of a row prefix is not supported");
      if (kind == QuantSim::kFp4E8m0) ops::fp4_quant_dequant_e8m0(p, rows, cols, block);
      else ops::fp4_quant_dequant_e4m3(p, rows, cols, block);
      return {};
  }
  return invalid_argument("quant_sim: unknown kind");
}

Status CpuOps::hadamard(const Tensor& x, int64_t rows, int64_t dim) {
  ops::hadamard_inplace(x.f32(), rows, dim);
  return {};
}

Status CpuOps::scale(const Tensor& x, int64_t n, float s, bool bf16) {
  float* p = x.f32();
  for (int64_t i = 0; i < n; ++i) p[i] = bf16 ? round_bf16(p[i] * s) : p[i] * s;
  return {};
}

Status CpuOps::add_ape(const Tensor& z, const Vec& ape, const Tensor& pos, int64_t rows, int64_t width,
                       int64_t ratio) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < width; ++j) z.f32()[t * width + j] += ape[size_t((pos.i64()[t] % ratio) * width + j)];
  return {};
}

Status CpuOps::hc_mixes(const HcMixCall& c) {
  ops::hc_mixes({cf(c.x), c.fn->data(), c.base->data(), c.scale->data(), c.rows, c.hc, c.dim, c.norm_eps, c.hc_eps,
                 c.sinkhorn_iters, c.pre.f32(), c.post.f32(), c.comb.f32()});
  return {};
}

Status CpuOps::hc_head_pre(const HcMixCall& c) {
  ops::hc_head_pre(cf(c.x), c.fn->data(), c.base->data(), c.scale->data(), c.pre.f32(), c.rows, c.hc, c.dim,
                   c.norm_eps, c.hc_eps);
  return {};
}

Status CpuOps::hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& y, int64_t rows, int64_t hc, int64_t dim,
                           bool bf16) {
  ops::hc_collapse(cf(X), cf(pre), y.f32(), rows, hc, dim, bf16);
  return {};
}

Status CpuOps::hc_post(const Tensor& f, const Tensor& X, const Tensor& post, const Tensor& comb, int64_t rows,
                       int64_t hc, int64_t dim, bool bf16) {
  ops::hc_post(cf(f), cf(X), cf(post), cf(comb), X.f32(), rows, hc, dim, bf16);
  return {};
}

Status CpuOps::hc_mean(const Tensor& X, const Tensor& y, int64_t y_stride, int64_t rows, int64_t hc, int64_t dim,
                       bool bf16) {
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      float s = 0;
      for (int64_t i = 0; i < hc; ++i) s += cf(X)[(t * hc + i) * dim + d];
      const float m = s / float(hc);
      y.f32()[t * y_stride + d] = bf16 ? round_bf16(m) : m;
    }
  return {};
}

Status CpuOps::swiglu(const Tensor& g, const Tensor& u, const Tensor& h, const Tensor& weights, int64_t rows,
                      int64_t inter, float limit, bool bf16) {
  for (int64_t r = 0; r < rows; ++r)
    ops::swiglu(cf(g) + r * inter, cf(u) + r * inter, h.f32() + r * inter, inter, limit,
                weights.empty() ? 1.0f : cf(weights)[r]);
  if (bf16) ops::round_bf16_inplace(h.f32(), rows * inter);
  return {};
}

// ---- MoE ----

Status CpuOps::route(const FfnWeights& F, const Tensor& logits, const Tensor& tokens, int64_t T, int64_t E, int64_t K,
                     const Tensor& sel, const Tensor& wt) {
  for (int64_t t = 0; t < T; ++t) {
    ops::RouteParams p{cf(logits) + t * E, F.bias.empty() ? nullptr : F.bias.data(), nullptr, E, K};
    if (!F.tid2eid.empty()) p.hash_ids = F.tid2eid.data() + int64_t(tokens.i32()[t]) * K;
    p.gate_temp = float(c_.gate_temp);
    p.sqrtsoftplus = c_.scoring_func == "sqrtsoftplus";
    p.norm_topk = c_.norm_topk_prob;
    p.renorm_eps = c_.is_v41();
    p.route_scale = float(c_.route_scale);
    p.sel = sel.i32() + t * K;
    p.weight = wt.f32() + t * K;
    ops::route(p);
  }
  return {};
}

Status CpuOps::routed_experts(const FfnWeights& F, const Tensor& m, const Tensor& sel, const Tensor& wt, int64_t T,
                              int64_t E, int64_t K, const Tensor& ybuf, Tensor* row_of) {
  const int64_t D = c_.hidden_size, I = c_.moe_inter_dim;
  const bool R = m_.ref();
  const float limit = float(c_.swiglu_limit);
  *row_of = Tensor{};
  std::fill_n(ybuf.f32(), T * K * D, 0.0f);
  // Each expert over the rows that chose it; ybuf[t, slot] keeps outputs in selection slots.
  for (int64_t e = 0; e < E; ++e) {
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < T * K; ++i)
      if (sel.i32()[i] == e) slots.push_back(i);
    if (slots.empty()) continue;
    const int64_t n = int64_t(slots.size());
    std::vector<float> x(static_cast<size_t>(n * D)), wv(static_cast<size_t>(n)), g(static_cast<size_t>(n * I)),
        u(static_cast<size_t>(n * I)), h(static_cast<size_t>(n * I)), y(static_cast<size_t>(n * D));
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(cf(m) + (slots[r] / K) * D, D, x.data() + r * D);
      wv[r] = cf(wt)[slots[r]];
    }
    const int64_t act = m_.expert_act_block_;
    linear_raw(x.data(), F.w1[e], n, D, I, g.data(), act, R, false, {F.block, DotOp::kW1, e});
    linear_raw(x.data(), F.w3[e], n, D, I, u.data(), act, R, false, {F.block, DotOp::kW3, e});
    for (int64_t r = 0; r < n; ++r)
      ops::swiglu(g.data() + r * I, u.data() + r * I, h.data() + r * I, I, limit, wv[r]);
    if (R) ops::round_bf16_inplace(h.data(), n * I);
    linear_raw(h.data(), F.w2[e], n, I, D, y.data(), act, R, false, {F.block, DotOp::kW2, e});
    for (int64_t r = 0; r < n; ++r) std::copy_n(y.data() + r * D, D, ybuf.f32() + slots[r] * D);
  }
  return {};
}

Status CpuOps::moe_combine(const Tensor& ybuf, const Tensor& ys, const Tensor& out, int64_t T, int64_t K, int64_t D,
                           bool bf16, const Tensor& row_of) {
  if (!row_of.empty()) return invalid_argument("moe_combine: the CPU backend keeps pairs in slot order");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < D; ++d) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += cf(ybuf)[(t * K + k) * D + d];
      s += cf(ys)[t * D + d];
      out.f32()[t * D + d] = bf16 ? round_bf16(s) : s;
    }
  return {};
}

// ---- Engram ----

Status CpuOps::engram_rows(const EngramWeights& E, std::span<const int64_t> ids, const Tensor& e) {
  const int64_t de = c_.engram_head_dim;
  return m_.ck_->dequant_row_list(E.table, ids, std::span<float>(e.f32(), ids.size() * size_t(de)));
}

Status CpuOps::engram_gate(const Tensor& X, const Tensor& kv, const Vec& wqk, int64_t rows, int64_t hc, int64_t D,
                           float eps, bool bf16) {
  ThreadPool::global().parallel_for(rows, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      ops::engram_gate({X.f32() + t * hc * D, cf(kv) + t * (hc + 1) * D, wqk.data(), hc, D, eps, false, bf16});
  });
  return {};
}

// ---- per-sequence state ----

LayerState& CpuOps::layer_state(FwdSeg& seg, int layer) const {
  return static_cast<CpuSequenceState*>(seg.st)->layers[size_t(layer)];
}

Result<PooledRows> CpuOps::compressor_feed(FwdChunk& ctx, int layer, Compressor which, const Tensor& v,
                                           const Tensor& z, int64_t ratio, int64_t c, bool overlap) {
  std::vector<float>& entries = pending_[which == Compressor::kKv ? 0 : 1];
  entries.clear();
  PooledRows out;
  for (FwdSeg& g : ctx.segs) {
    const size_t n0 = out.groups.size();
    auto rows = [&](const Tensor& t) { return t.empty() ? t : t.rows_from(g.row0, g.T); };
    feed_seg(g, layer, which, rows(v), rows(z), ratio, c, overlap, entries, out.groups);
    out.seg_n.push_back(int64_t(out.groups.size() - n0));
  }
  out.rows = Tensor{entries.data(), ElemType::kF32, int64_t(out.groups.size()), c};
  return out;
}

void CpuOps::feed_seg(FwdSeg& seg, int layer, Compressor which, const Tensor& v, const Tensor& z, int64_t ratio,
                      int64_t c, bool overlap, std::vector<float>& entries, std::vector<int64_t>& groups) {
  CompressorState& cs = which == Compressor::kKv ? layer_state(seg, layer).comp : layer_state(seg, layer).icomp;
  const int64_t width = overlap ? 2 * c : c, T = seg.T;
  const float* pv = cf(v);
  const float* pz = cf(z);
  // Each row joins the open group (and the rollback history); a full group pools into an entry.
  for (int64_t t = 0; t < T; ++t) {
    cs.v.insert(cs.v.end(), pv + t * width, pv + (t + 1) * width);
    cs.z.insert(cs.z.end(), pz + t * width, pz + (t + 1) * width);
    cs.hist_v.insert(cs.hist_v.end(), pv + t * width, pv + (t + 1) * width);
    cs.hist_z.insert(cs.hist_z.end(), pz + t * width, pz + (t + 1) * width);
    const int64_t keep = 2 * ratio + kMaxRollback, n_hist = int64_t(cs.hist_v.size()) / width;
    if (n_hist > keep) {
      cs.hist_v.erase(cs.hist_v.begin(), cs.hist_v.begin() + (n_hist - keep) * width);
      cs.hist_z.erase(cs.hist_z.begin(), cs.hist_z.begin() + (n_hist - keep) * width);
    }
    cs.hist_first = seg.pos[size_t(t)] + 1 - std::min(n_hist, keep);
    if (++cs.n_pend < ratio) continue;
    // V4 ratio 4 (overlap): first halves of the previous window, then second halves of this one.
    std::vector<const float*> vs, zs;
    if (overlap)
      for (int64_t s = 0; s < ratio; ++s) {
        vs.push_back(cs.has_prev ? cs.prev_v.data() + s * width : nullptr);
        zs.push_back(cs.has_prev ? cs.prev_z.data() + s * width : nullptr);
      }
    for (int64_t s = 0; s < ratio; ++s) {
      vs.push_back(cs.v.data() + s * width + (overlap ? c : 0));
      zs.push_back(cs.z.data() + s * width + (overlap ? c : 0));
    }
    std::vector<float> e(static_cast<size_t>(c));
    ops::softmax_pool({vs.data(), zs.data(), int64_t(vs.size()), c, e.data()});
    entries.insert(entries.end(), e.begin(), e.end());
    groups.push_back(seg.pos[size_t(t)] / ratio);
    if (overlap) {
      cs.prev_v = cs.v;
      cs.prev_z = cs.z;
      cs.has_prev = true;
    }
    cs.v.clear();
    cs.z.clear();
    cs.n_pend = 0;
  }
}

Result<Tensor> CpuOps::cache_reserve(FwdChunk&, int, Cache which, std::span<const int64_t> seg_n) {
  const int64_t width = which == Cache::kCkv ? c_.head_dim : c_.index_head_dim;
  int64_t n = 0;
  for (const int64_t k : seg_n) n += k;
  std::vector<float>& rows = pending_[which == Cache::kCkv ? 0 : 1];
  rows.assign(size_t(n * width), 0.0f);
  return Tensor{rows.data(), ElemType::kF32, n, width};
}

Status CpuOps::cache_commit(FwdChunk& ctx, int layer, Cache which, std::span<const int64_t> seg_n) {
  std::vector<float>& rows = pending_[which == Cache::kCkv ? 0 : 1];
  if (seg_n.size() != ctx.segs.size())
    return internal_error("cache_commit: {} row counts for {} sequences", seg_n.size(), ctx.segs.size());
  const int64_t width = which == Cache::kCkv ? c_.head_dim : c_.index_head_dim;
  int64_t n = 0;
  for (const int64_t k : seg_n) n += k;
  if (int64_t(rows.size()) != n * width)
    return internal_error("cache_commit: {} rows of width {} were not reserved", n, width);
  const float* src = rows.data();
  for (size_t s = 0; s < seg_n.size(); ++s) {
    LayerState& LS = layer_state(ctx.segs[s], layer);
    PagedRows& dst = which == Cache::kCkv ? LS.ckv : LS.ikeys;
    dst.append(std::span<const float>(src, size_t(seg_n[s] * width)));
    src += seg_n[s] * width;
  }
  rows.clear();
  return {};
}

Status CpuOps::index_topk(int l, FwdChunk& ctx, const Tensor& iq, const Tensor& wts, const Tensor& out,
                          const Tensor& out_n) {
  for (FwdSeg& g : ctx.segs)
    index_topk_seg(l, g, iq.rows_from(g.row0, g.T), wts.rows_from(g.row0, g.T), out.rows_from(g.row0, g.T),
                   out_n.rows_from(g.row0, g.T));
  return {};
}

void CpuOps::index_topk_seg(int l, FwdSeg& seg, const Tensor& iq, const Tensor& wts, const Tensor& out,
                            const Tensor& out_n) {
  const auto& role = c_.role(l);
  const bool R = m_.ref();
  const int64_t T = seg.T, nI = c_.index_n_heads, dI = c_.index_head_dim, ratio = role.ratio, K = c_.index_topk;
  const int64_t stride = seg.start + T;
  // Each index source scores the keys of its own kv source, in prefill and decode (v41 §9.x).
  const PagedRows& keys = layer_state(seg, role.kv_src).ikeys;
  uint8_t* cand = seg.cand.u8();
  const float ninf = -std::numeric_limits<float>::infinity();
  ThreadPool::global().parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> s;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t clen = (seg.pos[size_t(t)] + 1) / ratio;  // visible compressed positions
      s.assign(size_t(clen), 0.0f);
      keys.for_each_run(0, clen, [&](int64_t first, const float* k, int64_t n) {  // page by page
        ops::index_scores({cf(iq) + t * nI * dI, cf(wts) + t * nI, k, n, nI, dI, R, s.data() + first});
      });
      if (role.candidate_source) {
        ops::candidate_mask(s.data(), clen, clen, c_.candidate_block_size, c_.candidate_topk_blocks,
                            cand + t * stride);
      } else if (role.candidate_filtered) {
        for (int64_t i = 0; i < clen; ++i)
          if (!cand[t * stride + i]) s[size_t(i)] = ninf;
      }
      const std::vector<int32_t> idx = ops::topk_indices(s.data(), clen, K);
      std::copy(idx.begin(), idx.end(), out.i32() + t * K);
      out_n.i32()[t] = int32_t(idx.size());
    }
  });
}

Status CpuOps::attention(int l, FwdChunk& ctx, const Tensor& q, const Tensor& kv, const Vec& sink, const Tensor& o,
                         int64_t H, bool bf16) {
  const auto& role = c_.role(l);
  const int64_t Dh = c_.head_dim, W = c_.window, K = c_.index_topk;
  const float scale = 1.0f / std::sqrt(float(Dh));
  ForwardTrace* trace = m_.trace_;
  if (trace) {  // this layer's selections replace the previous forward's
    trace->topk.resize(size_t(c_.num_layers));
    trace->topk[size_t(l)].clear();
    trace->pos.clear();
    if (role.candidate_source) trace->cand.clear();
  }
  for (FwdSeg& g : ctx.segs) {
    auto* st = static_cast<CpuSequenceState*>(g.st);
    const LayerState& LS = st->layers[size_t(l)];
    const int64_t ring = st->ring_size;
    // Key list of each query: window (oldest first) then compressed rows (ascending).
    const PagedRows* ckv = role.ratio > 0 ? &st->layers[size_t(role.kv_src)].ckv : nullptr;
    const bool sel = role.ratio > 0 && role.idx_src >= 0;
    const int32_t* list = sel ? g.topk[size_t(role.idx_src)].i32() : nullptr;
    const int32_t* list_n = sel ? g.topk_n[size_t(role.idx_src)].i32() : nullptr;
    if (sel && !list) return internal_error("layer {}: index source {} published no top-k", l, role.idx_src);
    ThreadPool::global().parallel_for(g.T, [&](int64_t t0, int64_t t1) {
      std::vector<const float*> keys;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t p = g.pos[size_t(t)];
        keys.clear();
        for (int64_t s = std::max<int64_t>(0, p - W + 1); s <= p; ++s)
          keys.push_back(s >= g.start ? cf(kv) + (g.row0 + s - g.start) * Dh : LS.ring.data() + (s % ring) * Dh);
        if (list) {
          for (int32_t i = 0; i < list_n[t]; ++i) keys.push_back(ckv->row(list[t * K + i]));
        } else if (ckv) {  // V4 HCA: every visible compressed entry
          for (int64_t i = 0; i < (p + 1) / role.ratio; ++i) keys.push_back(ckv->row(i));
        }
        float* out = o.f32() + (g.row0 + t) * H * Dh;
        ops::sparse_attention({cf(q) + (g.row0 + t) * H * Dh, keys.data(), int64_t(keys.size()), H, Dh, sink.data(),
                               scale, bf16, out});
        if (bf16) ops::round_bf16_inplace(out, H * Dh);
      }
    });
    if (trace) {  // the selections of every row (ascending compressed rows) and the candidate masks
      for (int64_t t = 0; t < g.T; ++t) {
        trace->pos.push_back(g.pos[size_t(t)]);
        auto& rows = trace->topk[size_t(l)];
        if (list) rows.emplace_back(list + t * K, list + t * K + list_n[t]);
        if (role.candidate_source) {
          const uint8_t* cm = g.cand.u8() + t * (g.start + g.T);
          trace->cand.emplace_back(cm, cm + (g.pos[size_t(t)] + 1) / role.ratio);
        }
      }
    }
  }
  return {};
}

Status CpuOps::ring_write(int l, FwdChunk& ctx, const Tensor& kv) {
  const int64_t Dh = c_.head_dim;
  for (FwdSeg& g : ctx.segs) {
    auto* st = static_cast<CpuSequenceState*>(g.st);
    float* ring = st->layers[size_t(l)].ring.data();
    const int64_t rs = st->ring_size;
    for (int64_t t = std::max<int64_t>(0, g.T - rs); t < g.T; ++t)
      std::copy_n(cf(kv) + (g.row0 + t) * Dh, Dh, ring + (g.pos[size_t(t)] % rs) * Dh);
  }
  return {};
}

// ---- DSpark ----

Status CpuOps::draft_ring_write(int stage, FwdChunk& ctx, const Tensor& kv) {
  const int64_t Dh = c_.head_dim;
  for (FwdSeg& g : ctx.segs) {
    auto* st = static_cast<CpuSequenceState*>(g.st);
    if (st->draft_rings.size() <= size_t(stage)) return internal_error("CPU state has no DSpark draft rings");
    float* rg = st->draft_rings[size_t(stage)].data();
    const int64_t rs = st->ring_size;
    for (int64_t t = std::max<int64_t>(0, g.T - rs); t < g.T; ++t)
      std::copy_n(cf(kv) + (g.row0 + t) * Dh, Dh, rg + (g.pos[size_t(t)] % rs) * Dh);
  }
  return {};
}

Status CpuOps::draft_attention(int stage, FwdSeg& seg, const Tensor& q, const Tensor& kv, const Vec& sink,
                               const Tensor& o, int64_t H, bool bf16) {
  const auto* st = static_cast<const CpuSequenceState*>(seg.st);
  const int64_t B = seg.T, Dh = c_.head_dim, ring = st->ring_size, last = seg.start - 1;
  // Keys: committed ring rows max(0, a−W+1) … a, then every block row (no causal mask).
  std::vector<const float*> keys;
  for (int64_t p = std::max<int64_t>(0, last - c_.window + 1); p <= last; ++p)
    keys.push_back(st->draft_rings[size_t(stage)].data() + (p % ring) * Dh);
  for (int64_t j = 0; j < B; ++j) keys.push_back(cf(kv) + j * Dh);
  for (int64_t i = 0; i < B; ++i) {
    float* out = o.f32() + i * H * Dh;
    ops::sparse_attention({cf(q) + i * H * Dh, keys.data(), int64_t(keys.size()), H, Dh, sink.data(),
                           1.0f / std::sqrt(float(Dh)), bf16, out});
    if (bf16) ops::round_bf16_inplace(out, H * Dh);
  }
  return {};
}

Status CpuOps::markov_logits(int32_t prev, std::span<float> logits) {
  const int64_t r = c_.dspark_markov_rank, V = c_.vocab_size;
  const DSparkWeights& W = w_.dspark;
  ops::linear({W.markov_embed.data() + int64_t(prev) * r, W.markov_head.data(), logits.data(), 1, r, V});
  return {};
}

Status CpuOps::markov_embed_row(int32_t prev, std::span<float> e) {
  const int64_t r = c_.dspark_markov_rank;
  std::copy_n(w_.dspark.markov_embed.data() + int64_t(prev) * r, r, e.data());
  return {};
}

// ---- shapes, output ----

int64_t CpuOps::heads() const { return c_.num_heads; }
int64_t CpuOps::groups() const { return c_.o_groups; }
int64_t CpuOps::vocab_rows() const { return c_.vocab_size; }

Status CpuOps::logits_out(const Tensor& lg, int64_t n, std::vector<float>& logits) {
  logits.insert(logits.end(), cf(lg), cf(lg) + n);
  return {};
}

Status CpuOps::sample_rows(const Tensor&, std::span<const int64_t>, std::span<const ops::SampleSpec* const>,
                           std::span<int32_t* const>) {
  return Status(StatusCode::kUnimplemented, "the CPU backend samples on the host (samples_on_device is false)");
}

}  // namespace flashseek::forward
