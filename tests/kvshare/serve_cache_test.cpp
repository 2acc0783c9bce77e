// `flashseek serve` with the state cache: turn 2 of a conversation is served from the snapshot of
// turn 1 (usage.prompt_tokens_details.cached_tokens and /metrics prove it) and answers exactly
// like the engine alone; a restart with the same --cache-dir hits the disk tier; another API key
// (tenant) never hits; a corrupted snapshot file is detected, removed and not used.
#include <gtest/gtest.h>

#include <fstream>

#include "core/rng.h"
#include "engine/state_cache.h"
#include "server/http_server.h"
#include "serve_util.h"

namespace flashseek::kvtest {
namespace {

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b,
                            const std::vector<int32_t>& c = {}) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

std::vector<int32_t> random_ids(Rng& rng, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = int32_t(10 + rng.below(200));
  return v;
}

TEST(ServeCache, TurnTwoFromCacheAcrossRestartTenantsAndCorruption) {
  if (!have_tokenizer()) FS_SKIP_UNLESS_CI("no tokenizer: run scripts/fetch_tokenizer.sh");
  ft::TempDir dir;
  const std::string ckpt = (dir.path() / "tiny").string(), cache = (dir.path() / "cache").string();
  auto made = ft::run_command(ft::flashseek_bin() + " make-tiny --config tiny-v41 --seed 1 --out " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  Rng rng(21);
  const auto p1 = random_ids(rng, 30);
  std::vector<int32_t> p2, ans2;
  {
    Serve a(ckpt, dir.path() / "a.log", "--api-key k1 --cache-dir '" + cache + "'");
    ASSERT_TRUE(a.wait_ready()) << a.log_text();
    const Completion t1 = complete(a.port(), p1, 6, "k1");
    ASSERT_EQ(t1.status, 200) << a.log_text();
    EXPECT_EQ(t1.cached_tokens, 0);
    p2 = concat(p1, t1.tokens, random_ids(rng, 8));
    const Completion t2 = complete(a.port(), p2, 6, "k1");
    ASSERT_EQ(t2.status, 200);
    // The end-of-response snapshot: turn 1 + its answer without the last token (never fed back).
    EXPECT_EQ(t2.cached_tokens, 30 + 6 - 1);
    EXPECT_EQ(t2.tokens, run_tokens(ckpt, p2, 6));
    EXPECT_EQ(metric(a.port(), "flashseek_state_cache_hit_tokens_total{source=\"local\"}"), 35);
    EXPECT_EQ(metric(a.port(), "flashseek_cached_prompt_tokens_total"), 35);
    ans2 = t2.tokens;
  }
  const auto p3 = concat(p2, ans2, random_ids(rng, 5));
  const auto want3 = run_tokens(ckpt, p3, 4);
  {  // Another tenant on the same directory: never sees k1's snapshots.
    Serve b(ckpt, dir.path() / "b.log", "--api-key k2 --cache-dir '" + cache + "'");
    ASSERT_TRUE(b.wait_ready()) << b.log_text();
    const Completion t = complete(b.port(), p3, 4, "k2");
    ASSERT_EQ(t.status, 200);
    EXPECT_EQ(t.cached_tokens, 0);
    EXPECT_EQ(t.tokens, want3);
  }
  // Corrupt k1's longest snapshot for p3 (end of turn 2's response) by one byte.
  const uint64_t k1 = server::tenant_of("k1");
  const auto longest = std::vector<int32_t>(p3.begin(), p3.begin() + int64_t(p2.size() + 5));
  const auto file = std::filesystem::path(cache) /
                    fmt::format("{:016x}.fss", engine::prefix_hashes(k1, longest).back());
  ASSERT_TRUE(std::filesystem::exists(file));
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(std::filesystem::file_size(file) - 100));
    const char c = char(f.peek());
    f.put(char(c ^ 0x01));
  }
  {  // Restart as k1: the corrupt file is skipped (and removed); the end-of-prompt one is used.
    Serve c(ckpt, dir.path() / "c.log", "--api-key k1 --cache-dir '" + cache + "'");
    ASSERT_TRUE(c.wait_ready()) << c.log_text();
    const Completion t = complete(c.port(), p3, 4, "k1");
    ASSERT_EQ(t.status, 200);
    EXPECT_EQ(t.cached_tokens, int64_t(p2.size()));
    EXPECT_EQ(t.tokens, want3);
    EXPECT_FALSE(std::filesystem::exists(file));
    EXPECT_EQ(metric(c.port(), "flashseek_state_cache_hits_total{tier=\"disk\"}"), 1);
    EXPECT_EQ(metric(c.port(), "flashseek_state_cache_corrupt_total"), 1);
    const Completion wrong_key = complete(c.port(), p3, 4, "k2");
    EXPECT_EQ(wrong_key.status, 401);
  }
}

}  // namespace
}  // namespace flashseek::kvtest
