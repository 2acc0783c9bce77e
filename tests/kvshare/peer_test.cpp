// Peer transport and registry units: HMAC handshake (wrong secret refused and counted), GET of a
// missing or other tenant's snapshot, PUT verified by the receiver, unreachable peers fail fast
// with an error; Redis URL parsing.
#include <gtest/gtest.h>

#include "engine/state_cache.h"
#include "kv_test_util.h"
#include "kvshare/peer.h"
#include "kvshare/registry.h"
#include "redis_util.h"

namespace flashseek::kvtest {
namespace {

using PeerTest = TinyModel;

TEST_F(PeerTest, AuthenticatedGetAndVerifiedPut) {
  auto src = engine::StateCache::open({fingerprint_, 1 << 24, {}, 2});
  auto dst = engine::StateCache::open({fingerprint_, 1 << 24, {}, 2});
  ASSERT_TRUE(src.ok() && dst.ok());
  Rng rng(3);
  const auto t = random_tokens(rng, 19);
  (*src)->put(4, t, *run(t));
  (*src)->flush();
  const uint64_t key = engine::prefix_hashes(4, t).back();
  kvshare::SnapshotServer server(**src, "right", 1000);
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  const std::string addr = "127.0.0.1:" + std::to_string(*port);

  auto good = kvshare::fetch_snapshot(addr, "right", key, 4, 1000);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(*good, *(*src)->blob(key));
  EXPECT_FALSE(kvshare::fetch_snapshot(addr, "wrong", key, 4, 1000).ok());
  EXPECT_EQ(server.rejected(), 1);
  auto other_tenant = kvshare::fetch_snapshot(addr, "right", key, 5, 1000);
  ASSERT_FALSE(other_tenant.ok());
  EXPECT_EQ(other_tenant.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(kvshare::fetch_snapshot(addr, "right", key ^ 1, 4, 1000).ok());

  // PUT: the receiving server verifies the blob; a corrupted one is refused.
  kvshare::SnapshotServer sink(**dst, "right", 1000);
  auto sink_port = sink.start("127.0.0.1", 0);
  ASSERT_TRUE(sink_port.ok());
  const std::string sink_addr = "127.0.0.1:" + std::to_string(*sink_port);
  auto bad = *good;
  bad[bad.size() / 2] ^= 0x40;
  EXPECT_FALSE(kvshare::push_snapshot(sink_addr, "right", bad, 1000).ok());
  EXPECT_FALSE(kvshare::push_snapshot(sink_addr, "wrong", *good, 1000).ok());
  EXPECT_EQ((*dst)->stats().puts, 0);
  ASSERT_TRUE(kvshare::push_snapshot(sink_addr, "right", *good, 1000).ok());
  EXPECT_EQ((*dst)->stats().puts, 1);
  EXPECT_TRUE((*dst)->blob(key));

  const int dead = free_port();
  auto unreachable = kvshare::fetch_snapshot("127.0.0.1:" + std::to_string(dead), "right", key, 4, 500);
  ASSERT_FALSE(unreachable.ok());
  EXPECT_EQ(unreachable.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(kvshare::fetch_snapshot("no-port-here", "right", key, 4, 500).ok());
}

TEST(RegistryUrl, Parses) {
  auto a = kvshare::parse_redis_url("redis://10.0.0.5:6380/0");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "10.0.0.5");
  EXPECT_EQ(a->second, 6380);
  auto b = kvshare::parse_redis_url("redis://user:pw@cache");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "cache");
  EXPECT_EQ(b->second, 6379);
  for (const char* bad : {"redis://host:port", "redis://:6379", "redis://h:0", "redis://h:99999",
                          "redis://h:12x"}) {
    auto r = kvshare::parse_redis_url(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--redis"), std::string::npos);
  }
}

TEST(Registry, WorksWithoutRedisAndFindsLivePeers) {
  if (!have_redis()) FS_SKIP_UNLESS_CI("needs /usr/bin/redis-server");
  const int port = free_port();
  kvshare::Registry a({"redis://127.0.0.1:" + std::to_string(port), "a", "127.0.0.1:1"});
  const uint64_t hashes[] = {11, 22};
  EXPECT_FALSE(a.find(hashes));  // no Redis yet: nothing, no error
  a.announce(22, 1, 5, 100);
  RedisServer redis(port);
  kvshare::Registry b({redis.url(), "b", "127.0.0.1:2"});
  // a reconnects and re-announces what it owns; b finds it (longest first), a does not find itself.
  ASSERT_TRUE(redis.wait_for("HGET fs:snap:0000000000000016 owner", "a"));
  for (int i = 0; i < 100 && !b.find(hashes); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto loc = b.find(hashes);
  ASSERT_TRUE(loc);
  EXPECT_EQ(loc->hash, 22u);
  EXPECT_EQ(loc->owner, "a");
  EXPECT_EQ(loc->address, "127.0.0.1:1");
  EXPECT_FALSE(a.find(hashes));
  EXPECT_EQ(b.peers().count("a"), 1u);
  a.withdraw(22);
  for (int i = 0; i < 100 && redis.query("HGET fs:snap:0000000000000016 owner"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(redis.query("HGET fs:snap:0000000000000016 owner"));
  EXPECT_FALSE(b.find(hashes));
}

}  // namespace
}  // namespace flashseek::kvtest
