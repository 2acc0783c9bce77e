#include "model/weights.h"

#include <fmt/format.h>

namespace flashseek::model {
namespace {

// Appends weight specs for one block (decoder layer or MTP/DSpark stage) or for globals.
class SpecBuilder {
 public:
  explicit SpecBuilder(const ModelConfig& c) : c_(c) {}
  std::vector<WeightSpec> take() { return std::move(out_); }

  void add(std::string name, Shape shape, WeightKind kind, DType dt, Component comp, bool optional = false) {
    out_.push_back({std::move(name), std::move(shape), kind, dt, comp, optional});
  }
  void plain(const std::string& name, Shape shape, DType dt, Component comp) {
    add(name, std::move(shape), WeightKind::kPlain, dt, comp);
  }
  void linear(const std::string& name, Shape shape, Component comp) {
    add(name, std::move(shape), WeightKind::kLinear, DType::kBF16, comp);
  }

  // mHC mixers + the two block norms + attention (window part) of any block.
  void attention(const std::string& p, Component comp) {
    const int64_t D = c_.hidden_size, hc = c_.hc_mult, mix = (2 + hc) * hc;
    for (const char* sub : {"attn", "ffn"}) {
      plain(fmt::format("{}hc_{}_fn", p, sub), {mix, hc * D}, DType::kF32, comp);
      plain(fmt::format("{}hc_{}_base", p, sub), {mix}, DType::kF32, comp);
      plain(fmt::format("{}hc_{}_scale", p, sub), {3}, DType::kF32, comp);
    }
    plain(p + "attn_norm.weight", {D}, DType::kBF16, comp);
    plain(p + "ffn_norm.weight", {D}, DType::kBF16, comp);
    const int64_t qd = c_.num_heads * c_.head_dim;
    linear(p + "attn.wq_a.weight", {c_.q_lora_rank, D}, comp);
    plain(p + "attn.q_norm.weight", {c_.q_lora_rank}, DType::kBF16, comp);
    linear(p + "attn.wq_b.weight", {qd, c_.q_lora_rank}, comp);
    linear(p + "attn.wkv.weight", {c_.head_dim, D}, comp);
    plain(p + "attn.kv_norm.weight", {c_.head_dim}, DType::kBF16, comp);
    linear(p + "attn.wo_a.weight", {c_.o_groups * c_.o_lora_rank, qd / c_.o_groups}, comp);
    linear(p + "attn.wo_b.weight", {D, c_.o_groups * c_.o_lora_rank}, comp);
    plain(p + "attn.attn_sink", {c_.num_heads}, DType::kF32, comp);
  }

  // Router, shared expert and routed experts. `bias`: selection bias present; `bias_vl`: V4.1.
  void moe(const std::string& p, int64_t n_experts, bool hash, bool bias_vl, Component dense, Component experts) {
    const int64_t D = c_.hidden_size, I = c_.moe_inter_dim;
    plain(p + "ffn.gate.weight", {n_experts, D}, DType::kBF16, dense);
    if (hash) plain(p + "ffn.gate.tid2eid", {c_.vocab_size, c_.n_experts_per_tok}, DType::kI64, dense);
    else plain(p + "ffn.gate.bias", {n_experts}, DType::kF32, dense);
    if (bias_vl) plain(p + "ffn.gate.bias_vl", {n_experts}, DType::kF32, dense);
    linear(p + "ffn.shared_experts.w1.weight", {I, D}, dense);
    linear(p + "ffn.shared_experts.w2.weight", {D, I}, dense);
    linear(p + "ffn.shared_experts.w3.weight", {I, D}, dense);
    for (int64_t e = 0; e < n_experts; ++e) {
      const std::string q = fmt::format("{}ffn.experts.{}.", p, e);
      add(q + "w1.weight", {I, D}, WeightKind::kExpert, DType::kBF16, experts);
      add(q + "w2.weight", {D, I}, WeightKind::kExpert, DType::kBF16, experts);
      add(q + "w3.weight", {I, D}, WeightKind::kExpert, DType::kBF16, experts);
    }
  }

