// Disk tier under --cache-dir-bytes: least recently used files are removed first (and their
// eviction is reported to the remote tier, i.e. published), the budget holds across restarts
// (recency survives through file mtimes), and snapshots found on disk at start are announced
// to the remote tier when it attaches.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "engine/state_cache.h"
#include "kv_test_util.h"

namespace flashseek::kvtest {
namespace {

using engine::StateCache;
namespace fs = std::filesystem;

// Records what the cache tells its remote tier.
class Recorder final : public engine::RemoteTier {
 public:
  std::optional<std::vector<uint8_t>> fetch_longest(uint64_t, std::span<const uint64_t>) override {
    return std::nullopt;
  }
  void on_stored(uint64_t hash, uint64_t, int64_t, int64_t) override { stored.insert(hash); }
  void on_dropped(uint64_t hash) override { dropped.insert(hash); }
  std::set<uint64_t> stored, dropped;
};

class DiskBudget : public TinyModel {
 protected:
  std::unique_ptr<StateCache> open(const fs::path& dir, int64_t dir_bytes) {
    auto o = cache_opts(0, dir.string());
    o.dir_bytes = dir_bytes;
    auto c = StateCache::open(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  void put(StateCache& c, const std::vector<int32_t>& tokens) {
    c.put(1, tokens, *run(tokens));
    c.flush();
  }
  bool hits(StateCache& c, std::vector<int32_t> tokens) {
    const int64_t n = int64_t(tokens.size());
    tokens.push_back(7);
    auto hit = c.lookup(1, tokens, n);
    return hit && hit->n_tokens == n;
  }
  static uint64_t key(const std::vector<int32_t>& t) { return engine::prefix_hashes(1, t).back(); }
};

TEST_F(DiskBudget, LeastRecentlyUsedFilesGoFirstAndEvictionsArePublished) {
  flashseek::testing::TempDir dir;
  Rng rng(8);
  const auto a = random_tokens(rng, 20), b = random_tokens(rng, 20), c = random_tokens(rng, 20);
  int64_t one = 0;  // bytes of one snapshot of 20 tokens
  {
    flashseek::testing::TempDir probe;
    auto p = open(probe.path(), 0);
    put(*p, a);
    one = p->stats().disk_bytes;
  }
  ASSERT_GT(one, 0);
  {
    auto cache = open(dir.path(), 2 * one + one / 2);  // room for two
    Recorder rec;
    cache->set_remote(&rec);
    put(*cache, a);
    put(*cache, b);
    ASSERT_TRUE(hits(*cache, a));  // a is now more recent than b
    put(*cache, c);                // over budget: b goes
    const auto s = cache->stats();
    EXPECT_EQ(s.disk_evictions, 1);
    EXPECT_EQ(s.disk_entries, 2);
    EXPECT_LE(s.disk_bytes, 2 * one + one / 2);
    EXPECT_FALSE(fs::exists(dir.path() / fmt::format("{:016x}.fss", key(b))));
    EXPECT_EQ(rec.dropped, std::set<uint64_t>{key(b)});
    EXPECT_EQ(rec.stored, (std::set<uint64_t>{key(a), key(b), key(c)}));
    EXPECT_FALSE(hits(*cache, b));
    EXPECT_TRUE(hits(*cache, c));
    EXPECT_TRUE(hits(*cache, a));  // a is the most recent again
    cache->set_remote(nullptr);
  }
  // Restart with room for one: the least recently used file (c) goes at start; what is left is
  // announced when the remote tier attaches.
  auto cache = open(dir.path(), one + one / 2);
  const auto s = cache->stats();
  EXPECT_EQ(s.disk_entries, 1);
  EXPECT_EQ(s.disk_evictions, 1);
  Recorder rec;
  cache->set_remote(&rec);
  EXPECT_EQ(rec.stored, std::set<uint64_t>{key(a)});
  EXPECT_TRUE(hits(*cache, a));
  EXPECT_FALSE(hits(*cache, c));
  cache->set_remote(nullptr);
  auto negative = cache_opts(0, dir.path().string());
  negative.dir_bytes = -1;
  EXPECT_FALSE(StateCache::open(std::move(negative)).ok());
}

}  // namespace
}  // namespace flashseek::kvtest
