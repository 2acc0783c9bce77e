// Snapshot blobs (forward/state_io.h): a restored state continues exactly like the original;
// every corruption, truncation or foreign fingerprint is rejected with an error (never a crash).
#include <gtest/gtest.h>

#include <functional>

#include "forward/state.h"
#include "kv_test_util.h"

namespace flashseek::kvtest {
namespace {

using StateIo = TinyModel;

TEST_F(StateIo, RoundTripContinuesBitExactly) {
  Rng rng(1);
  for (int64_t len : {1, 7, 37, 150}) {  // below and beyond the window / compress ratios
    SCOPED_TRACE("len " + std::to_string(len));
    const auto prompt = random_tokens(rng, len);
    auto original = run(prompt);
    forward::SnapshotHeader h{fingerprint_, 42, 0x1234, len, 0};
    auto blob = forward::serialize_snapshot(*original, prompt, h);
    ASSERT_TRUE(blob.ok()) << blob.status().to_string();
    auto d = forward::deserialize_snapshot(*blob, fingerprint_, geometry_);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    EXPECT_EQ(d->tokens, prompt);
    EXPECT_EQ(d->header.tenant, 42u);
    EXPECT_EQ(d->header.prefix_hash, 0x1234u);
    EXPECT_EQ(d->state->length(), len);
    // Both continue with the same 5 tokens, one at a time: logits must be identical.
    const auto more = random_tokens(rng, 5);
    for (int32_t t : more) {
      std::vector<float> a, b;
      advance(*original, std::span<const int32_t>(&t, 1), &a);
      advance(*d->state, std::span<const int32_t>(&t, 1), &b);
      ASSERT_EQ(a, b);
    }
  }
}

TEST_F(StateIo, RejectsCorruptionTruncationAndOtherModels) {
  Rng rng(2);
  const auto prompt = random_tokens(rng, 23);
  auto st = run(prompt);
  auto blob = forward::serialize_snapshot(*st, prompt, {fingerprint_, 1, 2, 23, 0});
  ASSERT_TRUE(blob.ok());
  EXPECT_FALSE(forward::deserialize_snapshot(*blob, fingerprint_ ^ 1, geometry_).ok());
  for (int i = 0; i < 200; ++i) {  // single flipped bits anywhere, including the checksum
    auto bad = *blob;
    const size_t at = size_t(rng.below(bad.size()));
    bad[at] ^= uint8_t(1u << rng.below(8));
    EXPECT_FALSE(forward::deserialize_snapshot(bad, fingerprint_, geometry_).ok()) << "byte " << at;
  }
  for (int i = 0; i < 100; ++i) {  // truncations and garbage appended
    auto bad = *blob;
    if (i % 2) bad.resize(size_t(rng.below(bad.size())));
    else bad.insert(bad.end(), 1 + rng.below(64), uint8_t(rng.below(256)));
    EXPECT_FALSE(forward::deserialize_snapshot(bad, fingerprint_, geometry_).ok());
  }
  EXPECT_FALSE(forward::peek_snapshot_header(std::span<const uint8_t>(blob->data(), 10)).ok());
}

TEST_F(StateIo, SerializeChecksTokenCount) {
  Rng rng(3);
  const auto prompt = random_tokens(rng, 9);
  auto st = run(prompt);
  auto blob = forward::serialize_snapshot(*st, std::span<const int32_t>(prompt).first(8), {});
  ASSERT_FALSE(blob.ok());
  EXPECT_NE(blob.status().message().find("9 tokens"), std::string::npos);
}

TEST_F(StateIo, FingerprintSeparatesWeightsAndNumerics) {
  auto cfg = model::builtin_config("tiny-v41");
  ASSERT_TRUE(cfg.ok());
  flashseek::testing::TempDir other;
  ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 10}, other.path().string()).ok());
  auto a = forward::checkpoint_fingerprint(ckpt_.path().string(), "reference");
  auto b = forward::checkpoint_fingerprint(other.path().string(), "reference");
  auto c = forward::checkpoint_fingerprint(ckpt_.path().string(), "exact");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, fingerprint_);
  EXPECT_NE(*a, *b);  // same config, different random weights
  EXPECT_NE(*a, *c);
  auto missing = forward::checkpoint_fingerprint((other.path() / "nope").string(), "exact");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("config.json"), std::string::npos);
}

}  // namespace
}  // namespace flashseek::kvtest

