// config.json / inference/config.json -> ModelConfig. Three layouts (spec model-v4.md §1.1,
// model-v41.md §1.2-§1.6): flat HF (V4), nested HF (V4.1: text_config + quantization_config),
// flat reference names (both families). Key pairs are (HF name, reference name).
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/json_limits.h"
#include "model/config.h"
#include "model/json_fields.h"

namespace flashseek::model {
namespace {

using nlohmann::json;

// A config.json is a few KB nesting three levels (text_config.rope_scaling); these bounds leave
// ample room yet keep a hostile file from exhausting memory or the stack (a deep tree recurses
// on destruction) before any field is looked at.
constexpr uint64_t kMaxConfigBytes = 16ull << 20;
constexpr JsonLimits kConfigJsonLimits{/*max_depth=*/16, /*max_values=*/size_t(1) << 20};

// Picks the HF or the reference spelling of a key.
struct Keys {
  bool ref;
  const char* operator()(const char* hf, const char* rf) const { return ref ? rf : hf; }
};

Status read_backbone(const JsonFields& f, Keys k, ModelConfig& c) {
  FS_RETURN_IF_ERROR(f.req_int("vocab_size", c.vocab_size));
  FS_RETURN_IF_ERROR(f.req_int(k("hidden_size", "dim"), c.hidden_size));
  FS_RETURN_IF_ERROR(f.req_int(k("num_hidden_layers", "n_layers"), c.num_layers));
  FS_RETURN_IF_ERROR(f.req_int(k("num_attention_heads", "n_heads"), c.num_heads));
  FS_RETURN_IF_ERROR(f.req_int("head_dim", c.head_dim));
  FS_RETURN_IF_ERROR(f.req_int(k("qk_rope_head_dim", "rope_head_dim"), c.rope_head_dim));
  FS_RETURN_IF_ERROR(f.req_int("q_lora_rank", c.q_lora_rank));
  FS_RETURN_IF_ERROR(f.req_int("o_groups", c.o_groups));
  FS_RETURN_IF_ERROR(f.req_int("o_lora_rank", c.o_lora_rank));
  FS_RETURN_IF_ERROR(f.req_int(k("sliding_window", "window_size"), c.window));
  FS_RETURN_IF_ERROR(f.req_ints("compress_ratios", c.compress_ratios));
  FS_RETURN_IF_ERROR(f.req_int("index_n_heads", c.index_n_heads));
  FS_RETURN_IF_ERROR(f.req_int("index_head_dim", c.index_head_dim));
  FS_RETURN_IF_ERROR(f.req_int("index_topk", c.index_topk));
  if (!k.ref && f.has("num_key_value_heads")) {
    int64_t kv_heads = 0;
    FS_RETURN_IF_ERROR(f.req_int("num_key_value_heads", kv_heads));
    if (kv_heads != 1)
      return invalid_argument("{}: must be 1 (single shared K=V latent), got {}",
                              f.path("num_key_value_heads"), kv_heads);
  }
  // MoE
  FS_RETURN_IF_ERROR(f.req_int("n_routed_experts", c.n_routed_experts));
  FS_RETURN_IF_ERROR(f.opt_int("n_shared_experts", c.n_shared_experts));
  FS_RETURN_IF_ERROR(f.req_int(k("num_experts_per_tok", "n_activated_experts"), c.n_experts_per_tok));
  FS_RETURN_IF_ERROR(f.req_int(k("moe_intermediate_size", "moe_inter_dim"), c.moe_inter_dim));
  FS_RETURN_IF_ERROR(f.req_string(k("scoring_func", "score_func"), c.scoring_func));
  FS_RETURN_IF_ERROR(f.opt_bool("norm_topk_prob", c.norm_topk_prob));
  FS_RETURN_IF_ERROR(f.req_double(k("routed_scaling_factor", "route_scale"), c.route_scale));
  FS_RETURN_IF_ERROR(f.req_double("swiglu_limit", c.swiglu_limit));
  FS_RETURN_IF_ERROR(f.opt_double("gate_temp", c.gate_temp));
  if (!k.ref && f.has("topk_method")) {
    std::string m;
    FS_RETURN_IF_ERROR(f.req_string("topk_method", m));
    if (m != "noaux_tc")
      return invalid_argument("{}: only \"noaux_tc\" is supported, got \"{}\"", f.path("topk_method"), m);
  }
  // mHC
  FS_RETURN_IF_ERROR(f.opt_int("hc_mult", c.hc_mult));
  FS_RETURN_IF_ERROR(f.opt_int("hc_sinkhorn_iters", c.hc_sinkhorn_iters));
  FS_RETURN_IF_ERROR(f.opt_double("hc_eps", c.hc_eps));
  // MTP / DSpark stage count
  FS_RETURN_IF_ERROR(f.req_int(k("num_nextn_predict_layers", "n_mtp_layers"), c.num_mtp_layers));
  // Tokens
  FS_RETURN_IF_ERROR(f.opt_int("bos_token_id", c.bos_token_id));
  FS_RETURN_IF_ERROR(f.opt_int("eos_token_id", c.eos_token_id));
  FS_RETURN_IF_ERROR(f.opt_int("pad_token_id", c.pad_token_id));
  FS_RETURN_IF_ERROR(f.opt_int("image_token_id", c.image_token_id));
  return {};
}

// RoPE and YaRN: HF nests YaRN in `rope_scaling` (V4 spells the kind `type`, V4.1 `rope_type`);
// the reference has flat keys. No rope_scaling / original_seq_len 0 means no YaRN.
Status read_rope(const JsonFields& f, Keys k, ModelConfig& c) {
  FS_RETURN_IF_ERROR(f.req_double("rope_theta", c.rope_theta));
  FS_RETURN_IF_ERROR(f.req_double("compress_rope_theta", c.compress_rope_theta));
  if (k.ref) {
    FS_RETURN_IF_ERROR(f.opt_double("rope_factor", c.rope_factor));
    FS_RETURN_IF_ERROR(f.opt_int("original_seq_len", c.original_seq_len));
    FS_RETURN_IF_ERROR(f.opt_double("beta_fast", c.beta_fast));
    FS_RETURN_IF_ERROR(f.opt_double("beta_slow", c.beta_slow));
    FS_RETURN_IF_ERROR(f.opt_int("max_seq_len", c.max_position_embeddings));
    return {};
  }
  FS_RETURN_IF_ERROR(f.opt_int("max_position_embeddings", c.max_position_embeddings));
  FS_ASSIGN_OR_RETURN(const json* rs, f.opt_object("rope_scaling"));
  if (!rs) return {};
  JsonFields r(*rs, f.path("rope_scaling."));
  std::string type;
  if (r.has("rope_type")) FS_RETURN_IF_ERROR(r.req_string("rope_type", type));
  else FS_RETURN_IF_ERROR(r.req_string("type", type));
  if (type != "yarn")
    return invalid_argument("{}: only \"yarn\" is supported, got \"{}\"", f.path("rope_scaling.type"), type);
  FS_RETURN_IF_ERROR(r.req_double("factor", c.rope_factor));
  FS_RETURN_IF_ERROR(r.req_int("original_max_position_embeddings", c.original_seq_len));
  FS_RETURN_IF_ERROR(r.req_double("beta_fast", c.beta_fast));
  FS_RETURN_IF_ERROR(r.req_double("beta_slow", c.beta_slow));
  for (const char* bad : {"mscale", "mscale_all_dim"})
    if (r.has(bad))
      return invalid_argument("{}: YaRN amplitude scaling is not part of the V4 family",
                              r.path(bad));
  return {};
}

Status read_v41_extras(const JsonFields& f, Keys k, ModelConfig& c) {
  FS_RETURN_IF_ERROR(f.req_ints(k("kv_source_layer_ids", "kv_source_layers"), c.kv_source_layers));
  FS_RETURN_IF_ERROR(
      f.req_ints(k("index_source_layer_ids", "index_source_layers"), c.index_source_layers));
  FS_RETURN_IF_ERROR(
      f.req_int(k("candidate_source_layer_id", "candidate_source_layer"), c.candidate_source_layer));
  FS_RETURN_IF_ERROR(f.req_int("candidate_topk_blocks", c.candidate_topk_blocks));
  FS_RETURN_IF_ERROR(f.req_int("candidate_block_size", c.candidate_block_size));
  FS_RETURN_IF_ERROR(f.req_ints("engram_layer_ids", c.engram_layer_ids));
  if (!c.engram_layer_ids.empty()) {
    FS_RETURN_IF_ERROR(f.req_ints("engram_num_embeddings", c.engram_num_embeddings));
    FS_RETURN_IF_ERROR(f.req_int("engram_max_ngram_size", c.engram_max_ngram_size));
    FS_RETURN_IF_ERROR(f.req_int("engram_vocab_size", c.engram_vocab_size));
    FS_RETURN_IF_ERROR(f.req_int("engram_n_heads", c.engram_n_heads));
    FS_RETURN_IF_ERROR(f.req_int("engram_head_dim", c.engram_head_dim));
    FS_RETURN_IF_ERROR(f.req_int(k("engram_pad_token_id", "engram_pad_id"), c.engram_pad_token_id));
    FS_RETURN_IF_ERROR(f.req_int("engram_compressed_vocab_size", c.engram_compressed_vocab_size));
  }
  if (c.num_mtp_layers > 0) {
    FS_RETURN_IF_ERROR(f.req_int("dspark_block_size", c.dspark_block_size));
    FS_RETURN_IF_ERROR(f.req_int("dspark_noise_token_id", c.dspark_noise_token_id));
    FS_RETURN_IF_ERROR(f.req_ints("dspark_target_layer_ids", c.dspark_target_layer_ids));
    FS_RETURN_IF_ERROR(f.req_int("dspark_markov_rank", c.dspark_markov_rank));
    FS_RETURN_IF_ERROR(f.req_int("dspark_n_routed_experts", c.dspark_n_routed_experts));
    FS_RETURN_IF_ERROR(f.req_int(k("dspark_num_experts_per_tok", "dspark_n_activated_experts"),
                                 c.dspark_n_experts_per_tok));
  }
  if (f.has(k("num_hash_layers", "n_hash_layers"))) {
    FS_RETURN_IF_ERROR(f.req_int(k("num_hash_layers", "n_hash_layers"), c.num_hash_layers));
    if (c.num_hash_layers != 0)
      return invalid_argument("{}: V4.1 has no hash-routed layers, got {}",
                              f.path(k("num_hash_layers", "n_hash_layers")), c.num_hash_layers);
  }
  return {};
}

Status read_expert_dtype(const JsonFields& f, ModelConfig& c) {
  std::string e;
  FS_RETURN_IF_ERROR(f.opt_string("expert_dtype", e));
  if (e.empty()) return {};
  if (e == "fp4") c.fp4_experts = true;
  else if (e == "fp8" || e == "bf16") c.fp4_experts = false;
  else return invalid_argument("{}: expected \"fp4\", \"fp8\" or \"bf16\", got \"{}\"",
                               f.path("expert_dtype"), e);
  return {};
}

// HF `quantization_config` (absent: everything BF16, as in the oracle fixture).
Status read_quantization(const JsonFields& top, ModelConfig& c) {
  FS_ASSIGN_OR_RETURN(const json* q, top.opt_object("quantization_config"));
  c.fp8_weights = q != nullptr;
  c.fp4_experts = false;
  c.weight_block_size = c.is_v41() ? 32 : 128;  // the family's block, should FP8 tensors appear anyway
  if (!q) return read_expert_dtype(top, c);  // V4 writes expert_dtype at the top level
  JsonFields f(*q, top.path("quantization_config."));
  std::string method;
  FS_RETURN_IF_ERROR(f.req_string("quant_method", method));
  if (method != "fp8")
    return invalid_argument("{}: only \"fp8\" is supported, got \"{}\"", f.path("quant_method"), method);
  std::string fmt_name = "e4m3", scale_fmt = "ue8m0";
  FS_RETURN_IF_ERROR(f.opt_string("fmt", fmt_name));
  FS_RETURN_IF_ERROR(f.opt_string("scale_fmt", scale_fmt));
  if (fmt_name != "e4m3")
    return invalid_argument("{}: only \"e4m3\" is supported, got \"{}\"", f.path("fmt"), fmt_name);
  if (scale_fmt != "ue8m0")
    return invalid_argument("{}: only \"ue8m0\" is supported, got \"{}\"", f.path("scale_fmt"), scale_fmt);
  std::vector<int64_t> block;
  FS_RETURN_IF_ERROR(f.req_ints("weight_block_size", block));
  if (block.size() != 2 || block[0] != block[1] || block[0] <= 0)
    return invalid_argument("{}: expected two equal positive sizes, got {}",
                            f.path("weight_block_size"), q->at("weight_block_size").dump());
  c.weight_block_size = block[0];
  FS_RETURN_IF_ERROR(read_expert_dtype(top, c));
  return read_expert_dtype(f, c);
}

// Reference `dtype` ("fp8" / "bf16") and `expert_dtype`; the block size is a module constant there.
Status read_ref_formats(const JsonFields& f, ModelConfig& c) {
  std::string dtype = "bf16";
  FS_RETURN_IF_ERROR(f.opt_string("dtype", dtype));
  if (dtype != "fp8" && dtype != "bf16")
    return invalid_argument("{}: expected \"fp8\" or \"bf16\", got \"{}\"", f.path("dtype"), dtype);
  c.fp8_weights = dtype == "fp8";
  c.weight_block_size = c.is_v41() ? 32 : 128;
  c.fp4_experts = false;
  return read_expert_dtype(f, c);
}

Status read_vision(const json& v, const std::string& where, Keys k, ModelConfig& c) {
  JsonFields f(v, where);
  FS_RETURN_IF_ERROR(f.opt_int(k("num_hidden_layers", "vision_n_layers"), c.vision_num_layers));
  FS_RETURN_IF_ERROR(f.opt_int(k("hidden_size", "vision_dim"), c.vision_hidden_size));
  FS_RETURN_IF_ERROR(f.opt_int(k("num_attention_heads", "vision_n_heads"), c.vision_num_heads));
  FS_RETURN_IF_ERROR(f.opt_int(k("intermediate_size", "vision_inter_dim"), c.vision_intermediate_size));
  FS_RETURN_IF_ERROR(f.opt_int(k("patch_size", "vision_patch_size"), c.vision_patch_size));
  FS_RETURN_IF_ERROR(
      f.opt_int(k("downsample_ratio", "vision_downsample_ratio"), c.vision_downsample_ratio));
  return {};
}

Result<ModelConfig> parse_nested_v41(const json& j, const std::string& src) {
  ModelConfig c;
  c.family = Family::kV41;
  JsonFields top(j, src + ": ");
  FS_RETURN_IF_ERROR(top.opt_string("model_type", c.model_type));
  FS_ASSIGN_OR_RETURN(const json* tc, top.opt_object("text_config"));
  if (!tc) return invalid_argument("{}: text_config: required field is missing", src);
  JsonFields f(*tc, src + ": text_config.");
  const Keys k{false};
  c.rms_norm_eps = 0;
  FS_RETURN_IF_ERROR(f.req_double("rms_norm_eps", c.rms_norm_eps));  // 1e-20: never default it
  FS_RETURN_IF_ERROR(read_backbone(f, k, c));
  FS_RETURN_IF_ERROR(read_rope(f, k, c));
  FS_RETURN_IF_ERROR(read_v41_extras(f, k, c));
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "image_token_id"}) {
    int64_t* dst = key[0] == 'b' ? &c.bos_token_id : key[0] == 'e' ? &c.eos_token_id
                 : key[0] == 'p' ? &c.pad_token_id : &c.image_token_id;
    FS_RETURN_IF_ERROR(top.opt_int(key, *dst));  // top level wins over text_config
  }
  FS_RETURN_IF_ERROR(read_quantization(top, c));
  FS_ASSIGN_OR_RETURN(const json* vc, top.opt_object("vision_config"));
  if (vc) FS_RETURN_IF_ERROR(read_vision(*vc, src + ": vision_config.", k, c));
  return c;
}

