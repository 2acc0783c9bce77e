// fs:events subscription: a server's view of remote owners follows the published announcements;
// a snapshot whose owner announced its eviction is skipped by find() even while a (stale)
// registry entry still names that owner, a new announcement makes it findable again, and the
// listener resubscribes after Redis restarts.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "kvshare/registry.h"
#include "redis_util.h"

namespace flashseek::kvtest {
namespace {

// PUBLISH with a payload containing spaces (RedisServer::query splits on spaces).
void publish(const RedisServer& redis, const std::string& message) {
  redisContext* c = redisConnect("127.0.0.1", redis.port());
  ASSERT_TRUE(c && !c->err);
  freeReplyObject(redisCommand(c, "PUBLISH fs:events %s", message.c_str()));
  redisFree(c);
}

bool eventually(const std::function<bool()>& f, int timeout_ms = 8000) {
  for (int i = 0; i < timeout_ms / 50; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return f();
}

TEST(RegistryEvents, EvictionsSkipStaleOwnersAndListenerResubscribes) {
  if (!have_redis()) FS_SKIP_UNLESS_CI("needs /usr/bin/redis-server");
  RedisServer redis(free_port());
  kvshare::Registry a({redis.url(), "a", "127.0.0.1:1"});
  kvshare::Registry b({redis.url(), "b", "127.0.0.1:2"});
  const uint64_t hashes[] = {0x22};
  const std::string key = "HGET fs:snap:0000000000000022 owner";
  ASSERT_TRUE(eventually([&] { return b.subscribed(); }));
  a.announce(0x22, 1, 5, 100);
  ASSERT_TRUE(eventually([&] { return b.find(hashes).has_value(); }));
  ASSERT_TRUE(eventually([&] { return b.view_size() == 1; }));

  // An eviction event whose registry delete never landed: b stops offering a's entry at once.
  publish(redis, "evict 0000000000000022 a");
  ASSERT_TRUE(eventually([&] { return !b.find(hashes); }));
  EXPECT_EQ(redis.query(key), "a");  // the entry is still there: skipped through the view
  EXPECT_GE(b.stale_skipped(), 1);
  EXPECT_EQ(b.view_size(), 0u);
  a.announce(0x22, 1, 5, 100);  // re-announced ("own"): findable again
  ASSERT_TRUE(eventually([&] { return b.find(hashes).has_value(); }));

  // Redis restarts: b resubscribes (a re-announces), and later events reach it again.
  redis.stop();
  ASSERT_TRUE(eventually([&] { return !b.subscribed(); }));
  redis.start();
  ASSERT_TRUE(redis.wait_for(key, "a"));
  ASSERT_TRUE(eventually([&] { return b.subscribed() && b.find(hashes).has_value(); }));
  publish(redis, "evict 0000000000000022 a");
  ASSERT_TRUE(eventually([&] { return !b.find(hashes); }));
  const int64_t seen = b.events();
  EXPECT_GE(seen, 3);

}

}  // namespace
}  // namespace flashseek::kvtest
