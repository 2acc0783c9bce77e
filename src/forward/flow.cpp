// The model flow over the backend ops (flow.h). Row-wise work runs once over every row of the
// step; what depends on a sequence's own state (compressors, indexer, attention, ring writes)
// runs per sequence through the backend's state ops.
#include "forward/flow.h"

#include <algorithm>
#include <cmath>

#include "forward/state.h"
#include "ops/engram.h"
#include "ops/linear.h"

namespace flashseek::forward {

namespace {
LinearCall lin(const Tensor& x, const Vec& w, int64_t rows, int64_t in, int64_t out, const Tensor& y,
               int64_t act_block, bool bf16_out, LinearKey key = {}, bool bf16_in = false) {
  LinearCall c;
  c.x = x, c.w = &w, c.rows = rows, c.in = in, c.out = out, c.y = y;
  c.act_block = act_block, c.bf16_out = bf16_out, c.bf16_in = bf16_in, c.key = key;
  return c;
}

// c with LinearCall::x_bf16 = on: its x holds BF16 values (a norm's rounded output in reference
// numerics), which lets a backend take the exact BF16 products in another order.
LinearCall bf16_x(LinearCall c, bool on) {
  c.x_bf16 = on;
  return c;
}

// The LM head over rows of y, the norm's output (FP32 dots; BF16 values in reference numerics).
LinearCall head_call(const Tensor& y, const Vec& head, int64_t rows, int64_t D, int64_t V, const Tensor& out,
                     bool bf16_y) {
  return bf16_x(lin(y, head, rows, D, V, out, 0, false), bf16_y);
}
}  // namespace

Status Forward::forward(std::span<BatchItem> batch, std::vector<float>& logits) {
  const int64_t D = c_.hidden_size, hc = c_.hc_mult, L = c_.num_layers;
  const bool v41 = c_.is_v41();
  FwdChunk ctx;
  std::vector<int32_t> tok;
  std::vector<int64_t> pos;
  int64_t cand_bytes = 0;
  std::vector<size_t> order(batch.size());  // segment s holds batch item order[s]
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (b_.rows_by_length())
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return batch[a].tokens.size() < batch[b].tokens.size(); });
  for (const size_t idx : order) {
    BatchItem& item = batch[idx];
    FwdSeg g;
    g.st = static_cast<ModelState*>(item.state);
    g.tokens = item.tokens;
    g.start = g.st->len;
    g.T = int64_t(item.tokens.size());
    g.row0 = ctx.T;
    g.all_logits = item.all_logits;
    g.sample = item.sample;
    g.sampled = &item.sampled;
    for (int64_t t = 0; t < g.T; ++t) g.pos.push_back(g.start + t);
    tok.insert(tok.end(), item.tokens.begin(), item.tokens.end());
    pos.insert(pos.end(), g.pos.begin(), g.pos.end());
    g.topk.assign(size_t(L), Tensor{});
    g.topk_n.assign(size_t(L), Tensor{});
    cand_bytes += g.T * (g.start + g.T);
    ctx.T += g.T;
    ctx.segs.push_back(std::move(g));
  }
  const int64_t T = ctx.T;
  if (T == 0) return {};
  FS_ASSIGN_OR_RETURN(ctx.tokens, b_.scratch("tokens", ElemType::kI32, T));
  FS_ASSIGN_OR_RETURN(ctx.pos, b_.scratch("pos", ElemType::kI64, T));
  FS_RETURN_IF_ERROR(b_.upload(ctx.tokens, tok.data(), size_t(T) * 4));
  FS_RETURN_IF_ERROR(b_.upload(ctx.pos, pos.data(), size_t(T) * 8));
  if (ctx.segs.size() > 1) {  // rows → segment, for ops that serve every sequence in one launch
    std::vector<int32_t> row_seq(static_cast<size_t>(T));
    for (size_t i = 0; i < ctx.segs.size(); ++i)
      std::fill_n(row_seq.begin() + ctx.segs[i].row0, ctx.segs[i].T, int32_t(i));
    FS_ASSIGN_OR_RETURN(ctx.row_seq, b_.scratch("row_seq", ElemType::kI32, T));
    FS_RETURN_IF_ERROR(b_.upload(ctx.row_seq, row_seq.data(), size_t(T) * 4));
  }
  // Candidate masks (V4.1's candidate stage only; a byte per row and position, 8 GB for an
  // 8192-token chunk at 1M context): each sequence's own [T_s, start_s + T_s] region.
  const bool has_cand = c_.candidate_source_layer >= 0;
  Tensor cand;
  if (has_cand) {
    FS_ASSIGN_OR_RETURN(cand, b_.scratch("cand", ElemType::kU8, std::max<int64_t>(cand_bytes, 1)));
  }
  int64_t cand_off = 0;
  for (FwdSeg& g : ctx.segs) {
    g.tokens_d = ctx.tokens.rows_from(g.row0, g.T);
    g.pos_d = ctx.pos.rows_from(g.row0, g.T);
    if (has_cand)
      g.cand = cand.view(cand.numel(), 1).rows_from(cand_off, g.T * (g.start + g.T)).view(g.T, g.start + g.T);
    cand_off += g.T * (g.start + g.T);
  }
  if (v41 && !c_.engram_layer_ids.empty()) engram_ids(ctx);
  FS_ASSIGN_OR_RETURN(Tensor X, scratch_f("X", T * hc, D));  // [T, hc, D] residual streams
  FS_RETURN_IF_ERROR(b_.embed(w_.embed, ctx.tokens, X, T, hc, D));
  std::vector<float> pre_h(size_t(T * hc), 0.0f);  // V4.1: one-hot for layer 0
  for (int64_t t = 0; t < T; ++t) pre_h[size_t(t * hc)] = 1.0f;
  FS_ASSIGN_OR_RETURN(Tensor pre_in, scratch_f("pre_in", T, hc));
  FS_RETURN_IF_ERROR(b_.upload(pre_in, pre_h.data(), pre_h.size() * 4));
  Tensor taps;  // DSpark taps [T, n_taps·D] (v41 §5.2)
  const auto& tap_ids = c_.dspark_target_layer_ids;
  const int64_t n_taps = int64_t(tap_ids.size());
  if (w_.has_dspark && b_.draft_rings()) {
    FS_ASSIGN_OR_RETURN(taps, scratch_f("dspark_taps", T, n_taps * D));
  }
  bool attn_mixed = false;  // this block's attention mixes ran with the previous block's last update
  for (int l = 0; l < int(L); ++l) {
    const LayerWeights& LW = w_.layers[size_t(l)];
    if (LW.has_engram) FS_RETURN_IF_ERROR(engram(l, ctx, X));
    if (!taps.empty()) {  // plain mean of the streams entering the block (after its Engram)
      const auto it = std::find(tap_ids.begin(), tap_ids.end(), l);
      if (it != tap_ids.end()) {
        const Tensor dst = taps.view(T * n_taps, D).rows_from(it - tap_ids.begin());
        FS_RETURN_IF_ERROR(b_.hc_mean(X, dst, n_taps * D, T, hc, D, R()));
      }
    }
    std::optional<MoeCombineCall> combine;  // the FFN's combine, run with the block's stream update
    // Where the backend runs a stream update with the next sublayer's mixes (fuses_post_mixes), the
    // block's FFN update also forms the next block's attention mixes, unless an Engram module
    // changes the streams in between.
    const bool fuse_next = b_.fuses_post_mixes(T) && l + 1 < int(L) && !w_.layers[size_t(l) + 1].has_engram;
    FS_RETURN_IF_ERROR(block(
        LW, "", T, X, pre_in, [&](const Tensor& a, const Tensor& f) { return attention(l, ctx, a, f); },
        [&](const Tensor& a, const Tensor& f) {
          return moe(LW.ffn, "moe_", ctx.tokens, T, c_.n_routed_experts, c_.n_experts_per_tok, a, f, true, &combine);
        },
        &combine, attn_mixed, fuse_next ? &w_.layers[size_t(l) + 1] : nullptr));
    attn_mixed = fuse_next;
  }

  // The rows that leave as logits: every row of an all_logits item, else its last one; gathered
  // first when that is not every row.
  std::vector<std::pair<int64_t, int64_t>> runs;  // [first row, count)
  int64_t nr = 0;
  for (const FwdSeg& g : ctx.segs) {
    const int64_t r0 = g.all_logits ? g.row0 : g.row0 + g.T - 1, n = g.row0 + g.T - r0;
    if (!runs.empty() && runs.back().first + runs.back().second == r0) runs.back().second += n;
    else runs.emplace_back(r0, n);
    nr += n;
  }
  Tensor Xr = X, pre = pre_in, ph;
  if (nr < T) {
    FS_ASSIGN_OR_RETURN(Xr, scratch_f("final_x", nr * hc, D));
    FS_ASSIGN_OR_RETURN(pre, scratch_f("final_pre", nr, hc));
  }
  if (!v41) {
    FS_ASSIGN_OR_RETURN(ph, scratch_f("pre_head", nr, hc));
  }
  FS_ASSIGN_OR_RETURN(Tensor y, scratch_f("final_y", nr, D));
  const int64_t Vr = b_.vocab_rows();
  FS_ASSIGN_OR_RETURN(Tensor lg, scratch_f("logits", nr, Vr));
  // Final collapse (V4.1: the last FFN pre; V4: hc_head), norm, FP32 head.
  auto head = [&]() -> Status {
    if (nr < T) {
      int64_t o = 0;
      for (const auto& [r0, n] : runs) {
        FS_RETURN_IF_ERROR(b_.copy(Xr.rows_from(o * hc, n * hc), X.rows_from(r0 * hc, n * hc), size_t(n * hc * D) * 4));
        FS_RETURN_IF_ERROR(b_.copy(pre.rows_from(o, n), pre_in.rows_from(r0, n), size_t(n * hc) * 4));
        o += n;
      }
    }
    const float eps = float(c_.rms_norm_eps);
    if (!v41) {
      HcMixCall m;
      m.x = Xr, m.fn = &w_.hc_head_fn, m.base = &w_.hc_head_base, m.scale = &w_.hc_head_scale;
      m.rows = nr, m.hc = hc, m.dim = D, m.norm_eps = eps, m.hc_eps = float(c_.hc_eps), m.pre = ph;
      FS_RETURN_IF_ERROR(b_.hc_head_pre(m));
      pre = ph;
    }
    FS_RETURN_IF_ERROR(b_.hc_collapse_norm(Xr, pre, &w_.norm, y, y, nr, hc, D, eps, R()));
    return b_.linear(head_call(y, w_.head, nr, D, Vr, lg, R()));
  };
  // The DSpark rings' writes read only the taps (and write only the rings): beside the head.
  auto rings = [&]() -> Status { return taps.empty() ? Status{} : write_draft_rings(ctx, taps); };
  FS_RETURN_IF_ERROR(branches(rings, head));
  // Per item, in the batch's order: its logits rows, or the token sampled from its last row (lg
  // holds the segments' rows in segment order).
  std::vector<int64_t> lg_row(ctx.segs.size());
  std::vector<size_t> seg_of(batch.size());
  for (int64_t s = 0, o = 0; s < int64_t(ctx.segs.size()); ++s) {
    lg_row[size_t(s)] = o;
    o += ctx.segs[size_t(s)].all_logits ? ctx.segs[size_t(s)].T : 1;
    seg_of[order[size_t(s)]] = size_t(s);
  }
  std::vector<int64_t> s_rows;  // the items sampled on the device: all in one call
  std::vector<const ops::SampleSpec*> s_specs;
  std::vector<int32_t*> s_outs;
  for (size_t i = 0; i < batch.size(); ++i) {
    FwdSeg& g = ctx.segs[seg_of[i]];
    const int64_t n = g.all_logits ? g.T : 1, o = lg_row[seg_of[i]];
    if (g.sample) s_rows.push_back(o + n - 1), s_specs.push_back(g.sample), s_outs.push_back(g.sampled);
    else FS_RETURN_IF_ERROR(b_.logits_out(lg.rows_from(o, n), n * Vr, logits));
  }
  if (!s_rows.empty()) FS_RETURN_IF_ERROR(b_.sample_rows(lg, s_rows, s_specs, s_outs));
  if (w_.has_mtp && b_.mtp_state())
    for (FwdSeg& g : ctx.segs) FS_RETURN_IF_ERROR(b_.mtp_advance(g, X.rows_from(g.row0 * hc, g.T * hc)));

  for (FwdSeg& g : ctx.segs) {
    ModelState& st = *g.st;
    if (v41 && !c_.engram_layer_ids.empty()) {  // Engram look-back: last N−1 ids (+ rollback reserve)
      for (int32_t t : g.tokens) st.engram_hist.push_back(w_.engram_token_map[size_t(t)]);
      const size_t keep = size_t(c_.engram_max_ngram_size - 1 + kMaxRollback);
      if (st.engram_hist.size() > keep) st.engram_hist.erase(st.engram_hist.begin(), st.engram_hist.end() - keep);
    }
    st.len += g.T;
  }
  return {};
}