Result<ModelConfig> parse_flat(const json& j, const std::string& src, bool ref, bool v41) {
  ModelConfig c;
  c.family = v41 ? Family::kV41 : Family::kV4;
  JsonFields f(j, src + ": ");
  const Keys k{ref};
  FS_RETURN_IF_ERROR(f.opt_string("model_type", c.model_type));
  if (c.model_type.empty()) c.model_type = v41 ? "deepseek_v41" : "deepseek_v4";
  if (v41) {
    c.rms_norm_eps = 0;
    FS_RETURN_IF_ERROR(f.req_double(k("rms_norm_eps", "norm_eps"), c.rms_norm_eps));
  } else {
    FS_RETURN_IF_ERROR(f.opt_double(k("rms_norm_eps", "norm_eps"), c.rms_norm_eps));
  }
  FS_RETURN_IF_ERROR(read_backbone(f, k, c));
  FS_RETURN_IF_ERROR(read_rope(f, k, c));
  if (v41) {
    FS_RETURN_IF_ERROR(read_v41_extras(f, k, c));
    FS_RETURN_IF_ERROR(read_vision(j, src + ": ", k, c));
  } else {
    FS_RETURN_IF_ERROR(f.req_int(k("num_hash_layers", "n_hash_layers"), c.num_hash_layers));
  }
  if (ref) FS_RETURN_IF_ERROR(read_ref_formats(f, c));
  else FS_RETURN_IF_ERROR(read_quantization(f, c));
  return c;
}

}  // namespace

