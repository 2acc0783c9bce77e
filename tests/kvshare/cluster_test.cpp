// Two `flashseek serve` processes sharing conversation state through a real redis-server on
// loopback (UCX_TLS=tcp): turn 2 on B is fetched from A (B prefills only the new tokens; UCX GET
// by default, TCP with --kv-transport tcp) and answers like the engine alone; Redis stopped mid-run: both keep answering, sharing resumes after it restarts;
// owner killed before turn 2: B recomputes with the same answer; SIGTERM drain hands snapshots
// to a live peer.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "engine/state_cache.h"
#include "kvshare/ucx.h"
#include "redis_util.h"
#include "serve_util.h"
#include "server/http_server.h"

namespace flashseek::kvtest {
namespace {

std::vector<int32_t> ids(Rng& rng, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = int32_t(10 + rng.below(200));
  return v;
}
std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b,
                         const std::vector<int32_t>& c) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}
// Registry key of the end-of-response snapshot of (prompt, answer); these servers have no API
// keys and opt in to one shared cache (--shared-cache), tenant scopes: cluster_tenants_test.cpp.
std::string snap_key(const std::vector<int32_t>& prompt, const std::vector<int32_t>& answer) {
  auto t = prompt;
  t.insert(t.end(), answer.begin(), answer.end() - 1);
  return fmt::format("fs:snap:{:016x}", engine::prefix_hashes(server::tenant_of(""), t).back());
}

class Cluster2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_tokenizer()) FS_SKIP_UNLESS_CI("needs the tokenizer (scripts/fetch_tokenizer.sh)");
    if (!have_redis()) FS_SKIP_UNLESS_CI("needs /usr/bin/redis-server");
    setenv("UCX_TLS", "tcp", /*overwrite=*/0);  // as in CI: UCX over TCP sockets on loopback
    ckpt_ = (dir_.path() / "tiny").string();
    auto made = ft::run_command(ft::flashseek_bin() + " make-tiny --config tiny-v41 --seed 2 --out " + ckpt_);
    ASSERT_EQ(made.exit_code, 0) << made.output;
    redis_ = std::make_unique<RedisServer>(free_port());
  }
  std::unique_ptr<Serve> serve(const std::string& id, const std::string& secret = "s3cret",
                               const std::string& extra = "") {
    auto s = std::make_unique<Serve>(ckpt_, dir_.path() / (id + ".log"),
                                     "--redis " + redis_->url() + " --cluster-secret " + secret +
                                         " --server-id " + id + " --shared-cache " + extra);
    EXPECT_TRUE(s->wait_ready()) << s->log_text();
    return s;
  }
  ft::TempDir dir_;
  std::string ckpt_;
  std::unique_ptr<RedisServer> redis_;
};

