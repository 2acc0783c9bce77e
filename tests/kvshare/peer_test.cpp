// Peer transport and registry units: mutual HMAC handshake (wrong secret refused and counted, an
// owner with an unexpected id refused, proofs relayed through a fake owner never verify), every
// snapshot MAC-checked (a changed one is refused), sizes announced by peers capped before any
// allocation, peers served concurrently with bounded handshakes; GET of a missing or other
// tenant's snapshot, PUT verified by the receiver, unreachable peers fail fast; Redis URLs.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "engine/state_cache.h"
#include "kv_test_util.h"
#include "kvshare/peer.h"
#include "kvshare/registry.h"
#include "redis_util.h"

namespace flashseek::kvtest {
namespace {

using Clock = std::chrono::steady_clock;

// A loopback listening socket on a free port.
struct Listener {
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd, 8);
    socklen_t len = sizeof(a);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
  // Accepts one connection, waiting at most timeout_ms; -1 if none came.
  int accept_one(int timeout_ms = 5000) const {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return -1;
    return ::accept(fd, nullptr, nullptr);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  int fd = -1;
  int port = 0;
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Copies bytes both ways between two sockets until either side closes (bounded by timeout_ms).
void pump(int a, int b, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  uint8_t buf[65536];
  while (Clock::now() < deadline) {
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    if (::poll(p, 2, 50) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = ::recv(p[i].fd, buf, sizeof(buf), 0);
      if (n <= 0) return;
      if (::send(i == 0 ? b : a, buf, size_t(n), MSG_NOSIGNAL) != n) return;
    }
  }
}

// A "fake owner" someone with write access to Redis registered: it relays every connection to
// `target_port` (a real server) and records whether it saw any reply beyond the handshake.
struct RelayOwner {
  explicit RelayOwner(int target_port) {
    thread = std::thread([this, target_port] {
      while (!stop) {
        const int in = listener.accept_one(100);
        if (in < 0) continue;
        const int out = connect_to(target_port);
        if (out >= 0) pump(in, out, 5000);
        ::close(in);
        if (out >= 0) ::close(out);
      }
    });
  }
  ~RelayOwner() {
    stop = true;
    thread.join();
  }
  Listener listener;
  std::atomic<bool> stop{false};
  std::thread thread;
};

// The owner counts a GET after its last write returns, which may be just after the fetcher has
// the bytes: waits (bounded) for the count.
int64_t served_soon(const kvshare::SnapshotServer& s, int64_t want) {
  for (int i = 0; i < 500 && s.served() < want; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return s.served();
}

class PeerTest : public TinyModel {
 protected:
  std::unique_ptr<engine::StateCache> cache() {
    auto c = engine::StateCache::open(cache_opts(1 << 24));
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<kvshare::SnapshotServer> server(engine::StateCache& c, const std::string& id,
                                                  const std::string& secret = "right",
                                                  int handshake_ms = 1000, int max_peers = 16) {
    kvshare::SnapshotServerOptions o;
    o.auth = {secret, id};
    o.timeout_ms = 2000;
    o.handshake_timeout_ms = handshake_ms;
    o.max_peers = max_peers;
    o.enable_ucx = false;
    auto s = std::make_unique<kvshare::SnapshotServer>(c, std::move(o));
    auto port = s->start("127.0.0.1", 0);
    EXPECT_TRUE(port.ok()) << port.status().to_string();
    return s;
  }
  // Stores the state after `n` random tokens for `tenant`; returns (tokens, key).
  std::pair<std::vector<int32_t>, uint64_t> put(engine::StateCache& c, uint64_t tenant, int n,
                                                uint64_t seed) {
    Rng rng(seed);
    auto t = random_tokens(rng, n);
    c.put(tenant, t, *run(t));
    c.flush();
    return {t, engine::prefix_hashes(tenant, t).back()};
  }
  const kvshare::PeerAuth me_{"right", "fetcher"};
};

TEST_F(PeerTest, AuthenticatedGetAndVerifiedPut) {
  auto src = cache(), dst = cache();
  const auto [t, key] = put(*src, 4, 19, 3);
  auto owner = server(*src, "owner");
  const kvshare::PeerAddress at{owner->advertise(), "owner"};
  const uint64_t max = src->max_snapshot_bytes();

  auto good = kvshare::fetch_snapshot(at, me_, key, 4, 1000, max);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(*good, *src->blob(key));
  EXPECT_EQ(served_soon(*owner, 1), 1);
  EXPECT_FALSE(kvshare::fetch_snapshot(at, {"wrong", "fetcher"}, key, 4, 1000, max).ok());
  EXPECT_EQ(owner->rejected(), 1);
  // The registry named another owner for this address: the fetcher refuses the server.
  auto impostor = kvshare::fetch_snapshot({at.address, "someone-else"}, me_, key, 4, 1000, max);
  ASSERT_FALSE(impostor.ok());
  EXPECT_EQ(impostor.status().code(), StatusCode::kInvalidArgument);
  auto other_tenant = kvshare::fetch_snapshot(at, me_, key, 5, 1000, max);
  ASSERT_FALSE(other_tenant.ok());
  EXPECT_EQ(other_tenant.status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(kvshare::fetch_snapshot(at, me_, key ^ 1, 4, 1000, max).ok());

  // PUT: the receiving server verifies the blob; a corrupted one is refused.
  auto sink = server(*dst, "sink");
  const kvshare::PeerAddress sink_at{sink->advertise(), "sink"};
  auto bad = *good;
  bad[bad.size() / 2] ^= 0x40;
  EXPECT_FALSE(kvshare::push_snapshot(sink_at, me_, bad, 1000).ok());
  EXPECT_FALSE(kvshare::push_snapshot(sink_at, {"wrong", "fetcher"}, *good, 1000).ok());
  EXPECT_EQ(dst->stats().puts, 0);
  ASSERT_TRUE(kvshare::push_snapshot(sink_at, me_, *good, 1000).ok());
  EXPECT_EQ(dst->stats().puts, 1);
  EXPECT_TRUE(dst->blob(key));

  const int dead = free_port();
  auto unreachable =
      kvshare::fetch_snapshot({"127.0.0.1:" + std::to_string(dead), ""}, me_, key, 4, 500, max);
  ASSERT_FALSE(unreachable.ok());
  EXPECT_EQ(unreachable.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(kvshare::fetch_snapshot({"no-port-here", ""}, me_, key, 4, 500, max).ok());
}

// Someone who can write to Redis registers a fake owner whose address relays to a real server.
// Before the mutual handshake the relay made the victim answer its own server's challenge (and
// read / push snapshots); now the proofs are bound to both ids and the dialed address and the
// relay gets nothing.
TEST_F(PeerTest, RelayedHandshakeThroughAFakeOwnerIsRefused) {
  auto v_cache = cache(), w_cache = cache();
  const auto [tv, key_v] = put(*v_cache, 4, 17, 11);
  const auto [tw, key_w] = put(*w_cache, 4, 18, 12);
  auto v = server(*v_cache, "V");  // the victim's own endpoint
  auto w = server(*w_cache, "W");  // another honest server
  const kvshare::PeerAuth victim{"right", "V"};
  const uint64_t max = v_cache->max_snapshot_bytes();

  // (a) The registry names the victim itself as owner, at the fake address: its own proof would
  // be reflected back to its own endpoint.
  {
    RelayOwner fake(std::stoi(v->advertise().substr(10)));
    auto got = kvshare::fetch_snapshot({fake.listener.address(), "V"}, victim, key_v, 4, 1500, max);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << got.status().to_string();
    EXPECT_FALSE(kvshare::push_snapshot({fake.listener.address(), "V"}, victim,
                                        *v_cache->blob(key_v), 1500).ok());
  }
  // (b) The registry names W as owner, at the fake address relaying to W: W sees a proof for
  // another address and refuses it.
  {
    RelayOwner fake(std::stoi(w->advertise().substr(10)));
    auto got = kvshare::fetch_snapshot({fake.listener.address(), "W"}, victim, key_w, 4, 1500, max);
    ASSERT_FALSE(got.ok());
    EXPECT_GE(w->rejected(), 1);
  }
  EXPECT_EQ(v->served(), 0);
  EXPECT_EQ(w->served(), 0);
  EXPECT_EQ(v_cache->stats().puts, 1);  // nothing pushed through the relay
  // The honest path still works for both.
  EXPECT_TRUE(kvshare::fetch_snapshot({w->advertise(), "W"}, victim, key_w, 4, 1500, max).ok());
}

// A fake owner that holds the secret (it passes the handshake) but sends a snapshot whose bytes
// differ from its MAC (changed in transit), or announces a snapshot far larger than this model's
// largest: the first is refused as a MAC failure, the second before anything is allocated.
TEST_F(PeerTest, ChangedOrOversizeSnapshotsAreRefused) {
  auto src = cache();
  const auto [t, key] = put(*src, 4, 21, 5);
  const auto blob = *src->blob(key);
  const uint64_t max = src->max_snapshot_bytes();
  Listener l;
  enum Mode { kFlip, kHuge };
  auto serve_once = [&](Mode mode) {
    const int fd = l.accept_one();
    if (fd < 0) return;
    kvshare::PeerSession s;
    s.fd = fd;
    s.deadline = Clock::now() + std::chrono::seconds(5);
    if (kvshare::accept_peer(s, {"right", "owner"}, l.address()).ok()) {
      std::vector<uint8_t> req;
      s.recv(req);
      const auto tag = kvshare::snapshot_mac("right", blob);
      std::vector<uint8_t> reply = {1};  // offer
      const uint64_t n = mode == kHuge ? uint64_t(1) << 36 : blob.size();
      reply.insert(reply.end(), reinterpret_cast<const uint8_t*>(&n),
                   reinterpret_cast<const uint8_t*>(&n) + 8);
      reply.insert(reply.end(), tag.begin(), tag.end());
      s.send(reply);
      if (mode == kFlip) {
        auto changed = blob;
        changed[changed.size() - 20] ^= 1;  // e.g. a token id or a trailer byte
        ::send(fd, changed.data(), changed.size(), MSG_NOSIGNAL);
      }
      uint8_t sink[16];
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 3000) > 0) (void)::recv(fd, sink, sizeof(sink), 0);  // until it hangs up
    }
    ::close(fd);
  };
  {
    std::thread owner([&] { serve_once(kFlip); });
    auto got = kvshare::fetch_snapshot({l.address(), "owner"}, me_, key, 4, 3000, max);
    owner.join();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kParseError) << got.status().to_string();
  }
  {
    std::thread owner([&] { serve_once(kHuge); });
    auto got = kvshare::fetch_snapshot({l.address(), "owner"}, me_, key, 4, 3000, max);
    owner.join();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kOutOfRange) << got.status().to_string();
  }
  // A push larger than the receiver's maximum is refused unread.
  auto dst = cache();
  auto sink = server(*dst, "sink");
  std::vector<uint8_t> huge(size_t(dst->max_snapshot_bytes()) + 1, 0x11);
  EXPECT_FALSE(kvshare::push_snapshot({sink->advertise(), "sink"}, me_, huge, 3000).ok());
  EXPECT_EQ(sink->oversize(), 1);
  EXPECT_EQ(dst->stats().puts, 0);
}

// Peers are served concurrently: a connection that never speaks does not delay others; at most
// max_peers are served at once (more are closed at once), and a silent one is dropped when its
// handshake deadline passes.
TEST_F(PeerTest, StalledPeersNeitherBlockOthersNorHoldSlotsForever) {
  auto src = cache();
  const auto [t, key] = put(*src, 4, 15, 9);
  auto owner = server(*src, "owner", "right", /*handshake_ms=*/4000, /*max_peers=*/2);
  const int port = std::stoi(owner->advertise().substr(10));
  const kvshare::PeerAddress at{owner->advertise(), "owner"};
  const uint64_t max = src->max_snapshot_bytes();
  auto wait_active = [&](int n) {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (owner->active() != n && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return owner->active();
  };

  const int stalled = connect_to(port);  // connects, never answers the challenge
  ASSERT_GE(stalled, 0);
  ASSERT_EQ(wait_active(1), 1);
  // Served one at a time, this fetch would wait behind the stalled peer past its own timeout.
  auto got = kvshare::fetch_snapshot(at, me_, key, 4, 1000, max);
  ASSERT_TRUE(got.ok()) << got.status().to_string();

  const int stalled2 = connect_to(port);
  ASSERT_GE(stalled2, 0);
  ASSERT_EQ(wait_active(2), 2);
  auto busy = kvshare::fetch_snapshot(at, me_, key, 4, 1000, max);
  EXPECT_FALSE(busy.ok());
  EXPECT_GE(owner->busy(), 1);

  // The handshake deadline frees both slots: the server hangs up on the silent peers.
  for (int fd : {stalled, stalled2}) {
    uint8_t buf[256];
    ssize_t n = 1;
    pollfd p{fd, POLLIN, 0};
    while (n > 0 && ::poll(&p, 1, 10000) > 0) n = ::recv(fd, buf, sizeof(buf), 0);
    EXPECT_EQ(n, 0) << "the server closes a peer that does not finish the handshake";
    ::close(fd);
  }
  ASSERT_EQ(wait_active(0), 0);
  auto again = kvshare::fetch_snapshot(at, me_, key, 4, 1000, max);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(served_soon(*owner, 2), 2);
}

TEST(RegistryUrl, Parses) {
  auto a = kvshare::parse_redis_url("redis://10.0.0.5:6380/0");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 6380);
  EXPECT_TRUE(a->password.empty());
  auto b = kvshare::parse_redis_url("redis://user:p%40ss@cache");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "cache");
  EXPECT_EQ(b->port, 6379);
  EXPECT_EQ(b->user, "user");
  EXPECT_EQ(b->password, "p@ss");
  auto c = kvshare::parse_redis_url("redis://:only-pw@h:7000");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->user, "");
  EXPECT_EQ(c->password, "only-pw");
  EXPECT_FALSE(c->tls);
  auto tls = kvshare::parse_redis_url("rediss://:pw@h:6380");
  ASSERT_TRUE(tls.ok());
  EXPECT_TRUE(tls->tls);
  EXPECT_EQ(tls->host, "h");
  EXPECT_EQ(tls->port, 6380);
  EXPECT_EQ(tls->password, "pw");
  for (const char* bad : {"redis://host:port", "redis://:6379", "redis://h:0", "redis://h:99999",
                          "redis://h:12x", "redis://u:%4@h", "http://h:1", "redis://user:@h"}) {
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
