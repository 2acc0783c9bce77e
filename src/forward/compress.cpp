// KV compressors and the indexer of one layer over one chunk.
// V4.1 (v41 §2 items 5–6, §3.2 step 4): ratio 2 pools non-overlapping pairs, ratio 1 is a plain
// projection; index keys come from the pre-RoPE latent. V4 (v4 §3.5.5–3.5.6): ratio 4 overlapping
// windows with `ape`, ratio 128 plain, and a separate indexer compressor with Hadamard.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/numeric.h"
#include "core/thread_pool.h"
#include "forward/cpu_model.h"
#include "ops/compressor.h"
#include "ops/indexer.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/quant.h"
#include "ops/rope.h"

namespace flashseek::forward {

namespace {

// Feeds the chunk's (v, z) rows [T, width] into `cs`; returns the pooled entries (one per group
// completed in this chunk) as [n, c] and their group indices. `ratio` tokens per group;
// `overlap`: V4 ratio-4 windows of 8 slots (first halves of the previous window + second halves
// of the current one), width = 2c; otherwise width = c.
void pool_groups(CompressorState& cs, const std::vector<float>& v, const std::vector<float>& z,
                 const std::vector<int64_t>& pos, int64_t ratio, int64_t c, bool overlap,
                 std::vector<float>& entries, std::vector<int64_t>& groups) {
  const int64_t width = overlap ? 2 * c : c, T = int64_t(pos.size());
  for (int64_t t = 0; t < T; ++t) {
    cs.v.insert(cs.v.end(), v.begin() + t * width, v.begin() + (t + 1) * width);
    cs.z.insert(cs.z.end(), z.begin() + t * width, z.begin() + (t + 1) * width);
    cs.hist_v.insert(cs.hist_v.end(), v.begin() + t * width, v.begin() + (t + 1) * width);
    cs.hist_z.insert(cs.hist_z.end(), z.begin() + t * width, z.begin() + (t + 1) * width);
    const int64_t keep = 2 * ratio + kMaxRollback, n_hist = int64_t(cs.hist_v.size()) / width;
    if (n_hist > keep) {
      cs.hist_v.erase(cs.hist_v.begin(), cs.hist_v.begin() + (n_hist - keep) * width);
      cs.hist_z.erase(cs.hist_z.begin(), cs.hist_z.begin() + (n_hist - keep) * width);
    }
    cs.hist_first = pos[t] + 1 - std::min(n_hist, keep);
    if (++cs.n_pend < ratio) continue;
    std::vector<const float*> vs, zs;
    if (overlap) {
      for (int64_t s = 0; s < ratio; ++s) {
        vs.push_back(cs.has_prev ? cs.prev_v.data() + s * width : nullptr);
        zs.push_back(cs.has_prev ? cs.prev_z.data() + s * width : nullptr);
      }
    }
    for (int64_t s = 0; s < ratio; ++s) {
      vs.push_back(cs.v.data() + s * width + (overlap ? c : 0));
      zs.push_back(cs.z.data() + s * width + (overlap ? c : 0));
    }
    std::vector<float> e(static_cast<size_t>(c));
    ops::softmax_pool({vs.data(), zs.data(), int64_t(vs.size()), c, e.data()});
    entries.insert(entries.end(), e.begin(), e.end());
    groups.push_back(pos[t] / ratio);
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

// Compressor projections in FP32 (the reference promotes compressor weights; V4.1 ratio 1 is a
// BF16 GEMM): v = wkv·a [T, width], z = wgate·a + ape[pos mod ratio] (no gate: z stays empty).
void project(const std::vector<float>& a, const CompressorWeights& cw, const std::vector<int64_t>& pos,
             int64_t ratio, int64_t D, int64_t width, bool bf16_v, std::vector<float>& v, std::vector<float>& z) {
  const int64_t T = int64_t(pos.size());
  v.resize(size_t(T * width));
  ops::LinearParams pv{a.data(), cw.wkv.data(), v.data(), T, D, width};
  pv.bf16_out = bf16_v;
  ops::linear(pv);
  if (cw.wgate.empty()) return;
  z.resize(size_t(T * width));
  ops::linear({a.data(), cw.wgate.data(), z.data(), T, D, width});
  if (cw.ape.empty()) return;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < width; ++j) z[t * width + j] += cw.ape[(pos[t] % ratio) * width + j];
}

// V4.1 index keys from the pre-RoPE latents [n, Dh]: k_norm(wk(latent)), RoPE at the group's first
// token, FP4 with UE8M0 group-32 scales (reference).
std::vector<float> v41_index_keys(const AttentionWeights& A, const std::vector<float>& latent,
                                  const std::vector<int64_t>& gpos, int64_t Dh, int64_t dI, int64_t Dr,
                                  float eps, bool R) {
  const int64_t n = int64_t(gpos.size());
  std::vector<float> k(static_cast<size_t>(n * dI));
  ops::LinearParams p{latent.data(), A.idx_wk.data(), k.data(), n, Dh, dI};
  p.bf16_in = p.bf16_out = R;
  ops::linear(p);
  ops::rms_norm({k.data(), A.idx_k_norm.data(), k.data(), n, dI, eps, R});
  ops::apply_rope({k.data(), gpos.data(), A.rope_inv_freq.data(), n, 1, dI, Dr, false, R});
  if (R) ops::fp4_quant_dequant_e8m0(k.data(), n, dI, 32);
  return k;
}

}  // namespace

void CpuModel::compress(int l, ChunkCtx& ctx, const std::vector<float>& a) {
  const auto& c = config();
  const auto& role = c.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  LayerState& LS = ctx.st->layers[size_t(l)];
  const bool R = ref(), v41 = c.is_v41();
  const int64_t T = ctx.T, D = c.hidden_size, Dh = c.head_dim, Dr = c.rope_head_dim, dI = c.index_head_dim;
  const int64_t ratio = role.ratio;
  const float eps = float(c.rms_norm_eps);
  const bool overlap = !v41 && ratio == 4;
  const int64_t coff = overlap ? 2 : 1;

  std::vector<float> v, z, entries;
  std::vector<int64_t> groups;
  project(a, A.compressor, ctx.pos, ratio, D, coff * Dh, R && v41 && ratio == 1, v, z);
  if (v41 && ratio == 1) {
    entries = v;
    groups = ctx.pos;
  } else {
    pool_groups(LS.comp, v, z, ctx.pos, ratio, Dh, overlap, entries, groups);
  }
  const int64_t n = int64_t(groups.size());
  if (n == 0) return;
  std::vector<int64_t> gpos(groups.size());
  for (int64_t i = 0; i < n; ++i) gpos[i] = groups[i] * ratio;  // RoPE at the group's first token
  if (R) ops::round_bf16_inplace(entries.data(), n * Dh);
  ops::rms_norm({entries.data(), A.compressor.norm.data(), entries.data(), n, Dh, eps, R});
  if (v41 && !A.idx_wk.empty()) {
    const auto k = v41_index_keys(A, entries, gpos, Dh, dI, Dr, eps, R);
    LS.ikeys.append(k);
  }
  ops::apply_rope({entries.data(), gpos.data(), A.rope_inv_freq.data(), n, 1, Dh, Dr, false, R});
  if (R && v41) ops::fp4_quant_dequant_e4m3(entries.data(), n, Dh, 16);
  if (R && !v41)
    for (int64_t i = 0; i < n; ++i) ops::fp8_quant_dequant(entries.data() + i * Dh, 1, Dh - Dr, 64);
  LS.ckv.append(entries);
}

void CpuModel::compress_v4_index(int l, ChunkCtx& ctx, const std::vector<float>& a) {
  // V4 indexer compressor (c = dI): the attention compressor's pooling, then Hadamard + FP4 in
  // reference numerics (v4 §3.5.6).
  const auto& c = config();
  const int64_t ratio = c.role(l).ratio, D = c.hidden_size, dI = c.index_head_dim, Dr = c.rope_head_dim;
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  LayerState& LS = ctx.st->layers[size_t(l)];
  const bool R = ref(), overlap = ratio == 4;
  const float eps = float(c.rms_norm_eps);
  std::vector<float> iv, iz, ient;
  std::vector<int64_t> igroups;
  project(a, A.idx_compressor, ctx.pos, ratio, D, (overlap ? 2 : 1) * dI, false, iv, iz);
  pool_groups(LS.icomp, iv, iz, ctx.pos, ratio, dI, overlap, ient, igroups);
  const int64_t ni = int64_t(igroups.size());
  if (ni == 0) return;
  if (R) ops::round_bf16_inplace(ient.data(), ni * dI);
  ops::rms_norm({ient.data(), A.idx_compressor.norm.data(), ient.data(), ni, dI, eps, R});
  std::vector<int64_t> ipos(igroups.size());
  for (int64_t i = 0; i < ni; ++i) ipos[i] = igroups[i] * ratio;
  ops::apply_rope({ient.data(), ipos.data(), A.rope_inv_freq.data(), ni, 1, dI, Dr, false, R});
  if (R) {
    ops::hadamard_inplace(ient.data(), ni, dI);
    ops::round_bf16_inplace(ient.data(), ni * dI);
    ops::fp4_quant_dequant_e8m0(ient.data(), ni, dI, 32);
  }
  LS.ikeys.append(ient);
}

void CpuModel::index_select(int l, ChunkCtx& ctx, const std::vector<float>& a, const std::vector<float>& qlat) {
  const auto& c = config();
  const auto& role = c.role(l);
  const AttentionWeights& A = w_.layers[size_t(l)].attn;
  const bool R = ref(), v41 = c.is_v41();
  const int64_t T = ctx.T, D = c.hidden_size, Dr = c.rope_head_dim, Rq = c.q_lora_rank;
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim, ratio = role.ratio;
  std::vector<float> iq, wts;
  linear(qlat, A.idx_wq_b, T, Rq, nI * dI, iq, act_block_, R, dot_key(A.block, DotOp::kIdxWqB));
  ops::apply_rope({iq.data(), ctx.pos.data(), A.rope_inv_freq.data(), T, nI, dI, Dr, false, R});
  if (R) {
    if (!v41) {
      ops::hadamard_inplace(iq.data(), T * nI, dI);
      ops::round_bf16_inplace(iq.data(), T * nI * dI);
    }
    ops::fp4_quant_dequant_e8m0(iq.data(), T * nI, dI, 32);
  }
  linear(a, A.idx_weights_proj, T, D, nI, wts, 0, R, 0);  // no FP8 input: never perturbed
  const float wscale = 1.0f / std::sqrt(float(dI)) / std::sqrt(float(nI));
  for (auto& x : wts) x = R ? round_bf16(x * wscale) : x * wscale;

  // Each index source scores the keys of its own kv source, in prefill and decode (v41 §9.x).
  const PagedRows& keys = ctx.st->layers[size_t(role.kv_src)].ikeys;
  auto& out = ctx.topk[size_t(l)];
  out.assign(size_t(T), {});
  if (role.candidate_source) ctx.cand.assign(size_t(T), {});
  const float ninf = -std::numeric_limits<float>::infinity();
  ThreadPool::global().parallel_for(T, [&](int64_t t0, int64_t t1) {
    std::vector<float> s;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t clen = (ctx.pos[t] + 1) / ratio;  // visible compressed positions
      s.assign(size_t(clen), 0.0f);
      keys.for_each_run(0, clen, [&](int64_t first, const float* k, int64_t n) {  // page by page
        ops::index_scores({iq.data() + t * nI * dI, wts.data() + t * nI, k, n, nI, dI, R, s.data() + first});
      });
      if (role.candidate_source) {
        ctx.cand[t].resize(size_t(clen));
        ops::candidate_mask(s.data(), clen, clen, c.candidate_block_size, c.candidate_topk_blocks,
                            ctx.cand[t].data());
      } else if (role.candidate_filtered) {
        for (int64_t i = 0; i < clen; ++i)
          if (!ctx.cand[t][i]) s[i] = ninf;
      }
      out[t] = ops::topk_indices(s.data(), clen, c.index_topk);
    }
  });
}

}  // namespace flashseek::forward
