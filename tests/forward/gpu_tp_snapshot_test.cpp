// Snapshots of tensor-parallel sequences (TpModel::export_state / import_state, backends/cuda/gpu_tp.cpp;
// the per-rank conversion in gpu_state_io.cpp). The canonical host state of a multi-GPU sequence is
// rank 0's export; every rank imports that one state (ranks > 0 ignore the draft's part, which only
// rank 0 holds). GPU tests run TP=2 with host-staged ranks on GPU 0 (TpComm::kHost, devices {0, 0})
// on tie-free tiny-v41 (DSpark draft) and tiny-v4 (V4 MTP block), native weights, exact and
// reference numerics:
//  (a) every rank's own export equals rank 0's bit for bit except the draft fields, which ranks > 0
//      do not hold (the replication the canonical state relies on), and TpModel's export is rank 0's;
//  (b) export → import into a new state of the same TP model: the import's export is the snapshot
//      bit for bit, and continuing both (a chunk, one-token decodes, a chunk) gives bitwise equal
//      logits and draft proposals before and after the continuation;
//  (c) export → serialize_snapshot → deserialize with the TP model's fingerprint → import into a
//      second, independently loaded TP=2 model continues bitwise like the original (the "other
//      server"); a one-GPU model's fingerprint (and the other way round) refuses the blob;
//  (d) a state the TP model cannot take (a missing draft, wrong geometry, reference-numerics cache
//      values the compact formats cannot hold) is refused with the reason (naming the rank where a
//      rank refused) and the model keeps working;
//  (e) the engine with a StateCache on the TP=2 model: turn 2 of a conversation restores turn 1's
//      snapshot (cached tokens > 0) and answers with the greedy tokens of a run without the cache.
// With two GPUs (GpuTpSnapshotNccl, skipped otherwise): (a) and (b) over NCCL on GPUs 0 and 1.
// CPU: the backend kinds (cuda_backend_kind) give distinct snapshot fingerprints per world size,
// weight mode and communicator, and StateGeometry::ignore_draft skips only the draft rings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>

#include "backends/cuda/gpu_model.h"
#include "backends/cuda/gpu_tp.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "engine/state_cache.h"
#include "forward/cpu_model.h"
#include "forward/state_convert.h"
#include "forward/state_io.h"
#include "gpu_test_util.h"
#include "state_test_util.h"

#if FLASHSEEK_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "ops/cuda/runtime/comm.h"
#endif

