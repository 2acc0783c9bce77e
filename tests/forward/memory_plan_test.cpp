// The start-up memory plan (forward/memory_plan.h) and --engram-tables: with the tables on the
// device every GPU's weights grow by exactly the stored bytes of the Engram tables and nothing
// stays resident on the host for them; the CPU backend's plan does not depend on the option.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "core/dtype.h"
#include "forward/cache_format.h"
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

// The step's workspace grows with the step budget and, for the indexer, with the context: on a
// GPU the scores / block maxima / kept-block flags (9 bytes per row and position, capped at the
// 2 GiB of GpuModel::index_topk's row slices), and the candidate mask (a byte per row and
// position) only for configs with a candidate stage (V4.1, not V4); on a GPU also the constant
// key pool of the tensor-core row attention.
TEST(MemoryPlanWorkspace, CountsTheStepBudgetAndTheIndexersBuffers) {
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    auto cfg = model::builtin_config(name);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    ASSERT_GT(cfg->index_n_heads, 0) << name;
    const bool cand = cfg->candidate_source_layer >= 0;
    EXPECT_EQ(cand, cfg->is_v41()) << name;
    const SnapshotGeometry g = snapshot_geometry(*cfg, false, false, 4096);
    auto plan = [&](bool gpu, int64_t step, int64_t ctx) {
      MemoryPlanOptions o;
      o.gpu = gpu, o.native_weights = gpu, o.step_tokens = step, o.max_context = ctx;
      return plan_memory(*cfg, g, false, o, uint64_t(1) << 50).workspace;
    };
    const uint64_t two_gib = uint64_t(2) << 30;
    // The tensor-core row attention's key pool and slot lists (a constant on a GPU).
    const uint64_t attn_gpu = uint64_t(2 * kGpuDecodeAttnPoolBytes + kGpuDecodeAttnPoolBytes / 32);
    ASSERT_EQ(uint64_t(kGpuIndexScratchBytes), two_gib);  // GpuModel::index_topk's slice bound
    ASSERT_EQ(kGpuIndexEntryBytes, 9);                    // FP32 score + FP32 block maximum + flag
    // Per-token activations scale with the step; subtract them to see the indexer's part.
    const uint64_t per_token = plan(true, 2, 1) - plan(true, 1, 1) - 9 - (cand ? 1 : 0);
    ASSERT_GT(per_token, 0u) << name;
    for (const auto& [step, ctx] : {std::pair<int64_t, int64_t>{256, 4096}, {8192, 1048576}, {4096, 65536}}) {
      const uint64_t e = uint64_t(step) * uint64_t(ctx);
      const uint64_t idx_gpu = std::min<uint64_t>(9 * e, two_gib) + (cand ? e : 0), idx_cpu = cand ? e : 0;
      EXPECT_EQ(plan(true, step, ctx), uint64_t(step) * per_token + idx_gpu + attn_gpu)
          << name << " step " << step << " ctx " << ctx;
      EXPECT_EQ(plan(false, step, ctx), uint64_t(step) * per_token + idx_cpu) << name << " step " << step << " ctx " << ctx;
    }
  }
}

// --prefill-gemm-operands bf16-expanded: the workspace grows by the BF16 values of the largest FP8
// linear (the dense GEMMs' expansion scratch) plus one chunk of routed-expert matrices: whole
// matrices of at most kMoeExpandChunkBytes, at least one, at most the experts there are. Checked
// on the tiny configs (every expert in one chunk) and on tiny-v41 with experts wide enough that
// the chunk bound cuts the count; nothing changes off the GPU.
TEST(MemoryPlanWorkspace, CountsThePrefillWeightExpansion) {
  ASSERT_EQ(kMoeExpandChunkBytes, int64_t(1) << 30);
  struct Case {
    const char* name;
    int64_t inter;  // moe_inter_dim (0: the config's)
  };
  for (const Case& cs : {Case{"tiny-v41", 0}, Case{"tiny-v4", 0}, Case{"tiny-v41", 1 << 21}}) {
    auto cfg = model::builtin_config(cs.name);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    model::ModelConfig c = *cfg;
    if (cs.inter) c.moe_inter_dim = cs.inter;
    uint64_t dense = 0, expert = 0;  // BF16 bytes of the largest FP8 linear / of one routed expert matrix
    for (const model::WeightSpec& w : model::expected_weights(c)) {
      if (w.optional || w.shape.size() != 2 || w.component == model::Component::kVision ||
          w.component == model::Component::kDraftDense || w.component == model::Component::kDraftExperts)
        continue;  // not loaded (the plans below are without a draft)
      const uint64_t bf16 = 2 * uint64_t(w.shape[0]) * uint64_t(w.shape[1]);
      if (w.kind == model::WeightKind::kExpert && w.name.find(".ffn.experts.") != std::string::npos)
        expert = std::max(expert, bf16);
      else if (w.kind == model::WeightKind::kLinear && model::release_tensors(w, c)[0].dtype == DType::kF8E4M3)
        dense = std::max(dense, bf16);
    }
    ASSERT_GT(dense, 0u) << cs.name;
    ASSERT_GT(expert, 0u) << cs.name;
    const uint64_t chunk = std::min<uint64_t>(uint64_t(c.n_routed_experts),
                                              std::max<uint64_t>(1, uint64_t(kMoeExpandChunkBytes) / expert));
    if (cs.inter) {
      EXPECT_LT(chunk, uint64_t(c.n_routed_experts)) << "the chunk bound should cut the experts";
    } else {
      EXPECT_EQ(chunk, uint64_t(c.n_routed_experts));
    }
    const SnapshotGeometry g = snapshot_geometry(c, false, false, 256);
    for (bool gpu : {true, false}) {
      MemoryPlanOptions o;
      o.gpu = gpu, o.native_weights = gpu, o.max_context = 256;
      const MemoryPlan off = plan_memory(c, g, false, o, uint64_t(1) << 50);
      o.prefill_weight_expansion = true;
      const MemoryPlan on = plan_memory(c, g, false, o, uint64_t(1) << 50);
      EXPECT_EQ(on.workspace - off.workspace, gpu ? dense + chunk * expert : 0) << cs.name << " gpu " << gpu;
      EXPECT_EQ(on.total - off.total, on.workspace - off.workspace) << cs.name;
    }
  }
}

