// Softmax pooling of the KV compressors (v4 §3.5.5, v41 §2 item 5): every channel d of an entry
// is Σ_s softmax_s(z_s[d]) · v_s[d] over the entry's slots.
#pragma once
#include <cstdint>

namespace flashseek::ops {

struct SoftmaxPoolParams {
  const float* const* v = nullptr;  // [n_slots] pointers to [dim] values; nullptr = empty slot
  const float* const* z = nullptr;  // [n_slots] pointers to [dim] gates (ape already added)
  int64_t n_slots = 0, dim = 0;
  float* out = nullptr;             // [dim]
};
// FP32, per channel; empty slots have weight 0 (gate −∞ in the reference).
void softmax_pool(const SoftmaxPoolParams& p);

}  // namespace flashseek::ops