  // V4 compressor (CSA ratio 4: overlapping, two halves; HCA ratio 128) and CSA indexer.
  void v4_compressor(const std::string& p, int ratio) {
    const int64_t D = c_.hidden_size, Dh = c_.head_dim, ID = c_.index_head_dim;
    const auto comp = Component::kCompressors;
    const int64_t coff = ratio == 4 ? 2 : 1;
    plain(p + "attn.compressor.wkv.weight", {coff * Dh, D}, DType::kBF16, comp);
    plain(p + "attn.compressor.wgate.weight", {coff * Dh, D}, DType::kBF16, comp);
    plain(p + "attn.compressor.ape", {ratio, coff * Dh}, DType::kF32, comp);
    plain(p + "attn.compressor.norm.weight", {Dh}, DType::kBF16, comp);
    if (ratio != 4) return;
    linear(p + "attn.indexer.wq_b.weight", {c_.index_n_heads * ID, c_.q_lora_rank}, comp);
    plain(p + "attn.indexer.weights_proj.weight", {c_.index_n_heads, D}, DType::kBF16, comp);
    plain(p + "attn.indexer.compressor.wkv.weight", {2 * ID, D}, DType::kBF16, comp);
    plain(p + "attn.indexer.compressor.wgate.weight", {2 * ID, D}, DType::kBF16, comp);
    plain(p + "attn.indexer.compressor.ape", {4, 2 * ID}, DType::kF32, comp);
    plain(p + "attn.indexer.compressor.norm.weight", {ID}, DType::kBF16, comp);
  }

  // V4.1 CSA2 (§6): compressor on kv sources (no wgate at ratio 1), index keys on kv sources,
  // indexer query + weights on index sources.
  void v41_csa2(const std::string& p, const LayerRole& r) {
    const int64_t D = c_.hidden_size, Dh = c_.head_dim, ID = c_.index_head_dim;
    const auto comp = Component::kCompressors;
    if (r.kv_source) {
      plain(p + "attn.compressor.wkv.weight", {Dh, D}, DType::kBF16, comp);
      if (r.ratio != 1) plain(p + "attn.compressor.wgate.weight", {Dh, D}, DType::kBF16, comp);
      plain(p + "attn.compressor.norm.weight", {Dh}, DType::kBF16, comp);
      if (r.index_source) {
        plain(p + "attn.indexer.wk.weight", {ID, Dh}, DType::kBF16, comp);
        plain(p + "attn.indexer.k_norm.weight", {ID}, DType::kBF16, comp);
      }
    }
    if (r.index_source) {
      linear(p + "attn.indexer.wq_b.weight", {c_.index_n_heads * ID, c_.q_lora_rank}, comp);
      plain(p + "attn.indexer.weights_proj.weight", {c_.index_n_heads, D}, DType::kBF16, comp);
    }
  }

  void engram(const std::string& p, int64_t rows) {
    const int64_t D = c_.hidden_size, de = c_.engram_head_dim;
    const int64_t ncol = (c_.engram_max_ngram_size - 1) * c_.engram_n_heads;
    add(p + "engram.embed.weight", {rows, de}, WeightKind::kEngramTable, DType::kBF16, Component::kEngramTables);
    linear(p + "engram.wkv.weight", {(c_.hc_mult + 1) * D, ncol * de}, Component::kEngramProj);
    plain(p + "engram.q_weight", {c_.hc_mult, D}, DType::kBF16, Component::kEngramProj);
    plain(p + "engram.k_weight", {c_.hc_mult, D}, DType::kBF16, Component::kEngramProj);
  }

