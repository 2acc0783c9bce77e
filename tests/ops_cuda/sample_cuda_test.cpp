// The CUDA sampling op against its CPU twin (ops::sample_rows_ref) on random rows: odd vocab sizes
// (1, 2, 7, 1000, 129280), ties, -inf / NaN entries, rows without a finite logit, tiny and huge
// temperatures and every filter. Greedy rows must match exactly; sampled rows must match except
// where u (or top_p, or a min-p threshold) lies within kMargin of a boundary of the twin's
// distribution, where the two summation orders may legitimately disagree; those rows are counted
// and their fraction is asserted to be tiny.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/rng.h"
#include "gpu_util.h"
#include "ops/cuda/sampling/sample.h"
#include "ops/sample.h"

namespace flashseek::ops::cuda {
namespace {

using testing::DeviceBuffer;

constexpr double kMargin = 1e-9;

std::vector<float> random_row(Rng& rng, size_t V, int kind) {
  std::vector<float> row(V);
  const double scale = kind == 0 ? 3.0 : kind == 1 ? 0.01 : 1.0;  // peaked, flat, medium
  for (auto& x : row) {
    x = float(rng.normal() * scale);
    if (kind == 2) x = std::round(x * 4) / 4;  // quantised: many ties
  }
  if (V > 4) row[rng.below(V)] = row[rng.below(V)];
  if (rng.uniform() < 0.3)
    for (size_t i = 0; i < V / 8 + 1; ++i) row[rng.below(V)] = -INFINITY;
  if (rng.uniform() < 0.1) row[rng.below(V)] = NAN;
  return row;
}

SampleSpec random_spec(Rng& rng, size_t V, int variant) {
  SampleSpec s;
  s.u = rng.uniform();
  switch (variant % 9) {
    case 0: s.temperature = 0; break;                          // greedy
    case 1: s.top_k = 1; s.temperature = 5; break;             // greedy through top_k
    case 2: s.temperature = 0.1 + 2 * rng.uniform(); break;    // temperature only
    case 3: s.top_k = 1 + int64_t(rng.below(std::min<size_t>(V + 2, 100))); break;
    case 4: s.top_p = 0.05 + 0.95 * rng.uniform(); break;
    case 5: s.min_p = rng.uniform() * 0.6; break;
    case 6: s.temperature = 1e-3; s.top_p = 0.9; break;        // tiny temperature
    case 7: s.temperature = 1e4; s.top_k = int64_t(rng.below(V + 3)); s.min_p = 0.5; break;
    default:
      s.temperature = 0.3 + rng.uniform();
      s.top_k = int64_t(rng.below(V + 3));
      s.top_p = 0.2 + 0.8 * rng.uniform();
      s.min_p = rng.uniform() * 0.3;
  }
  if (variant % 13 == 5) s.u = 0.0;
  if (variant % 13 == 6) s.u = 1.0 - 1.0 / 9007199254740992.0;  // the largest u below 1
  return s;
}

// Whether the twin's choice for this row is within rounding of a decision boundary.
bool near_boundary(std::span<const float> row, const SampleSpec& s) {
  auto d = sample_distribution(row, s);
  if (!d.ok() || s.greedy()) return false;
  double cum = 0;
  for (double p : d->probs) {
    cum += p;
    if (std::fabs(s.u - cum) < kMargin) return true;
  }
  if (s.top_p < 1.0) {  // the nucleus cut: cumulative mass in descending order vs top_p
    SampleSpec k = s;
    k.top_p = 1.0, k.min_p = 0.0;
    auto dk = sample_distribution(row, k);
    std::vector<std::pair<int32_t, double>> c;
    for (size_t i = 0; i < dk->ids.size(); ++i) c.push_back({dk->ids[i], dk->probs[i]});
    std::sort(c.begin(), c.end(), [&](auto& a, auto& b) {
      const float la = row[size_t(a.first)], lb = row[size_t(b.first)];
      return la != lb ? la > lb : a.first < b.first;
    });
    double acc = 0;
    for (auto& [id, p] : c) {
      acc += p;
      if (std::fabs(acc - s.top_p) < kMargin) return true;
    }
  }
  if (s.min_p > 0.0) {  // the min-p threshold
    SampleSpec m = s;
    m.min_p = 0.0;
    auto dm = sample_distribution(row, m);
    const double mx = *std::max_element(dm->probs.begin(), dm->probs.end());
    for (double p : dm->probs)
      if (std::fabs(p - s.min_p * mx) < kMargin * mx) return true;
  }
  return false;
}

struct Outcome {
  int greedy = 0, sampled = 0, excluded = 0, none = 0;
};

// Samples R rows of vocab V on the GPU and with the twin; compares as described above.
void compare(int64_t V, int64_t R, uint64_t seed, Outcome& o) {
  Rng rng(seed);
  std::vector<float> logits;
  std::vector<SampleSpec> specs;
  for (int64_t r = 0; r < R; ++r) {
    std::vector<float> row = random_row(rng, size_t(V), int(r % 3));
    if (r % 17 == 16) std::fill(row.begin(), row.end(), -INFINITY);  // no candidate at all
    logits.insert(logits.end(), row.begin(), row.end());
    specs.push_back(random_spec(rng, size_t(V), int(r)));
  }
  std::vector<int32_t> want(static_cast<size_t>(R));
  SampleRowsParams p;
  p.logits = logits.data(), p.rows = R, p.vocab = V, p.specs = specs.data(), p.out = want.data();
  ASSERT_TRUE(sample_rows_ref(p).ok());

  auto ws_bytes = sample_rows_workspace_bytes(V);
  ASSERT_TRUE(ws_bytes.ok()) << ws_bytes.status().to_string();
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_out(static_cast<size_t>(R));
  DeviceBuffer<char> ws(*ws_bytes);
  ASSERT_TRUE(d_logits.ok() && d_out.ok() && ws.ok());
  SampleRowsParams g = p;
  g.logits = d_logits.get(), g.out = d_out.get(), g.workspace = ws.get(), g.workspace_bytes = *ws_bytes;
  FS_ASSERT_OK(sample_rows_cuda(g, 0));
  FS_ASSERT_OK(cuda_status(cudaDeviceSynchronize(), "sync"));
  const std::vector<int32_t> got = d_out.to_host();
  for (int64_t r = 0; r < R; ++r) {
    const auto row = std::span<const float>(logits).subspan(size_t(r * V), size_t(V));
    const SampleSpec& s = specs[size_t(r)];
    if (want[size_t(r)] < 0) {
      ++o.none;
      EXPECT_EQ(got[size_t(r)], -1) << "V " << V << " row " << r;
      continue;
    }
    if (s.greedy()) {
      ++o.greedy;
      EXPECT_EQ(got[size_t(r)], want[size_t(r)]) << "greedy, V " << V << " row " << r;
      continue;
    }
    ++o.sampled;
    if (got[size_t(r)] == want[size_t(r)]) continue;
    if (near_boundary(row, s)) {
      ++o.excluded;
      continue;
    }
    ADD_FAILURE() << "V " << V << " row " << r << ": gpu " << got[size_t(r)] << " twin "
                  << want[size_t(r)] << " (T " << s.temperature << " k " << s.top_k << " p " << s.top_p
                  << " min_p " << s.min_p << " u " << s.u << ")";
  }
}

TEST(CudaSample, MatchesTheTwinOnRandomRows) {
  FS_REQUIRE_GPU();
  Outcome o;
  const int64_t vocabs[] = {1, 2, 7, 1000, 4099, 129280};
  const int64_t rows[] = {40, 60, 120, 300, 120, 90};
  for (size_t i = 0; i < std::size(vocabs); ++i) compare(vocabs[i], rows[i], 100 + i, o);
  std::printf("[ sample ] greedy %d, sampled %d (excluded near a boundary: %d), no candidate %d\n",
              o.greedy, o.sampled, o.excluded, o.none);
  EXPECT_GT(o.greedy, 50);
  EXPECT_GT(o.sampled, 400);
  EXPECT_LE(o.excluded * 100, o.sampled) << "more than 1% of the sampled rows near a boundary";
}

// Four equal logits: every candidate holds exactly 1/4 on both sides, so u = j/4 (a boundary)
// must give token j on the device as on the CPU.
TEST(CudaSample, DyadicBoundariesAgree) {
  FS_REQUIRE_GPU();
  const std::vector<float> flat(4, 1.5f);
  std::vector<SampleSpec> specs;
  for (int j = 0; j < 4; ++j) {
    SampleSpec s;
    s.u = j / 4.0;
    specs.push_back(s);
    s.top_p = 0.999;
    specs.push_back(s);
  }
  std::vector<float> logits;
  for (size_t i = 0; i < specs.size(); ++i) logits.insert(logits.end(), flat.begin(), flat.end());
  auto ws_bytes = sample_rows_workspace_bytes(4);
  ASSERT_TRUE(ws_bytes.ok());
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_out(specs.size());
  DeviceBuffer<char> ws(*ws_bytes);
  SampleRowsParams g;
  g.logits = d_logits.get(), g.rows = int64_t(specs.size()), g.vocab = 4, g.specs = specs.data();
  g.out = d_out.get(), g.workspace = ws.get(), g.workspace_bytes = *ws_bytes;
  FS_ASSERT_OK(sample_rows_cuda(g, 0));
  const std::vector<int32_t> got = d_out.to_host();
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(got[i], int32_t(i / 2)) << "row " << i;
}

TEST(CudaSample, RejectsBadWorkspaceAndSpecs) {
  FS_REQUIRE_GPU();
  std::vector<float> logits(8, 0.0f);
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<int32_t> d_out(1);
  SampleSpec s;
  SampleRowsParams g;
  g.logits = d_logits.get(), g.rows = 1, g.vocab = 8, g.specs = &s, g.out = d_out.get();
  Status st = sample_rows_cuda(g, 0);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.message();
  auto ws_bytes = sample_rows_workspace_bytes(8);
  ASSERT_TRUE(ws_bytes.ok());
  DeviceBuffer<char> ws(*ws_bytes);
  g.workspace = ws.get(), g.workspace_bytes = *ws_bytes - 1;
  EXPECT_FALSE(sample_rows_cuda(g, 0).ok());
  g.workspace_bytes = *ws_bytes;
  FS_ASSERT_OK(sample_rows_cuda(g, 0));
  s.top_p = 1.5;
  st = sample_rows_cuda(g, 0);
  EXPECT_NE(st.message().find("top_p"), std::string::npos) << st.message();
  EXPECT_FALSE(sample_rows_workspace_bytes(0).ok());
}

}  // namespace
}  // namespace flashseek::ops::cuda
