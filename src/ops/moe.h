// MoE router and clamped SwiGLU (v4 §3.6, v41 §2 item 7).
#pragma once
#include <cstdint>

namespace flashseek::ops {

struct RouteParams {
  const float* logits = nullptr;     // [n_experts] router logits x · W_gateᵀ (FP32)
  const float* bias = nullptr;       // [n_experts] selection-only bias, nullable
  const int32_t* hash_ids = nullptr; // [k] V4 hash routing (tid2eid row), nullable
  int64_t n_experts = 0, k = 0;
  float gate_temp = 1.0f;            // logits are divided by it (V4.1)
  bool sqrtsoftplus = true;          // else softmax scores
  bool norm_topk = true;             // renormalise the chosen scores
  bool renorm_eps = false;           // V4.1: divide by (sum + 1e-20) and only when k > 1
  float route_scale = 1.0f;
  int32_t* sel = nullptr;            // [k] chosen experts, ascending expert id
  float* weight = nullptr;           // [k] routing weights, same order as sel
};
// Selection ties: lower expert id first. A repeated V4 hash id gets weight 0 after its first copy.
void route(const RouteParams& p);

// h[i] = silu(min(gate[i], limit)) · clamp(up[i], ±limit) · weight (limit <= 0: no clamp).
void swiglu(const float* gate, const float* up, float* h, int64_t n, float limit, float weight);

// Routed (token, slot) pairs grouped by expert so that each expert's matrices are read once per
// step for all its tokens (a stable counting sort; pairs of one expert keep their slot order).
// sel/weight: [n_pairs] in slot order (pair p = token p / k, slot p % k). Outputs: group_start
// [n_experts + 1] (pairs of expert e at sorted positions [group_start[e], group_start[e + 1])),
// pair_row [n_pairs] (token row of the sorted pair), sorted_weight [n_pairs], and slot_pos
// [n_pairs] (sorted position of pair p). An expert id outside [0, n_experts) is an error (false).
bool group_pairs_by_expert(const int32_t* sel, const float* weight, int64_t n_pairs, int64_t n_experts, int64_t k,
                           int32_t* group_start, int32_t* pair_row, float* sorted_weight, int32_t* slot_pos);

// group_pairs_by_expert's groups in compact form (a step with fewer pairs than experts, where
// most experts have no pair): one group per expert that has pairs, in ascending expert order
// (the same sorted positions), then empty groups of expert -1 at the end, n_slots groups in all
// (a launch's fixed group count; n_slots >= the experts with pairs, which n_pairs bounds).
// group_start: [n_experts + 1] as group_pairs_by_expert writes it. Outputs: out_start
// [n_slots + 1], out_expert [n_slots]. Returns the number of experts with pairs, or -1 when
// n_slots is too small (outputs then unspecified).
int64_t compact_expert_groups(const int32_t* group_start, int64_t n_experts, int64_t n_slots, int32_t* out_start,
                              int32_t* out_expert);

}  // namespace flashseek::ops
