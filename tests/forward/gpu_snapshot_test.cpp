// Snapshots of GPU sequence states (gpu_state_io.cpp, Model::export_state / import_state on the
// CUDA backend), on make-tiny tiny-v41 (DSpark, Engram, ratio 1/2 compressors) and tiny-v4
// (overlapping ratio-4 and ratio-128 compressors, V4 indexer compressor), exact and reference
// numerics:
//  (a) a GPU state (prefill crossing compression groups, then tokens fed and rolled back so the
//      rollback history is in use) → export → serialize_snapshot → deserialize → import on the
//      same model and on a second, independently loaded GpuModel: the import's export equals the
//      first export bit for bit, continuing it (a chunk, decodes, a chunk) gives logits bitwise
//      equal to continuing the uninterrupted state, and DSpark proposals after the restore equal
//      those of the original state bit for bit;
//  (b) a state produced by the CPU model survives import → export on the GPU bit for bit (the
//      GPU backend keeps no V4 MTP state: those fields are dropped);
//  (c) a state of another checkpoint's geometry is refused before anything reaches the device;
//  (d) the engine on the GPU model with a StateCache: turn 2 of a conversation restores the
//      snapshot of turn 1 (cached tokens > 0) and answers with the same greedy tokens as without
//      the cache (tie-free checkpoint: no near-tie can flip between chunkings).
// Tensor-parallel snapshots: gpu_tp_snapshot_test.cpp.
// Skips visibly without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "core/rng.h"
#include "engine/engine.h"
#include "engine/state_cache.h"
#include "forward/cpu_model.h"
#include "backends/cuda/gpu_model.h"
#include "forward/state_io.h"
#include "gpu_test_util.h"
#include "state_test_util.h"