void Forward::engram_ids(FwdChunk& ctx) const {
  const size_t n_layers = c_.engram_layer_ids.size();
  std::vector<std::vector<int64_t>> per_layer(n_layers);
  for (const FwdSeg& g : ctx.segs) {
    const auto& hist = g.st->engram_hist;
    const size_t n_back = std::min(hist.size(), size_t(c_.engram_max_ngram_size - 1));
    std::vector<int64_t> cids(hist.end() - int64_t(n_back), hist.end());
    for (int32_t t : g.tokens) cids.push_back(w_.engram_token_map[size_t(t)]);
    for (size_t li = 0; li < n_layers; ++li) {
      const auto& lay = w_.layers[size_t(c_.engram_layer_ids[li])].engram.layout;
      std::vector<int64_t> ids(size_t(g.T * lay.n_cols()));
      ops::engram_hash(lay, cids.data(), int64_t(n_back), g.T, g.start, w_.engram_pad_c, ids.data());
      per_layer[li].insert(per_layer[li].end(), ids.begin(), ids.end());
    }
  }
  ctx.engram_ids.clear();
  for (auto& ids : per_layer) ctx.engram_ids.insert(ctx.engram_ids.end(), ids.begin(), ids.end());
}

Status Forward::engram(int layer, FwdChunk& ctx, const Tensor& X) {
  const EngramWeights& E = w_.layers[size_t(layer)].engram;
  const int64_t T = ctx.T, D = c_.hidden_size, hc = c_.hc_mult, de = c_.engram_head_dim, nc = E.layout.n_cols();
  int64_t li = 0;
  while (c_.engram_layer_ids[size_t(li)] != layer) ++li;
  const std::span<const int64_t> ids(ctx.engram_ids.data() + li * T * nc, size_t(T * nc));
  FS_ASSIGN_OR_RETURN(Tensor e, scratch_f("engram_e", T * nc, de));
  FS_ASSIGN_OR_RETURN(Tensor kv, scratch_f("engram_kv", T, (hc + 1) * D));
  FS_RETURN_IF_ERROR(b_.engram_rows(E, ids, e));
  FS_RETURN_IF_ERROR(b_.linear(lin(e, E.wkv, T, nc * de, (hc + 1) * D, kv, p_.act_block, R(),
                                   {layer, DotOp::kEngramWkv})));
  return b_.engram_gate(X, kv, E.wqk, T, hc, D, float(c_.rms_norm_eps), R());
}

