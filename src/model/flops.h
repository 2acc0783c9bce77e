// The arithmetic of prefilling a sequence, counted as perf-budget.md §4.1 counts it: per token and
// layer, 2·out·in for every matrix of the layer that the token goes through (the attention
// projections, the mHC mixers, the router, the shared expert, the compressor and indexer
// projections, the Engram projection and gate; the routed experts' matrices weighted by top-k /
// experts), 4·heads·head_dim per attention key (the window's keys and the compressed ones, at most
// index_topk of them where a top-k list chooses), and 2·index_heads·index_head_dim per index key
// scored (every visible compressed row at an index source, at most the candidate blocks' rows
// after the candidate source). Embeddings, tables, norms and the LM head are not counted.
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace flashseek::model {

struct PrefillFlops {
  double linear = 0;     // matrices
  double attention = 0;  // attention core (QKᵀ and PV)
  double index = 0;      // index scores
  double total() const { return linear + attention + index; }
};

// Positions [start, start + tokens) of one sequence through layers [0, layers) (layers < 0: all
// of cfg.num_layers). start >= 0, tokens >= 0.
PrefillFlops prefill_flops(const ModelConfig& cfg, int64_t start, int64_t tokens, int64_t layers = -1);

// One layer's matrix FLOPs per token (the first term above), for each of cfg.num_layers layers.
std::vector<double> layer_linear_flops_per_token(const ModelConfig& cfg);

}  // namespace flashseek::model