  void hc_head(const std::string& p, Component comp) {
    const int64_t hc = c_.hc_mult;
    plain(p + "hc_head_fn", {hc, hc * c_.hidden_size}, DType::kF32, comp);
    plain(p + "hc_head_base", {hc}, DType::kF32, comp);
    plain(p + "hc_head_scale", {1}, DType::kF32, comp);
  }

  void vision() {
    const int64_t D = c_.hidden_size, vd = c_.vision_hidden_size, vi = c_.vision_intermediate_size;
    const int64_t ds = c_.vision_downsample_ratio, ps = c_.vision_patch_size;
    auto v = [&](const std::string& name, Shape s) {
      add(name, std::move(s), WeightKind::kPlain, DType::kBF16, Component::kVision, /*optional=*/true);
    };
    for (const char* n : {"image_start", "image_end", "image_newline"}) v(n, {D});
    v("aligner.w1.weight", {D, vd * ds * ds});
    v("aligner.w1.bias", {D});
    v("aligner.w2.weight", {D, D});
    v("aligner.w2.bias", {D});
    v("vision.patch_embed.proj.weight", {vd, 3 * ps * ps});
    v("vision.patch_embed.proj.bias", {vd});
    for (int64_t b = 0; b < c_.vision_num_layers; ++b) {
      const std::string q = fmt::format("vision.blocks.{}.", b);
      v(q + "attn.wqkv.weight", {3 * vd, vd});
      v(q + "attn.wqkv.bias", {3 * vd});
      v(q + "attn.wo.weight", {vd, vd});
      v(q + "attn.wo.bias", {vd});
      v(q + "mlp.w1.weight", {2 * vi, vd});
      v(q + "mlp.w2.weight", {vd, vi});
      v(q + "norm1.weight", {vd});
      v(q + "norm2.weight", {vd});
    }
    v("vision.norm.weight", {vd});
  }

