// The model configuration, parsed from a release-style checkpoint directory:
//   V4-Flash:  flat HF `config.json` (spec model-v4.md §1);
//   V4.1-Flash: nested `config.json` (`text_config`, `quantization_config`, spec model-v41.md §1)
//   or the reference's flat `inference/config.json` names (§1.6).
// Every field the forward pass relies on is validated at load (a bad field is an error naming it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace flashseek::model {

enum class Family { kV4, kV41 };

// How a decoder layer's attention obtains its compressed KV and top-k (v41 §1.7, §3.2).
struct LayerRole {
  int ratio = 0;                  // compress_ratios[layer]: 0 window only; V4: 4 or 128; V4.1: 1 or 2
  bool kv_source = false;         // runs the compressor and owns a compressed-KV cache
  bool index_source = false;      // owns an indexer query and computes its own top-k
  bool candidate_source = false;  // V4.1: derives the candidate mask (§3.4)
  bool candidate_filtered = false;// V4.1: index source after the candidate source (REINDEX)
  int kv_src = -1;                // layer whose compressed KV this layer reads (-1: none)
  int idx_src = -1;               // layer whose top-k list this layer uses (-1: none / all entries)
  bool engram = false;            // V4.1: Engram module before this block
  bool hash_routed = false;       // V4: MoE selection from tid2eid
  double rope_theta = 10000;      // this layer's RoPE base
  bool yarn = false;              // YaRN frequency interpolation on this layer's RoPE
};

struct ModelConfig {
  Family family = Family::kV41;
  std::string model_type;         // "deepseek_v4", "deepseek_v41", ...

  // --- backbone dims ---
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // D
  int64_t num_layers = 0;         // decoder layers (without MTP / DSpark stages)
  int64_t num_heads = 0;          // H
  int64_t head_dim = 0;           // Dh
  int64_t rope_head_dim = 0;      // Dr (trailing slice of each head)
  int64_t q_lora_rank = 0;
  int64_t o_groups = 0;
  int64_t o_lora_rank = 0;
  int64_t window = 0;             // sliding_window
  std::vector<int> compress_ratios;  // num_layers + num_mtp entries

  // --- indexer ---
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;

  // --- MoE ---
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 1;
  int64_t n_experts_per_tok = 0;
  int64_t moe_inter_dim = 0;
  int64_t num_hash_layers = 0;    // V4 only
  std::string scoring_func = "sqrtsoftplus";
  bool norm_topk_prob = true;
  double route_scale = 1.0;
  double swiglu_limit = 0.0;      // 0 = no clamp
  double gate_temp = 1.0;         // V4.1 (router logits divided by it)

  // --- mHC ---
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;

  // --- norms / RoPE ---
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  double compress_rope_theta = 160000;
  double rope_factor = 1;         // YaRN factor
  int64_t original_seq_len = 0;   // YaRN original length (0 = YaRN off)
  double beta_fast = 32, beta_slow = 1;
  int64_t max_position_embeddings = 0;

  // --- tokens ---
  int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = 2;
  int64_t image_token_id = -1;

  // --- on-disk formats ---
  bool fp8_weights = true;        // quantization_config present (FP8 e4m3 + e8m0 block scales)
  int64_t weight_block_size = 128;// 128 (V4) or 32 (V4.1); square blocks
  bool fp4_experts = true;        // expert_dtype == "fp4"

  // --- MTP / DSpark ---
  int64_t num_mtp_layers = 0;     // V4: classic MTP blocks; V4.1: DSpark stages
  int64_t dspark_block_size = 0;
  int64_t dspark_noise_token_id = -1;
  std::vector<int> dspark_target_layer_ids;
  int64_t dspark_markov_rank = 0;
  int64_t dspark_n_routed_experts = 0;
  int64_t dspark_n_experts_per_tok = 0;

  // --- V4.1 CSA2 sharing ---
  std::vector<int> kv_source_layers;
  std::vector<int> index_source_layers;
  int candidate_source_layer = -1;
  int64_t candidate_topk_blocks = 0;
  int64_t candidate_block_size = 0;

  // --- V4.1 Engram ---
  std::vector<int> engram_layer_ids;
  std::vector<int64_t> engram_num_embeddings;
  int64_t engram_max_ngram_size = 0;
  int64_t engram_vocab_size = 0;
  int64_t engram_n_heads = 0;
  int64_t engram_head_dim = 0;
  int64_t engram_pad_token_id = 2;
  int64_t engram_compressed_vocab_size = 0;

  // --- V4.1 vision tower (config only; the forward does not use it, its tensors are optional) ---
  int64_t vision_num_layers = 0;
  int64_t vision_hidden_size = 0;
  int64_t vision_num_heads = 0;
  int64_t vision_intermediate_size = 0;
  int64_t vision_patch_size = 0;
  int64_t vision_downsample_ratio = 0;

  // Derived (filled by finalize()).
  std::vector<LayerRole> roles;   // num_layers + num_mtp entries
  // Non-fatal findings of finalize_config (e.g. the oracle fixture's candidate budget is 3
  // positions short of v41 §3.3's strict bound); loaders should log them.
  std::vector<std::string> warnings;

  bool is_v41() const { return family == Family::kV41; }
  const LayerRole& role(int layer) const { return roles.at(size_t(layer)); }
};

// Reads `<dir>/config.json` (or `<dir>/inference/config.json` when the former is absent),
// detects the family, fills every field, derives roles and validates. Errors name the field.
Result<ModelConfig> load_config(const std::string& dir);
// Same from JSON text; `source` names the file in error messages.
Result<ModelConfig> parse_config(const std::string& json_text, const std::string& source);
// Derives `roles` and checks every invariant (v41 §3.3, v4 §1.2); called by parse_config.
Status finalize_config(ModelConfig& cfg);

}  // namespace flashseek::model

namespace flashseek::model {

// Serialises a config in the release layouts (used by make-tiny and round-trip tests):
// V4 -> flat HF `config.json`; V4.1 -> nested HF `config.json` (text_config, vision_config,
// quantization_config when fp8_weights). `inference/config.json` uses the reference names.
std::string config_to_hf_json(const ModelConfig& cfg);
std::string config_to_ref_json(const ModelConfig& cfg);

// Number of decoder + MTP/DSpark layers (= compress_ratios.size() after validation).
inline int64_t total_layers(const ModelConfig& cfg) { return cfg.num_layers + cfg.num_mtp_layers; }

}  // namespace flashseek::model