Status Forward::block(const LayerWeights& L, const std::string& tag, int64_t T, const Tensor& X, const Tensor& pre_in,
                      const Sublayer& attn, const Sublayer& ffn, std::optional<MoeCombineCall>* ffn_combine,
                      bool attn_mixed, const LayerWeights* next_layer) {
  const bool v41 = c_.is_v41();
  const int64_t hc = c_.hc_mult, D = c_.hidden_size;
  const float eps = float(c_.rms_norm_eps);
  FS_ASSIGN_OR_RETURN(Tensor pre_a, scratch_f(tag + "pre_a", T, hc));
  FS_ASSIGN_OR_RETURN(Tensor pre_f, scratch_f(tag + "pre_f", T, hc));
  FS_ASSIGN_OR_RETURN(Tensor post, scratch_f(tag + "post", T, hc));
  FS_ASSIGN_OR_RETURN(Tensor comb, scratch_f(tag + "comb", T, hc * hc));
  // A backend that runs the attention's stream update and the FFN's mixes as one op
  // (Backend::hc_post_mixes) reads the attention's post and comb while it writes the FFN's: the
  // FFN's go to their own buffers then.
  const bool fuse = b_.fuses_post_mixes(T);
  Tensor post_f = post, comb_f = comb;
  if (fuse) {
    FS_ASSIGN_OR_RETURN(post_f, scratch_f(tag + "post_f", T, hc));
    FS_ASSIGN_OR_RETURN(comb_f, scratch_f(tag + "comb_f", T, hc * hc));
  }
  FS_ASSIGN_OR_RETURN(Tensor u, scratch_f(tag + "u", T, D));
  FS_ASSIGN_OR_RETURN(Tensor a, scratch_f(tag + "a", T, D));
  FS_ASSIGN_OR_RETURN(Tensor f, scratch_f(tag + "f", T, D));
  auto mix_call = [&](const Vec& fn, const Vec& base, const Vec& scale, const Tensor& pre, const Tensor& po,
                      const Tensor& co) {
    HcMixCall m;
    m.x = X, m.fn = &fn, m.base = &base, m.scale = &scale, m.rows = T, m.hc = hc, m.dim = D;
    m.norm_eps = eps, m.hc_eps = float(c_.hc_eps), m.sinkhorn_iters = c_.hc_sinkhorn_iters;
    m.pre = pre, m.post = po, m.comb = co;
    return m;
  };
  // One sublayer: its mixes (pre, post, comb from X), the collapse of X by `pre_c`, the norm, the
  // sublayer, then hc_post with the mixes' post and comb. V4.1 applies the previous sublayer's pre
  // weights to the current stream (v41 §2 item 1), so there the collapse, norm and sublayer do not
  // read what the mixes write: the mixes run beside them (a lane-1 branch, joined before hc_post).
  // V4 collapses by the fresh pre: one chain.
  // `mixed`: the sublayer's mixes already ran (with the previous stream update, hc_post_mixes);
  // `next` (optional): the next sublayer's mixes, handed to this sublayer's stream update.
  auto sublayer = [&](const Vec& fn, const Vec& base, const Vec& scale, const Tensor& pre, const Tensor& pre_c,
                      const Tensor& po, const Tensor& co, const Vec& norm_w, const Sublayer& body,
                      std::optional<MoeCombineCall>* pending, bool mixed, const HcMixCall* next) -> Status {
    auto mix = [&]() { return mixed ? Status{} : b_.hc_mixes(mix_call(fn, base, scale, pre, po, co)); };
    auto rest = [&]() -> Status {
      FS_RETURN_IF_ERROR(b_.hc_collapse_norm(X, pre_c, &norm_w, u, a, T, hc, D, eps, R()));
      return body(a, f);
    };
    if (v41 && !mixed) {
      FS_RETURN_IF_ERROR(branches(mix, rest, /*lane=*/1));
    } else {
      FS_RETURN_IF_ERROR(mix());
      FS_RETURN_IF_ERROR(rest());
    }
    if (pending && pending->has_value()) {  // the body left its combine (into f) to this update
      const MoeCombineCall c = **pending;
      pending->reset();
      if (next) return b_.moe_combine_post_mixes(c, X, po, co, hc, R(), *next);
      return b_.moe_combine_post(c, X, po, co, hc, R());
    }
    if (next) return b_.hc_post_mixes(f, X, po, co, T, hc, D, R(), *next);
    return b_.hc_post(f, X, po, co, T, hc, D, R());
  };
  const HcMixCall ffn_mixes = mix_call(L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, pre_f, post_f, comb_f);
  // The next block's attention mixes (the same scratch: this block is done with pre_a, post and
  // comb by its FFN's update).
  std::optional<HcMixCall> next_mixes;
  if (fuse && next_layer) {
    const LayerWeights& N = *next_layer;
    next_mixes = mix_call(N.hc_attn_fn, N.hc_attn_base, N.hc_attn_scale, pre_a, post, comb);
  }
  FS_RETURN_IF_ERROR(sublayer(L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, pre_a, v41 ? pre_in : pre_a, post, comb,
                              L.attn_norm, attn, nullptr, attn_mixed, fuse ? &ffn_mixes : nullptr));
  FS_RETURN_IF_ERROR(sublayer(L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, pre_f, v41 ? pre_a : pre_f, post_f, comb_f,
                              L.ffn_norm, ffn, ffn_combine, fuse, next_mixes ? &*next_mixes : nullptr));
  return b_.copy(pre_in, pre_f, size_t(T * hc) * 4);
}

