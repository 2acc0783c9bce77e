// ModelConfig -> release-style JSON (the inverse of config_parse.cpp; make-tiny writes these).
#include <nlohmann/json.hpp>

#include "model/config.h"

namespace flashseek::model {
namespace {

using nlohmann::json;

// Fields shared by every layout; `ref` selects the reference spelling.
json common_fields(const ModelConfig& c, bool ref) {
  auto k = [ref](const char* hf, const char* rf) { return std::string(ref ? rf : hf); };
  json j;
  j["vocab_size"] = c.vocab_size;
  j[k("hidden_size", "dim")] = c.hidden_size;
  j[k("num_hidden_layers", "n_layers")] = c.num_layers;
  j[k("num_attention_heads", "n_heads")] = c.num_heads;
  if (!ref) j["num_key_value_heads"] = 1;
  j["head_dim"] = c.head_dim;
  j[k("qk_rope_head_dim", "rope_head_dim")] = c.rope_head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j[k("sliding_window", "window_size")] = c.window;
  j["compress_ratios"] = c.compress_ratios;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j[k("num_experts_per_tok", "n_activated_experts")] = c.n_experts_per_tok;
  j[k("moe_intermediate_size", "moe_inter_dim")] = c.moe_inter_dim;
  j[k("scoring_func", "score_func")] = c.scoring_func;
  j[k("routed_scaling_factor", "route_scale")] = c.route_scale;
  j["swiglu_limit"] = c.swiglu_limit;
  if (!ref) {
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["topk_method"] = "noaux_tc";
    j["hidden_act"] = "silu";
    j["attention_bias"] = false;
    j["tie_word_embeddings"] = false;
  }
  if (c.gate_temp != 1.0) j["gate_temp"] = c.gate_temp;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j[k("rms_norm_eps", "norm_eps")] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["compress_rope_theta"] = c.compress_rope_theta;
  if (ref) {
    j["rope_factor"] = c.rope_factor;
    j["original_seq_len"] = c.original_seq_len;
    j["beta_fast"] = c.beta_fast;
    j["beta_slow"] = c.beta_slow;
    if (c.max_position_embeddings > 0) j["max_seq_len"] = c.max_position_embeddings;
  } else {
    if (c.max_position_embeddings > 0) j["max_position_embeddings"] = c.max_position_embeddings;
    if (c.original_seq_len > 0) {
      j["rope_scaling"] = {{c.is_v41() ? "rope_type" : "type", "yarn"},
                           {"factor", c.rope_factor},
                           {"original_max_position_embeddings", c.original_seq_len},
                           {"beta_fast", c.beta_fast},
                           {"beta_slow", c.beta_slow}};
    }
  }
  j[k("num_nextn_predict_layers", "n_mtp_layers")] = c.num_mtp_layers;
  return j;
}

void add_v41_fields(const ModelConfig& c, bool ref, json& j) {
  auto k = [ref](const char* hf, const char* rf) { return std::string(ref ? rf : hf); };
  j[k("kv_source_layer_ids", "kv_source_layers")] = c.kv_source_layers;
  j[k("index_source_layer_ids", "index_source_layers")] = c.index_source_layers;
  j[k("candidate_source_layer_id", "candidate_source_layer")] = c.candidate_source_layer;
  j["candidate_topk_blocks"] = c.candidate_topk_blocks;
  j["candidate_block_size"] = c.candidate_block_size;
  j["engram_layer_ids"] = c.engram_layer_ids;
  if (!c.engram_layer_ids.empty()) {
    j["engram_num_embeddings"] = c.engram_num_embeddings;
    j["engram_max_ngram_size"] = c.engram_max_ngram_size;
    j["engram_vocab_size"] = c.engram_vocab_size;
    j["engram_n_heads"] = c.engram_n_heads;
    j["engram_head_dim"] = c.engram_head_dim;
    j[k("engram_pad_token_id", "engram_pad_id")] = c.engram_pad_token_id;
    j["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  }
  if (c.num_mtp_layers > 0) {
    j["dspark_block_size"] = c.dspark_block_size;
    j["dspark_noise_token_id"] = c.dspark_noise_token_id;
    j["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
    j["dspark_markov_rank"] = c.dspark_markov_rank;
    j["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
    j[k("dspark_num_experts_per_tok", "dspark_n_activated_experts")] = c.dspark_n_experts_per_tok;
  }
}

json vision_fields(const ModelConfig& c, bool ref) {
  auto k = [ref](const char* hf, const char* rf) { return std::string(ref ? rf : hf); };
  json v;
  if (!ref) v["model_type"] = "deepseek_v41_vision";
  v[k("num_hidden_layers", "vision_n_layers")] = c.vision_num_layers;
  v[k("hidden_size", "vision_dim")] = c.vision_hidden_size;
  v[k("num_attention_heads", "vision_n_heads")] = c.vision_num_heads;
  v[k("intermediate_size", "vision_inter_dim")] = c.vision_intermediate_size;
  v[k("patch_size", "vision_patch_size")] = c.vision_patch_size;
  v[k("downsample_ratio", "vision_downsample_ratio")] = c.vision_downsample_ratio;
  return v;
}

json quantization_config(const ModelConfig& c) {
  json q = {{"quant_method", "fp8"},
            {"fmt", "e4m3"},
            {"activation_scheme", "dynamic"},
            {"scale_fmt", "ue8m0"},
            {"weight_block_size", {c.weight_block_size, c.weight_block_size}}};
  if (c.is_v41()) q["expert_dtype"] = c.fp4_experts ? "fp4" : "fp8";
  return q;
}

}  // namespace

std::string config_to_hf_json(const ModelConfig& c) {
  json text = common_fields(c, false);
  json top;
  if (!c.is_v41()) {
    top = std::move(text);
    top["architectures"] = {"DeepseekV4ForCausalLM"};
    top["model_type"] = c.model_type.empty() ? "deepseek_v4" : c.model_type;
    top["num_hash_layers"] = c.num_hash_layers;
    top["bos_token_id"] = c.bos_token_id;
    top["eos_token_id"] = c.eos_token_id;
    top["torch_dtype"] = "bfloat16";
    if (c.fp8_weights) top["quantization_config"] = quantization_config(c);
    if (c.fp4_experts) top["expert_dtype"] = "fp4";
    return top.dump(1);
  }
  text["model_type"] = "deepseek_v41_text";
  add_v41_fields(c, false, text);
  top["architectures"] = {"DeepseekV41ForCausalLM"};
  top["model_type"] = c.model_type.empty() ? "deepseek_v41" : c.model_type;
  top["dtype"] = "bfloat16";
  top["bos_token_id"] = c.bos_token_id;
  top["eos_token_id"] = c.eos_token_id;
  top["pad_token_id"] = c.pad_token_id;
  if (c.image_token_id >= 0) top["image_token_id"] = c.image_token_id;
  if (c.fp8_weights) top["quantization_config"] = quantization_config(c);
  top["text_config"] = std::move(text);
  top["vision_config"] = vision_fields(c, false);
  return top.dump(1);
}

std::string config_to_ref_json(const ModelConfig& c) {
  json j = common_fields(c, true);
  j["dtype"] = c.fp8_weights ? "fp8" : "bf16";
  j["expert_dtype"] = c.fp4_experts ? json("fp4") : json(nullptr);
  j["scale_fmt"] = "ue8m0";
  if (!c.is_v41()) {
    j["n_hash_layers"] = c.num_hash_layers;
    return j.dump(1);
  }
  add_v41_fields(c, true, j);
  if (c.image_token_id >= 0) j["image_token_id"] = c.image_token_id;
  j.update(vision_fields(c, true));
  return j.dump(1);
}

}  // namespace flashseek::model
