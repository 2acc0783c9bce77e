// Sparse MQA decode attention over a pool of BF16 latent rows (K = V) selected by an index list
// per query (window rows + selected compressed rows, −1 = padding), with per-head sinks
// (v4 §3.5.7). Params shared by the CUDA launcher (ops/cuda/sparse_attn.h, split-KV) and the CPU
// twin below, which decodes the rows and runs ops::sparse_attention.
#pragma once
#include <cstdint>

#include "core/status.h"

namespace flashseek::ops {

struct SparseAttnPoolParams {
  const float* q = nullptr;       // [m, n_heads, head_dim] queries, RoPE applied
  const uint16_t* kv = nullptr;   // [n_rows, head_dim] BF16 rows
  const int32_t* idx = nullptr;   // [m, n_idx] row of each key; < 0 or >= n_rows = padding
  const float* sink = nullptr;    // [n_heads] sink logits
  float* out = nullptr;           // [m, n_heads, head_dim]
  int64_t m = 0, n_idx = 0, n_rows = 0, n_heads = 0, head_dim = 0;
  float scale = 0;                // softmax scale, head_dim^-0.5
  int64_t n_splits = 1;           // GPU: key-list chunks reduced by a combine pass
  float* workspace = nullptr;     // GPU: sparse_attn_workspace_floats(...) floats
};

Status validate(const SparseAttnPoolParams& p);
int64_t sparse_attn_workspace_floats(int64_t m, int64_t n_splits, int64_t n_heads,
                                     int64_t head_dim);

// CPU twin: a query without any valid key gets a zero output, as ops::sparse_attention does.
Status sparse_attention_pool_ref(const SparseAttnPoolParams& p);

}  // namespace flashseek::ops