Status Forward::project_qkv(const AttentionWeights& A, const std::string& tag, const Tensor& a, const Tensor& pos,
                            int64_t T, int64_t H, Tensor& qlat, Tensor& q, Tensor& kv,
                            const std::function<Status()>& beside, FwdChunk* ctx, int layer, bool* published) {
  const bool v41 = c_.is_v41();
  const int64_t D = c_.hidden_size, Dh = c_.head_dim, Dr = c_.rope_head_dim, Rq = c_.q_lora_rank;
  const float eps = float(c_.rms_norm_eps);
  FS_ASSIGN_OR_RETURN(qlat, scratch_f(tag + "qlat", T, Rq));
  FS_ASSIGN_OR_RETURN(q, scratch_f(tag + "q", T, H * Dh));
  FS_ASSIGN_OR_RETURN(kv, scratch_f(tag + "kv", T, Dh));
  // wq_a and wkv read the same input: one launch where the backend keeps them stacked
  // (Backend::linear_pair), else each at the head of its branch below.
  const LinearCall q_a = lin(a, A.wq_a, T, D, Rq, qlat, p_.act_block, R(), {A.block, DotOp::kWqA});
  const LinearCall w_kv = lin(a, A.wkv, T, D, Dh, kv, p_.act_block, R(), {A.block, DotOp::kWkv});
  FS_ASSIGN_OR_RETURN(const bool paired, b_.linear_pair(q_a, w_kv));
  // Query: q = RoPE(wq_b(q_norm(wq_a a))) (+ V4's per-head norm before RoPE). The longer chain,
  // so the side branch (a backend may favour it).
  auto query = [&]() -> Status {
    if (!paired) FS_RETURN_IF_ERROR(b_.linear(q_a));
    FS_RETURN_IF_ERROR(b_.rms_norm(qlat, &A.q_norm, qlat, T, Rq, eps, R()));
    FS_RETURN_IF_ERROR(b_.linear(lin(qlat, A.wq_b, T, Rq, H * Dh, q, p_.act_block, R(), {A.block, DotOp::kWqB})));
    if (!v41) {
      if (R()) FS_RETURN_IF_ERROR(b_.rms_norm_bf16_heads(q, T * H, Dh, eps));
      else FS_RETURN_IF_ERROR(b_.rms_norm(q, nullptr, q, T * H, Dh, eps, false));
    }
    return b_.rope(q, pos, A.rope_inv_freq, T, H, Dh, Dr, false, R());
  };
  // Window KV: kv_norm(wkv a), RoPE, FP8 simulation (reference numerics). Reads only `a`, writes
  // only kv: independent of the query.
  auto window_kv = [&]() -> Status {
    if (!paired) FS_RETURN_IF_ERROR(b_.linear(w_kv));
    const NormRopeQuantCall rows = kv_rows(A, kv, pos, T);
    if (!published) return b_.norm_rope_quant(rows);
    FS_ASSIGN_OR_RETURN(*published, b_.window_kv_rows(layer, *ctx, rows));
    return Status{};
  };
  return branches(query, [&]() -> Status {
    FS_RETURN_IF_ERROR(window_kv());
    return beside ? beside() : Status{};
  });
}

NormRopeQuantCall Forward::kv_rows(const AttentionWeights& A, const Tensor& kv, const Tensor& pos, int64_t T) const {
  const bool v41 = c_.is_v41();
  NormRopeQuantCall c;
  c.x = kv, c.pos = pos, c.w = &A.kv_norm, c.inv_freq = &A.rope_inv_freq;
  c.rows = T, c.dim = c_.head_dim, c.rope_dim = c_.rope_head_dim, c.eps = float(c_.rms_norm_eps), c.bf16 = R();
  if (R()) {  // V4.1: the RoPE tail included
    c.quant_prefix = v41 ? c.dim : c.dim - c.rope_dim;
    c.quant_block = v41 ? 32 : 64;
  }
  return c;
}

Status Forward::output_projection(const AttentionWeights& A, const std::string& tag, const Tensor& pos, int64_t T,
                                  int64_t H, int64_t G, const Tensor& o, const Tensor& out, bool bf16_out,
                                  bool unroped) {
  const int64_t Dh = c_.head_dim, Ro = c_.o_lora_rank, in_g = H * Dh / G;
  if (!unroped) FS_RETURN_IF_ERROR(b_.rope(o, pos, A.rope_inv_freq, T, H, Dh, c_.rope_head_dim, true, R()));
  // Grouped output projection: group g = heads [g·H/G, (g+1)·H/G), z_g = wo_a[g] · o_g (BF16 GEMM
  // in the reference), then wo_b.
  FS_ASSIGN_OR_RETURN(Tensor z, scratch_f(tag, T, G * Ro));
  FS_RETURN_IF_ERROR(b_.grouped_linear(o, A.wo_a, T, G, in_g, Ro, z, R()));
  return b_.linear(lin(z, A.wo_b, T, G * Ro, c_.hidden_size, out, p_.act_block, bf16_out, {A.block, DotOp::kWoB}));
}