TEST_F(Cluster2, TurnTwoOnPeerOutageRecoveryAndDeadOwner) {
  auto a = serve("A"), b = serve("B");
  Rng rng(31);
  // Remote hit: turn 1 on A, turn 2 on B.
  const auto p1 = ids(rng, 30);
  const auto t1 = complete(a->port(), p1, 6);
  ASSERT_EQ(t1.status, 200) << a->log_text();
  ASSERT_TRUE(redis_->wait_for("HGET " + snap_key(p1, t1.tokens) + " owner", "A"));
  const auto p2 = cat(p1, t1.tokens, ids(rng, 8));
  const auto t2 = complete(b->port(), p2, 6);
  ASSERT_EQ(t2.status, 200) << b->log_text();
  EXPECT_EQ(t2.cached_tokens, 35);
  EXPECT_EQ(t2.tokens, run_tokens(ckpt_, p2, 6));
  EXPECT_EQ(metric(b->port(), "flashseek_state_cache_hit_tokens_total{source=\"remote\"}"), 35);
  EXPECT_GT(metric(b->port(), "flashseek_state_cache_remote_bytes_total"), 0);
  // Default transport: a one-sided UCX GET when built with UCX.
  const std::string used = kvshare::ucx_built() ? "ucx" : "tcp";
  EXPECT_EQ(metric(b->port(), "flashseek_kvshare_transfers_total{transport=\"" + used + "\"}"), 1);
  EXPECT_GT(metric(b->port(), "flashseek_kvshare_transfer_bytes_total{transport=\"" + used + "\"}"), 0);
  if (kvshare::ucx_built()) {  // counted when B's completion message arrives: poll briefly
    for (int i = 0; i < 100 && metric(a->port(), "flashseek_kvshare_served_ucx_total") < 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(metric(a->port(), "flashseek_kvshare_served_ucx_total"), 1);
  }
  EXPECT_TRUE(redis_->wait_for("HGET " + snap_key(p1, t1.tokens) + " owner", "B"));  // moved

  // Redis down: both keep answering (local only); a snapshot made meanwhile is announced once
  // Redis is back, and sharing resumes.
  redis_->stop();
  const auto r1 = ids(rng, 25);
  const auto u1 = complete(a->port(), r1, 5);
  ASSERT_EQ(u1.status, 200) << a->log_text();
  EXPECT_EQ(complete(b->port(), ids(rng, 12), 3).status, 200);
  redis_->start();
  ASSERT_TRUE(redis_->wait_for("HGET " + snap_key(r1, u1.tokens) + " owner", "A"))
      << a->log_text();
  for (int i = 0; i < 160 && !redis_->query("GET fs:server:B"); ++i)  // B is back too
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto r2 = cat(r1, u1.tokens, ids(rng, 4));
  const auto u2 = complete(b->port(), r2, 5);
  ASSERT_EQ(u2.status, 200);
  EXPECT_EQ(u2.cached_tokens, 25 + 5 - 1);
  EXPECT_EQ(u2.tokens, run_tokens(ckpt_, r2, 5));

  // A server fetching over TCP (--kv-transport tcp) gets the same hit from the same owner.
  auto t = serve("T", "s3cret", "--kv-transport tcp");
  for (int i = 0; i < 100 && !redis_->query("GET fs:server:T"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto w1 = ids(rng, 22);
  const auto x1 = complete(a->port(), w1, 4);
  ASSERT_EQ(x1.status, 200);
  ASSERT_TRUE(redis_->wait_for("HGET " + snap_key(w1, x1.tokens) + " owner", "A"));
  const auto w2 = cat(w1, x1.tokens, ids(rng, 5));
  const auto x2 = complete(t->port(), w2, 4);
  ASSERT_EQ(x2.status, 200) << t->log_text();
  EXPECT_EQ(x2.cached_tokens, 22 + 4 - 1);
  EXPECT_EQ(x2.tokens, run_tokens(ckpt_, w2, 4));
  EXPECT_EQ(metric(t->port(), "flashseek_kvshare_transfers_total{transport=\"tcp\"}"), 1);
  EXPECT_EQ(metric(t->port(), "flashseek_kvshare_transfers_total{transport=\"ucx\"}"), 0);
  t->stop();

  // Owner killed before turn 2: B's fetch fails, it recomputes; same answer, no error.
  const auto q1 = ids(rng, 20);
  const auto v1 = complete(a->port(), q1, 4);
  ASSERT_EQ(v1.status, 200);
  ASSERT_TRUE(redis_->wait_for("HGET " + snap_key(q1, v1.tokens) + " owner", "A"));
  a->kill_hard();
  const auto q2 = cat(q1, v1.tokens, ids(rng, 6));
  const auto v2 = complete(b->port(), q2, 4);
  ASSERT_EQ(v2.status, 200) << b->log_text();
  EXPECT_EQ(v2.cached_tokens, 0);
  EXPECT_EQ(v2.tokens, run_tokens(ckpt_, q2, 4));
  EXPECT_EQ(metric(b->port(), "flashseek_kvshare_recompute_fallbacks_total"), 1);
}

TEST_F(Cluster2, WrongSecretIsRefusedAndDrainHandsOver) {
  auto a = serve("A"), intruder = serve("X", "not-the-secret");
  Rng rng(41);
  const auto p1 = ids(rng, 18);
  const auto t1 = complete(a->port(), p1, 4);
  ASSERT_EQ(t1.status, 200);
  ASSERT_TRUE(redis_->wait_for("HGET " + snap_key(p1, t1.tokens) + " owner", "A"));
  const auto p2 = cat(p1, t1.tokens, ids(rng, 3));
  const auto t2 = complete(intruder->port(), p2, 4);
  ASSERT_EQ(t2.status, 200);
  EXPECT_EQ(t2.cached_tokens, 0);  // A refused to hand its snapshot over
  EXPECT_EQ(t2.tokens, run_tokens(ckpt_, p2, 4));
  EXPECT_EQ(metric(a->port(), "flashseek_kvshare_auth_rejected_total"), 1);
  intruder->stop();

  // Drain: A's snapshots move to B on SIGTERM; B then serves turn 2 from its own memory.
  auto b = serve("B");
  for (int i = 0; i < 100 && !redis_->query("GET fs:server:B"); ++i)  // B's first heartbeat
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  a->stop();
  ASSERT_TRUE(redis_->wait_for("HGET " + snap_key(p1, t1.tokens) + " owner", "B"));
  const auto t3 = complete(b->port(), p2, 4);
  ASSERT_EQ(t3.status, 200);
  EXPECT_EQ(t3.cached_tokens, 18 + 4 - 1);
  EXPECT_EQ(metric(b->port(), "flashseek_state_cache_hit_tokens_total{source=\"local\"}"), 21);
  EXPECT_EQ(t3.tokens, t2.tokens);
}

}  // namespace
}  // namespace flashseek::kvtest