namespace flashseek::forward {
namespace {
using namespace gpu_test;  // NOLINT: test helpers (gpu_test_util.h)
using state_test::expect_same_state;
using state_test::same_bits;

// ---- CPU ---------------------------------------------------------------------------------------

// One GPU keeps its kinds (snapshots already cached stay valid); every world size, weight mode and
// communicator gets its own fingerprint, so a state is never restored where it would not continue
// bit for bit (TP=2 vs one GPU vs TP=4: the all-reduced sums change the FP32 summation order).
TEST(TpSnapshotKind, KindsSeparateWorldSizeWeightsAndCommunicator) {
  EXPECT_EQ(cuda_backend_kind(false, 1, ""), "cuda");
  EXPECT_EQ(cuda_backend_kind(true, 1, ""), "cuda-native");
  EXPECT_EQ(cuda_backend_kind(true, 1, "nccl"), cuda_backend_kind(true, 1, "")) << "one GPU has no communicator";
  const uint64_t fp = 0x0123456789abcdefull;
  std::set<uint64_t> fps{state_fingerprint(fp, "cpu")};
  int kinds = 1;
  for (int world : {1, 2, 4, 8})
    for (bool native : {false, true})
      for (const char* comm : {"nccl", "host"}) {
        if (world == 1 && std::string(comm) == "host") continue;  // the same model as "nccl" above
        const std::string k = cuda_backend_kind(native, world, comm);
        if (world > 1) {
          EXPECT_NE(k.find("-tp" + std::to_string(world)), std::string::npos) << k;
        }
        fps.insert(state_fingerprint(fp, k));
        ++kinds;
      }
  EXPECT_EQ(int(fps.size()), kinds) << "two backend kinds share a snapshot fingerprint";
}

// ignore_draft (a tensor-parallel rank > 0) skips the DSpark rings only: the backbone's geometry is
// still checked, and without the flag a draft-less model refuses a state that carries rings.
TEST(TpSnapshotKind, IgnoreDraftSkipsOnlyTheDraftRings) {
  auto cfg = model::builtin_config("tiny-v41");
  ASSERT_TRUE(cfg.ok());
  const std::string dir = tiny_checkpoint("fs_tpsnap_cpu_v41", cfg.value(), 3);
  auto m = CpuModel::load(dir, Numerics::kExact);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  CpuModel& M = **m;
  ASSERT_TRUE(M.has_draft()) << "make-tiny tiny-v41 carries the DSpark draft";
  auto st = M.new_sequence();
  std::vector<float> sink;
  ASSERT_TRUE(feed(M, *st, random_tokens(20, M.config().vocab_size, 4), sink).ok());
  auto x = M.export_state(*st);
  ASSERT_TRUE(x.ok());
  CpuSequenceState& s = **x;
  ASSERT_FALSE(s.draft_rings.empty());
  const StateGeometry full = M.state_geometry();
  StateGeometry none = full, ignore = full;
  none.draft = false;
  ignore.draft = false, ignore.ignore_draft = true;
  EXPECT_TRUE(check_state_geometry(s, M.config(), full).ok());
  EXPECT_FALSE(check_state_geometry(s, M.config(), none).ok()) << "rings the model does not keep";
  EXPECT_TRUE(check_state_geometry(s, M.config(), ignore).ok());
  CpuSequenceState bad_ring = s;
  bad_ring.draft_rings[0].pop_back();
  EXPECT_FALSE(check_state_geometry(bad_ring, M.config(), full).ok());
  EXPECT_TRUE(check_state_geometry(bad_ring, M.config(), ignore).ok()) << "the draft is not this backend's";
  CpuSequenceState no_rings = s;
  no_rings.draft_rings.clear();
  EXPECT_TRUE(check_state_geometry(no_rings, M.config(), ignore).ok());
  CpuSequenceState bad_backbone = s;
  bad_backbone.layers[1].ring.pop_back();
  const Status r = check_state_geometry(bad_backbone, M.config(), ignore);
  ASSERT_FALSE(r.ok()) << "the backbone is still checked";
  EXPECT_NE(r.message().find("window ring"), std::string::npos) << r.message();
}

// ---- GPU ---------------------------------------------------------------------------------------

int gpu_count() {
#if FLASHSEEK_HAVE_CUDA
  std::string why;
  if (!ops::cuda::cuda_device_available(&why)) return 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
#else
  return 0;
#endif
}

// Tie-free (every expert of the backbone and the draft active, every compressed entry selected),
// as the other TP draft tests: no near-tie can flip a discrete choice.
std::string ckpt(const std::string& name) {
  auto cfg = model::builtin_config(name);
  EXPECT_TRUE(cfg.ok());
  model::ModelConfig c = cfg.value();
  widen_selections(c, /*draft=*/true);
  return tiny_checkpoint("fs_tpsnap_" + name, c, 19);
}

Result<std::unique_ptr<Model>> load_tp2(const std::string& dir, Numerics numerics, std::vector<int> devices = {0, 0},
                                        TpComm comm = TpComm::kHost) {
  GpuLoadOptions o;  // native weights (the default)
  o.tp_comm = comm;
  return load_model_tp(dir, numerics, devices, o);
}

std::vector<float> feed_all(Model& m, SequenceState& st, std::span<const int32_t> t) {
  std::vector<float> logits;
  const Status s = feed(m, st, t, logits);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return logits;
}

// The committed tokens [0, n) in chunks of 41 (then the rest), then 3 tokens fed and rolled back:
// the compressors' open groups come from their rollback history, which the snapshot must carry
// (and rank 0's MTP history).
std::unique_ptr<SequenceState> build_state(Model& m, const std::vector<int32_t>& tokens, int64_t n) {
  auto st = m.new_sequence();
  for (int64_t i = 0; i < n; i += 41)
    feed_all(m, *st, std::span<const int32_t>(tokens).subspan(size_t(i), size_t(std::min<int64_t>(41, n - i))));
  feed_all(m, *st, random_tokens(3, m.config().vocab_size, 123));
  const Status s = m.rollback(*st, n);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return st;
}

// After the snapshot point: a 5-token chunk, three one-token decodes, a 12-token chunk (20 tokens,
// all logits).
std::vector<float> continue_from(Model& m, SequenceState& st, const std::vector<int32_t>& tokens, int64_t n) {
  std::vector<float> out;
  int64_t at = n;
  for (int64_t len : {5, 1, 1, 1, 12}) {
    const auto l = feed_all(m, st, std::span<const int32_t>(tokens).subspan(size_t(at), size_t(len)));
    out.insert(out.end(), l.begin(), l.end());
    at += len;
  }
  return out;
}
constexpr int64_t kContinued = 20;

// tiny-v41 (window 8): 41 tokens, past the window ring and across many ratio-2 groups; tiny-v4:
// 140 tokens, past its first ratio-128 group (compressed rows, an open group, the indexer's).
int64_t prefix_len(const std::string& config) { return config == "tiny-v4" ? 140 : 41; }

void expect_same_draft(const DraftBlock& a, const DraftBlock& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_TRUE(same_bits(a.logits, b.logits)) << what << ": max|d logit| " << max_abs_diff(a.logits, b.logits);
  EXPECT_TRUE(same_bits(a.confidence, b.confidence)) << what;
}

// (a): rank r's export == rank 0's with the draft fields removed; ranks > 0 hold no draft; the
// model's export is rank 0's.
void check_rank_states(const Model& T, const SequenceState& st, const CpuSequenceState& model_export) {
  auto ranks = tp_rank_states(T, st);
  ASSERT_TRUE(ranks.ok()) << ranks.status().to_string();
  ASSERT_GE(ranks->size(), 2u);
  {
    SCOPED_TRACE("TpModel export vs rank 0's");
    expect_same_state(model_export, *(*ranks)[0]);
  }
  CpuSequenceState backbone = *(*ranks)[0];
  backbone.draft_rings.clear();
  backbone.mtp_ring.clear();
  backbone.mtp_hist_x.clear();
  for (size_t r = 1; r < ranks->size(); ++r) {
    const CpuSequenceState& x = *(*ranks)[r];
    EXPECT_TRUE(x.draft_rings.empty() && x.mtp_ring.empty() && x.mtp_hist_x.empty())
        << "rank " << r << " holds draft state";
    SCOPED_TRACE("rank " + std::to_string(r) + " vs rank 0");
    expect_same_state(backbone, x);
  }
}

// (a) + (b) on TP model T: snapshot, import into a new state of T, continue both bitwise.
void check_same_model_round_trip(Model& T, const std::string& config, const char* label) {
  const int64_t V = T.config().vocab_size, n = prefix_len(config);
  const auto tokens = random_tokens(n + kContinued + 1, V, 31);
  auto st = build_state(T, tokens, n);
  ASSERT_EQ(st->length(), n);
  auto host = T.export_state(*st);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  ASSERT_EQ((*host)->len, n);
  check_rank_states(T, *st, **host);
  if (config == "tiny-v41") {
    EXPECT_FALSE((*host)->draft_rings.empty()) << "rank 0's DSpark rings are in the snapshot";
  } else {
    EXPECT_FALSE((*host)->mtp_hist_x.empty()) << "rank 0's MTP history is in the snapshot";
  }

  auto imp = T.import_state(**host);
  ASSERT_TRUE(imp.ok()) << imp.status().to_string();
  ASSERT_EQ((*imp)->length(), n);
  auto again = T.export_state(**imp);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  {
    SCOPED_TRACE("export of the import");
    expect_same_state(**host, **again);
  }
  check_rank_states(T, **imp, **again);

  ASSERT_TRUE(T.has_draft());
  auto d0 = T.propose(*st, tokens[size_t(n)]), d1 = T.propose(**imp, tokens[size_t(n)]);
  ASSERT_TRUE(d0.ok() && d1.ok()) << d0.status().to_string() << " " << d1.status().to_string();
  expect_same_draft(*d0, *d1, "proposal at the snapshot point");
  const std::vector<float> want = continue_from(T, *st, tokens, n);
  const std::vector<float> got = continue_from(T, **imp, tokens, n);
  ASSERT_EQ(want.size(), size_t(kContinued * V));
  std::printf("[gpu tp snapshot] %s %s: %lld tokens restored on the same TP=2 model, continuation max|d logit| %.3g\n",
              config.c_str(), label, (long long)n, max_abs_diff(want, got));
  EXPECT_TRUE(same_bits(want, got)) << "max|d logit| " << max_abs_diff(want, got);
  auto e0 = T.propose(*st, tokens[size_t(n + kContinued)]), e1 = T.propose(**imp, tokens[size_t(n + kContinued)]);
  ASSERT_TRUE(e0.ok() && e1.ok());
  expect_same_draft(*e0, *e1, "proposal after the continuation");
}

struct SnapParam {
  const char* config;
  Numerics numerics;
};
std::string snap_name(const ::testing::TestParamInfo<SnapParam>& i) {
  std::string s = std::string(i.param.config) + (i.param.numerics == Numerics::kExact ? "_exact" : "_reference");
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}
const char* label(Numerics n) { return n == Numerics::kExact ? "exact" : "reference"; }

class GpuTpSnapshot : public ::testing::TestWithParam<SnapParam> {};

TEST_P(GpuTpSnapshot, HostStagedTp2RestoreOnTheSameModelContinuesBitwise) {
  FS_REQUIRE_GPU();
  const SnapParam p = GetParam();
  auto tp = load_tp2(ckpt(p.config), p.numerics);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  check_same_model_round_trip(**tp, p.config, label(p.numerics));
}

// (c): the snapshot format between two TP=2 models of one checkpoint ("another server"), and the
// fingerprint that keeps one-GPU and TP=2 snapshots apart.
TEST_P(GpuTpSnapshot, HostStagedTp2SnapshotContinuesOnASecondModelAndNotOnOneGpu) {
  FS_REQUIRE_GPU();
  const SnapParam p = GetParam();
  const std::string dir = ckpt(p.config);
  auto a = load_tp2(dir, p.numerics);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = load_tp2(dir, p.numerics);  // a second, independent load
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto one = load_model_gpu(dir, p.numerics, 0);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  Model &A = **a, &B = **b, &O = **one;
  EXPECT_EQ(A.backend_kind(), B.backend_kind());
  EXPECT_NE(A.backend_kind(), O.backend_kind());
  EXPECT_NE(A.backend_kind().find("-tp2"), std::string::npos) << A.backend_kind();
  auto cfp = checkpoint_fingerprint(dir, label(p.numerics));
  ASSERT_TRUE(cfp.ok()) << cfp.status().to_string();
  const uint64_t fp_a = state_fingerprint(*cfp, A.backend_kind()), fp_b = state_fingerprint(*cfp, B.backend_kind());
  const uint64_t fp_one = state_fingerprint(*cfp, O.backend_kind());

  const int64_t V = A.config().vocab_size, n = prefix_len(p.config);
  const auto tokens = random_tokens(n + kContinued, V, 37);
  auto st = build_state(A, tokens, n);
  auto host = A.export_state(*st);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  const std::span<const int32_t> prefix = std::span<const int32_t>(tokens).first(size_t(n));
  auto blob = serialize_snapshot(**host, prefix, {fp_a, 1, 2, n, 0});
  ASSERT_TRUE(blob.ok()) << blob.status().to_string();
  auto dec = deserialize_snapshot(*blob, fp_b, model_snapshot_geometry(B, int64_t(1) << 20));
  ASSERT_TRUE(dec.ok()) << dec.status().to_string();
  EXPECT_EQ(dec->tokens, std::vector<int32_t>(prefix.begin(), prefix.end()));

  auto want_draft = A.propose(*st, tokens[size_t(n)]);
  ASSERT_TRUE(want_draft.ok()) << want_draft.status().to_string();
  const std::vector<float> want = continue_from(A, *st, tokens, n);
  auto imp = B.import_state(*dec->state);
  ASSERT_TRUE(imp.ok()) << imp.status().to_string();
  auto again = B.export_state(**imp);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  {
    SCOPED_TRACE("second model's export of the import");
    expect_same_state(**host, **again);
  }
  auto d = B.propose(**imp, tokens[size_t(n)]);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  expect_same_draft(*want_draft, *d, "second model's proposal");
  const std::vector<float> got = continue_from(B, **imp, tokens, n);
  std::printf("[gpu tp snapshot] %s %s: %lld tokens through the snapshot format into a second TP=2 model, "
              "continuation max|d logit| %.3g\n", p.config, label(p.numerics), (long long)n, max_abs_diff(want, got));
  EXPECT_TRUE(same_bits(want, got)) << "max|d logit| " << max_abs_diff(want, got);

  // A one-GPU server of the same checkpoint does not take the TP=2 blob, nor the TP=2 server a
  // one-GPU blob: the fingerprints differ (the states would not continue bit for bit).
  auto on_one = deserialize_snapshot(*blob, fp_one, model_snapshot_geometry(O, int64_t(1) << 20));
  ASSERT_FALSE(on_one.ok());
  EXPECT_NE(on_one.status().message().find("fingerprint"), std::string::npos) << on_one.status().message();
  auto os = build_state(O, tokens, n);
  auto ohost = O.export_state(*os);
  ASSERT_TRUE(ohost.ok()) << ohost.status().to_string();
  auto oblob = serialize_snapshot(**ohost, prefix, {fp_one, 1, 2, n, 0});
  ASSERT_TRUE(oblob.ok()) << oblob.status().to_string();
  auto on_tp = deserialize_snapshot(*oblob, fp_b, model_snapshot_geometry(B, int64_t(1) << 20));
  ASSERT_FALSE(on_tp.ok());
  EXPECT_NE(on_tp.status().message().find("fingerprint"), std::string::npos) << on_tp.status().message();
}

// (d): refusals leave the TP model usable; an error from a rank's import names the rank.
TEST_P(GpuTpSnapshot, HostStagedTp2RefusesBadStatesAndStaysUsable) {
  FS_REQUIRE_GPU();
  const SnapParam p = GetParam();
  auto tp = load_tp2(ckpt(p.config), p.numerics);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  Model& T = **tp;
  const int64_t V = T.config().vocab_size, n = prefix_len(p.config);
  const auto tokens = random_tokens(n + kContinued, V, 41);
  auto st = build_state(T, tokens, n);
  auto host = T.export_state(*st);
  ASSERT_TRUE(host.ok()) << host.status().to_string();
  // The draft's part is checked (by rank 0's geometry) although ranks > 0 ignore it.
  CpuSequenceState no_draft = **host;
  if (std::string(p.config) == "tiny-v41") {
    no_draft.draft_rings.clear();
  } else {
    no_draft.mtp_ring.clear();
  }
  auto r1 = T.import_state(no_draft);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("state geometry"), std::string::npos) << r1.status().message();
  CpuSequenceState bad = **host;
  bad.layers[2].ring.pop_back();
  auto r2 = T.import_state(bad);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("window ring"), std::string::npos) << r2.status().message();
  // Reference numerics keep the caches in compact formats: a value they cannot hold is refused by
  // every rank's import (the error names the first rank); exact numerics keep FP32 and take it.
  CpuSequenceState off = **host;
  float& v = off.layers[0].ring[3];
  v = std::nextafter(v == 0.0f ? 1.0f : v, 1e30f);
  auto r3 = T.import_state(off);
  if (p.numerics == Numerics::kReference) {
    ASSERT_FALSE(r3.ok());
    EXPECT_NE(r3.status().message().find("rank 0 of 2"), std::string::npos) << r3.status().message();
    EXPECT_NE(r3.status().message().find("not exactly representable"), std::string::npos) << r3.status().message();
  } else {
    EXPECT_TRUE(r3.ok()) << r3.status().to_string();
  }
  auto e = T.export_state(*T.new_sequence());
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_EQ((*e)->len, 0);
  auto one = load_model_gpu(ckpt(p.config), p.numerics, 0);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_FALSE(T.export_state(*(*one)->new_sequence()).ok()) << "a one-GPU state is not a multi-GPU state";
  // Still usable: the good snapshot imports and continues like the original.
  auto imp = T.import_state(**host);
  ASSERT_TRUE(imp.ok()) << imp.status().to_string();
  const auto want = continue_from(T, *st, tokens, n), got = continue_from(T, **imp, tokens, n);
  EXPECT_TRUE(same_bits(want, got)) << "max|d logit| " << max_abs_diff(want, got);
}

