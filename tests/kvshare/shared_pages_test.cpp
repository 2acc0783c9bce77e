// Pages shared between snapshots (host tier): two snapshots of one conversation hold the sealed
// pages of compressed KV / index keys once, so together they take less than their two
// self-contained blobs; both restore exactly (also after the first is evicted); blobs served to
// peers are self-contained; a thin blob never decodes without all of its pages.
#include <gtest/gtest.h>

#include "engine/state_cache.h"
#include "kv_test_util.h"

namespace flashseek::kvtest {
namespace {

using SharedPages = TinyModel;

TEST_F(SharedPages, TwoTurnsShareTheirPagesAndBothRestoreExactly) {
  auto cache = engine::StateCache::open(cache_opts(int64_t(1) << 30));
  ASSERT_TRUE(cache.ok());
  Rng rng(21);
  const auto turn2 = random_tokens(rng, 700);  // turn 1 = its first 600 tokens
  const std::vector<int32_t> turn1(turn2.begin(), turn2.begin() + 600);
  auto st1 = run(turn1);
  auto st2 = st1->clone();  // the conversation goes on from turn 1's state
  advance(*st2, std::span<const int32_t>(turn2).subspan(600));
  const auto full1 = forward::serialize_snapshot(*st1, turn1, {fingerprint_, 1, 0, 600, 0});
  const auto full2 = forward::serialize_snapshot(*st2, turn2, {fingerprint_, 1, 0, 700, 0});
  ASSERT_TRUE(full1.ok() && full2.ok());

  (*cache)->put(1, turn1, *st1);
  (*cache)->flush();
  const auto one = (*cache)->stats();
  ASSERT_GT(one.host_pages, 0) << "turn 1 must hold sealed pages for this test to mean anything";
  (*cache)->put(1, turn2, *st2);
  (*cache)->flush();
  const auto two = (*cache)->stats();
  EXPECT_EQ(two.host_entries, 2);
  // Turn 2 adds only its new pages: the shared ones are counted once.
  EXPECT_LT(two.host_bytes, int64_t(full1->size() + full2->size()));
  EXPECT_LT(two.host_bytes - one.host_bytes, int64_t(full2->size()) - one.host_page_bytes / 2);
  EXPECT_GT(two.host_pages, one.host_pages);
  const int64_t unique = two.host_pages;

  auto restores = [&](const std::vector<int32_t>& tokens, int64_t n) {
    auto seq = tokens;
    seq.push_back(3);
    auto hit = (*cache)->lookup(1, seq, int64_t(seq.size()) - 1);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->n_tokens, n);
    auto mine = hit->state->clone();
    std::vector<float> a, b;
    advance(*mine, std::span<const int32_t>(seq).subspan(size_t(n)), &a);
    run(seq, &b);
    EXPECT_EQ(a, b);
  };
  restores(turn1, 600);
  restores(turn2, 700);

  // Served to a peer: self-contained and byte-identical to a direct serialisation.
  const uint64_t k1 = engine::prefix_hashes(1, turn1).back();
  const uint64_t k2 = engine::prefix_hashes(1, turn2).back();
  auto served = (*cache)->blob(k2);
  ASSERT_TRUE(served);
  auto decoded = forward::deserialize_snapshot(*served, fingerprint_, geometry_);
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  forward::SnapshotHeader h2{fingerprint_, 1, k2, 700, 0};
  EXPECT_EQ(*served, *forward::serialize_snapshot(*st2, turn2, h2));

  // Turn 1 gone: turn 2 keeps the pages it references and still restores exactly.
  (*cache)->erase(k1);
  const auto after = (*cache)->stats();
  EXPECT_EQ(after.host_entries, 1);
  EXPECT_EQ(after.host_pages, unique);  // every page of turn 1 is also in turn 2
  restores(turn2, 700);
  (*cache)->erase(k2);
  EXPECT_EQ((*cache)->stats().host_pages, 0);
  EXPECT_EQ((*cache)->stats().host_bytes, 0);
}

// Serves one blob as the "peer" for every lookup.
class OnePeer final : public engine::RemoteTier {
 public:
  explicit OnePeer(std::vector<uint8_t> blob) : blob_(std::move(blob)) {}
  std::optional<std::vector<uint8_t>> fetch_longest(uint64_t, std::span<const uint64_t>) override {
    return blob_;
  }
  void on_stored(uint64_t, uint64_t, int64_t, int64_t) override {}
  void on_dropped(uint64_t) override {}

