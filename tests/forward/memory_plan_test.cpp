// The start-up memory plan (forward/memory_plan.h) and --engram-tables: with the tables on the
// device every GPU's weights grow by exactly the stored bytes of the Engram tables and nothing
// stays resident on the host for them; the CPU backend's plan does not depend on the option.
#include <gtest/gtest.h>

#include "forward/memory_plan.h"
#include "forward/state_io.h"
#include "model/make_tiny.h"
#include "model/weights.h"

namespace flashseek::forward {
namespace {

TEST(MemoryPlanEngram, DeviceTablesCountAgainstEveryGpu) {
  auto cfg = model::builtin_config("tiny-v41");
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  ASSERT_FALSE(cfg->engram_layer_ids.empty());
  uint64_t tables = 0;  // FP8 codes + E8M0 scales of every table, as stored
  for (const model::WeightSpec& w : model::expected_weights(*cfg))
    if (w.kind == model::WeightKind::kEngramTable)
      for (const auto& t : model::release_tensors(w, *cfg)) tables += uint64_t(shape_numel(t.shape)) * dtype_size(t.dtype);
  ASSERT_GT(tables, 0u);
  const SnapshotGeometry g = snapshot_geometry(*cfg, false, true, 256);
  for (int tp : {1, 2}) {
    MemoryPlanOptions host;
    host.max_context = 256;
    host.gpu = true;
    host.tensor_parallel = tp;
    host.native_weights = tp == 1;
    MemoryPlanOptions dev = host;
    dev.engram_on_device = true;
    const MemoryPlan a = plan_memory(*cfg, g, true, host, uint64_t(1) << 40);
    const MemoryPlan b = plan_memory(*cfg, g, true, dev, uint64_t(1) << 40);
    EXPECT_EQ(b.weights, a.weights + tables) << "tp " << tp;
    EXPECT_EQ(a.host_weights, tables) << "tp " << tp;
    EXPECT_EQ(b.host_weights, 0u) << "tp " << tp;
    EXPECT_EQ(b.total, a.total + tables) << "tp " << tp;
  }
  MemoryPlanOptions cpu;
  cpu.max_context = 256;
  MemoryPlanOptions cpu_dev = cpu;
  cpu_dev.engram_on_device = true;  // host memory either way
  EXPECT_EQ(plan_memory(*cfg, g, true, cpu, 1ull << 40).total, plan_memory(*cfg, g, true, cpu_dev, 1ull << 40).total);
}

}  // namespace
}  // namespace flashseek::forward
