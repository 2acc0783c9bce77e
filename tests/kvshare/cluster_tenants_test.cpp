// Cross-server sharing keeps tenants apart: two `flashseek serve` processes with the same key file
// and a real redis-server (UCX_TLS=tcp). The registry key of a snapshot is the hash chain started
// from the tenant's id and records that tenant; tenant bob on server B sending alice's turn-2
// prompt fetches nothing and gets cached_tokens == 0 (and the engine's answer), while alice on B
// gets turn 1 from A.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "engine/state_cache.h"
#include "redis_util.h"
#include "serve_util.h"
#include "server/tenants.h"

namespace flashseek::kvtest {
namespace {

TEST(ClusterTenants, RemoteSnapshotsStayWithTheirTenant) {
  if (!have_tokenizer() || !have_redis()) GTEST_SKIP() << "needs the tokenizer and redis-server";
  setenv("UCX_TLS", "tcp", /*overwrite=*/0);
  ft::TempDir dir;
  const std::string ckpt = (dir.path() / "tiny").string();
  auto made = ft::run_command(ft::flashseek_bin() + " make-tiny --config tiny-v41 --seed 4 --out " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto keys = dir.path() / "keys";
  std::ofstream(keys) << "ka alice\nkb bob\n";
  RedisServer redis(free_port());
  auto start = [&](const std::string& id) {
    return std::make_unique<Serve>(ckpt, dir.path() / (id + ".log"),
                                   "--redis " + redis.url() + " --cluster-secret s3cret --server-id " +
                                       id + " --api-key-file '" + keys.string() + "'");
  };
  auto a = start("A"), b = start("B");
  ASSERT_TRUE(a->wait_ready()) << a->log_text();
  ASSERT_TRUE(b->wait_ready()) << b->log_text();

  Rng rng(91);
  std::vector<int32_t> p1(20);
  for (auto& t : p1) t = int32_t(10 + rng.below(200));
  const Completion t1 = complete(a->port(), p1, 5, "ka");
  ASSERT_EQ(t1.status, 200) << a->log_text();
  // The end-of-response snapshot's registry key starts the chain at alice's tenant id and the
  // record names alice; the same tokens under the shared scope are not registered.
  auto snap = p1;
  snap.insert(snap.end(), t1.tokens.begin(), t1.tokens.end() - 1);
  const uint64_t alice = server::tenant_of("alice");
  const std::string key = fmt::format("fs:snap:{:016x}", engine::prefix_hashes(alice, snap).back());
  ASSERT_TRUE(redis.wait_for("HGET " + key + " owner", "A")) << a->log_text();
  EXPECT_EQ(redis.query("HGET " + key + " tenant"), std::to_string(alice));
  EXPECT_FALSE(redis.query(fmt::format("HGET fs:snap:{:016x} owner",
                                       engine::prefix_hashes(server::kSharedScope, snap).back())));

  auto p2 = p1;
  p2.insert(p2.end(), t1.tokens.begin(), t1.tokens.end());
  for (int i = 0; i < 4; ++i) p2.push_back(int32_t(10 + rng.below(200)));
  const auto want = run_tokens(ckpt, p2, 4);
  auto transfers = [&](int port) {
    return metric(port, "flashseek_kvshare_transfers_total{transport=\"ucx\"}") +
           metric(port, "flashseek_kvshare_transfers_total{transport=\"tcp\"}");
  };
  // bob on B: nothing of alice's is looked up, fetched or reported.
  const Completion bob = complete(b->port(), p2, 4, "kb");
  ASSERT_EQ(bob.status, 200) << b->log_text();
  EXPECT_EQ(bob.cached_tokens, 0);
  EXPECT_EQ(bob.tokens, want);
  EXPECT_EQ(transfers(b->port()), 0);
  // alice on B: turn 1 comes from A.
  const Completion mine = complete(b->port(), p2, 4, "ka");
  ASSERT_EQ(mine.status, 200) << b->log_text();
  EXPECT_EQ(mine.cached_tokens, int64_t(snap.size()));
  EXPECT_EQ(mine.tokens, want);
  EXPECT_EQ(transfers(b->port()), 1);
  EXPECT_EQ(metric(b->port(), "flashseek_state_cache_hit_tokens_total{source=\"remote\"}"),
            double(snap.size()));
}

}  // namespace
}  // namespace flashseek::kvtest