 private:
  std::vector<uint8_t> blob_;
};

TEST_F(SharedPages, FetchedSnapshotJoinsThePageStore) {
  Rng rng(23);
  const auto turn2 = random_tokens(rng, 700);
  const std::vector<int32_t> turn1(turn2.begin(), turn2.begin() + 600);
  auto st1 = run(turn1);
  const uint64_t k1 = engine::prefix_hashes(1, turn1).back();
  auto full1 = forward::serialize_snapshot(*st1, turn1, {fingerprint_, 1, k1, 600, 0});
  ASSERT_TRUE(full1.ok());
  auto cache = engine::StateCache::open(cache_opts(int64_t(1) << 30));
  ASSERT_TRUE(cache.ok());
  OnePeer peer(*full1);
  (*cache)->set_remote(&peer);
  auto hit = (*cache)->lookup(1, turn2, 650);  // turn 2 arrives here; turn 1 lives on the peer
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->tier, engine::CacheTier::kRemote);
  EXPECT_EQ(hit->n_tokens, 600);
  (*cache)->flush();
  const auto one = (*cache)->stats();
  EXPECT_GT(one.host_pages, 0);  // stored thin, its pages in the store
  EXPECT_EQ(*(*cache)->blob(k1), *full1);
  auto st2 = hit->state->clone();  // the conversation continues from the fetched state
  advance(*st2, std::span<const int32_t>(turn2).subspan(600));
  (*cache)->put(1, turn2, *st2);
  (*cache)->flush();
  const auto two = (*cache)->stats();
  auto full2 = forward::serialize_snapshot(*st2, turn2, {fingerprint_, 1, 0, 700, 0});
  ASSERT_TRUE(full2.ok());
  EXPECT_LT(two.host_bytes - one.host_bytes, int64_t(full2->size()) - one.host_page_bytes / 2);
  (*cache)->set_remote(nullptr);
}

TEST_F(SharedPages, ThinBlobsNeedTheirPages) {
  Rng rng(22);
  const auto t = random_tokens(rng, 300);
  auto st = run(t);
  std::vector<forward::PagePtr> kept;
  const forward::PageSink sink = [&](const forward::PagePtr& p) -> std::optional<uint64_t> {
    kept.push_back(p);
    return uint64_t(kept.size() - 1);
  };
  auto thin = forward::serialize_snapshot(*st, t, {fingerprint_, 1, 0, 300, 0}, &sink);
  ASSERT_TRUE(thin.ok());
  ASSERT_FALSE(kept.empty());
  auto refs = forward::snapshot_page_refs(*thin);
  ASSERT_TRUE(refs.ok());
  EXPECT_EQ(refs->size(), kept.size());
  EXPECT_FALSE(forward::deserialize_snapshot(*thin, fingerprint_, geometry_).ok());  // no page source
  const forward::PageSource missing_one = [&](uint64_t k) -> const forward::PagedRows::Page* {
    return k + 1 == kept.size() ? nullptr : kept[k].get();
  };
  EXPECT_FALSE(forward::deserialize_snapshot(*thin, fingerprint_, geometry_, &missing_one).ok());
  const forward::PageSource all = [&](uint64_t k) -> const forward::PagedRows::Page* {
    return k < kept.size() ? kept[k].get() : nullptr;
  };
  auto d = forward::deserialize_snapshot(*thin, fingerprint_, geometry_, &all);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(*forward::serialize_snapshot(*d->state, t, {fingerprint_, 1, 0, 300, 0}),
            *forward::serialize_snapshot(*st, t, {fingerprint_, 1, 0, 300, 0}));
}

}  // namespace
}  // namespace flashseek::kvtest