Status Forward::attention(int l, FwdChunk& ctx, const Tensor& a, const Tensor& out) {
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const int64_t T = ctx.T, D = c_.hidden_size, H = b_.heads(), Dh = c_.head_dim;
  Tensor qlat, q, kv;
  // The compressors read only `a` (their state and caches are not the query's or the window's):
  // beside the query. The indexer reads the query's latent: after the join.
  auto compressors = [&]() -> Status { return A.has_compressor ? compress(l, ctx, a) : Status{}; };
  bool published = false;  // the window rows already in the ring (Backend::window_kv_rows)
  FS_RETURN_IF_ERROR(project_qkv(A, "", a, ctx.pos, T, H, qlat, q, kv, compressors, &ctx, l, &published));
  if (A.has_indexer) FS_RETURN_IF_ERROR(index_select(l, ctx, a, qlat));
  FS_ASSIGN_OR_RETURN(Tensor o, scratch_f("attn_o", T, H * Dh));
  FS_RETURN_IF_ERROR(b_.attention_unrope(l, ctx, q, kv, A.attn_sink, o, H, Dh, R(), A.rope_inv_freq, c_.rope_head_dim));
  // Only now publish the chunk's window rows (the queries above read older ones from the ring),
  // beside the output projection, which reads no state; unless the backend wrote them with the
  // window KV rows' own work (into slots this attention does not read).
  auto publish = [&]() { return published ? Status{} : b_.ring_write(l, ctx, kv); };
  return branches(publish, [&]() -> Status {
    // Several GPUs: each rank's wo_b output is a partial sum; BF16 rounding after the all-reduce.
    FS_RETURN_IF_ERROR(output_projection(A, "attn_z", ctx.pos, T, H, b_.groups(), o, out, R() && !b_.split(), true));
    return b_.tp_allreduce(out, T * D, R());
  });
}

Status Forward::compress(int l, FwdChunk& ctx, const Tensor& a) {
  const auto& role = c_.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool v41 = c_.is_v41();
  const int64_t T = ctx.T, D = c_.hidden_size, Dh = c_.head_dim, dI = c_.index_head_dim, ratio = role.ratio;
  const int64_t coff = !v41 && ratio == 4 ? 2 : 1;
  // Projections in FP32 over every row (the reference promotes compressor weights; V4.1 ratio 1
  // is a BF16 GEMM); gates get `ape` at pos mod ratio (V4).
  auto project = [&](const CompressorWeights& cw, int64_t width, const std::string& tag, Tensor& v,
                     Tensor& z) -> Status {
    FS_ASSIGN_OR_RETURN(v, scratch_f(tag + "_v", T, width));
    FS_RETURN_IF_ERROR(b_.linear(bf16_x(lin(a, cw.wkv, T, D, width, v, 0, R() && v41 && ratio == 1), R())));
    if (!b_.has(cw.wgate)) return {};
    FS_ASSIGN_OR_RETURN(z, scratch_f(tag + "_z", T, width));
    FS_RETURN_IF_ERROR(b_.linear(bf16_x(lin(a, cw.wgate, T, D, width, z, 0, false), R())));
    if (b_.has(cw.ape)) FS_RETURN_IF_ERROR(b_.add_ape(z, cw.ape, ctx.pos, T, width, ratio));
    return {};
  };
  Tensor v, z, iv, iz;
  FS_RETURN_IF_ERROR(project(A.compressor, coff * Dh, "cmp", v, z));
  if (A.has_idx_compressor) FS_RETURN_IF_ERROR(project(A.idx_compressor, coff * dI, "icmp", iv, iz));
  // Every sequence at once: the state ops take the chunk, the entry ops are row-wise.
  const bool overlap = !v41 && ratio == 4;
  if (v41 && ratio == 1) {  // a plain projection: every row is an entry
    std::vector<int64_t> seg_n, groups;
    for (const FwdSeg& g : ctx.segs) {
      seg_n.push_back(g.T);
      groups.insert(groups.end(), g.pos.begin(), g.pos.end());
    }
    FS_ASSIGN_OR_RETURN(Tensor e, b_.cache_reserve(ctx, l, Cache::kCkv, seg_n));
    FS_RETURN_IF_ERROR(b_.copy(e, v, size_t(T * Dh) * 4));
    FS_RETURN_IF_ERROR(finish_entries(l, ctx, Compressor::kKv, e, groups, seg_n));
  } else {
    FS_ASSIGN_OR_RETURN(PooledRows p, b_.compressor_feed(ctx, l, Compressor::kKv, v, z, ratio, Dh, overlap));
    if (!p.groups.empty()) FS_RETURN_IF_ERROR(finish_entries(l, ctx, Compressor::kKv, p.rows, p.groups, p.seg_n));
  }
  if (!A.has_idx_compressor) return {};
  // V4 indexer compressor (c = dI): the same pooling, then Hadamard + FP4 (reference).
  FS_ASSIGN_OR_RETURN(PooledRows p, b_.compressor_feed(ctx, l, Compressor::kIndex, iv, iz, ratio, dI, overlap));
  if (!p.groups.empty()) FS_RETURN_IF_ERROR(finish_entries(l, ctx, Compressor::kIndex, p.rows, p.groups, p.seg_n));
  return {};
}

Status Forward::finish_entries(int l, FwdChunk& ctx, Compressor which, const Tensor& e,
                               const std::vector<int64_t>& groups, std::span<const int64_t> seg_n) {
  const auto& role = c_.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool v41 = c_.is_v41();
  const int64_t Dh = c_.head_dim, Dr = c_.rope_head_dim, dI = c_.index_head_dim, n = int64_t(groups.size());
  const int64_t ratio = role.ratio;
  const float eps = float(c_.rms_norm_eps);
  std::vector<int64_t> gp(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) gp[i] = groups[i] * ratio;  // RoPE at the group's first token
  FS_ASSIGN_OR_RETURN(Tensor gpos, b_.scratch(which == Compressor::kKv ? "cmp_gpos" : "icmp_gpos", ElemType::kI64, n));
  FS_RETURN_IF_ERROR(b_.upload(gpos, gp.data(), gp.size() * 8));
  if (which == Compressor::kIndex) {  // V4 index keys
    if (R()) FS_RETURN_IF_ERROR(b_.quant_sim(e, n, dI, dI, 1, QuantSim::kBf16));
    FS_RETURN_IF_ERROR(b_.rms_norm(e, &A.idx_compressor.norm, e, n, dI, eps, R()));
    FS_RETURN_IF_ERROR(b_.rope(e, gpos, A.rope_inv_freq, n, 1, dI, Dr, false, R()));
    if (R()) {
      FS_RETURN_IF_ERROR(b_.hadamard(e, n, dI));
      FS_RETURN_IF_ERROR(b_.quant_sim(e, n, dI, dI, 1, QuantSim::kBf16));
      FS_RETURN_IF_ERROR(b_.quant_sim(e, n, dI, dI, 32, QuantSim::kFp4E8m0));
    }
    return b_.cache_commit(ctx, l, Cache::kIkeys, seg_n);
  }
  if (R()) FS_RETURN_IF_ERROR(b_.quant_sim(e, n, Dh, Dh, 1, QuantSim::kBf16));
  FS_RETURN_IF_ERROR(b_.rms_norm(e, &A.compressor.norm, e, n, Dh, eps, R()));
  if (v41 && b_.has(A.idx_wk)) {  // V4.1 index keys from the pre-RoPE latent: k_norm(wk(latent)), RoPE, FP4
    FS_ASSIGN_OR_RETURN(Tensor k, b_.cache_reserve(ctx, l, Cache::kIkeys, seg_n));
    FS_RETURN_IF_ERROR(b_.linear(lin(e, A.idx_wk, n, Dh, dI, k, 0, R(), {}, R())));
    FS_RETURN_IF_ERROR(b_.rms_norm(k, &A.idx_k_norm, k, n, dI, eps, R()));
    FS_RETURN_IF_ERROR(b_.rope(k, gpos, A.rope_inv_freq, n, 1, dI, Dr, false, R()));
    if (R()) FS_RETURN_IF_ERROR(b_.quant_sim(k, n, dI, dI, 32, QuantSim::kFp4E8m0));
    FS_RETURN_IF_ERROR(b_.cache_commit(ctx, l, Cache::kIkeys, seg_n));
  }
  FS_RETURN_IF_ERROR(b_.rope(e, gpos, A.rope_inv_freq, n, 1, Dh, Dr, false, R()));
  if (R() && v41) FS_RETURN_IF_ERROR(b_.quant_sim(e, n, Dh, Dh, 16, QuantSim::kFp4E4m3));
  if (R() && !v41) FS_RETURN_IF_ERROR(b_.quant_sim(e, n, Dh, Dh - Dr, 64, QuantSim::kFp8));
  return b_.cache_commit(ctx, l, Cache::kCkv, seg_n);
}

