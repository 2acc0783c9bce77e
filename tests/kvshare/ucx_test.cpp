// Snapshot GET over UCX (one-sided ucp_get_nbx of the owner's registered memory) with
// UCX_TLS=tcp on loopback, as CI runs it: the bytes equal the owner's blob; a wrong secret never
// gets an rkey; another tenant's or an unknown snapshot is not found; a peer without UCX says so
// (the caller falls back to TCP); a peer that hands out an offer and then never progresses
// (hung / dead) costs at most the timeout, and the fetching node still works afterwards; a
// snapshot held thin (shared pages) is served self-contained.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/hmac.h>
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
  auto src = engine::StateCache::open({fingerprint_, 1 << 24, {}, 2});
  ASSERT_TRUE(src.ok());
  Rng rng(5);
  const auto t = random_tokens(rng, 23);
  (*src)->put(7, t, *run(t));
  (*src)->flush();
  const uint64_t key = engine::prefix_hashes(7, t).back();
  kvshare::SnapshotServer server(**src, "right", 2000, /*enable_ucx=*/true);
  ASSERT_TRUE(server.ucx_enabled());
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  const std::string addr = "127.0.0.1:" + std::to_string(*port);
  auto node = kvshare::UcxNode::create();
  ASSERT_TRUE(node.ok()) << node.status().to_string();

  for (int i = 0; i < 2; ++i) {  // the second GET reuses the owner's registration
    auto got = kvshare::fetch_snapshot_ucx(addr, "right", key, 7, 2000, **node);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, *(*src)->blob(key));
  }
  EXPECT_EQ(served_ucx_soon(server, 2), 2);

  auto wrong = kvshare::fetch_snapshot_ucx(addr, "wrong", key, 7, 2000, **node);
  EXPECT_FALSE(wrong.ok());
  EXPECT_EQ(server.rejected(), 1);
  auto other = kvshare::fetch_snapshot_ucx(addr, "right", key, 8, 2000, **node);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kNotFound);
  auto missing = kvshare::fetch_snapshot_ucx(addr, "right", key ^ 1, 7, 2000, **node);
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
  auto thin = kvshare::fetch_snapshot_ucx(addr, "right", long_key, 7, 2000, **node);
  ASSERT_TRUE(thin.ok()) << thin.status().to_string();
  EXPECT_EQ(*thin, *forward::serialize_snapshot(*long_st, long_t, {fingerprint_, 7, long_key, 320, 0}));
  EXPECT_EQ(served_ucx_soon(server, 3), 3);

  // An owner without UCX answers "unsupported"; its TCP path still serves the same bytes.
  kvshare::SnapshotServer tcp_only(**src, "right", 2000, /*enable_ucx=*/false);
  auto tcp_port = tcp_only.start("127.0.0.1", 0);
  ASSERT_TRUE(tcp_port.ok());
  const std::string tcp_addr = "127.0.0.1:" + std::to_string(*tcp_port);
  auto refused = kvshare::fetch_snapshot_ucx(tcp_addr, "right", key, 7, 2000, **node);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
  auto tcp = kvshare::fetch_snapshot(tcp_addr, "right", key, 7, 2000);
  ASSERT_TRUE(tcp.ok());
  EXPECT_EQ(*tcp, *(*src)->blob(key));

  // Nobody listening: fails fast as unavailable.
  auto dead = kvshare::fetch_snapshot_ucx("127.0.0.1:" + std::to_string(free_port()), "right",
                                          key, 7, 500, **node);
  ASSERT_FALSE(dead.ok());
  EXPECT_EQ(dead.status().code(), StatusCode::kUnavailable);
}

// A peer that passes the handshake and offers a registered region of a worker that is never
// progressed again: the fetcher's GET cannot complete and must give up at the timeout.
TEST_F(UcxPeerTest, HungOwnerCostsAtMostTheTimeout) {
  auto silent = kvshare::UcxNode::create();
  ASSERT_TRUE(silent.ok()) << silent.status().to_string();
  std::vector<uint8_t> data(1 << 20, 0x5a);
  auto region = (*silent)->map(data.data(), data.size());
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
    uint8_t nonce[32] = {1, 2, 3}, answer[32], request[17];
    ::send(fd, "FSKV", 4, 0);
    ::send(fd, nonce, 32, 0);
    ::recv(fd, answer, 32, MSG_WAITALL);
    ::recv(fd, request, 17, MSG_WAITALL);  // 'U', hash, tenant
    const uint8_t offer = 1;
    const uint64_t where[2] = {(*region)->size(), (*region)->address()};
    const auto& rkey = (*region)->rkey();
    const auto& worker = (*silent)->address();
    const uint32_t rn = uint32_t(rkey.size()), wn = uint32_t(worker.size());
    ::send(fd, &offer, 1, 0);
    ::send(fd, where, sizeof(where), 0);
    ::send(fd, &rn, 4, 0);
    ::send(fd, rkey.data(), rn, 0);
    ::send(fd, &wn, 4, 0);
    ::send(fd, worker.data(), wn, 0);
    uint8_t done = 0;
    // The fetcher reports its failure, then hangs up. The owner keeps the connection open until
    // then, so a fetch that returns did give up by itself (its GET deadline), not on a socket error.
    if (::recv(fd, &done, 1, MSG_WAITALL) == 1) reported = done;
    ::close(fd);
  });
  auto node = kvshare::UcxNode::create();
  ASSERT_TRUE(node.ok());
  auto got = kvshare::fetch_snapshot_ucx(addr, "any", 1, 1, 800, **node);
  fake.join();
  ::close(lfd);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status().to_string();
  EXPECT_EQ(reported, 0) << "the fetcher must give up on its own and report the failed GET";

  // The fetching node is still usable: a real owner serves it afterwards.
  auto src = engine::StateCache::open({fingerprint_, 1 << 24, {}, 2});
  ASSERT_TRUE(src.ok());
  Rng rng(6);
  const auto t = random_tokens(rng, 9);
  (*src)->put(3, t, *run(t));
  (*src)->flush();
  kvshare::SnapshotServer server(**src, "k", 2000, true);
  auto port = server.start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok());
  const uint64_t key = engine::prefix_hashes(3, t).back();
  auto ok = kvshare::fetch_snapshot_ucx("127.0.0.1:" + std::to_string(*port), "k", key, 3, 2000,
                                        **node);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(*ok, *(*src)->blob(key));
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
