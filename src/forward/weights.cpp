#include "forward/weights.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "model/tensor_gen.h"
#include "model/weights.h"
#include "ops/rope.h"

namespace flashseek::forward {
namespace {

using model::Checkpoint;
using model::ModelConfig;

// Loads `name` and checks its element count (errors name the tensor).
Status get(const Checkpoint& ck, const std::string& name, int64_t numel, Vec& out) {
  FS_ASSIGN_OR_RETURN(out, ck.dequant_f32(name));
  if (int64_t(out.size()) != numel)
    return invalid_argument("tensor {}: expected {} elements, got {}", name, numel, out.size());
  return {};
}

// A matrix whose dequantisation is queued: they run in parallel once every tensor was checked.
struct MatJob {
  std::string name;
  int64_t numel;
  Vec* out;
  uint64_t bytes;  // stored bytes (codes + scales): what the progress counts
};

// The options and, when matrices are left to the backend, the names of those left empty.
struct LoadCtx {
  bool matrices = true;
  std::vector<std::string>* deferred = nullptr;
  std::vector<MatJob>* jobs = nullptr;
};

uint64_t stored_bytes(const Checkpoint& ck, const std::string& name) {
  uint64_t b = 0;
  if (auto t = ck.find(name); t.ok()) b += t->data.size();
  if (auto s = ck.find(model::scale_name_for(name)); s.ok()) b += s->data.size();
  return b;
}

// A matrix: checked now (exists, `numel` logical elements) and dequantised later in parallel
// (run_jobs), or (WeightLoadOptions::matrices false) left empty (the caller uploads the stored
// bytes itself). A tensor that fails the check is loaded at once so that the error is the one a
// sequential load reports first.
Status mat(const Checkpoint& ck, LoadCtx& o, const std::string& name, int64_t numel, Vec& out) {
  if (o.matrices) {
    auto shape = ck.logical_shape(name);
    if (!shape.ok() || shape_numel(*shape) != numel) return get(ck, name, numel, out);
    o.jobs->push_back({name, numel, &out, stored_bytes(ck, name)});
    return {};
  }
  o.deferred->push_back(name);
  FS_ASSIGN_OR_RETURN(const Shape shape, ck.logical_shape(name));
  if (shape_numel(shape) != numel)
    return invalid_argument("tensor {}: expected {} elements, got {}", name, numel, shape_numel(shape));
  out.clear();
  return {};
}

Status load_compressor(const Checkpoint& ck, LoadCtx& o, const std::string& p, int64_t rows, int64_t D,
                       int64_t c, int64_t ape_rows, bool gate, CompressorWeights& w) {
  FS_RETURN_IF_ERROR(mat(ck, o, p + "wkv.weight", rows * D, w.wkv));
  if (gate) FS_RETURN_IF_ERROR(mat(ck, o, p + "wgate.weight", rows * D, w.wgate));
  if (ape_rows > 0) FS_RETURN_IF_ERROR(get(ck, p + "ape", ape_rows * rows, w.ape));
  return get(ck, p + "norm.weight", c, w.norm);
}

// `prefix` is "layers.L." or "mtp.S."; `layer` indexes the roles (num_layers + S for stages).
Status load_attention(const Checkpoint& ck, LoadCtx& o, const std::string& prefix, int layer, AttentionWeights& a) {
  const ModelConfig& c = ck.config();
  const auto& role = c.role(layer);
  const std::string p = prefix + "attn.";
  const int64_t D = c.hidden_size, H = c.num_heads, Dh = c.head_dim, Rq = c.q_lora_rank;
  FS_RETURN_IF_ERROR(mat(ck, o, p + "wq_a.weight", Rq * D, a.wq_a));
  FS_RETURN_IF_ERROR(get(ck, p + "q_norm.weight", Rq, a.q_norm));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "wq_b.weight", H * Dh * Rq, a.wq_b));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "wkv.weight", Dh * D, a.wkv));
  FS_RETURN_IF_ERROR(get(ck, p + "kv_norm.weight", Dh, a.kv_norm));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "wo_a.weight", c.o_groups * c.o_lora_rank * (H * Dh / c.o_groups), a.wo_a));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "wo_b.weight", D * c.o_groups * c.o_lora_rank, a.wo_b));
  FS_RETURN_IF_ERROR(get(ck, p + "attn_sink", H, a.attn_sink));
  const int64_t nI = c.index_n_heads, dI = c.index_head_dim;
  if (c.is_v41()) {
    a.has_compressor = role.kv_source;
    if (a.has_compressor)
      FS_RETURN_IF_ERROR(load_compressor(ck, o, p + "compressor.", Dh, D, Dh, 0, role.ratio == 2, a.compressor));
    a.has_indexer = role.index_source;
    if (a.has_indexer) {
      FS_RETURN_IF_ERROR(mat(ck, o, p + "indexer.wq_b.weight", nI * dI * Rq, a.idx_wq_b));
      FS_RETURN_IF_ERROR(mat(ck, o, p + "indexer.weights_proj.weight", nI * D, a.idx_weights_proj));
      if (role.kv_source) {
        FS_RETURN_IF_ERROR(mat(ck, o, p + "indexer.wk.weight", dI * Dh, a.idx_wk));
        FS_RETURN_IF_ERROR(get(ck, p + "indexer.k_norm.weight", dI, a.idx_k_norm));
      }
    }
  } else if (role.ratio > 0) {
    const int64_t coff = role.ratio == 4 ? 2 : 1;
    a.has_compressor = true;
    FS_RETURN_IF_ERROR(load_compressor(ck, o, p + "compressor.", coff * Dh, D, Dh, role.ratio, true, a.compressor));
    if (role.ratio == 4) {
      a.has_indexer = a.has_idx_compressor = true;
      FS_RETURN_IF_ERROR(mat(ck, o, p + "indexer.wq_b.weight", nI * dI * Rq, a.idx_wq_b));
      FS_RETURN_IF_ERROR(mat(ck, o, p + "indexer.weights_proj.weight", nI * D, a.idx_weights_proj));
      FS_RETURN_IF_ERROR(load_compressor(ck, o, p + "indexer.compressor.", coff * dI, D, dI, role.ratio, true,
                                         a.idx_compressor));
    }
  }
  ops::RopeSpec rs{c.rope_head_dim, role.rope_theta, role.yarn, c.rope_factor, c.original_seq_len,
                   c.beta_fast, c.beta_slow};
  a.rope_inv_freq = ops::rope_inv_freq(rs);
  return {};
}