Status Forward::index_select(int l, FwdChunk& ctx, const Tensor& a, const Tensor& qlat) {
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool v41 = c_.is_v41();
  const int64_t T = ctx.T, D = c_.hidden_size, Dr = c_.rope_head_dim, Rq = c_.q_lora_rank;
  const int64_t nI = c_.index_n_heads, dI = c_.index_head_dim, K = c_.index_topk;
  FS_ASSIGN_OR_RETURN(Tensor iq, scratch_f("idx_q", T, nI * dI));
  FS_ASSIGN_OR_RETURN(Tensor wts, scratch_f("idx_w", T, nI));
  FS_RETURN_IF_ERROR(b_.linear(lin(qlat, A.idx_wq_b, T, Rq, nI * dI, iq, p_.act_block, R(), {A.block, DotOp::kIdxWqB})));
  FS_RETURN_IF_ERROR(b_.rope(iq, ctx.pos, A.rope_inv_freq, T, nI, dI, Dr, false, R()));
  if (R()) {
    if (!v41) {
      FS_RETURN_IF_ERROR(b_.hadamard(iq, T * nI, dI));
      FS_RETURN_IF_ERROR(b_.quant_sim(iq, T * nI, dI, dI, 1, QuantSim::kBf16));
    }
    FS_RETURN_IF_ERROR(b_.quant_sim(iq, T * nI, dI, dI, 32, QuantSim::kFp4E8m0));
  }
  FS_RETURN_IF_ERROR(b_.linear(bf16_x(lin(a, A.idx_weights_proj, T, D, nI, wts, 0, R()), R())));  // no FP8 input
  FS_RETURN_IF_ERROR(b_.scale(wts, T * nI, 1.0f / std::sqrt(float(dI)) / std::sqrt(float(nI)), R()));
  // This layer's lists for every row (later layers read them through their idx_src).
  FS_ASSIGN_OR_RETURN(Tensor out, b_.scratch("topk" + std::to_string(l), ElemType::kI32, T, K));
  FS_ASSIGN_OR_RETURN(Tensor out_n, b_.scratch("topk_n" + std::to_string(l), ElemType::kI32, T));
  FS_RETURN_IF_ERROR(b_.index_topk(l, ctx, iq, wts, out, out_n));
  for (FwdSeg& g : ctx.segs) {
    g.topk[size_t(l)] = out.rows_from(g.row0, g.T);
    g.topk_n[size_t(l)] = out_n.rows_from(g.row0, g.T);
  }
  return {};
}

Status Forward::moe(const FfnWeights& F, const std::string& tag, const Tensor& tokens, int64_t T, int64_t E, int64_t K,
                    const Tensor& m, const Tensor& out, bool sharded, std::optional<MoeCombineCall>* defer) {
  const int64_t D = c_.hidden_size, I = c_.moe_inter_dim, TK = T * K;
  const bool split = sharded && b_.split();
  const float limit = float(c_.swiglu_limit);
  FS_ASSIGN_OR_RETURN(Tensor logits, scratch_f(tag + "logits", T, E));
  FS_ASSIGN_OR_RETURN(Tensor sel, b_.scratch(tag + "sel", ElemType::kI32, T, K));
  FS_ASSIGN_OR_RETURN(Tensor wt, scratch_f(tag + "wt", T, K));
  FS_ASSIGN_OR_RETURN(Tensor ybuf, scratch_f(tag + "y", TK, D));
  FS_ASSIGN_OR_RETURN(Tensor ys, scratch_f(tag + "ys", T, D));
  Tensor row_of;
  // Router and routed experts (the longer chain: the side branch): outputs per (row, slot),
  // summed in slot order (ascending expert id).
  auto routed = [&]() -> Status {
    FS_RETURN_IF_ERROR(b_.linear(bf16_x(lin(m, F.gate, T, D, E, logits, 0, false), R())));  // FP32 router logits
    FS_RETURN_IF_ERROR(b_.route(F, logits, tokens, T, E, K, sel, wt));
    if (split) FS_RETURN_IF_ERROR(b_.tp_remap_experts(sel, wt, TK));  // several GPUs: only this rank's experts
    return b_.routed_experts(F, m, sel, wt, T, E, K, ybuf, &row_of);
  };
  // Shared expert: w2 · bf16?(silu(min(w1 m, L)) · clamp(w3 m)). Reads only m, writes only ys and
  // its own scratch: independent of the routed experts.
  auto shared = [&]() -> Status {
    if (!b_.has(F.s_w1)) return b_.zero(ys);  // the shared expert lives on another rank
    FS_ASSIGN_OR_RETURN(Tensor g, scratch_f(tag + "sg", T, I));
    FS_ASSIGN_OR_RETURN(Tensor u, scratch_f(tag + "su", T, I));
    FS_ASSIGN_OR_RETURN(Tensor h, scratch_f(tag + "sh", T, I));
    FS_RETURN_IF_ERROR(b_.gated_linear(lin(m, F.s_w1, T, D, I, g, p_.act_block, R(), {F.block, DotOp::kW1, -1}),
                                       lin(m, F.s_w3, T, D, I, u, p_.act_block, R(), {F.block, DotOp::kW3, -1}), h,
                                       T, I, limit, R()));
    return b_.linear(lin(h, F.s_w2, T, I, D, ys, p_.act_block, R(), {F.block, DotOp::kW2, -1}));
  };
  FS_RETURN_IF_ERROR(branches(routed, shared));
  if (defer && !split) {
    MoeCombineCall c;
    c.ybuf = ybuf, c.ys = ys, c.out = out, c.row_of = row_of, c.T = T, c.K = K, c.D = D, c.bf16 = R();
    *defer = c;
    return {};
  }
  // Several GPUs: each rank's combine is a partial sum; BF16 rounding after the all-reduce.
  FS_RETURN_IF_ERROR(b_.moe_combine(ybuf, ys, out, T, K, D, R() && !split, row_of));
  return split ? b_.tp_allreduce(out, T * D, R()) : Status{};
}