INSTANTIATE_TEST_SUITE_P(TieFree, GpuTpSnapshot,
                         ::testing::Values(SnapParam{"tiny-v41", Numerics::kReference},
                                           SnapParam{"tiny-v41", Numerics::kExact},
                                           SnapParam{"tiny-v4", Numerics::kReference},
                                           SnapParam{"tiny-v4", Numerics::kExact}),
                         snap_name);

// (e): turn 1, then turn 2 = turn 1 + answer + a new message, through the engine on the TP=2 model
// with a state cache: turn 2 restores the end-of-response snapshot of turn 1 (rank 0's export,
// imported on both ranks) and answers like turn 2 without the cache.
TEST(GpuTpSnapshotEngine, HostStagedTp2SecondTurnRestoresThePrefix) {
  FS_REQUIRE_GPU();
  const std::string dir = ckpt("tiny-v41");
  auto tp = load_tp2(dir, Numerics::kReference);
  ASSERT_TRUE(tp.ok()) << tp.status().to_string();
  Model& T = **tp;
  gpu_test::check_second_turn_restores_prefix(T, dir, 60, "gpu tp");
}

// NCCL on GPUs 0 and 1 (decode steps as CUDA graphs): NCCL's all-reduce leaves the same bits on
// both ranks (every rank's export equals rank 0's but for the draft), the round trip continues
// bitwise, and the kind names the world size but not the host-staged communicator.
TEST(GpuTpSnapshotNccl, Tp2RestoreContinuesBitwise) {
  const int n = gpu_count();
  if (n < 2) GTEST_SKIP() << "NCCL TP=2 snapshot test skipped: needs 2 GPUs, this machine has " << n;
#if FLASHSEEK_HAVE_CUDA
  if (!ops::cuda::nccl_built()) GTEST_SKIP() << "NCCL TP=2 snapshot test skipped: this build has no NCCL";
#endif
  for (const char* name : {"tiny-v41", "tiny-v4"}) {
    SCOPED_TRACE(name);
    const std::string dir = ckpt(name);
    auto tp = load_tp2(dir, Numerics::kReference, {0, 1}, TpComm::kNccl);
    ASSERT_TRUE(tp.ok()) << tp.status().to_string();
    auto host = load_tp2(dir, Numerics::kReference);
    ASSERT_TRUE(host.ok()) << host.status().to_string();
    EXPECT_NE((*tp)->backend_kind().find("-tp2"), std::string::npos) << (*tp)->backend_kind();
    EXPECT_NE((*tp)->backend_kind(), (*host)->backend_kind());
    check_same_model_round_trip(**tp, name, "reference, NCCL");
  }
}

}  // namespace
}  // namespace flashseek::forward
