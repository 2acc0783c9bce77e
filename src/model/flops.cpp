#include "model/flops.h"

#include <algorithm>
#include <string>

#include "model/weights.h"

namespace flashseek::model {

std::vector<double> layer_linear_flops_per_token(const ModelConfig& cfg) {
  std::vector<double> per(size_t(std::max<int64_t>(cfg.num_layers, 0)), 0.0);
  const double routed_share =
      cfg.n_routed_experts > 0 ? double(cfg.n_experts_per_tok) / double(cfg.n_routed_experts) : 0.0;
  for (const WeightSpec& w : expected_weights(cfg)) {
    // Matrices only: 2-D floating weights of a backbone layer that act on each token's vector
    // (not the Engram tables, the V4 hash table or the compressors' additive position tables).
    if (w.shape.size() != 2 || w.kind == WeightKind::kEngramTable) continue;
    if (w.dtype != DType::kBF16 && w.dtype != DType::kF32 && w.dtype != DType::kF16) continue;
    if (w.name.size() >= 4 && w.name.compare(w.name.size() - 4, 4, ".ape") == 0) continue;
    if (w.name.rfind("layers.", 0) != 0) continue;
    const size_t dot = w.name.find('.', 7);
    if (dot == std::string::npos) continue;
    const int64_t layer = std::stoll(w.name.substr(7, dot - 7));
    if (layer < 0 || layer >= cfg.num_layers) continue;
    double f = 2.0 * double(w.shape[0]) * double(w.shape[1]);
    if (w.component == Component::kRoutedExperts) f *= routed_share;
    per[size_t(layer)] += f;
  }
  return per;
}

PrefillFlops prefill_flops(const ModelConfig& cfg, int64_t start, int64_t tokens, int64_t layers) {
  PrefillFlops out;
  const int64_t n_layers = layers < 0 ? cfg.num_layers : std::min(layers, cfg.num_layers);
  if (tokens <= 0 || start < 0 || n_layers <= 0) return out;
  const std::vector<double> lin = layer_linear_flops_per_token(cfg);
  const double per_key = 4.0 * double(cfg.num_heads) * double(cfg.head_dim);
  const double per_index_key = 2.0 * double(cfg.index_n_heads) * double(cfg.index_head_dim);
  const int64_t candidate_rows = cfg.candidate_topk_blocks * cfg.candidate_block_size;
  for (int64_t l = 0; l < n_layers; ++l) {
    const LayerRole& r = cfg.role(int(l));
    out.linear += lin[size_t(l)] * double(tokens);
    double keys = 0, scored = 0;
    for (int64_t p = start; p < start + tokens; ++p) {
      const int64_t visible = p + 1;
      keys += double(std::min(visible, cfg.window));
      if (r.ratio <= 0 || r.kv_src < 0) continue;
      const int64_t comp = visible / r.ratio;  // compressed rows visible at position p
      keys += double(r.idx_src >= 0 ? std::min(comp, cfg.index_topk) : comp);
      if (r.index_source)
        scored += double(r.candidate_filtered && candidate_rows > 0 ? std::min(comp, candidate_rows) : comp);
    }
    out.attention += keys * per_key;
    out.index += scored * per_index_key;
  }
  return out;
}

}  // namespace flashseek::model