// A multi-GPU model keeps the draft whole on rank 0 (backends/cuda/gpu_tp.h), so the per-GPU plan
// counts all of the draft's weights at every tensor-parallel size, not a 1/N share.
TEST(MemoryPlanDraft, TensorParallelCountsTheWholeDraftOnRankZero) {
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    auto cfg = model::builtin_config(name);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    uint64_t draft = 0;  // FP32 copies of the draft's weights (what tensor-parallel ranks hold)
    for (const model::WeightSpec& w : model::expected_weights(*cfg))
      if (!w.optional && (w.component == model::Component::kDraftDense || w.component == model::Component::kDraftExperts))
        draft += 4 * uint64_t(shape_numel(w.shape));
    ASSERT_GT(draft, 0u) << name;
    const SnapshotGeometry g = snapshot_geometry(*cfg, !cfg->is_v41(), cfg->is_v41(), 256);
    for (int tp : {1, 2, 4}) {
      MemoryPlanOptions o;
      o.max_context = 256;
      o.gpu = true;
      o.tensor_parallel = tp;
      const MemoryPlan with = plan_memory(*cfg, g, true, o, uint64_t(1) << 40);
      const MemoryPlan without = plan_memory(*cfg, g, false, o, uint64_t(1) << 40);
      EXPECT_EQ(with.weights - without.weights, draft) << name << " tp " << tp;
    }
  }
}

// The GPU plan counts the caches in the row formats the CUDA backend stores (forward/
// cache_format.h): reference numerics compact (ring, compressed KV and index key rows of the
// formats' bytes), exact numerics FP32; DSpark rings FP32 either way; the CPU plan stays FP32.
TEST(MemoryPlanCaches, GpuStateUsesTheStoredRowBytes) {
  for (const char* name : {"tiny-v4", "tiny-v41"}) {
    auto cfg = model::builtin_config(name);
    ASSERT_TRUE(cfg.ok());
    const SnapshotGeometry g = snapshot_geometry(*cfg, false, cfg->is_v41(), 512);
    MemoryPlanOptions o;
    o.max_context = 512;
    o.gpu = true;
    o.native_weights = true;
    const MemoryPlan ref = plan_memory(*cfg, g, true, o, 1ull << 40);
    o.numerics = Numerics::kExact;
    const MemoryPlan exact = plan_memory(*cfg, g, true, o, 1ull << 40);
    o.gpu = false;
    const MemoryPlan cpu = plan_memory(*cfg, g, true, o, 1ull << 40);
    const CacheFormats f = cache_formats(*cfg, Numerics::kReference);
    uint64_t rings = 0, ckv = 0, ikeys = 0;
    for (const auto& L : g.layers) {
      rings += uint64_t(g.ring_size * f.ring.row_bytes());
      if (L.ckv.ratio > 0) ckv += uint64_t(512 / L.ckv.ratio * f.ckv.row_bytes());
      if (L.ikeys.ratio > 0) ikeys += uint64_t(512 / L.ikeys.ratio * f.ikeys.row_bytes());
    }
    rings += uint64_t(g.draft_stages * g.ring_size * 4 * g.ring_width);
    EXPECT_EQ(ref.state.rings, rings) << name;
    EXPECT_EQ(ref.state.compressed_kv, ckv) << name;
    EXPECT_EQ(ref.state.index_keys, ikeys) << name;
    EXPECT_GT(ckv, 0u) << name;
    EXPECT_GT(ikeys, 0u) << name;
    EXPECT_EQ(exact.state.total(), cpu.state.total()) << name;  // FP32 caches
    EXPECT_LT(ref.state.total(), exact.state.total()) << name;
    EXPECT_EQ(exact.total - ref.total, exact.state.total() - ref.state.total()) << name;
  }
}

}  // namespace
}  // namespace flashseek::forward