Status load_ffn(const Checkpoint& ck, LoadCtx& o, const std::string& prefix, bool hash_routed, int64_t E, FfnWeights& f) {
  const ModelConfig& c = ck.config();
  const std::string p = prefix + "ffn.";
  const int64_t D = c.hidden_size, I = c.moe_inter_dim;
  FS_RETURN_IF_ERROR(mat(ck, o, p + "gate.weight", E * D, f.gate));
  if (hash_routed) {
    FS_ASSIGN_OR_RETURN(auto ids, ck.read_ints(p + "gate.tid2eid"));
    if (int64_t(ids.size()) != c.vocab_size * c.n_experts_per_tok)
      return invalid_argument("tensor {}gate.tid2eid: expected {} ids, got {}", p,
                              c.vocab_size * c.n_experts_per_tok, ids.size());
    for (int64_t v : ids) {
      if (v < 0 || v >= E) return invalid_argument("tensor {}gate.tid2eid: expert id {} out of range", p, v);
      f.tid2eid.push_back(int32_t(v));
    }
  } else {
    FS_RETURN_IF_ERROR(get(ck, p + "gate.bias", E, f.bias));
  }
  f.w1.resize(size_t(E));
  f.w2.resize(size_t(E));
  f.w3.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string q = fmt::format("{}experts.{}.", p, e);
    FS_RETURN_IF_ERROR(mat(ck, o, q + "w1.weight", I * D, f.w1[e]));
    FS_RETURN_IF_ERROR(mat(ck, o, q + "w2.weight", D * I, f.w2[e]));
    FS_RETURN_IF_ERROR(mat(ck, o, q + "w3.weight", I * D, f.w3[e]));
  }
  FS_RETURN_IF_ERROR(mat(ck, o, p + "shared_experts.w1.weight", I * D, f.s_w1));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "shared_experts.w2.weight", D * I, f.s_w2));
  return mat(ck, o, p + "shared_experts.w3.weight", I * D, f.s_w3);
}