// ---- DSpark (v41 §5) ----

// ctx = rms_norm(main_proj · [taps of a position]); per stage: kv_norm(wkv ctx), RoPE, FP8 (ref),
// written to the stage's ring at the position.
Status Forward::write_draft_rings(FwdChunk& ctx, const Tensor& taps) {
  const DSparkWeights& W = w_.dspark;
  const int64_t T = ctx.T, D = c_.hidden_size, Dh = c_.head_dim, n_in = int64_t(c_.dspark_target_layer_ids.size()) * D;
  const float eps = float(c_.rms_norm_eps);
  FS_ASSIGN_OR_RETURN(Tensor cx, scratch_f("dspark_cx", T, D));
  FS_ASSIGN_OR_RETURN(Tensor kv, scratch_f("dspark_kv", T, Dh));
  FS_RETURN_IF_ERROR(b_.linear(lin(taps, W.main_proj, T, n_in, D, cx, p_.act_block, R(),
                                   {c_.num_layers, DotOp::kMainProj})));
  FS_RETURN_IF_ERROR(b_.rms_norm(cx, &W.main_norm, cx, T, D, eps, R()));
  for (size_t s = 0; s < W.stages.size(); ++s) {
    const AttentionWeights& A = W.stages[s].attn;
    FS_RETURN_IF_ERROR(b_.linear(lin(cx, A.wkv, T, D, Dh, kv, p_.act_block, R(), {A.block, DotOp::kWkv})));
    FS_RETURN_IF_ERROR(b_.norm_rope_quant(kv_rows(A, kv, ctx.pos, T)));
    FS_RETURN_IF_ERROR(b_.draft_ring_write(int(s), ctx, kv));
  }
  return {};
}

Status Forward::draft_attention(int stage, FwdSeg& seg, const Tensor& pos, const Tensor& a, const Tensor& out) {
  const AttentionWeights& A = w_.dspark.stages[size_t(stage)].attn;
  const int64_t B = seg.T, H = c_.num_heads, Dh = c_.head_dim;
  Tensor qlat, q, kv;
  FS_RETURN_IF_ERROR(project_qkv(A, "dr_", a, pos, B, H, qlat, q, kv));
  FS_ASSIGN_OR_RETURN(Tensor o, scratch_f("dr_o", B, H * Dh));
  FS_RETURN_IF_ERROR(b_.draft_attention(stage, seg, q, kv, A.attn_sink, o, H, R()));
  return output_projection(A, "dr_z", pos, B, H, c_.o_groups, o, out, R());
}

Result<DraftBlock> Forward::propose(ModelState& st, int32_t x0, const DraftChooser& choose) {
  const int64_t V = c_.vocab_size, D = c_.hidden_size, hc = c_.hc_mult, B = c_.dspark_block_size;
  const int64_t r = c_.dspark_markov_rank;
  const DSparkWeights& W = w_.dspark;
  std::vector<int32_t> ids(size_t(B), int32_t(c_.dspark_noise_token_id));
  ids[0] = x0;
  FwdSeg g;
  g.st = &st;
  g.tokens = ids;
  g.start = st.len;
  g.T = B;
  for (int64_t j = 0; j < B; ++j) g.pos.push_back(st.len + j);
  FS_ASSIGN_OR_RETURN(g.tokens_d, b_.scratch("dr_tokens", ElemType::kI32, B));
  FS_ASSIGN_OR_RETURN(g.pos_d, b_.scratch("dr_pos", ElemType::kI64, B));
  FS_RETURN_IF_ERROR(b_.upload(g.tokens_d, ids.data(), size_t(B) * 4));
  FS_RETURN_IF_ERROR(b_.upload(g.pos_d, g.pos.data(), size_t(B) * 8));
  FS_ASSIGN_OR_RETURN(Tensor X, scratch_f("dr_X", B * hc, D));
  FS_RETURN_IF_ERROR(b_.embed(w_.embed, g.tokens_d, X, B, hc, D));
  std::vector<float> pre_h(size_t(B * hc), 0.0f);
  for (int64_t j = 0; j < B; ++j) pre_h[size_t(j * hc)] = 1.0f;
  FS_ASSIGN_OR_RETURN(Tensor pre, scratch_f("dr_pre_in", B, hc));
  FS_RETURN_IF_ERROR(b_.upload(pre, pre_h.data(), pre_h.size() * 4));
  for (int s = 0; s < int(W.stages.size()); ++s) {
    const LayerWeights& S = W.stages[size_t(s)];
    FS_RETURN_IF_ERROR(block(
        S, "dr_", B, X, pre, [&](const Tensor& a, const Tensor& f) { return draft_attention(s, g, g.pos_d, a, f); },
        [&](const Tensor& a, const Tensor& f) {
          return moe(S.ffn, "dr_moe_", g.tokens_d, B, c_.dspark_n_routed_experts, c_.dspark_n_experts_per_tok, a, f,
                     /*sharded=*/false);
        }));
  }
  FS_ASSIGN_OR_RETURN(Tensor hf, scratch_f("dr_hf", B, D));
  FS_ASSIGN_OR_RETURN(Tensor y, scratch_f("dr_y", B, D));
  FS_ASSIGN_OR_RETURN(Tensor U, scratch_f("dr_U", B, V));
  FS_RETURN_IF_ERROR(b_.hc_collapse(X, pre, hf, B, hc, D, R()));
  FS_RETURN_IF_ERROR(b_.rms_norm(hf, &W.norm, y, B, D, float(c_.rms_norm_eps), R()));
  FS_RETURN_IF_ERROR(b_.draft_head(head_call(y, w_.head, B, D, V, U, R())));  // every vocabulary row
  std::vector<float> hU(size_t(B * V)), hhf(size_t(B * D));
  FS_RETURN_IF_ERROR(b_.download_now(hU.data(), U, hU.size() * 4));
  FS_RETURN_IF_ERROR(b_.download_now(hhf.data(), hf, hhf.size() * 4));
  // Sequential Markov correction: ℓ_i = U_{i−1} + Hm · E[y_{i−1}]; confidence on [hf_{i−1} ‖ e_i].
  DraftBlock out;
  out.logits.resize(size_t(B * V));
  int32_t prev = x0;
  std::vector<float> cin(size_t(D + r)), e(static_cast<size_t>(r));
  for (int64_t i = 1; i <= B; ++i) {
    float* l = out.logits.data() + (i - 1) * V;
    FS_RETURN_IF_ERROR(b_.markov_logits(prev, std::span<float>(l, size_t(V))));
    FS_RETURN_IF_ERROR(b_.markov_embed_row(prev, e));
    for (int64_t v = 0; v < V; ++v) l[v] += hU[size_t((i - 1) * V + v)];
    std::copy_n(hhf.data() + (i - 1) * D, D, cin.data());
    std::copy_n(e.data(), r, cin.data() + D);
    out.confidence.push_back(ops::dot_f32(W.confidence.data(), cin.data(), D + r));  // host rows
    const std::span<const float> row(l, size_t(V));
    prev = choose ? choose(i, row) : int32_t(std::max_element(l, l + V) - l);
    if (prev < 0 || prev >= V) return invalid_argument("propose: chooser returned token {} outside [0, {})", prev, V);
    out.tokens.push_back(prev);
  }
  return out;
}

