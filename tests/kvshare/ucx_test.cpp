// Snapshot GET over UCX (one-sided ucp_get_nbx of the owner's registered memory) with
// UCX_TLS=tcp on loopback, as CI runs it: the bytes equal the owner's blob; a wrong secret never
// gets an rkey; another tenant's or an unknown snapshot is not found; a peer without UCX says so
// (the caller falls back to TCP); a peer that hands out an offer and then never progresses
// (hung / dead) costs at most the timeout, and the fetching node still works afterwards; a
// snapshot held thin (shared pages) is served self-contained.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "engine/state_cache.h"
#include "kv_test_util.h"
#include "kvshare/peer.h"
#include "kvshare/ucx.h"
#include "redis_util.h"

namespace flashseek::kvtest {
namespace {

// The owner counts a GET when the fetcher's completion message arrives, just after the fetch
// returns: waits (bounded) for the count.
int64_t served_ucx_soon(const kvshare::SnapshotServer& s, int64_t want) {
  for (int i = 0; i < 200 && s.served_ucx() < want; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return s.served_ucx();
}

// The tests run UCX over TCP sockets unless the caller picked transports.
void use_tcp_ucx() { setenv("UCX_TLS", "tcp", /*overwrite=*/0); }

class UcxPeerTest : public TinyModel {
 protected:
  void SetUp() override {
    if (!kvshare::ucx_built()) FS_SKIP_UNLESS_CI("this build has no UCX (libucx-dev)");
    use_tcp_ucx();
    TinyModel::SetUp();
  }
};

TEST_F(UcxPeerTest, GetIsAuthenticatedTenantScopedAndExact) {
  auto src = engine::StateCache::open(cache_opts(1 << 24));
  ASSERT_TRUE(src.ok());
  const uint64_t max = (*src)->max_snapshot_bytes();
  const kvshare::PeerAuth me{"right", "fetcher"};
  Rng rng(5);
  const auto t = random_tokens(rng, 23);
  (*src)->put(7, t, *run(t));
  (*src)->flush();
  const uint64_t key = engine::prefix_hashes(7, t).back();
  kvshare::SnapshotServer server(**src, {{"right", "owner"}, {}, 2000, 1000, 16, /*ucx=*/true});
  ASSERT_TRUE(server.ucx_enabled());
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  const kvshare::PeerAddress addr{"127.0.0.1:" + std::to_string(*port), "owner"};
  auto node = kvshare::UcxNode::create();
  ASSERT_TRUE(node.ok()) << node.status().to_string();

  for (int i = 0; i < 2; ++i) {  // the second GET reuses the owner's registration
    auto got = kvshare::fetch_snapshot_ucx(addr, me, key, 7, 2000, max, **node);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, *(*src)->blob(key));
  }
  EXPECT_EQ(served_ucx_soon(server, 2), 2);

  auto wrong = kvshare::fetch_snapshot_ucx(addr, {"wrong", "fetcher"}, key, 7, 2000, max, **node);
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(server.rejected(), 1);
  auto other = kvshare::fetch_snapshot_ucx(addr, me, key, 8, 2000, max, **node);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kNotFound);
  auto missing = kvshare::fetch_snapshot_ucx(addr, me, key ^ 1, 7, 2000, max, **node);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(served_ucx_soon(server, 3), 2);  // nothing more was served (yet)

  // A snapshot with sealed pages lives thin in the owner's memory: it is made self-contained for
  // the GET (and unregistered after it); the bytes equal a direct serialisation.
  const auto long_t = random_tokens(rng, 320);
  auto long_st = run(long_t);
  (*src)->put(7, long_t, *long_st);
  (*src)->flush();
  ASSERT_GT((*src)->stats().host_pages, 0);
  const uint64_t long_key = engine::prefix_hashes(7, long_t).back();
  auto thin = kvshare::fetch_snapshot_ucx(addr, me, long_key, 7, 2000, max, **node);
  ASSERT_TRUE(thin.ok()) << thin.status().to_string();
  EXPECT_EQ(*thin, *forward::serialize_snapshot(*long_st, long_t, {fingerprint_, 7, long_key, 320, 0}));
  EXPECT_EQ(served_ucx_soon(server, 3), 3);

  // An owner without UCX answers "unsupported"; its TCP path still serves the same bytes.
  kvshare::SnapshotServer tcp_only(**src, {{"right", "tcp-owner"}, {}, 2000, 1000, 16, false});
  auto tcp_port = tcp_only.start("127.0.0.1", 0);
  ASSERT_TRUE(tcp_port.ok());
  const kvshare::PeerAddress tcp_addr{"127.0.0.1:" + std::to_string(*tcp_port), "tcp-owner"};
  auto refused = kvshare::fetch_snapshot_ucx(tcp_addr, me, key, 7, 2000, max, **node);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
  auto tcp = kvshare::fetch_snapshot(tcp_addr, me, key, 7, 2000, max);
  ASSERT_TRUE(tcp.ok());
  EXPECT_EQ(*tcp, *(*src)->blob(key));

