// CPU twin of the grouped expert GEMV (ops/moe_quant.h), built on block_linear_ref so both
// formats share one dequantisation path.
#include "ops/moe_quant.h"

#include <algorithm>
#include <vector>

#include "core/numeric.h"
#include "ops/linear_quant.h"
#include "ops/moe.h"

namespace flashseek::ops {

namespace {
Status check_indices(const ExpertGemvParams& p, int64_t x_rows) {
  if (p.group_start[0] != 0 || p.group_start[p.n_groups] != p.n_pairs)
    return invalid_argument("expert_gemv: group_start must run from 0 to n_pairs={}", p.n_pairs);
  for (int64_t g = 0; g < p.n_groups; ++g) {
    if (p.group_start[g + 1] < p.group_start[g])
      return invalid_argument("expert_gemv: group_start[{}] decreases", g + 1);
    if (p.group_expert[g] < -1 || p.group_expert[g] >= p.n_experts)
      return out_of_range("expert_gemv: group_expert[{}]={} outside [-1, {})", g, p.group_expert[g],
                          p.n_experts);
  }
  for (int64_t i = 0; i < p.n_pairs; ++i) {
    const int64_t row = p.pair_row ? p.pair_row[i] : i;
    if (row < 0 || row >= x_rows)
      return out_of_range("expert_gemv: pair_row[{}]={} outside [0, {})", i, row, x_rows);
  }
  return {};
}
}  // namespace

Status expert_gemv_ref(const ExpertGemvParams& p, int64_t x_rows) {
  FS_RETURN_IF_ERROR(validate(p));
  FS_RETURN_IF_ERROR(check_indices(p, x_rows));
  std::vector<float> g(static_cast<size_t>(p.n)), u(static_cast<size_t>(p.n));
  // w_packed: each group's matrices back in row-major form (one expert at a time).
  std::vector<uint8_t> rw, rs, ru, rus;
  for (int64_t grp = 0; grp < p.n_groups; ++grp) {
    const int64_t e = p.group_expert[grp];
    if (e < 0) {  // another rank's expert (expert parallel): the group's outputs are 0
      std::fill(p.y + p.group_start[grp] * p.n, p.y + p.group_start[grp + 1] * p.n, 0.0f);
      continue;
    }
    const uint8_t *w = p.w + e * p.expert_stride, *ws = p.w_scale + e * p.expert_scale_stride;
    const uint8_t *wu = p.w_up ? p.w_up + e * p.expert_stride : nullptr;
    const uint8_t *wus = p.w_up ? p.w_up_scale + e * p.expert_scale_stride : nullptr;
    if (p.w_packed && p.group_start[grp] < p.group_start[grp + 1]) {
      FS_RETURN_IF_ERROR(unpack_weight_fragments(p.format, p.n, p.k, rw, rs, w, ws));
      if (wu) FS_RETURN_IF_ERROR(unpack_weight_fragments(p.format, p.n, p.k, ru, rus, wu, wus));
    }
    for (int64_t i = p.group_start[grp]; i < p.group_start[grp + 1]; ++i) {
      const int64_t row = p.pair_row ? p.pair_row[i] : i;
      BlockLinearParams lp;
      lp.x = p.x + row * p.k;
      lp.m = 1, lp.n = p.n, lp.k = p.k;
      lp.format = p.format, lp.w_block = p.w_block, lp.act_block = p.act_block;
      lp.w = w, lp.w_scale = ws;
      lp.y = p.w_up ? g.data() : p.y + i * p.n;
      lp.bf16_round_out = p.w_up ? p.bf16_round_gate_up : p.bf16_round_out;
      FS_RETURN_IF_ERROR(block_linear_ref(lp));
      if (!p.w_up) continue;
      lp.w = wu, lp.w_scale = wus;
      lp.y = u.data();
      FS_RETURN_IF_ERROR(block_linear_ref(lp));
      swiglu(g.data(), u.data(), p.y + i * p.n, p.n, p.swiglu_limit,
             p.pair_weight ? p.pair_weight[i] : 1.0f);
      if (p.bf16_round_out)
        for (int64_t j = 0; j < p.n; ++j) p.y[i * p.n + j] = round_bf16(p.y[i * p.n + j]);
    }
  }
  return {};
}

}  // namespace flashseek::ops