Status load_engram(const Checkpoint& ck, LoadCtx& o, ModelWeights& mw) {
  const ModelConfig& c = ck.config();
  const int64_t n_eng = int64_t(c.engram_layer_ids.size());
  auto layouts = ops::engram_layouts(n_eng, c.engram_max_ngram_size, c.engram_n_heads, c.engram_vocab_size);
  nlohmann::json tm;
  const auto path = std::filesystem::path(ck.dir()) / "engram_token_map.json";
  if (const std::string* text = ck.side_file("engram_token_map.json")) {  // in-memory checkpoint
    tm = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (tm.is_discarded()) return parse_error("{}: not valid JSON", path.string());
  } else if (std::filesystem::exists(path)) {
    try {
      std::ifstream f(path);
      tm = nlohmann::json::parse(f);
    } catch (const std::exception& e) {
      return parse_error("{}: {}", path.string(), e.what());
    }
  }
  if (tm.contains("map")) {
    mw.engram_token_map = tm["map"].get<std::vector<int64_t>>();
  } else if (c.engram_compressed_vocab_size == c.vocab_size) {
    for (int64_t i = 0; i < c.vocab_size; ++i) mw.engram_token_map.push_back(i);
  } else {
    return not_found("{}: missing (needed: compressed vocab {} != vocab {})", path.string(),
                     c.engram_compressed_vocab_size, c.vocab_size);
  }
  if (int64_t(mw.engram_token_map.size()) != c.vocab_size)
    return invalid_argument("{}: map has {} entries, vocab is {}", path.string(), mw.engram_token_map.size(),
                            c.vocab_size);
  for (int64_t v : mw.engram_token_map)
    if (v < 0 || v >= c.engram_compressed_vocab_size)
      return invalid_argument("{}: compressed id {} outside [0, {})", path.string(), v, c.engram_compressed_vocab_size);
  mw.engram_pad_c = mw.engram_token_map[size_t(c.engram_pad_token_id)];
  const int64_t D = c.hidden_size, hc = c.hc_mult;
  for (int64_t i = 0; i < n_eng; ++i) {
    const int layer = c.engram_layer_ids[size_t(i)];
    auto& L = mw.layers[size_t(layer)];
    L.has_engram = true;
    EngramWeights& e = L.engram;
    e.layout = layouts[size_t(i)];
    if (e.layout.n_rows() != c.engram_num_embeddings[size_t(i)])
      return invalid_argument("engram_num_embeddings[{}]: {} but the prime layout gives {} rows", i,
                              c.engram_num_embeddings[size_t(i)], e.layout.n_rows());
    if (tm.contains("multipliers")) {
      e.layout.multipliers = tm["multipliers"][size_t(i)].get<std::vector<int64_t>>();
    } else {  // numpy PCG64 re-implemented (v41 §4.4); seeded by the layer id
      e.layout.multipliers = ops::engram_multipliers(layer, c.engram_compressed_vocab_size, c.engram_max_ngram_size);
    }
    if (int64_t(e.layout.multipliers.size()) != c.engram_max_ngram_size)
      return invalid_argument("{}: engram layer {} needs {} multipliers, got {}", path.string(), layer,
                              c.engram_max_ngram_size, e.layout.multipliers.size());
    const std::string p = fmt::format("layers.{}.engram.", layer);
    e.table = p + "embed.weight";
    FS_ASSIGN_OR_RETURN(auto tv, ck.find(e.table));
    if (tv.shape.size() != 2 || tv.shape[0] != e.layout.n_rows() || tv.shape[1] != c.engram_head_dim)
      return invalid_argument("tensor {}: expected [{}, {}] rows, got {}", e.table, e.layout.n_rows(),
                              c.engram_head_dim, shape_to_string(tv.shape));
    const int64_t in = e.layout.n_cols() * c.engram_head_dim;
    FS_RETURN_IF_ERROR(mat(ck, o, p + "wkv.weight", (hc + 1) * D * in, e.wkv));
    Vec q, k;
    FS_RETURN_IF_ERROR(get(ck, p + "q_weight", hc * D, q));
    FS_RETURN_IF_ERROR(get(ck, p + "k_weight", hc * D, k));
    e.wqk.resize(q.size());
    for (size_t j = 0; j < q.size(); ++j) e.wqk[j] = q[j] * k[j];  // FP32 product, kept FP32
  }
  return {};
}