namespace flashseek::kvtest {
namespace {

// Decodes a blob of `st` after `mutate` changed the decoded state and it was serialised again:
// the checksum is valid (re-computed), only the geometry is wrong.
Result<forward::DecodedSnapshot> reencoded(const forward::SequenceState& st,
                                           const std::vector<int32_t>& tokens, uint64_t fp,
                                           const forward::SnapshotGeometry& g,
                                           const std::function<void(forward::CpuSequenceState&,
                                                                    std::vector<int32_t>&)>& mutate) {
  auto copy = st.clone();
  auto& s = dynamic_cast<forward::CpuSequenceState&>(*copy);
  auto toks = tokens;
  mutate(s, toks);
  auto blob = forward::serialize_snapshot(s, toks, {fp, 1, 2, int64_t(toks.size()), 0});
  if (!blob.ok()) return blob.status();
  return forward::deserialize_snapshot(*blob, fp, g);
}

// Every field class of the state is checked against the model's geometry, each with a blob whose
// checksum is valid (so the checksum cannot be what catches it). Before, such a state was used:
// a wrong ring size gave a division by zero (SIGFPE) and short vectors out-of-bounds reads and
// writes in the forward pass.
TEST_F(StateIo, ValidChecksumWithWrongGeometryIsRejected) {
  Rng rng(7);
  // Sealed pages, full windows, Engram, DSpark; odd, so ratio-2 compressors hold an open group.
  const auto prompt = random_tokens(rng, 151);
  auto st = run(prompt);
  using S = forward::CpuSequenceState;
  using T = std::vector<int32_t>;
  // Unchanged, it decodes (the mutations below are the only difference).
  ASSERT_TRUE(reencoded(*st, prompt, fingerprint_, geometry_, [](S&, T&) {}).ok());
  int kv = -1;  // a layer with compressed rows and a compressor with an open group
  for (int l = 0; l < int(geometry_.layers.size()); ++l)
    if (geometry_.layers[size_t(l)].ckv.ratio > 1 && geometry_.layers[size_t(l)].comp.ratio > 1)
      kv = l;
  int ik = -1;  // a layer with index keys
  for (int l = 0; l < int(geometry_.layers.size()); ++l)
    if (geometry_.layers[size_t(l)].ikeys.ratio > 0) ik = l;
  ASSERT_GE(ik, 0);
  ASSERT_GE(kv, 0);
  int plain = -1;  // a layer that never holds compressed rows
  for (int l = 0; l < int(geometry_.layers.size()); ++l)
    if (geometry_.layers[size_t(l)].ckv.ratio == 0) plain = l;
  ASSERT_GE(plain, 0);
  ASSERT_GT(geometry_.engram_keep, 0);
  ASSERT_GT(geometry_.draft_stages, 0);
  const std::vector<std::pair<std::string, std::function<void(S&, T&)>>> cases = {
      {"ring size", [](S& s, T&) { s.ring_size = 0; }},
      {"layer count", [](S& s, T&) { s.layers.pop_back(); }},
      {"extra layer", [](S& s, T&) { s.layers.push_back(s.layers.back()); }},
      {"window ring", [](S& s, T&) { s.layers[0].ring.resize(s.layers[0].ring.size() / 2); }},
      {"compressed rows", [&](S& s, T&) { s.layers[size_t(kv)].ckv.truncate(s.layers[size_t(kv)].ckv.size() - 1); }},
      {"compressed width", [&](S& s, T&) {
         auto rows = s.layers[size_t(kv)].ckv.to_vector();
         s.layers[size_t(kv)].ckv.reset(s.layers[size_t(kv)].ckv.width() / 2);
         s.layers[size_t(kv)].ckv.append(rows);
       }},
      {"index keys", [&](S& s, T&) { s.layers[size_t(ik)].ikeys.clear(); }},
      {"rows on a layer without any", [&](S& s, T&) {
         auto& l = s.layers[size_t(plain)];
         l.ckv.append(std::vector<float>(size_t(l.ckv.width()), 1.0f));
       }},
      {"pending count", [&](S& s, T&) { s.layers[size_t(kv)].comp.n_pend += 1; }},
      {"open group", [&](S& s, T&) { s.layers[size_t(kv)].comp.v.push_back(1.0f); }},
      {"gate rows", [&](S& s, T&) { s.layers[size_t(kv)].comp.z.clear(); }},
      {"history start", [&](S& s, T&) { s.layers[size_t(kv)].comp.hist_first -= 1; }},
      {"history width", [&](S& s, T&) { s.layers[size_t(kv)].comp.hist_v.pop_back(); }},
      {"unused compressor", [](S& s, T&) { s.layers[0].icomp.n_pend = 1; }},
      {"Engram history length", [](S& s, T&) { s.engram_hist.push_back(s.engram_hist.back()); }},
      {"Engram id", [](S& s, T&) { s.engram_hist.back() = -5; }},
      {"DSpark ring count", [](S& s, T&) { s.draft_rings.pop_back(); }},
      {"DSpark ring size", [](S& s, T&) { s.draft_rings[0].resize(3); }},
      {"MTP ring on a model without MTP", [](S& s, T&) { s.mtp_ring.assign(16, 0.0f); }},
      {"MTP history", [](S& s, T&) { s.mtp_hist_x.assign(16, 0.0f); }},
      {"token id", [&](S&, T& t) { t[3] = int32_t(model_->config().vocab_size); }},
  };
  for (const auto& [what, mutate] : cases) {
    auto d = reencoded(*st, prompt, fingerprint_, geometry_, mutate);
    EXPECT_FALSE(d.ok()) << what;
  }
  // Longer than the serving context: refused (and the blob bound covers every valid state).
  auto small = geometry_;
  small.max_tokens = 100;
  EXPECT_FALSE(reencoded(*st, prompt, fingerprint_, small, [](S&, T&) {}).ok());
  auto blob = forward::serialize_snapshot(*st, prompt, {fingerprint_, 1, 2, 151, 0});
  ASSERT_TRUE(blob.ok());
  EXPECT_LE(blob->size(), forward::max_snapshot_bytes(geometry_));
}

// The geometry derived from the configs matches every state the models produce: V4 (MTP,
// overlapping ratio-4 compressors with indexer compressors, ratio 128) and V4.1 (Engram, DSpark),
// at lengths around the ratios and after rollbacks.
TEST(StateGeometry, RealStatesOfBothFamiliesFit) {
  for (const char* name : {"tiny-v4", "tiny-v41"}) {
    SCOPED_TRACE(name);
    auto cfg = model::builtin_config(name);
    ASSERT_TRUE(cfg.ok());
    flashseek::testing::TempDir dir;
    ASSERT_TRUE(model::make_tiny_checkpoint(*cfg, {.seed = 3}, dir.path().string()).ok());
    auto m = forward::load_model(dir.path().string(), forward::Numerics::kExact);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    auto g = forward::checkpoint_snapshot_geometry(dir.path().string(), 4096);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    Rng rng(9);
    auto st = (*m)->new_sequence();
    int64_t len = 0;
    for (int64_t step : {1, 2, 5, 130, 3, 1, 140}) {
      std::vector<int32_t> t(static_cast<size_t>(step));
      for (auto& x : t) x = int32_t(rng.below(uint64_t(cfg->vocab_size)));
      forward::BatchItem item{st.get(), t, false};
      std::vector<float> logits;
      ASSERT_TRUE((*m)->forward({&item, 1}, logits).ok());
      len += step;
      const auto& cs = dynamic_cast<const forward::CpuSequenceState&>(*st);
      Status ok = forward::validate_state(cs, *g);
      EXPECT_TRUE(ok.ok()) << "len " << len << ": " << ok.to_string();
      if (len > 8) {  // a rollback keeps the state valid
        auto back = st->clone();
        ASSERT_TRUE((*m)->rollback(*back, len - 5).ok());
        Status rb = forward::validate_state(dynamic_cast<const forward::CpuSequenceState&>(*back), *g);
        EXPECT_TRUE(rb.ok()) << "rollback to " << len - 5 << ": " << rb.to_string();
      }
    }
  }
}

}  // namespace
}  // namespace flashseek::kvtest
