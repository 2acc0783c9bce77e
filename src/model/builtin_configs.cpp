// Built-in test configurations: tiny-v4 (spec model-v4.md §6), tiny-v41 (model-v41.md §8) and
// demo (tiny-v41 with the full 129,280-token vocabulary).
#include "model/make_tiny.h"

namespace flashseek::model {
namespace {

ModelConfig tiny_v4() {
  ModelConfig c;
  c.family = Family::kV4;
  c.model_type = "deepseek_v4";
  c.vocab_size = 1024;
  c.hidden_size = 256;
  c.num_layers = 4;
  c.num_heads = 16;
  c.head_dim = 128;
  c.rope_head_dim = 64;
  c.q_lora_rank = 128;
  c.o_groups = 4;
  c.o_lora_rank = 64;
  c.window = 8;
  c.compress_ratios = {0, 4, 128, 4, 0};
  c.index_n_heads = 4;
  c.index_head_dim = 128;
  c.index_topk = 4;
  c.n_routed_experts = 8;
  c.n_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.moe_inter_dim = 128;
  c.num_hash_layers = 2;
  c.scoring_func = "sqrtsoftplus";
  c.route_scale = 1.5;
  c.swiglu_limit = 10.0;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000;
  c.compress_rope_theta = 160000;
  c.rope_factor = 16;
  c.original_seq_len = 65536;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.max_position_embeddings = 1048576;
  c.num_mtp_layers = 1;
  c.fp8_weights = true;
  c.weight_block_size = 128;
  c.fp4_experts = true;
  return c;
}

ModelConfig tiny_v41() {
  ModelConfig c;
  c.family = Family::kV41;
  c.model_type = "deepseek_v41";
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.moe_inter_dim = 64;
  c.num_layers = 7;
  c.num_heads = 4;
  c.head_dim = 64;
  c.rope_head_dim = 16;
  c.q_lora_rank = 64;
  c.o_lora_rank = 32;
  c.o_groups = 2;
  c.swiglu_limit = 10.0;
  c.rms_norm_eps = 1e-20;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000;
  c.rope_factor = 4;
  c.beta_fast = 32;
  c.beta_slow = 1;
  c.original_seq_len = 32;
  c.n_routed_experts = 4;
  c.n_shared_experts = 1;
  c.n_experts_per_tok = 2;
  c.scoring_func = "sqrtsoftplus";
  c.norm_topk_prob = true;
  c.route_scale = 1.5;
  c.window = 8;
  c.compress_ratios = {0, 2, 2, 1, 1, 1, 0, 0, 0, 0};
  c.compress_rope_theta = 160000;
  c.kv_source_layers = {1, 3};
  c.index_source_layers = {1, 3, 5};
  c.index_n_heads = 2;
  c.index_head_dim = 32;
  c.index_topk = 4;
  c.candidate_source_layer = 3;
  c.candidate_topk_blocks = 2;
  c.candidate_block_size = 4;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 20;
  c.hc_eps = 1e-6;
  c.engram_layer_ids = {1, 4};
  c.engram_num_embeddings = {152, 220};
  c.engram_max_ngram_size = 3;
  c.engram_vocab_size = 31;
  c.engram_n_heads = 2;
  c.engram_head_dim = 32;
  c.engram_pad_token_id = 2;
  c.engram_compressed_vocab_size = 256;
  c.num_mtp_layers = 3;
  c.dspark_block_size = 3;
  c.dspark_noise_token_id = 250;
  c.dspark_target_layer_ids = {4, 5, 6};
  c.dspark_markov_rank = 8;
  c.dspark_n_routed_experts = 2;
  c.dspark_n_experts_per_tok = 1;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  c.pad_token_id = 2;
  c.image_token_id = 253;  // §1.2's 129264 lies outside a 256-token vocabulary (fixture uses 253)
  c.fp8_weights = true;
  c.weight_block_size = 32;
  c.fp4_experts = true;
  c.vision_num_layers = 0;  // vision disabled (§8); the remaining fields as released (§1.5)
  c.vision_hidden_size = 1024;
  c.vision_num_heads = 16;
  c.vision_intermediate_size = 2816;
  c.vision_patch_size = 14;
  c.vision_downsample_ratio = 3;
  return c;
}

}  // namespace

Result<ModelConfig> builtin_config(std::string_view name) {
  ModelConfig c;
  if (name == "tiny-v4") {
    c = tiny_v4();
  } else if (name == "tiny-v41") {
    c = tiny_v41();
  } else if (name == "demo") {
    c = tiny_v41();
    c.vocab_size = 129280;
    c.engram_compressed_vocab_size = 129280;  // identity token map
    c.image_token_id = 129264;
    c.dspark_noise_token_id = 128799;
  } else {
    return not_found("unknown built-in config \"{}\" (tiny-v4, tiny-v41, demo)", name);
  }
  FS_RETURN_IF_ERROR(finalize_config(c));
  return c;
}

}  // namespace flashseek::model
