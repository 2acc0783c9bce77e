// finalize_config: field validation and per-layer role derivation (model-v4.md §1.2,
// model-v41.md §1.7 and the load-time checks of §3.3). Errors name the offending field.
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "model/config.h"

namespace flashseek::model {
namespace {

Status positive(const char* field, int64_t v) {
  if (v <= 0) return invalid_argument("{}: must be > 0, got {}", field, v);
  return {};
}

// Layer-id lists must be strictly ascending and inside [0, limit).
Status check_layer_list(const char* field, const std::vector<int>& ids, int64_t limit) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limit)
      return invalid_argument("{}[{}]: layer {} is outside [0, {})", field, i, ids[i], limit);
    if (i > 0 && ids[i] <= ids[i - 1])
      return invalid_argument("{}: must be strictly ascending, got {} after {}", field, ids[i],
                              ids[i - 1]);
  }
  return {};
}

bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Last element of the ascending list `ids` that is <= layer, or -1.
int last_at_or_before(const std::vector<int>& ids, int layer) {
  int best = -1;
  for (int s : ids) if (s <= layer) best = s;
  return best;
}

// Generous upper bounds: a corrupt config must not make the weight map allocate billions of entries.
Status at_most(const char* field, int64_t v, int64_t limit) {
  if (v > limit) return invalid_argument("{}: {} exceeds the supported maximum {}", field, v, limit);
  return {};
}

Status check_limits(const ModelConfig& c) {
  FS_RETURN_IF_ERROR(at_most("num_hidden_layers", c.num_layers, 1024));
  FS_RETURN_IF_ERROR(at_most("num_nextn_predict_layers", c.num_mtp_layers, 64));
  FS_RETURN_IF_ERROR(at_most("n_routed_experts", c.n_routed_experts, 1 << 16));
  FS_RETURN_IF_ERROR(at_most("dspark_n_routed_experts", c.dspark_n_routed_experts, 1 << 16));
  FS_RETURN_IF_ERROR(at_most("hc_mult", c.hc_mult, 64));
  FS_RETURN_IF_ERROR(at_most("engram_max_ngram_size", c.engram_max_ngram_size, 64));
  FS_RETURN_IF_ERROR(at_most("engram_n_heads", c.engram_n_heads, 1 << 16));
  FS_RETURN_IF_ERROR(at_most("vision_config.num_hidden_layers", c.vision_num_layers, 1024));
  return {};
}

