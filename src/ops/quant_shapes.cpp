// Shape checks shared by the CPU twins and the CUDA launchers of the block-scaled ops.
#include <string>

#include "ops/attention_pool.h"
#include "ops/fp4_fragments.h"
#include "ops/linear_quant.h"
#include "ops/moe_quant.h"

namespace flashseek::ops {

namespace {
Status check_dims(const char* op, int64_t n, int64_t k, int64_t w_block, int64_t act_block,
                  WeightFormat f) {
  if (n <= 0 || k <= 0) return invalid_argument("{}: n and k must be positive (n={}, k={})", op, n, k);
  if (k % 32 != 0) return invalid_argument("{}: k={} is not a multiple of 32", op, k);
  if (act_block != 32 && act_block != 128)
    return invalid_argument("{}: act_block must be 32 or 128, got {}", op, act_block);
  if (k % act_block != 0)
    return invalid_argument("{}: k={} is not a multiple of act_block {}", op, k, act_block);
  if (f == WeightFormat::kFp8) {
    if (w_block != 32 && w_block != 128)
      return invalid_argument("{}: w_block must be 32 or 128, got {}", op, w_block);
    if (k % w_block != 0)
      return invalid_argument("{}: k={} is not a multiple of w_block {}", op, k, w_block);
  }
  return {};
}
}  // namespace

int64_t weight_code_bytes(WeightFormat f, int64_t n, int64_t k) {
  return f == WeightFormat::kFp8 ? n * k : n * (k / 2);
}

int64_t weight_scale_bytes(WeightFormat f, int64_t n, int64_t k, int64_t w_block) {
  if (f == WeightFormat::kFp4) return n * (k / 32);
  return ((n + w_block - 1) / w_block) * (k / w_block);
}

Status validate(const BlockLinearParams& p) {
  if (!p.x || !p.w || !p.w_scale || !p.y)
    return invalid_argument("block_linear: x, w, w_scale and y must be set");
  if (p.m <= 0) return invalid_argument("block_linear: m must be positive, got {}", p.m);
  if (bool(p.xq) != bool(p.xs)) return invalid_argument("block_linear: xq and xs must be set together");
  if (p.bf16_out && p.bf16_round_out)
    return invalid_argument("block_linear: bf16_out and bf16_round_out are exclusive");
  if (bool(p.w_up) != bool(p.w_up_scale))
    return invalid_argument("block_linear: w_up and w_up_scale must be set together");
  if (p.bf16_round_gate_up && !p.w_up) return invalid_argument("block_linear: bf16_round_gate_up needs w_up");
  if (bool(p.y2) != (p.n2 != 0) || p.n2 < 0 || p.n2 >= p.n)
    return invalid_argument("block_linear: y2 and n2 must be set together, 0 < n2 < n (n={}, n2={})", p.n, p.n2);
  if (p.tune_n < 0 || p.tune_n >= (int64_t(1) << 30))
    return invalid_argument("block_linear: tune_n={} outside [0, 2^30)", p.tune_n);
  if (p.w_packed && (p.y2 || !(p.format == WeightFormat::kFp4 ? fp4_fragment_shape_ok(p.n, p.k)
                                                                 : fp8_fragment_shape_ok(p.n, p.k))))
    return invalid_argument("block_linear: w_packed (the fragment order) needs n={} a multiple of 32 (and, FP4, k={} of "
                            "64), and no stacked output (y2)", p.n, p.k);
  return check_dims("block_linear", p.n, p.k, p.w_block, p.act_block, p.format);
}

Status validate(const ExpertGemvParams& p) {
  if (!p.x || !p.w || !p.w_scale || !p.y || !p.group_expert || !p.group_start)
    return invalid_argument("expert_gemv: x, w, w_scale, y, group_expert, group_start must be set");
  if (bool(p.w_up) != bool(p.w_up_scale))
    return invalid_argument("expert_gemv: w_up and w_up_scale must be set together");
  if (bool(p.xq) != bool(p.xs)) return invalid_argument("expert_gemv: xq and xs must be set together");
  if (p.bf16_round_gate_up && !p.w_up) return invalid_argument("expert_gemv: bf16_round_gate_up needs w_up");
  if (p.n_groups <= 0 || p.n_pairs <= 0 || p.n_experts <= 0)
    return invalid_argument("expert_gemv: n_groups={}, n_pairs={}, n_experts={} must be positive",
                            p.n_groups, p.n_pairs, p.n_experts);
  if (p.n_groups > 65535) return invalid_argument("expert_gemv: n_groups={} > 65535", p.n_groups);
  if (p.n_experts > 1 && (p.expert_stride <= 0 || p.expert_scale_stride <= 0))
    return invalid_argument("expert_gemv: expert_stride/expert_scale_stride must be set for {} experts",
                            p.n_experts);
  if (p.w_packed && !(p.format == WeightFormat::kFp4 ? fp4_fragment_shape_ok(p.n, p.k) : fp8_fragment_shape_ok(p.n, p.k)))
    return invalid_argument("expert_gemv: w_packed (the fragment order) needs n={} a multiple of 32 (and, FP4, k={} "
                            "of 64)", p.n, p.k);
  if (p.ring_stages < 0 || p.ring_stages > 8)
    return invalid_argument("expert_gemv: ring_stages={} outside 0..8", p.ring_stages);
  return check_dims("expert_gemv", p.n, p.k, p.w_block, p.act_block, p.format);
}

int64_t sparse_attn_workspace_floats(int64_t m, int64_t n_splits, int64_t n_heads,
                                     int64_t head_dim) {
  return m * n_splits * n_heads * (head_dim + 2);
}

Status validate(const SparseAttnPoolParams& p) {
  if (!p.q || !p.kv || !p.idx || !p.sink || !p.out)
    return invalid_argument("sparse_attention_pool: q, kv, idx, sink and out must be set");
  if (p.m <= 0 || p.n_idx <= 0 || p.n_rows <= 0)
    return invalid_argument("sparse_attention_pool: m={}, n_idx={}, n_rows={} must be positive",
                            p.m, p.n_idx, p.n_rows);
  if (p.n_heads <= 0 || p.n_heads > 64)
    return invalid_argument("sparse_attention_pool: n_heads={} must be in 1..64", p.n_heads);
  if (p.head_dim <= 0 || p.head_dim > 512 || p.head_dim % 2 != 0)
    return invalid_argument("sparse_attention_pool: head_dim={} must be even and <= 512", p.head_dim);
  if (p.n_splits <= 0 || p.n_splits > 1024)
    return invalid_argument("sparse_attention_pool: n_splits={} must be in 1..1024", p.n_splits);
  if (!(p.scale > 0)) return invalid_argument("sparse_attention_pool: scale must be > 0");
  return {};
}

}  // namespace flashseek::ops
