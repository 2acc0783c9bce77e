// `flashseek serve` on a tiny checkpoint: `cached_tokens` never reveals another tenant's prompts.
// Keys from --api-key-file, FLASHSEEK_API_KEYS and --api-key map to tenants; a tenant sending
// another tenant's exact turn-2 prompt gets cached_tokens == 0 (and the engine's answer) while a
// second key of the same tenant hits; without keys every request is isolated; --shared-cache and
// --cache-scope user opt in to reuse.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/rng.h"
#include "serve_util.h"

namespace flashseek::kvtest {
namespace {

std::vector<int32_t> random_ids(Rng& rng, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = int32_t(10 + rng.below(200));
  return v;
}
std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b,
                            const std::vector<int32_t>& c) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

class TenantsServe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_tokenizer()) GTEST_SKIP() << "no tokenizer: run scripts/fetch_tokenizer.sh";
    ckpt_ = (dir_.path() / "tiny").string();
    auto made = ft::run_command(ft::flashseek_bin() + " make-tiny --config tiny-v41 --seed 3 --out " + ckpt_);
    ASSERT_EQ(made.exit_code, 0) << made.output;
    Rng rng(77);
    p1_ = random_ids(rng, 24);
    extra_ = random_ids(rng, 6);
  }
  // Turn 1 (p1) then turn 2 = p1 + answer + extra; returns turn 2's prompt.
  std::vector<int32_t> turn_two(int port, const std::string& key, const std::string& user = {}) {
    const Completion t1 = complete(port, p1_, 5, key, user);
    EXPECT_EQ(t1.status, 200);
    EXPECT_EQ(t1.cached_tokens, 0);
    return concat(p1_, t1.tokens, extra_);
  }
  static constexpr int64_t kTurnOneHit = 24 + 5 - 1;  // end-of-response snapshot of turn 1

  ft::TempDir dir_;
  std::string ckpt_;
  std::vector<int32_t> p1_, extra_;
};

TEST_F(TenantsServe, AnotherTenantNeverHitsKeysOfOneTenantDo) {
  const auto keys = dir_.path() / "keys";
  std::ofstream(keys) << "# tenant alice has two keys\nka1 alice\nka2 alice\n";
  // bob's key from the environment (inherited by the server), carol's from --api-key.
  setenv("FLASHSEEK_API_KEYS", "kb1 bob,kb2 bob", 1);
  Serve s(ckpt_, dir_.path() / "s.log", "--api-key-file '" + keys.string() + "' --api-key kc");
  unsetenv("FLASHSEEK_API_KEYS");
  ASSERT_TRUE(s.wait_ready()) << s.log_text();
  const auto p2 = turn_two(s.port(), "ka1");
  const auto want = run_tokens(ckpt_, p2, 5);
  // bob and carol send alice's exact turn-2 prompt: no hit, same (engine) answer.
  for (const std::string key : {"kb1", "kc"}) {
    const Completion other = complete(s.port(), p2, 5, key);
    ASSERT_EQ(other.status, 200) << key << "\n" << s.log_text();
    EXPECT_EQ(other.cached_tokens, 0) << key;
    EXPECT_EQ(other.tokens, want) << key;
  }
  // alice's other key hits turn 1's snapshot.
  const Completion mine = complete(s.port(), p2, 5, "ka2");
  ASSERT_EQ(mine.status, 200);
  EXPECT_EQ(mine.cached_tokens, kTurnOneHit);
  EXPECT_EQ(mine.tokens, want);
  // bob's second key reaches bob's own snapshot of p2 (taken when kb1 sent it).
  const auto p3 = concat(p2, want, {});
  const Completion bob = complete(s.port(), p3, 3, "kb2");
  ASSERT_EQ(bob.status, 200);
  EXPECT_EQ(bob.cached_tokens, int64_t(p2.size() + 5 - 1));
  EXPECT_EQ(metric(s.port(), "flashseek_state_cache_hit_tokens_total{source=\"local\"}"),
            double(kTurnOneHit + int64_t(p2.size()) + 4));
  EXPECT_EQ(complete(s.port(), p1_, 1, "kx").status, 401);
  EXPECT_EQ(complete(s.port(), p1_, 1, "").status, 401);
}

TEST_F(TenantsServe, NoKeysIsolatesEveryRequestByDefault) {
  Serve s(ckpt_, dir_.path() / "s.log", "");
  ASSERT_TRUE(s.wait_ready()) << s.log_text();
  const auto p2 = turn_two(s.port(), "", "u1");
  for (int i = 0; i < 2; ++i) {  // the same caller (same `user`) twice: still nothing reused
    const Completion t2 = complete(s.port(), p2, 5, "", "u1");
    ASSERT_EQ(t2.status, 200) << s.log_text();
    EXPECT_EQ(t2.cached_tokens, 0);
  }
  EXPECT_EQ(metric(s.port(), "flashseek_state_cache_hit_tokens_total{source=\"local\"}"), 0);
  EXPECT_EQ(metric(s.port(), "flashseek_state_cache_snapshots_total"), 0);  // nothing kept either
}

TEST_F(TenantsServe, SharedCacheIsAnOptIn) {
  Serve s(ckpt_, dir_.path() / "s.log", "--shared-cache");
  ASSERT_TRUE(s.wait_ready()) << s.log_text();
  const auto p2 = turn_two(s.port(), "");
  const Completion t2 = complete(s.port(), p2, 5, "");
  ASSERT_EQ(t2.status, 200);
  EXPECT_EQ(t2.cached_tokens, kTurnOneHit);
  EXPECT_EQ(t2.tokens, run_tokens(ckpt_, p2, 5));
}

TEST_F(TenantsServe, UserScopeOptIn) {
  Serve s(ckpt_, dir_.path() / "s.log", "--cache-scope user");
  ASSERT_TRUE(s.wait_ready()) << s.log_text();
  const auto p2 = turn_two(s.port(), "", "u1");
  EXPECT_EQ(complete(s.port(), p2, 5, "", "u2").cached_tokens, 0);  // another user
  EXPECT_EQ(complete(s.port(), p2, 5, "").cached_tokens, 0);        // no user: isolated
  EXPECT_EQ(complete(s.port(), p2, 5, "", "u1").cached_tokens, kTurnOneHit);
}

}  // namespace
}  // namespace flashseek::kvtest