Status check_dims(const ModelConfig& c) {
  FS_RETURN_IF_ERROR(check_limits(c));
  FS_RETURN_IF_ERROR(positive("vocab_size", c.vocab_size));
  FS_RETURN_IF_ERROR(positive("hidden_size", c.hidden_size));
  FS_RETURN_IF_ERROR(positive("num_hidden_layers", c.num_layers));
  FS_RETURN_IF_ERROR(positive("num_attention_heads", c.num_heads));
  FS_RETURN_IF_ERROR(positive("head_dim", c.head_dim));
  FS_RETURN_IF_ERROR(positive("qk_rope_head_dim", c.rope_head_dim));
  FS_RETURN_IF_ERROR(positive("q_lora_rank", c.q_lora_rank));
  FS_RETURN_IF_ERROR(positive("o_groups", c.o_groups));
  FS_RETURN_IF_ERROR(positive("o_lora_rank", c.o_lora_rank));
  FS_RETURN_IF_ERROR(positive("sliding_window", c.window));
  FS_RETURN_IF_ERROR(positive("index_n_heads", c.index_n_heads));
  FS_RETURN_IF_ERROR(positive("index_head_dim", c.index_head_dim));
  FS_RETURN_IF_ERROR(positive("index_topk", c.index_topk));
  FS_RETURN_IF_ERROR(positive("n_routed_experts", c.n_routed_experts));
  FS_RETURN_IF_ERROR(positive("num_experts_per_tok", c.n_experts_per_tok));
  FS_RETURN_IF_ERROR(positive("moe_intermediate_size", c.moe_inter_dim));
  FS_RETURN_IF_ERROR(positive("hc_mult", c.hc_mult));
  FS_RETURN_IF_ERROR(positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters));
  FS_RETURN_IF_ERROR(positive("weight_block_size", c.weight_block_size));
  if (c.num_mtp_layers < 0)
    return invalid_argument("num_nextn_predict_layers: must be >= 0, got {}", c.num_mtp_layers);
  if (c.rope_head_dim > c.head_dim || c.rope_head_dim % 2 != 0)
    return invalid_argument("qk_rope_head_dim: must be even and <= head_dim ({}), got {}",
                            c.head_dim, c.rope_head_dim);
  if (c.rope_head_dim > c.index_head_dim)
    return invalid_argument("index_head_dim: must be >= qk_rope_head_dim ({}), got {}",
                            c.rope_head_dim, c.index_head_dim);
  if ((c.num_heads * c.head_dim) % c.o_groups != 0 || c.num_heads % c.o_groups != 0)
    return invalid_argument("o_groups: {} does not divide num_attention_heads {}", c.o_groups, c.num_heads);
  if (c.n_experts_per_tok > c.n_routed_experts)
    return invalid_argument("num_experts_per_tok: {} exceeds n_routed_experts {}",
                            c.n_experts_per_tok, c.n_routed_experts);
  if (c.n_shared_experts != 1)
    return invalid_argument("n_shared_experts: must be 1 (the reference asserts it), got {}",
                            c.n_shared_experts);
  if (c.scoring_func != "sqrtsoftplus" && c.scoring_func != "sigmoid" && c.scoring_func != "softmax")
    return invalid_argument("scoring_func: unknown \"{}\" (sqrtsoftplus, sigmoid, softmax)", c.scoring_func);
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    return invalid_argument("rms_norm_eps: must be a positive number, got {}", c.rms_norm_eps);
  if (!(c.hc_eps >= 0)) return invalid_argument("hc_eps: must be >= 0, got {}", c.hc_eps);
  if (!(c.route_scale > 0)) return invalid_argument("routed_scaling_factor: must be > 0, got {}", c.route_scale);
  if (!(c.swiglu_limit >= 0)) return invalid_argument("swiglu_limit: must be >= 0, got {}", c.swiglu_limit);
  if (!(c.gate_temp > 0)) return invalid_argument("gate_temp: must be > 0, got {}", c.gate_temp);
  if (!(c.rope_theta > 0)) return invalid_argument("rope_theta: must be > 0, got {}", c.rope_theta);
  if (!(c.compress_rope_theta > 0))
    return invalid_argument("compress_rope_theta: must be > 0, got {}", c.compress_rope_theta);
  if (c.original_seq_len < 0)
    return invalid_argument("rope_scaling.original_max_position_embeddings: must be >= 0, got {}", c.original_seq_len);
  if (c.original_seq_len > 0 && !(c.rope_factor >= 1))
    return invalid_argument("rope_scaling.factor: must be >= 1, got {}", c.rope_factor);
  for (int64_t id : {c.bos_token_id, c.eos_token_id})
    if (id < 0 || id >= c.vocab_size)
      return invalid_argument("bos_token_id/eos_token_id: {} outside the vocabulary [0, {})", id, c.vocab_size);
  // Packed FP4 needs pairs and 32-groups along the input dim of every expert matrix.
  if (c.fp4_experts && (c.hidden_size % 32 != 0 || c.moe_inter_dim % 32 != 0))
    return invalid_argument("moe_intermediate_size/hidden_size: must be multiples of 32 for FP4 experts, "
                            "got {} / {}", c.moe_inter_dim, c.hidden_size);
  if (int64_t(c.compress_ratios.size()) != total_layers(c))
    return invalid_argument("compress_ratios: expected {} entries (num_hidden_layers {} + "
                            "num_nextn_predict_layers {}), got {}", total_layers(c), c.num_layers,
                            c.num_mtp_layers, c.compress_ratios.size());
  for (int64_t l = c.num_layers; l < total_layers(c); ++l)
    if (c.compress_ratios[size_t(l)] != 0)
      return invalid_argument("compress_ratios[{}]: MTP/DSpark stage must have ratio 0, got {}", l,
                              c.compress_ratios[size_t(l)]);
  return {};
}

void set_rope(const ModelConfig& c, LayerRole& r) {
  r.rope_theta = r.ratio > 0 ? c.compress_rope_theta : c.rope_theta;
  r.yarn = r.ratio > 0 && c.original_seq_len > 0;
}

