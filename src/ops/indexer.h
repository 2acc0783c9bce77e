// Lightning-indexer scoring, top-k selection and the V4.1 candidate pre-filter
// (v4 §3.5.6, v41 §2 item 6, §3.2 step 5, §3.4).
#pragma once
#include <cstdint>
#include <vector>

namespace flashseek::ops {

struct IndexScoreParams {
  const float* q = nullptr;     // [n_heads, head_dim] one query (RoPE'd, maybe FP4-simulated)
  const float* w = nullptr;     // [n_heads] head weights (scale constants already applied)
  const float* keys = nullptr;  // [n_keys, head_dim] index keys
  int64_t n_keys = 0, n_heads = 0, head_dim = 0;
  bool bf16 = false;            // reference: dot, relu·w and head sum rounded to BF16
  float* scores = nullptr;      // [n_keys] Σ_h relu(q_h · k) · w_h
};
void index_scores(const IndexScoreParams& p);

// Indices of the best min(k, #finite) finite scores, returned in ascending index order.
// Ties are broken deterministically: the lower index wins (the reference's torch.topk order is
// unspecified at ties, v41 §3.4).
std::vector<int32_t> topk_indices(const float* scores, int64_t n, int64_t k);

// Candidate mask of v41 §3.4 for one query: scores [n] (unreachable = −inf), `clen` visible
// positions, blocks of `block` positions, keep the best `top_blocks` blocks after pinning the
// block of position clen − 1 (nothing pinned when clen = 0). Ties: lower block index first.
// mask[t] = 1 if position t lies in a kept block.
void candidate_mask(const float* scores, int64_t n, int64_t clen, int64_t block,
                    int64_t top_blocks, uint8_t* mask);

}  // namespace flashseek::ops
