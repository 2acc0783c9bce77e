#include "ops/indexer.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/numeric.h"
#include "ops/linear.h"

namespace flashseek::ops {

void index_scores(const IndexScoreParams& p) {
  for (int64_t t = 0; t < p.n_keys; ++t) {
    const float* k = p.keys + t * p.head_dim;
    float s = 0;
    for (int64_t h = 0; h < p.n_heads; ++h) {
      float d = dot_f32(p.q + h * p.head_dim, k, p.head_dim);
      if (p.bf16) d = round_bf16(d);
      float v = std::max(d, 0.0f) * p.w[h];
      if (p.bf16) v = round_bf16(v);
      s += v;
    }
    p.scores[t] = p.bf16 ? round_bf16(s) : s;
  }
}

namespace {
// Orders indices by score descending, lower index first at ties.
struct ByScore {
  const float* s;
  bool operator()(int32_t a, int32_t b) const { return s[a] > s[b] || (s[a] == s[b] && a < b); }
};
}  // namespace

std::vector<int32_t> topk_indices(const float* scores, int64_t n, int64_t k) {
  std::vector<int32_t> idx;
  idx.reserve(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(scores[i])) idx.push_back(int32_t(i));
  }
  const size_t keep = size_t(std::min<int64_t>(k, int64_t(idx.size())));
  std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(), ByScore{scores});
  idx.resize(keep);
  std::sort(idx.begin(), idx.end());
  return idx;
}

void candidate_mask(const float* scores, int64_t n, int64_t clen, int64_t block,
                    int64_t top_blocks, uint8_t* mask) {
  assert(block > 0);
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t nb = (n + block - 1) / block;
  std::vector<float> b(static_cast<size_t>(nb), ninf);
  for (int64_t t = 0; t < n; ++t) b[t / block] = std::max(b[t / block], scores[t]);
  if (clen > 0 && (clen - 1) / block < nb) b[(clen - 1) / block] = std::numeric_limits<float>::infinity();
  std::vector<int32_t> order(static_cast<size_t>(nb));
  std::iota(order.begin(), order.end(), 0);
  const size_t keep = size_t(std::min(top_blocks, nb));
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), ByScore{b.data()});
  std::vector<uint8_t> kept(static_cast<size_t>(nb), 0);
  for (size_t i = 0; i < keep; ++i) {
    if (b[order[i]] > ninf) kept[order[i]] = 1;
  }
  for (int64_t t = 0; t < n; ++t) mask[t] = kept[t / block];
}

}  // namespace flashseek::ops
