// The prefill arithmetic count (model/flops.h) against perf-budget.md §4.1: every layer role's
// MFLOP per token of an 8,192-token chunk at context 0, 128k and 1M, and the 40 layers' total.
#include <gtest/gtest.h>

#include "model/flops.h"
#include "model_test_util.h"
#include "test_util.h"

namespace flashseek::model {
namespace {

ModelConfig real_v41() {
  const char* rel = "tests/model/data/v41-flash-config.json";
  auto c = parse_config(testutil::read_file(testutil::source_path(rel)), rel);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return c.ok() ? c.value() : ModelConfig{};
}

// MFLOP per token of layer l over positions [start, start + 8192).
double layer_mflop(const ModelConfig& c, int l, int64_t start) {
  constexpr int64_t kChunk = 8192;
  const double f = prefill_flops(c, start, kChunk, l + 1).total() - prefill_flops(c, start, kChunk, l).total();
  return f / double(kChunk) / 1e6;
}

TEST(PrefillFlops, RealV41RolesMatchPerfBudget) {
  const ModelConfig c = real_v41();
  ASSERT_EQ(c.num_layers, 40);
  // The spec prints one decimal; its index-scoring and attention averages are rounded the same way.
  constexpr double kTol = 0.15;
  struct Row {
    const char* role;
    int layer;
    double at0, at128k, at1m;
  };
  const Row rows[] = {
      {"window-only", 0, 771.2, 771.4, 771.4},
      {"FULL ratio-2 source", 2, 872.3, 1413.5, 5171.6},
      {"ratio-2 reuse", 3, 834.1, 838.5, 838.5},
      {"ratio-1 FULL + candidate", 20, 886.0, 1962.0, 9478.1},
      {"ratio-1 reuse", 21, 836.2, 838.5, 838.5},
      {"REINDEX", 24, 880.6, 983.5, 983.5},
  };
  for (const Row& r : rows) {
    EXPECT_NEAR(layer_mflop(c, r.layer, 0), r.at0, kTol) << r.role << " at C = 0";
    EXPECT_NEAR(layer_mflop(c, r.layer, 131072), r.at128k, kTol) << r.role << " at C = 128k";
    EXPECT_NEAR(layer_mflop(c, r.layer, 1048576), r.at1m, kTol) << r.role << " at C = 1M";
  }
  // Engram on layer 1 (window-only otherwise): the spec's 314.8 added.
  EXPECT_NEAR(layer_mflop(c, 1, 0) - layer_mflop(c, 0, 0), 314.8, kTol);
  // The dense part of every layer (a window-only layer without its attention keys): 754.6.
  EXPECT_NEAR(layer_linear_flops_per_token(c)[0] / 1e6, 754.6, 0.05);
  // All 40 layers, GFLOP per token.
  for (const auto& [start, g] : {std::pair<int64_t, double>{0, 34.25}, {131072, 37.46}, {1048576, 56.25}})
    EXPECT_NEAR(prefill_flops(c, start, 8192).total() / 8192 / 1e9, g, 0.005) << "C = " << start;
}

TEST(PrefillFlops, EdgeCases) {
  const ModelConfig c = real_v41();
  EXPECT_EQ(prefill_flops(c, 0, 0).total(), 0.0);
  EXPECT_EQ(prefill_flops(c, 5, 10, 0).total(), 0.0);
  // Additive over chunks: [0, 300) == [0, 100) + [100, 300).
  const PrefillFlops a = prefill_flops(c, 0, 100), b = prefill_flops(c, 100, 200), ab = prefill_flops(c, 0, 300);
  EXPECT_NEAR(a.total() + b.total(), ab.total(), ab.total() * 1e-12);
  // A position's attention grows with the window until it is full, then only with compressed rows.
  EXPECT_GT(prefill_flops(c, 127, 1, 1).attention, prefill_flops(c, 0, 1, 1).attention);
  EXPECT_EQ(prefill_flops(c, 200, 1, 1).attention, prefill_flops(c, 127, 1, 1).attention);
}

}  // namespace
}  // namespace flashseek::model
