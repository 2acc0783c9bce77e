#include "ops/moe.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <numeric>
#include <vector>

namespace flashseek::ops {

namespace {
// torch softplus (β = 1, threshold 20: returns x above it).
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
}  // namespace

void route(const RouteParams& p) {
  assert(p.logits && p.sel && p.weight && p.k > 0 && p.k <= p.n_experts);
  const int64_t E = p.n_experts;
  std::vector<float> score(static_cast<size_t>(E));
  if (p.sqrtsoftplus) {
    for (int64_t e = 0; e < E; ++e) score[e] = std::sqrt(softplus(p.logits[e] / p.gate_temp));
  } else {
    float m = p.logits[0] / p.gate_temp;
    for (int64_t e = 1; e < E; ++e) m = std::max(m, p.logits[e] / p.gate_temp);
    float s = 0;
    for (int64_t e = 0; e < E; ++e) s += (score[e] = std::exp(p.logits[e] / p.gate_temp - m));
    for (int64_t e = 0; e < E; ++e) score[e] /= s;
  }
  std::vector<int32_t> sel(static_cast<size_t>(p.k));
  if (p.hash_ids) {
    std::copy(p.hash_ids, p.hash_ids + p.k, sel.begin());
  } else {
    std::vector<float> key(score);
    if (p.bias) {
      for (int64_t e = 0; e < E; ++e) key[e] += p.bias[e];
    }
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + p.k, order.end(), [&](int32_t a, int32_t b) {
      return key[a] > key[b] || (key[a] == key[b] && a < b);
    });
    std::copy(order.begin(), order.begin() + p.k, sel.begin());
  }
  // Ascending expert id: the reference accumulates routed outputs in that order.
  std::sort(sel.begin(), sel.end());
  float sum = 0;
  for (int64_t i = 0; i < p.k; ++i) sum += score[sel[i]];
  for (int64_t i = 0; i < p.k; ++i) {
    float w = score[sel[i]];
    if (p.norm_topk) {
      if (!p.renorm_eps) w /= sum;
      else if (p.k > 1) w /= (sum + 1e-20f);
    }
    p.sel[i] = sel[i];
    p.weight[i] = w * p.route_scale;
    // A repeated hash id counts in the denominator but contributes once: the reference's scatter
    // keeps one copy (v4 §3.6 step 7).
    if (i > 0 && sel[i] == sel[i - 1]) p.weight[i] = 0.0f;
  }
}

void swiglu(const float* gate, const float* up, float* h, int64_t n, float limit, float weight) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i], u = up[i];
    if (limit > 0) {
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
    }
    h[i] = (g / (1.0f + std::exp(-g))) * u * weight;
  }
}

bool group_pairs_by_expert(const int32_t* sel, const float* weight, int64_t n_pairs, int64_t n_experts, int64_t k,
                           int32_t* group_start, int32_t* pair_row, float* sorted_weight, int32_t* slot_pos) {
  for (int64_t e = 0; e <= n_experts; ++e) group_start[e] = 0;
  for (int64_t p = 0; p < n_pairs; ++p) {
    if (sel[p] < 0 || sel[p] >= n_experts) return false;
    ++group_start[sel[p] + 1];
  }
  for (int64_t e = 0; e < n_experts; ++e) group_start[e + 1] += group_start[e];
  std::vector<int32_t> next(group_start, group_start + n_experts);
  for (int64_t p = 0; p < n_pairs; ++p) {
    const int32_t s = next[size_t(sel[p])]++;
    pair_row[s] = int32_t(p / k);
    sorted_weight[s] = weight[p];
    slot_pos[p] = s;
  }
  return true;
}

int64_t compact_expert_groups(const int32_t* group_start, int64_t n_experts, int64_t n_slots, int32_t* out_start,
                              int32_t* out_expert) {
  int64_t g = 0;
  for (int64_t e = 0; e < n_experts; ++e) {
    if (group_start[e + 1] == group_start[e]) continue;
    if (g == n_slots) return -1;
    out_start[g] = group_start[e];
    out_expert[g] = int32_t(e);
    ++g;
  }
  const int64_t touched = g;
  for (; g < n_slots; ++g) out_start[g] = group_start[n_experts], out_expert[g] = -1;
  out_start[n_slots] = group_start[n_experts];
  return touched;
}

}  // namespace flashseek::ops