Result<Tensor> Forward::mtp_block(const SequenceState& st, const Tensor& xm, const Tensor& tok,
                                  const std::vector<int64_t>& pos, Tensor* logits) {
  const MtpWeights& M = w_.mtp;
  const AttentionWeights& A = M.block.attn;
  // Every head and output group: the MTP block's weights are whole (never split across ranks).
  const int64_t n = int64_t(pos.size()), D = c_.hidden_size, hc = c_.hc_mult, H = c_.num_heads, Dh = c_.head_dim;
  const float eps = float(c_.rms_norm_eps);
  if (n < 1) return internal_error("mtp_block: no pair");
  for (int64_t r = 1; r < n; ++r)  // the attention reads window keys as one run of positions
    if (pos[size_t(r)] != pos[0] + r) return internal_error("mtp_block: positions are not consecutive");
  FS_ASSIGN_OR_RETURN(Tensor pd, b_.scratch("mtp_pos", ElemType::kI64, n));
  FS_RETURN_IF_ERROR(b_.upload(pd, pos.data(), size_t(n) * 8));
  // X = bf16?(e_proj(enorm(embed[next])) broadcast over the streams + h_proj(hnorm(X_p))).
  FS_ASSIGN_OR_RETURN(Tensor e, scratch_f("mtp_e", n, D));
  FS_ASSIGN_OR_RETURN(Tensor hh, scratch_f("mtp_hh", n * hc, D));
  FS_ASSIGN_OR_RETURN(Tensor ep, scratch_f("mtp_ep", n, D));
  FS_ASSIGN_OR_RETURN(Tensor X, scratch_f("mtp_X", n * hc, D));
  FS_ASSIGN_OR_RETURN(Tensor pre, scratch_f("mtp_pre", n, hc));
  FS_RETURN_IF_ERROR(b_.embed(w_.embed, tok, e, n, 1, D));
  FS_RETURN_IF_ERROR(b_.rms_norm(e, &M.enorm, e, n, D, eps, R()));
  FS_RETURN_IF_ERROR(b_.rms_norm(xm, &M.hnorm, hh, n * hc, D, eps, R()));
  FS_RETURN_IF_ERROR(b_.linear({e, &M.e_proj, n, D, D, ep, p_.act_block, R(), false, {A.block, DotOp::kEProj}}));
  FS_RETURN_IF_ERROR(b_.linear({hh, &M.h_proj, n * hc, D, D, X, p_.act_block, R(), false, {A.block, DotOp::kHProj}}));
  FS_RETURN_IF_ERROR(b_.stream_add(ep, X, n, hc, D, R()));
  FS_RETURN_IF_ERROR(b_.zero(pre));
  FS_ASSIGN_OR_RETURN(Tensor kv_rows, scratch_f("mtp_kv_rows", n, Dh));
  // Window attention over the MTP ring and the block's own rows (causal), as the backbone's window
  // layers: key s is kv[s − pos[0]] when s >= pos[0], else the ring's row of s.
  auto attn = [&](const Tensor& a, const Tensor& out) -> Status {
    Tensor qlat, q, kv;
    FS_RETURN_IF_ERROR(project_qkv(A, "mtp_", a, pd, n, H, qlat, q, kv));
    FS_RETURN_IF_ERROR(b_.copy(kv_rows, kv, size_t(n * Dh) * 4));  // the caller's ring write after the block
    FS_ASSIGN_OR_RETURN(Tensor o, scratch_f("mtp_o", n, H * Dh));
    FS_RETURN_IF_ERROR(b_.mtp_attention(st, q, kv, pos, A.attn_sink, o, R()));
    return output_projection(A, "mtp_z", pd, n, H, c_.o_groups, o, out, R());
  };
  FS_RETURN_IF_ERROR(block(M.block, "mtp_", n, X, pre, attn, [&](const Tensor& m, const Tensor& out) {
    return moe(M.block.ffn, "mtp_moe_", tok, n, c_.n_routed_experts, c_.n_experts_per_tok, m, out, /*sharded=*/false);
  }));
  if (!logits) return kv_rows;
  // hc_head, collapse, norm and the LM head (the backbone's head, FP32 dots).
  FS_ASSIGN_OR_RETURN(Tensor y, scratch_f("mtp_y", n, D));
  HcMixCall hm;
  hm.x = X, hm.fn = &M.hc_head_fn, hm.base = &M.hc_head_base, hm.scale = &M.hc_head_scale;
  hm.rows = n, hm.hc = hc, hm.dim = D, hm.norm_eps = eps, hm.hc_eps = float(c_.hc_eps), hm.pre = pre;
  FS_RETURN_IF_ERROR(b_.hc_head_pre(hm));
  FS_RETURN_IF_ERROR(b_.hc_collapse(X, pre, y, n, hc, D, R()));
  FS_RETURN_IF_ERROR(b_.rms_norm(y, &M.norm, y, n, D, eps, R()));
  FS_ASSIGN_OR_RETURN(*logits, scratch_f("mtp_logits", n, c_.vocab_size));
  FS_RETURN_IF_ERROR(b_.draft_head(head_call(y, w_.head, n, D, c_.vocab_size, *logits, R())));
  return kv_rows;
}

}  // namespace flashseek::forward