Status derive_v4(ModelConfig& c) {
  if (c.num_hash_layers < 0 || c.num_hash_layers > c.num_layers)
    return invalid_argument("num_hash_layers: must be in [0, num_hidden_layers={}], got {}",
                            c.num_layers, c.num_hash_layers);
  if (c.num_hash_layers > 0 && c.n_experts_per_tok > c.n_routed_experts)
    return invalid_argument("num_experts_per_tok: hash layers need distinct ids");
  c.roles.assign(size_t(total_layers(c)), LayerRole{});
  for (int l = 0; l < int(total_layers(c)); ++l) {
    LayerRole& r = c.roles[size_t(l)];
    r.ratio = c.compress_ratios[size_t(l)];
    if (r.ratio != 0 && r.ratio != 4 && r.ratio != 128)
      return invalid_argument("compress_ratios[{}]: V4 supports 0, 4 and 128, got {}", l, r.ratio);
    if (r.ratio > 0) {
      r.kv_source = true;
      r.kv_src = l;
      r.index_source = r.ratio == 4;  // CSA: lightning indexer; HCA attends every entry
      r.idx_src = r.index_source ? l : -1;
    }
    r.hash_routed = l < c.num_hash_layers;
    set_rope(c, r);
  }
  return {};
}

Status check_v41_lists(const ModelConfig& c, std::vector<std::string>& warnings) {
  FS_RETURN_IF_ERROR(check_layer_list("kv_source_layer_ids", c.kv_source_layers, c.num_layers));
  FS_RETURN_IF_ERROR(check_layer_list("index_source_layer_ids", c.index_source_layers, c.num_layers));
  FS_RETURN_IF_ERROR(check_layer_list("engram_layer_ids", c.engram_layer_ids, c.num_layers));
  FS_RETURN_IF_ERROR(check_layer_list("dspark_target_layer_ids", c.dspark_target_layer_ids, c.num_layers));
  if (c.candidate_source_layer >= c.num_layers || c.candidate_source_layer < -1)
    return invalid_argument("candidate_source_layer_id: layer {} is outside [0, {})",
                            c.candidate_source_layer, c.num_layers);
  if (c.candidate_source_layer >= 0) {
    FS_RETURN_IF_ERROR(positive("candidate_topk_blocks", c.candidate_topk_blocks));
    FS_RETURN_IF_ERROR(positive("candidate_block_size", c.candidate_block_size));
    // A filtered selection must find index_topk positions (v41 §3.3). Fewer candidate positions
    // than index_topk even with a full pinned block is an error; missing only the pinned block's
    // partial tail (the official fixture: 128*4 - 3 = 509 < 512) is a warning.
    const int64_t full = c.candidate_topk_blocks * c.candidate_block_size;
    const int64_t reach = full - (c.candidate_block_size - 1);
    if (full < c.index_topk)
      return invalid_argument("candidate_topk_blocks: candidate_topk_blocks*candidate_block_size = {} "
                              "must be >= index_topk {}", full, c.index_topk);
    if (reach < c.index_topk)
      warnings.push_back(fmt::format("candidate_topk_blocks: candidate_topk_blocks*candidate_block_size - "
                                     "(candidate_block_size-1) = {} < index_topk {} (v41 §3.3)", reach, c.index_topk));
  }
  if (!c.engram_layer_ids.empty()) {
    if (c.engram_num_embeddings.size() != c.engram_layer_ids.size())
      return invalid_argument("engram_num_embeddings: {} entries for {} engram layers",
                              c.engram_num_embeddings.size(), c.engram_layer_ids.size());
    for (size_t i = 0; i < c.engram_num_embeddings.size(); ++i)
      if (c.engram_num_embeddings[i] <= 0)
        return invalid_argument("engram_num_embeddings[{}]: must be > 0, got {}", i, c.engram_num_embeddings[i]);
    if (c.engram_max_ngram_size < 2)
      return invalid_argument("engram_max_ngram_size: must be >= 2, got {}", c.engram_max_ngram_size);
    FS_RETURN_IF_ERROR(positive("engram_vocab_size", c.engram_vocab_size));
    FS_RETURN_IF_ERROR(positive("engram_n_heads", c.engram_n_heads));
    FS_RETURN_IF_ERROR(positive("engram_head_dim", c.engram_head_dim));
    FS_RETURN_IF_ERROR(positive("engram_compressed_vocab_size", c.engram_compressed_vocab_size));
    if (c.engram_head_dim % 32 != 0)
      return invalid_argument("engram_head_dim: must be a multiple of 32 (one e8m0 scale per 32), got {}",
                              c.engram_head_dim);
    if (c.engram_pad_token_id < 0 || c.engram_pad_token_id >= c.vocab_size)
      return invalid_argument("engram_pad_token_id: {} outside the vocabulary", c.engram_pad_token_id);
  }
  if (c.num_mtp_layers > 0) {
    FS_RETURN_IF_ERROR(positive("dspark_block_size", c.dspark_block_size));
    FS_RETURN_IF_ERROR(positive("dspark_markov_rank", c.dspark_markov_rank));
    FS_RETURN_IF_ERROR(positive("dspark_n_routed_experts", c.dspark_n_routed_experts));
    FS_RETURN_IF_ERROR(positive("dspark_num_experts_per_tok", c.dspark_n_experts_per_tok));
    if (c.dspark_n_experts_per_tok > c.dspark_n_routed_experts)
      return invalid_argument("dspark_num_experts_per_tok: {} exceeds dspark_n_routed_experts {}",
                              c.dspark_n_experts_per_tok, c.dspark_n_routed_experts);
    if (c.dspark_noise_token_id < 0 || c.dspark_noise_token_id >= c.vocab_size)
      return invalid_argument("dspark_noise_token_id: {} outside the vocabulary [0, {})",
                              c.dspark_noise_token_id, c.vocab_size);
    if (c.dspark_target_layer_ids.empty())
      return invalid_argument("dspark_target_layer_ids: must name at least one layer");
  }
  return {};
}