namespace flashseek::forward {
namespace {
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)
using state_test::expect_same_state;
using state_test::same_bits;

// One make-tiny checkpoint per config (and tie-free variant) per process.
std::string ckpt(const std::string& name, bool tie_free = false) {
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig c = cfg.value();
  if (tie_free) widen_selections(c, c.is_v41());
  return tiny_checkpoint("fs_gpusnap_" + name + (tie_free ? "_tf" : ""), c, 21);
}

std::vector<float> feed(Model& m, SequenceState& st, std::span<const int32_t> t) {
  std::vector<float> logits;
  BatchItem item{&st, t, true};
  const Status s = m.forward({&item, 1}, logits);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return logits;
}

// The committed tokens [0, n) in chunks of 41 (then the rest), then 3 tokens fed and rolled back:
// the open groups are rebuilt from the rollback history, which the snapshot must carry.
std::unique_ptr<SequenceState> build_state(Model& m, const std::vector<int32_t>& tokens, int64_t n) {
  auto st = m.new_sequence();
  for (int64_t i = 0; i < n; i += 41)
    feed(m, *st, std::span<const int32_t>(tokens).subspan(size_t(i), size_t(std::min<int64_t>(41, n - i))));
  const auto junk = random_tokens(3, m.config().vocab_size, 123);
  feed(m, *st, junk);
  const Status s = m.rollback(*st, n);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return st;
}

// Continuation pattern after the snapshot point: a 5-token chunk (graph-sized), three decodes,
// then a 12-token chunk (eager): 20 tokens, all logits.
std::vector<float> continue_from(Model& m, SequenceState& st, const std::vector<int32_t>& tokens, int64_t n) {
  std::vector<float> out;
  int64_t at = n;
  for (int64_t len : {5, 1, 1, 1, 12}) {
    const auto l = feed(m, st, std::span<const int32_t>(tokens).subspan(size_t(at), size_t(len)));
    out.insert(out.end(), l.begin(), l.end());
    at += len;
  }
  return out;
}

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = a.size() == b.size() ? 0 : 1e30;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

struct SnapParam {
  const char* config;
  Numerics numerics;
};
class GpuSnapshot : public ::testing::TestWithParam<SnapParam> {
 protected:
  // Past two ratio-128 groups on V4; on V4.1 well past the 16-slot ring and many ratio-2 groups.
  int64_t prefix_len() const { return std::string(GetParam().config) == "tiny-v4" ? 263 : 71; }
};

TEST_P(GpuSnapshot, RestoreOnSameAndSecondModelContinuesBitwise) {
  FS_REQUIRE_GPU();
  const SnapParam p = GetParam();
  const std::string dir = ckpt(p.config);
  auto a = load_model_gpu(dir, p.numerics, 0);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = load_model_gpu(dir, p.numerics, 0);  // a second, independent load of the checkpoint
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  Model& A = **a;
  const int64_t V = A.config().vocab_size, n = prefix_len();
  const auto tokens = random_tokens(n + 20, V, 31);
  auto st = build_state(A, tokens, n);
  ASSERT_EQ(st->length(), n);

  auto host = A.export_state(*st);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  ASSERT_EQ((*host)->len, n);
  auto blob = serialize_snapshot(**host, std::span<const int32_t>(tokens).first(size_t(n)), {77, 1, 2, n, 0});
  ASSERT_TRUE(blob.ok()) << blob.status().to_string();
  auto dec = deserialize_snapshot(*blob, 77, model_snapshot_geometry(A, int64_t(1) << 20));
  ASSERT_TRUE(dec.ok()) << dec.status().to_string();

  // The original's proposals and continuation (on a clone: st itself stays the snapshot point).
  std::optional<DraftBlock> want_draft;
  if (A.has_draft()) {
    auto d = A.propose(*st, tokens[size_t(n)]);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    want_draft = std::move(*d);
  }
  auto ref = st->clone();
  const std::vector<float> want = continue_from(A, *ref, tokens, n);
  ASSERT_EQ(want.size(), size_t(20 * V));

  for (Model* M : {&A, b->get()}) {
    const char* which = M == &A ? "same model" : "second model";
    auto imp = M->import_state(*dec->state);
    ASSERT_TRUE(imp.ok()) << which << ": " << imp.status().to_string();
    ASSERT_EQ((*imp)->length(), n);
    auto again = M->export_state(**imp);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    {
      SCOPED_TRACE(which);
      expect_same_state(**host, **again);
    }
    if (want_draft) {
      auto d = M->propose(**imp, tokens[size_t(n)]);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      EXPECT_EQ(d->tokens, want_draft->tokens) << which;
      EXPECT_TRUE(same_bits(d->logits, want_draft->logits)) << which << ": max|d| " << max_abs(d->logits, want_draft->logits);
      EXPECT_TRUE(same_bits(d->confidence, want_draft->confidence)) << which;
    }
    const std::vector<float> got = continue_from(*M, **imp, tokens, n);
    std::printf("[gpu snapshot] %s %s %s: %lld tokens restored, continuation max|d logit| %.3g\n", p.config,
                p.numerics == Numerics::kExact ? "exact" : "reference", which, (long long)n, max_abs(want, got));
    EXPECT_TRUE(same_bits(want, got)) << which << ": max|d logit| " << max_abs(want, got);
  }
}

// A state the CPU model produced (same checkpoint and numerics) goes through the device and back
// bit for bit, and the GPU continues it (values within the backends' fp tolerance: printed only).
TEST_P(GpuSnapshot, CpuStateRoundTripsThroughTheDevice) {
  FS_REQUIRE_GPU();
  const SnapParam p = GetParam();
  const std::string dir = ckpt(p.config);
  auto cpu = load_model(dir, p.numerics);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = load_model_gpu(dir, p.numerics, 0, cpu_twin_weights(p.numerics));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model &C = **cpu, &G = **gpu;
  const int64_t V = C.config().vocab_size;
  for (int64_t n : {int64_t(0), int64_t(1), int64_t(6), prefix_len()}) {
    const auto tokens = random_tokens(n + 20, V, 41 + uint64_t(n));
    std::unique_ptr<SequenceState> cs;
    if (n >= 4) {
      cs = build_state(C, tokens, n);
    } else {
      cs = C.new_sequence();
      if (n > 0) feed(C, *cs, std::span<const int32_t>(tokens).first(size_t(n)));
    }
    auto x = C.export_state(*cs);
    ASSERT_TRUE(x.ok());
    auto y = G.import_state(**x);
    ASSERT_TRUE(y.ok()) << "length " << n << ": " << y.status().to_string();
    auto back = G.export_state(**y);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    SCOPED_TRACE("CPU state of length " + std::to_string(n));
    expect_same_state(**x, **back, /*ignore_mtp=*/true);
    // The CUDA backend keeps V4's MTP state (its live ring rows and newest history row: GpuMtp.*
    // compares them bit for bit); a state without one comes back without one.
    if (n > 0) {
      EXPECT_EQ((*back)->mtp_ring.size(), (*x)->mtp_ring.size());
    }
    if (n > 0) {
      auto gs = build_state(G, tokens, n);  // the same tokens on the GPU from scratch
      const auto lg = continue_from(G, *gs, tokens, n), lc = continue_from(G, **y, tokens, n);
      std::printf("[gpu snapshot] %s %s: CPU state of %lld tokens continued on the GPU, max|d logit| vs GPU "
                  "prefill %.3g\n", p.config, p.numerics == Numerics::kExact ? "exact" : "reference", (long long)n,
                  max_abs(lg, lc));
    }
  }
}

// Another checkpoint's state (V4 ↔ V4.1 geometry) is refused with a geometry error; a foreign
// backend state is refused by export_state.
TEST_P(GpuSnapshot, ForeignGeometryIsRefused) {
  FS_REQUIRE_GPU();
  const SnapParam p = GetParam();
  const std::string other = std::string(p.config) == "tiny-v4" ? "tiny-v41" : "tiny-v4";
  auto gpu = load_model_gpu(ckpt(p.config), p.numerics, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto cpu_other = load_model(ckpt(other), p.numerics);
  ASSERT_TRUE(cpu_other.ok()) << cpu_other.status().to_string();
  auto s = (*cpu_other)->new_sequence();
  feed(**cpu_other, *s, random_tokens(12, (*cpu_other)->config().vocab_size, 5));
  auto x = (*cpu_other)->export_state(*s);
  ASSERT_TRUE(x.ok());
  auto r = (*gpu)->import_state(**x);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("state geometry"), std::string::npos) << r.status().message();
  EXPECT_FALSE((*gpu)->export_state(*s).ok()) << "a CPU state is not a GPU state";
}

// The GPU keeps the caches in compact formats (reference numerics): a state whose ring, compressed
// KV or index key values the format cannot hold exactly (one value one ulp off) is refused with a
// clear error rather than rounded; exact numerics keeps FP32 caches and takes it.
TEST_P(GpuSnapshot, UnrepresentableCacheValuesAreRefused) {
  FS_REQUIRE_GPU();
  const SnapParam p = GetParam();
  const std::string dir = ckpt(p.config);
  auto cpu = load_model(dir, p.numerics);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = load_model_gpu(dir, p.numerics, 0, cpu_twin_weights(p.numerics));
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  auto s = (*cpu)->new_sequence();
  feed(**cpu, *s, random_tokens(70, (*cpu)->config().vocab_size, 6));
  for (int which = 0; which < 3; ++which) {
    auto x = (*cpu)->export_state(*s);
    ASSERT_TRUE(x.ok());
    CpuSequenceState& st = **x;
    bool changed = false;
    for (LayerState& L : st.layers) {
      if (changed) break;
      PagedRows& rows = which == 1 ? L.ckv : L.ikeys;
      if (which == 0) {
        L.ring[3] = std::nextafter(L.ring[3] == 0.0f ? 1.0f : L.ring[3], 1e30f), changed = true;
      } else if (rows.size() > 0) {
        std::vector<float> v = rows.to_vector();
        v[1] = std::nextafter(v[1] == 0.0f ? 1.0f : v[1], 1e30f);
        rows.reset(rows.width());
        rows.append(v);
        changed = true;
      }
    }
    ASSERT_TRUE(changed) << which;
    auto r = (*gpu)->import_state(st);
    if (p.numerics == Numerics::kExact) {
      EXPECT_TRUE(r.ok()) << which << ": " << r.status().to_string();
    } else {
      ASSERT_FALSE(r.ok()) << which;
      EXPECT_NE(r.status().message().find("not exactly representable"), std::string::npos) << r.status().message();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, GpuSnapshot,
                         ::testing::Values(SnapParam{"tiny-v41", Numerics::kExact},
                                           SnapParam{"tiny-v41", Numerics::kReference},
                                           SnapParam{"tiny-v4", Numerics::kExact},
                                           SnapParam{"tiny-v4", Numerics::kReference}),
                         [](const ::testing::TestParamInfo<SnapParam>& info) {
                           std::string s = std::string(info.param.config) +
                                           (info.param.numerics == Numerics::kExact ? "_exact" : "_reference");
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// Turn 1, then turn 2 = turn 1 + answer + a new message, through the engine on the GPU model with
// a state cache: turn 2 restores the end-of-response snapshot of turn 1 (cached tokens > 0, only
// the rest prefilled) and answers like turn 2 without any cache.
TEST(GpuSnapshotEngine, SecondTurnRestoresThePrefix) {
  FS_REQUIRE_GPU();
  const std::string dir = ckpt("tiny-v41", /*tie_free=*/true);
  auto gpu = load_model_gpu(dir, Numerics::kReference, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();
  Model& G = **gpu;
  gpu_test::check_second_turn_restores_prefix(G, dir, 90, "gpu");
}

}  // namespace
}  // namespace flashseek::forward