  // Nobody listening: fails fast as unavailable.
  auto dead = kvshare::fetch_snapshot_ucx({"127.0.0.1:" + std::to_string(free_port()), ""}, me,
                                          key, 7, 500, max, **node);
  ASSERT_FALSE(dead.ok());
  EXPECT_EQ(dead.status().code(), StatusCode::kUnavailable);
}

// A peer that passes the handshake and offers a registered region of a worker that is never
// progressed again: the fetcher's GET cannot complete and must give up at the timeout.
TEST_F(UcxPeerTest, HungOwnerCostsAtMostTheTimeout) {
  auto silent = kvshare::UcxNode::create();
  ASSERT_TRUE(silent.ok()) << silent.status().to_string();
  std::vector<uint8_t> data(1 << 20, 0x5a);
  auto region = (*silent)->map(data.data(), data.size(), kvshare::UcxAccess::kRemoteRead);
  ASSERT_TRUE(region.ok()) << region.status().to_string();

  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  int reported = -1;  // the fetcher's completion byte, as the hung owner received it
  std::thread fake([&] {
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    kvshare::PeerSession s;
    s.fd = fd;
    s.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::vector<uint8_t> request, done;
    if (kvshare::accept_peer(s, {"any", "hung"}, addr).ok() && s.recv(request)) {  // 'U', hash, tenant
      std::vector<uint8_t> offer = {1};
      auto put = [&](const void* p, size_t n) {
        offer.insert(offer.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
      };
      const uint64_t where[2] = {(*region)->size(), (*region)->address()};
      put(where, sizeof(where));
      const auto tag = kvshare::snapshot_mac("any", data);
      put(tag.data(), tag.size());
      for (const std::vector<uint8_t>* v : {&(*region)->rkey(), &(*silent)->address()}) {
        const uint32_t n = uint32_t(v->size());
        put(&n, 4);
        put(v->data(), n);
      }
      s.send(offer);
      // The fetcher reports its failure, then hangs up. The owner keeps the connection open until
      // then, so a fetch that returns did give up by itself (its GET deadline), not on a socket error.
      if (s.recv(done, 1) && done.size() == 1) reported = done[0];
    }
    ::close(fd);
  });
  auto node = kvshare::UcxNode::create();
  ASSERT_TRUE(node.ok());
  auto got = kvshare::fetch_snapshot_ucx({addr, "hung"}, {"any", "fetcher"}, 1, 1, 800,
                                         data.size(), **node);
  fake.join();
  ::close(lfd);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().to_string();
  EXPECT_EQ(reported, 0) << "the fetcher must give up on its own and report the failed GET";

  // The fetching node is still usable: a real owner serves it afterwards.
  auto src = engine::StateCache::open(cache_opts(1 << 24));
  ASSERT_TRUE(src.ok());
  Rng rng(6);
  const auto t = random_tokens(rng, 9);
  (*src)->put(3, t, *run(t));
  (*src)->flush();
  kvshare::SnapshotServer server(**src, {{"k", "owner"}, {}, 2000, 1000, 16, true});
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const uint64_t key = engine::prefix_hashes(3, t).back();
  auto ok = kvshare::fetch_snapshot_ucx({"127.0.0.1:" + std::to_string(*port), "owner"},
                                        {"k", "fetcher"}, key, 3, 2000,
                                        (*src)->max_snapshot_bytes(), **node);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, *(*src)->blob(key));
}

// A fake owner (it holds the secret) offers a registered region whose bytes no longer match the
// MAC it announced (changed in memory after the MAC was taken), or a region far larger than this
// model's largest snapshot: the first is refused after the GET as a MAC failure, the second before
// any buffer is allocated.
TEST_F(UcxPeerTest, ChangedOrOversizeOffersAreRefused) {
  auto owner = kvshare::UcxNode::create();
  ASSERT_TRUE(owner.ok()) << owner.status().to_string();
  std::vector<uint8_t> data(4096, 0x5a);
  auto region = (*owner)->map(data.data(), data.size(), kvshare::UcxAccess::kRemoteRead);
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  const auto tag = kvshare::snapshot_mac("k", data);
  data[100] ^= 1;  // changed after the MAC
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  const std::string addr = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  auto serve_once = [&](uint64_t size) {
    const int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    kvshare::PeerSession s;
    s.fd = fd;
    s.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::vector<uint8_t> request, done;
    if (kvshare::accept_peer(s, {"k", "owner"}, addr).ok() && s.recv(request)) {
      std::vector<uint8_t> offer = {1};
      auto put = [&](const void* p, size_t n) {
        offer.insert(offer.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
      };
      const uint64_t where[2] = {size, (*region)->address()};
      put(where, sizeof(where));
      put(tag.data(), tag.size());
      for (const std::vector<uint8_t>* v : {&(*region)->rkey(), &(*owner)->address()}) {
        const uint32_t n = uint32_t(v->size());
        put(&n, 4);
        put(v->data(), n);
      }
      s.send(offer);
      // Progress our worker (software RMA) until the fetcher reports, or hangs up.
      while (std::chrono::steady_clock::now() < s.deadline) {
        (*owner)->progress();
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 0) > 0) break;
      }
      s.recv(done, 1);
    }
    ::close(fd);
  };
  auto node = kvshare::UcxNode::create();
  ASSERT_TRUE(node.ok());
  {
    std::thread fake([&] { serve_once(data.size()); });
    auto got = kvshare::fetch_snapshot_ucx({addr, "owner"}, {"k", "fetcher"}, 1, 1, 3000,
                                           1 << 20, **node);
    fake.join();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kParseError) << got.status().to_string();
  }
  {
    std::thread fake([&] { serve_once(uint64_t(1) << 36); });
    auto got = kvshare::fetch_snapshot_ucx({addr, "owner"}, {"k", "fetcher"}, 1, 1, 3000,
                                           1 << 20, **node);
    fake.join();
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), StatusCode::kOutOfRange) << got.status().to_string();
  }
  ::close(lfd);
}

TEST(Transport, ParsesNames) {
  EXPECT_EQ(*kvshare::parse_transport("tcp"), kvshare::Transport::kTcp);
  auto bad = kvshare::parse_transport("rdma");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ucx or tcp"), std::string::npos);
  EXPECT_EQ(kvshare::parse_transport("ucx").ok(), kvshare::ucx_built());
}

}  // namespace
}  // namespace flashseek::kvtest