Result<ModelConfig> parse_config(const std::string& json_text, const std::string& source) {
  if (json_text.size() > kMaxConfigBytes)
    return out_of_range("{}: {} bytes, above the limit of {} bytes", source, json_text.size(), kMaxConfigBytes);
  if (JsonScan scan = scan_json(json_text, kConfigJsonLimits); scan != JsonScan::kOk)
    return parse_error("{}: {}", source, describe(scan, kConfigJsonLimits));
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return parse_error("{}: not valid JSON", source);
  if (!j.is_object()) return parse_error("{}: top level must be a JSON object", source);
  Result<ModelConfig> r = [&]() -> Result<ModelConfig> {
    // vision_config only appears in the nested layout: without text_config that file is broken.
    if (j.contains("text_config") || j.contains("vision_config")) return parse_nested_v41(j, source);
    const bool ref = j.contains("dim");
    // (A model_type that is not a string reads as none: value() would throw on it.)
    const auto mt_it = j.find("model_type");
    const std::string mt = mt_it != j.end() && mt_it->is_string() ? mt_it->get<std::string>() : "";
    const bool v41 = mt.rfind("deepseek_v41", 0) == 0 ||
                     j.contains(ref ? "kv_source_layers" : "kv_source_layer_ids");
    return parse_flat(j, source, ref, v41);
  }();
  if (!r.ok()) return r;
  ModelConfig cfg = std::move(r).value();
  Status st = finalize_config(cfg);
  if (!st.ok()) return st.with_context(source);
  return cfg;
}

Result<ModelConfig> load_config(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path path = fs::path(dir) / "config.json";
  if (!fs::exists(path)) path = fs::path(dir) / "inference" / "config.json";
  if (!fs::exists(path))
    return not_found("{}: neither config.json nor inference/config.json exists", dir);
  FS_ASSIGN_OR_RETURN(std::string text, read_bounded_file(path.string(), kMaxConfigBytes));
  return parse_config(text, path.string());
}

}  // namespace flashseek::model
