// sequence_state_bytes (forward/state_io.h): the FP32 figure is what the CPU backend actually
// holds after a prefill (rings, compressed KV, index keys exactly; compressor partials within
// the bound), and the compact figure reproduces perf-budget.md §2's row sizes at real width.
#include <numeric>

#include <gtest/gtest.h>

#include "forward/cpu_model.h"
#include "forward/state.h"
#include "forward/state_io.h"
#include "model/checkpoint.h"
#include "model/dummy.h"
#include "model/make_tiny.h"

namespace flashseek::forward {
namespace {

uint64_t floats(const std::vector<float>& v) { return 4 * uint64_t(v.size()); }

class StateBytesCpu : public ::testing::TestWithParam<const char*> {};

TEST_P(StateBytesCpu, Fp32MatchesTheCpuState) {
  auto cfg = model::builtin_config(GetParam());
  ASSERT_TRUE(cfg.ok());
  const std::string name = std::string("dummy:state-bytes-") + GetParam();
  auto ck = model::make_dummy_checkpoint(*cfg, {.seed = 1}, name);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  model::register_memory_checkpoint(name, *ck);
  auto m = load_model(name, Numerics::kExact);
  model::unregister_memory_checkpoint(name);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  for (int64_t T : {1, 37, 300}) {
    auto st = (*m)->new_sequence();
    std::vector<int32_t> tokens(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) tokens[size_t(i)] = int32_t((i * 7 + 3) % cfg->vocab_size);
    BatchItem item{st.get(), tokens};
    std::vector<float> logits;
    ASSERT_TRUE((*m)->forward({&item, 1}, logits).ok());
    const auto& s = dynamic_cast<const CpuSequenceState&>(*st);
    uint64_t rings = floats(s.mtp_ring), ckv = 0, ikeys = 0, comp = 0;
    for (const auto& r : s.draft_rings) rings += floats(r);
    for (const auto& L : s.layers) {
      rings += floats(L.ring);
      ckv += 4 * uint64_t(L.ckv.size() * L.ckv.width());
      ikeys += 4 * uint64_t(L.ikeys.size() * L.ikeys.width());
      for (const CompressorState* c : {&L.comp, &L.icomp})
        comp += floats(c->v) + floats(c->z) + floats(c->prev_v) + floats(c->prev_z) + floats(c->hist_v) +
                floats(c->hist_z);
    }
    const StateBytes b = sequence_state_bytes(model_snapshot_geometry(**m, T), T, StateFormat::kFp32);
    EXPECT_EQ(b.rings, rings) << T;
    EXPECT_EQ(b.compressed_kv, ckv) << T;
    EXPECT_EQ(b.index_keys, ikeys) << T;
    EXPECT_LE(comp, b.compressors) << T;
    if (T >= 128) EXPECT_GT(ckv, 0u) << T;  // a full group of every ratio has been compressed
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, StateBytesCpu, ::testing::Values("tiny-v4", "tiny-v41"));

TEST(StateBytes, CompactRowsArePerfBudgetSizesAtRealWidth) {
  // Real V4.1 widths (head_dim 512, index_head_dim 128) on a 2-layer geometry: one kv + index
  // source of ratio 2 and one window-only layer.
  SnapshotGeometry g;
  g.ring_size = 128 + kMaxRollback;
  g.ring_width = 512;
  g.layers.resize(2);
  g.layers[0].ckv = {512, 0};
  g.layers[0].ikeys = {128, 0};
  g.layers[1].ckv = {512, 2};
  g.layers[1].ikeys = {128, 2};
  g.layers[1].comp = {2, 512, false};
  const int64_t T = 1000;
  const StateBytes c = sequence_state_bytes(g, T, StateFormat::kCompact);
  EXPECT_EQ(c.rings, 2u * uint64_t(g.ring_size) * 528);     // 512 e4m3 + 16 E8M0
  EXPECT_EQ(c.compressed_kv, uint64_t(T / 2) * 288);          // 512 FP4 + 32 E4M3
  EXPECT_EQ(c.index_keys, uint64_t(T / 2) * 68);              // 128 FP4 + 4 E8M0
  const StateBytes f = sequence_state_bytes(g, T, StateFormat::kFp32);
  EXPECT_EQ(f.compressed_kv, uint64_t(T / 2) * 512 * 4);
  EXPECT_EQ(f.compressors, c.compressors);  // partial groups stay FP32 in both
  EXPECT_LT(c.total(), f.total());
}

}  // namespace
}  // namespace flashseek::forward
