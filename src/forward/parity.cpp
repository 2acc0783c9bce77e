#include "forward/parity.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace flashseek::forward {

namespace {
// Nearest-rank quantile of sorted `v` (q in (0, 1]): the ceil(q·n)-th smallest.
double nearest_rank(const std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  const auto rank = int64_t(std::ceil(q * double(v.size())));
  return v[size_t(std::clamp<int64_t>(rank, 1, int64_t(v.size())) - 1)];
}
}  // namespace

std::string ParityStats::to_string() const {
  return fmt::format("positions {} max|dlogit| median {:.3g} p99 {:.3g} max {:.3g}; argmax {}/{} = {:.4f} "
                     "({} ties excluded){}",
                     positions, median, p99, max, agree, compared, argmax_agreement(), ties,
                     finite ? "" : "; NON-FINITE logits");
}

Result<ParityStats> parity_stats(std::span<const float> ref, std::span<const float> other, int64_t vocab,
                                 double tie_eps) {
  if (vocab <= 0) return invalid_argument("parity_stats: vocab {} must be positive", vocab);
  if (ref.size() != other.size())
    return invalid_argument("parity_stats: {} reference logits vs {} compared", ref.size(), other.size());
  if (ref.size() % size_t(vocab) != 0)
    return invalid_argument("parity_stats: {} logits are not whole rows of {}", ref.size(), vocab);
  ParityStats s;
  s.positions = int64_t(ref.size()) / vocab;
  std::vector<double> per_pos(size_t(s.positions));
  for (int64_t p = 0; p < s.positions; ++p) {
    const float* a = ref.data() + p * vocab;
    const float* b = other.data() + p * vocab;
    double m = 0;
    int64_t top = 0, second = -1, top_b = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      if (!std::isfinite(a[v]) || !std::isfinite(b[v])) s.finite = false;
      m = std::max(m, std::fabs(double(a[v]) - double(b[v])));
      if (v > 0 && a[v] > a[top]) {
        second = top;
        top = v;
      } else if (v > 0 && (second < 0 || a[v] > a[second])) {
        second = v;
      }
      if (b[v] > b[top_b]) top_b = v;
    }
    per_pos[size_t(p)] = m;
    if (second >= 0 && double(a[top]) - double(a[second]) <= tie_eps) {
      ++s.ties;
      continue;
    }
    ++s.compared;
    if (top == top_b)
      ++s.agree;
    else
      s.flips.push_back({p, double(a[top]) - double(a[second]), m});
  }
  std::sort(per_pos.begin(), per_pos.end());
  s.median = nearest_rank(per_pos, 0.5);
  s.p99 = nearest_rank(per_pos, 0.99);
  s.max = per_pos.empty() ? 0 : per_pos.back();
  return s;
}

std::vector<double> top2_gaps(std::span<const float> logits, int64_t vocab) {
  std::vector<double> g;
  if (vocab <= 0) return g;
  for (size_t off = 0; off + size_t(vocab) <= logits.size(); off += size_t(vocab)) {
    double t1 = -INFINITY, t2 = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      const double x = logits[off + size_t(v)];
      if (x > t1) {
        t2 = t1;
        t1 = x;
      } else if (x > t2) {
        t2 = x;
      }
    }
    g.push_back(vocab > 1 ? t1 - t2 : 0.0);
  }
  return g;
}

Result<std::vector<float>> teacher_forced_logits(Model& m, std::span<const int32_t> tokens, int64_t chunk) {
  if (chunk <= 0) return invalid_argument("teacher_forced_logits: chunk {} must be positive", chunk);
  if (tokens.empty()) return invalid_argument("teacher_forced_logits: no tokens");
  auto st = m.new_sequence();
  std::vector<float> out;
  for (size_t i = 0; i < tokens.size(); i += size_t(chunk)) {
    const size_t n = std::min(tokens.size() - i, size_t(chunk));
    BatchItem item{st.get(), tokens.subspan(i, n), true};
    FS_RETURN_IF_ERROR(m.forward({&item, 1}, out));
  }
  return out;
}

}  // namespace flashseek::forward