// mHC params, norms, attention and MoE of one decoder layer or draft stage.
Status load_block(const Checkpoint& ck, LoadCtx& o, const std::string& p, int layer, int64_t n_experts, LayerWeights& L) {
  const ModelConfig& c = ck.config();
  const int64_t D = c.hidden_size, hc = c.hc_mult, nm = (2 + hc) * hc;
  FS_RETURN_IF_ERROR(mat(ck, o, p + "hc_attn_fn", nm * hc * D, L.hc_attn_fn));
  FS_RETURN_IF_ERROR(get(ck, p + "hc_attn_base", nm, L.hc_attn_base));
  FS_RETURN_IF_ERROR(get(ck, p + "hc_attn_scale", 3, L.hc_attn_scale));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "hc_ffn_fn", nm * hc * D, L.hc_ffn_fn));
  FS_RETURN_IF_ERROR(get(ck, p + "hc_ffn_base", nm, L.hc_ffn_base));
  FS_RETURN_IF_ERROR(get(ck, p + "hc_ffn_scale", 3, L.hc_ffn_scale));
  FS_RETURN_IF_ERROR(get(ck, p + "attn_norm.weight", D, L.attn_norm));
  FS_RETURN_IF_ERROR(get(ck, p + "ffn_norm.weight", D, L.ffn_norm));
  FS_RETURN_IF_ERROR(load_attention(ck, o, p, layer, L.attn));
  L.attn.block = L.ffn.block = layer;
  return load_ffn(ck, o, p, c.role(layer).hash_routed, n_experts, L.ffn);
}

Status load_dspark(const Checkpoint& ck, LoadCtx& o, DSparkWeights& d) {
  const ModelConfig& c = ck.config();
  const int64_t D = c.hidden_size, V = c.vocab_size, r = c.dspark_markov_rank;
  const int64_t n_taps = int64_t(c.dspark_target_layer_ids.size()), last = c.num_mtp_layers - 1;
  d.stages.resize(size_t(c.num_mtp_layers));
  for (int s = 0; s < int(c.num_mtp_layers); ++s)
    FS_RETURN_IF_ERROR(load_block(ck, o, fmt::format("mtp.{}.", s), int(c.num_layers) + s,
                                  c.dspark_n_routed_experts, d.stages[size_t(s)]));
  FS_RETURN_IF_ERROR(mat(ck, o, "mtp.0.main_proj.weight", D * n_taps * D, d.main_proj));
  FS_RETURN_IF_ERROR(get(ck, "mtp.0.main_norm.weight", D, d.main_norm));
  const std::string p = fmt::format("mtp.{}.", last);
  FS_RETURN_IF_ERROR(get(ck, p + "norm.weight", D, d.norm));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "markov_head.embed.weight", V * r, d.markov_embed));
  FS_RETURN_IF_ERROR(mat(ck, o, p + "markov_head.head.weight", V * r, d.markov_head));
  return get(ck, p + "confidence_head.proj.weight", D + r, d.confidence);
}

// Dequantises the queued matrices on `threads` threads, biggest first; the first error in load
// order is returned. Each finished matrix reports its stored bytes to `progress`.
Status run_jobs(const Checkpoint& ck, std::vector<MatJob>& jobs, const WeightLoadOptions& opts) {
  std::vector<size_t> order(jobs.size());
  uint64_t total = 0;
  for (size_t i = 0; i < jobs.size(); ++i) order[i] = i, total += jobs[i].bytes;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return jobs[a].bytes > jobs[b].bytes; });
  std::vector<Status> errors(jobs.size());
  std::atomic<uint64_t> done{0};
  model::run_tasks(int64_t(order.size()), opts.threads, [&](int64_t t) {
    MatJob& j = jobs[order[size_t(t)]];
    errors[order[size_t(t)]] = get(ck, j.name, j.numel, *j.out);
    const uint64_t d = done.fetch_add(j.bytes) + j.bytes;
    if (opts.progress) opts.progress(d, total);
  });
  for (const Status& e : errors) FS_RETURN_IF_ERROR(e);
  return {};
}

}  // namespace