 private:
  const ModelConfig& c_;
  std::vector<WeightSpec> out_;
};

void add_v4(const ModelConfig& c, SpecBuilder& b) {
  const int64_t D = c.hidden_size;
  for (int l = 0; l < int(c.num_layers); ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    const LayerRole& r = c.role(l);
    b.attention(p, Component::kAttention);
    if (r.ratio > 0) b.v4_compressor(p, r.ratio);
    b.moe(p, c.n_routed_experts, r.hash_routed, false, Component::kSharedRouters, Component::kRoutedExperts);
  }
  for (int s = 0; s < int(c.num_mtp_layers); ++s) {
    const std::string p = fmt::format("mtp.{}.", s);
    const auto dense = Component::kDraftDense;
    b.attention(p, dense);
    b.moe(p, c.n_routed_experts, false, false, dense, Component::kDraftExperts);
    b.plain(p + "enorm.weight", {D}, DType::kBF16, dense);
    b.plain(p + "hnorm.weight", {D}, DType::kBF16, dense);
    b.linear(p + "e_proj.weight", {D, D}, dense);
    b.linear(p + "h_proj.weight", {D, D}, dense);
    b.plain(p + "norm.weight", {D}, DType::kBF16, dense);
    b.hc_head(p, dense);
  }
}

void add_v41(const ModelConfig& c, SpecBuilder& b) {
  const int64_t D = c.hidden_size;
  for (int l = 0; l < int(c.num_layers); ++l) {
    const std::string p = fmt::format("layers.{}.", l);
    const LayerRole& r = c.role(l);
    b.attention(p, Component::kAttention);
    b.v41_csa2(p, r);
    for (size_t i = 0; i < c.engram_layer_ids.size(); ++i)
      if (c.engram_layer_ids[i] == l) b.engram(p, c.engram_num_embeddings[i]);
    b.moe(p, c.n_routed_experts, false, true, Component::kSharedRouters, Component::kRoutedExperts);
  }
  for (int s = 0; s < int(c.num_mtp_layers); ++s) {
    const std::string p = fmt::format("mtp.{}.", s);
    const auto dense = Component::kDraftDense;
    b.attention(p, dense);
    b.moe(p, c.dspark_n_routed_experts, false, true, dense, Component::kDraftExperts);
    if (s == 0) {
      b.linear(p + "main_proj.weight", {D, int64_t(c.dspark_target_layer_ids.size()) * D}, dense);
      b.plain(p + "main_norm.weight", {D}, DType::kBF16, dense);
    }
    if (s == int(c.num_mtp_layers) - 1) {
      b.plain(p + "norm.weight", {D}, DType::kBF16, dense);
      b.plain(p + "markov_head.embed.weight", {c.vocab_size, c.dspark_markov_rank}, DType::kBF16, dense);
      b.plain(p + "markov_head.head.weight", {c.vocab_size, c.dspark_markov_rank}, DType::kBF16, dense);
      b.plain(p + "confidence_head.proj.weight", {1, D + c.dspark_markov_rank}, DType::kBF16, dense);
    }
  }
  if (c.vision_num_layers > 0) b.vision();
}

}  // namespace

const char* component_name(Component c) {
  switch (c) {
    case Component::kRoutedExperts: return "routed experts";
    case Component::kEngramTables: return "Engram tables";
    case Component::kAttention: return "attention incl. mHC";
    case Component::kSharedRouters: return "shared experts + routers";
    case Component::kEmbedHead: return "embedding + LM head";
    case Component::kEngramProj: return "Engram projections";
    case Component::kCompressors: return "compressors + indexers";
    case Component::kDraftExperts: return "draft (MTP/DSpark) experts";
    case Component::kDraftDense: return "draft (MTP/DSpark) dense";
    case Component::kVision: return "vision tower";
    case Component::kOther: return "other";
  }
  return "?";
}

std::vector<WeightSpec> expected_weights(const ModelConfig& c) {
  SpecBuilder b(c);
  const int64_t D = c.hidden_size;
  b.plain("embed.weight", {c.vocab_size, D}, DType::kBF16, Component::kEmbedHead);
  b.plain("head.weight", {c.vocab_size, D}, DType::kBF16, Component::kEmbedHead);
  b.plain("norm.weight", {D}, DType::kBF16, Component::kEmbedHead);
  if (c.is_v41()) add_v41(c, b);
  else {
    b.hc_head("", Component::kEmbedHead);
    add_v4(c, b);
  }
  return b.take();
}

std::string scale_name_for(const std::string& w) {
  static const std::string kSuffix = ".weight";
  if (w.size() > kSuffix.size() && w.compare(w.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0)
    return w.substr(0, w.size() - kSuffix.size()) + ".scale";
  return w + ".scale";
}

std::vector<StoredTensor> release_tensors(const WeightSpec& w, const ModelConfig& c, bool bf16_linears) {
  const int64_t out = w.shape.empty() ? 1 : w.shape[0];
  const int64_t in = w.shape.size() < 2 ? 1 : w.shape[1];
  const int64_t b = c.weight_block_size;
  switch (w.kind) {
    case WeightKind::kPlain:
      return {{w.name, w.dtype, w.shape}};
    case WeightKind::kEngramTable:
      return {{w.name, DType::kF8E4M3, w.shape}, {scale_name_for(w.name), DType::kF8E8M0, {out, ceil_div(in, 32)}}};
    case WeightKind::kExpert:
      if (c.fp4_experts && !bf16_linears)
        return {{w.name, DType::kI8, {out, in / 2}}, {scale_name_for(w.name), DType::kF8E8M0, {out, in / 32}}};
      [[fallthrough]];
    case WeightKind::kLinear:
      if (c.fp8_weights && !bf16_linears)
        return {{w.name, DType::kF8E4M3, w.shape},
                {scale_name_for(w.name), DType::kF8E8M0, {ceil_div(out, b), ceil_div(in, b)}}};
      return {{w.name, DType::kBF16, w.shape}};
  }
  return {};
}

}  // namespace flashseek::model