// The role invariants of v41 §3.3, checked on the derived roles.
Status check_v41_roles(const ModelConfig& c) {
  for (int s : c.kv_source_layers) {
    if (c.roles[size_t(s)].ratio == 0)
      return invalid_argument("kv_source_layer_ids: layer {} has compress ratio 0", s);
    if (!contains(c.index_source_layers, s))
      return invalid_argument("kv_source_layer_ids: layer {} must also be in index_source_layer_ids "
                              "(only an index-source kv source derives index keys)", s);
  }
  for (int s : c.index_source_layers)
    if (c.roles[size_t(s)].ratio == 0)
      return invalid_argument("index_source_layer_ids: layer {} has compress ratio 0", s);
  for (int l = 0; l < int(c.num_layers); ++l) {
    const LayerRole& r = c.roles[size_t(l)];
    if (r.ratio == 0) continue;
    if (r.kv_src < 0)
      return invalid_argument("kv_source_layer_ids: layer {} (ratio {}) has no kv source at or before it", l, r.ratio);
    if (c.roles[size_t(r.kv_src)].ratio != r.ratio)
      return invalid_argument("compress_ratios[{}]: ratio {} differs from its kv source layer {} (ratio {})",
                              l, r.ratio, r.kv_src, c.roles[size_t(r.kv_src)].ratio);
    if (r.idx_src < r.kv_src)
      return invalid_argument("index_source_layer_ids: layer {} would use the top-k of layer {} "
                              "which precedes its kv source {}", l, r.idx_src, r.kv_src);
  }
  const int cand = c.candidate_source_layer;
  if (cand >= 0) {
    if (!contains(c.index_source_layers, cand))
      return invalid_argument("candidate_source_layer_id: layer {} is not an index source", cand);
    for (int s : c.index_source_layers)
      if (s > cand && c.roles[size_t(s)].kv_src != c.roles[size_t(cand)].kv_src)
        return invalid_argument("index_source_layer_ids: layer {} after the candidate source {} reads "
                                "kv source {} instead of {}", s, cand, c.roles[size_t(s)].kv_src,
                                c.roles[size_t(cand)].kv_src);
  }
  return {};
}

Status derive_v41(ModelConfig& c) {
  FS_RETURN_IF_ERROR(check_v41_lists(c, c.warnings));
  c.roles.assign(size_t(total_layers(c)), LayerRole{});
  for (int l = 0; l < int(total_layers(c)); ++l) {
    LayerRole& r = c.roles[size_t(l)];
    r.ratio = c.compress_ratios[size_t(l)];
    if (r.ratio < 0 || r.ratio > 2)
      return invalid_argument("compress_ratios[{}]: V4.1 supports 0, 1 and 2, got {}", l, r.ratio);
    set_rope(c, r);
    if (l >= c.num_layers) continue;  // DSpark stages: window only, no Engram
    r.kv_source = contains(c.kv_source_layers, l);
    r.index_source = contains(c.index_source_layers, l);
    r.candidate_source = l == c.candidate_source_layer;
    r.candidate_filtered = r.index_source && c.candidate_source_layer >= 0 && l > c.candidate_source_layer;
    r.engram = contains(c.engram_layer_ids, l);
    if (r.ratio > 0) {
      r.kv_src = last_at_or_before(c.kv_source_layers, l);
      r.idx_src = last_at_or_before(c.index_source_layers, l);
    }
  }
  return check_v41_roles(c);
}

}  // namespace

Status finalize_config(ModelConfig& cfg) {
  cfg.warnings.clear();
  FS_RETURN_IF_ERROR(check_dims(cfg));
  return cfg.is_v41() ? derive_v41(cfg) : derive_v4(cfg);
}

}  // namespace flashseek::model
