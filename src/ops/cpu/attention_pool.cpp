// CPU twin of the pooled sparse attention (ops/attention_pool.h): decodes the BF16 rows a query
// selects and runs the reference ops::sparse_attention on them.
#include "ops/attention_pool.h"

#include <vector>

#include "core/numeric.h"
#include "ops/attention.h"
#include "ops/quant.h"

namespace flashseek::ops {

Status sparse_attention_pool_ref(const SparseAttnPoolParams& p) {
  FS_RETURN_IF_ERROR(validate(p));
  const int64_t d = p.head_dim;
  std::vector<float> rows(static_cast<size_t>(p.n_idx * d));
  std::vector<const float*> keys(static_cast<size_t>(p.n_idx));
  std::vector<float> qb;
  for (int64_t t = 0; t < p.m; ++t) {
    for (int64_t s = 0; s < p.n_idx; ++s) {
      const int64_t r = p.idx[t * p.n_idx + s];
      keys[s] = nullptr;
      if (r < 0 || r >= p.n_rows) continue;
      for (int64_t i = 0; i < d; ++i) rows[s * d + i] = bf16_to_f32(p.kv[r * d + i]);
      keys[s] = rows.data() + s * d;
    }
    // BF16 query and BF16 probabilities for P·V (the reference's activations; the GPU kernels'
    // MMA operands); the softmax denominator stays FP32.
    qb.assign(p.q + t * p.n_heads * d, p.q + (t + 1) * p.n_heads * d);
    round_bf16_inplace(qb.data(), int64_t(qb.size()));
    SparseAttnParams ap;
    ap.q = qb.data();
    ap.keys = keys.data();
    ap.n_keys = p.n_idx, ap.n_heads = p.n_heads, ap.head_dim = d;
    ap.sink = p.sink, ap.scale = p.scale, ap.bf16_probs = true;
    ap.out = p.out + t * p.n_heads * d;
    sparse_attention(ap);
  }
  return {};
}

}  // namespace flashseek::ops