Result<ModelWeights> load_weights(const Checkpoint& ck, const WeightLoadOptions& opts) {
  const ModelConfig& c = ck.config();
  ModelWeights mw;
  std::vector<MatJob> jobs;
  LoadCtx o{opts.matrices, &mw.deferred_matrices, &jobs};
  const int64_t D = c.hidden_size, V = c.vocab_size, hc = c.hc_mult;
  FS_RETURN_IF_ERROR(mat(ck, o, "embed.weight", V * D, mw.embed));
  FS_RETURN_IF_ERROR(mat(ck, o, "head.weight", V * D, mw.head));
  FS_RETURN_IF_ERROR(get(ck, "norm.weight", D, mw.norm));
  if (!c.is_v41()) {
    FS_RETURN_IF_ERROR(mat(ck, o, "hc_head_fn", hc * hc * D, mw.hc_head_fn));
    FS_RETURN_IF_ERROR(get(ck, "hc_head_base", hc, mw.hc_head_base));
    FS_RETURN_IF_ERROR(get(ck, "hc_head_scale", 1, mw.hc_head_scale));
  }
  mw.layers.resize(size_t(c.num_layers));
  for (int l = 0; l < int(c.num_layers); ++l)
    FS_RETURN_IF_ERROR(load_block(ck, o, fmt::format("layers.{}.", l), l, c.n_routed_experts, mw.layers[size_t(l)]));
  if (c.is_v41() && !c.engram_layer_ids.empty()) FS_RETURN_IF_ERROR(load_engram(ck, o, mw));
  // A config that declares draft layers whose tensors are all absent loads the backbone alone
  // (Checkpoint::validate: one warning; a partly present draft fails there, naming the tensors).
  const bool draft = c.num_mtp_layers > 0 && !ck.validation().draft_absent;
  if (c.num_mtp_layers > 0 && !draft)
    spdlog::warn("{}: {} draft layer(s) declared but no mtp.* tensors: loading the backbone "
                 "without a draft (speculative decoding off)", ck.dir(), c.num_mtp_layers);
  if (!c.is_v41() && draft) {
    mw.has_mtp = true;
    MtpWeights& m = mw.mtp;
    FS_RETURN_IF_ERROR(load_block(ck, o, "mtp.0.", int(c.num_layers), c.n_routed_experts, m.block));
    FS_RETURN_IF_ERROR(get(ck, "mtp.0.enorm.weight", D, m.enorm));
    FS_RETURN_IF_ERROR(get(ck, "mtp.0.hnorm.weight", D, m.hnorm));
    FS_RETURN_IF_ERROR(mat(ck, o, "mtp.0.e_proj.weight", D * D, m.e_proj));
    FS_RETURN_IF_ERROR(mat(ck, o, "mtp.0.h_proj.weight", D * D, m.h_proj));
    FS_RETURN_IF_ERROR(get(ck, "mtp.0.norm.weight", D, m.norm));
    FS_RETURN_IF_ERROR(mat(ck, o, "mtp.0.hc_head_fn", hc * hc * D, m.hc_head_fn));
    FS_RETURN_IF_ERROR(get(ck, "mtp.0.hc_head_base", hc, m.hc_head_base));
    FS_RETURN_IF_ERROR(get(ck, "mtp.0.hc_head_scale", 1, m.hc_head_scale));
  }
  if (c.is_v41() && draft) {
    mw.has_dspark = true;
    FS_RETURN_IF_ERROR(load_dspark(ck, o, mw.dspark));
  }
  FS_RETURN_IF_ERROR(run_jobs(ck, jobs, opts));
  return mw;
}

}  // namespace flashseek::forward
