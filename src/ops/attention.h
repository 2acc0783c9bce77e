// Sparse multi-query attention with per-head sinks over an explicit key list (v4 §3.5.7):
// K = V = one shared latent row per key; the sink logit (unscaled) adds to the denominator only.
#pragma once
#include <cstdint>

namespace flashseek::ops {

struct SparseAttnParams {
  const float* q = nullptr;           // [n_heads, head_dim] one query (RoPE applied)
  const float* const* keys = nullptr; // [n_keys] pointers to [head_dim] rows; nullptr = padding (−1)
  int64_t n_keys = 0, n_heads = 0, head_dim = 0;
  const float* sink = nullptr;        // [n_heads]
  float scale = 0;                    // softmax scale (head_dim^-0.5)
  bool bf16_probs = false;            // reference: probabilities rounded to BF16 before P·V
  float* out = nullptr;               // [n_heads, head_dim]
};
// Keys are walked in list order; the result of a query does not depend on other queries.
void sparse_attention(const SparseAttnParams& p);

}  // namespace flashseek::ops
