// StateCache (engine/state_cache.h): longest-prefix lookup scoped by tenant, host LRU under a
// byte budget, the disk tier across restarts (corrupt files removed, never used), and the engine
// wiring: turn 2 of a conversation prefills only its new tokens and answers exactly as without
// the cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/engine.h"
#include "engine/state_cache.h"
#include "kv_test_util.h"

namespace flashseek::kvtest {
namespace {

using engine::StateCache;
namespace fs = std::filesystem;

class Cache : public TinyModel {
 protected:
  std::unique_ptr<StateCache> open(int64_t host_bytes, std::string dir = {}) {
    auto c = StateCache::open(cache_opts(host_bytes, std::move(dir)));
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // Puts the state after `tokens` into the cache.
  void put(StateCache& c, uint64_t tenant, const std::vector<int32_t>& tokens) {
    auto st = run(tokens);
    c.put(tenant, tokens, *st);
    c.flush();
  }
  // Restored state continues exactly like a fresh run of the whole sequence.
  void expect_continues(const engine::CacheHit& hit, const std::vector<int32_t>& tokens) {
    auto mine = hit.state->clone();
    std::vector<float> a, b;
    advance(*mine, std::span<const int32_t>(tokens).subspan(size_t(hit.n_tokens)), &a);
    run(tokens, &b);
    EXPECT_EQ(a, b);
  }
};

TEST_F(Cache, LongestPrefixWinsAndTenantsAreSeparate) {
  auto c = open(int64_t(1) << 30);
  Rng rng(4);
  const auto seq = random_tokens(rng, 40);
  const std::vector<int32_t> p10(seq.begin(), seq.begin() + 10), p25(seq.begin(), seq.begin() + 25);
  put(*c, 7, p10);
  put(*c, 7, p25);
  auto hit = c->lookup(7, seq, 39);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->n_tokens, 25);
  EXPECT_EQ(hit->tier, engine::CacheTier::kHost);
  expect_continues(*hit, seq);
  auto shorter = c->lookup(7, seq, 24);  // max_len below the longest snapshot
  ASSERT_TRUE(shorter);
  EXPECT_EQ(shorter->n_tokens, 10);
  expect_continues(*shorter, seq);
  EXPECT_FALSE(c->lookup(8, seq, 39));  // another tenant never sees tenant 7's snapshots
  auto diverged = seq;
  diverged[5] = (diverged[5] + 1) % int32_t(model_->config().vocab_size);
  EXPECT_FALSE(c->lookup(7, diverged, 39));
  const auto s = c->stats();
  EXPECT_EQ(s.puts, 2);
  EXPECT_EQ(s.hits_host, 2);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.hit_tokens_local, 35);
}

TEST_F(Cache, HostTierStaysUnderItsByteBudget) {
  Rng rng(5);
  auto probe = open(int64_t(1) << 30);
  const auto first = random_tokens(rng, 30);
  put(*probe, 1, first);
  const int64_t one = probe->stats().host_bytes;  // blob bytes of one 30-token snapshot
  ASSERT_GT(one, 30 * 4);
  auto c = open(one * 3 + one / 2);  // room for 3
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 6; ++i) {
    seqs.push_back(random_tokens(rng, 30));
    put(*c, 1, seqs.back());
    const auto s = c->stats();
    EXPECT_LE(s.host_bytes, one * 3 + one / 2);
    EXPECT_EQ(s.host_bytes, s.host_entries * one);  // honest accounting: blob sizes
  }
  // Keep the oldest surviving one hot, then add one more: the least recently used goes.
  ASSERT_TRUE(c->lookup(1, seqs[3], 30));
  put(*c, 1, random_tokens(rng, 30));
  EXPECT_TRUE(c->lookup(1, seqs[3], 30));
  EXPECT_FALSE(c->lookup(1, seqs[4], 30));
  EXPECT_FALSE(c->lookup(1, seqs[0], 30));
  EXPECT_EQ(c->stats().evictions, 4);
}

TEST_F(Cache, DiskTierSurvivesRestartAndDropsCorruptFiles) {
  flashseek::testing::TempDir dir;
  Rng rng(6);
  const auto a = random_tokens(rng, 33), b = random_tokens(rng, 21);
  {
    auto c = open(0, dir.path().string());  // no host tier: everything lives on disk
    put(*c, 3, a);
    put(*c, 3, b);
    EXPECT_EQ(c->stats().disk_entries, 2);
  }
  auto seq = a;
  seq.push_back(5);
  {
    auto c = open(int64_t(1) << 30, dir.path().string());
    EXPECT_EQ(c->stats().disk_entries, 2);
    auto hit = c->lookup(3, seq, int64_t(seq.size()) - 1);
    ASSERT_TRUE(hit);
    EXPECT_EQ(hit->tier, engine::CacheTier::kDisk);
    EXPECT_EQ(hit->n_tokens, 33);
    expect_continues(*hit, seq);
    auto again = c->lookup(3, seq, int64_t(seq.size()) - 1);  // promoted into host memory
    ASSERT_TRUE(again);
    EXPECT_EQ(again->tier, engine::CacheTier::kHost);
  }
  // Flip one byte in the middle of b's file: the lookup rejects it and removes the file.
  fs::path b_file;
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (fs::file_size(e.path()) < fs::file_size(dir.path() / fmt::format(
            "{:016x}.fss", engine::prefix_hashes(3, a).back())))
      b_file = e.path();
  ASSERT_FALSE(b_file.empty());
  {
    std::fstream f(b_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(fs::file_size(b_file) / 2));
    f.put('\x5a');
  }
  // Plus an unreadable stray file and a half-written temporary.
  std::ofstream(dir.path() / "00000000deadbeef.fss") << "garbage";
  std::ofstream(dir.path() / "0000000000000001.fss.tmp") << "partial";
  auto c = open(int64_t(1) << 30, dir.path().string());
  EXPECT_EQ(c->stats().corrupt, 1);  // the garbage header, at scan time
  auto seq_b = b;
  seq_b.push_back(1);
  EXPECT_FALSE(c->lookup(3, seq_b, int64_t(seq_b.size()) - 1));
  EXPECT_FALSE(fs::exists(b_file));
  EXPECT_FALSE(fs::exists(dir.path() / "00000000deadbeef.fss"));
  EXPECT_FALSE(fs::exists(dir.path() / "0000000000000001.fss.tmp"));
  const auto s = c->stats();
  EXPECT_EQ(s.corrupt, 2);
  EXPECT_EQ(s.disk_entries, 1);
  EXPECT_TRUE(c->lookup(3, seq, int64_t(seq.size()) - 1));  // a's file is still good
}

TEST_F(Cache, BlobsFromPeersAreVerified) {
  Rng rng(7);
  auto src = open(int64_t(1) << 30);
  const auto t = random_tokens(rng, 17);
  put(*src, 2, t);
  const uint64_t key = engine::prefix_hashes(2, t).back();
  auto blob = src->blob(key);
  ASSERT_TRUE(blob);
  auto dst = open(int64_t(1) << 30);
  auto bad = *blob;
  bad[bad.size() / 3] ^= 0x10;
  EXPECT_FALSE(dst->insert_blob(bad).ok());
  auto foreign_opts = cache_opts(1 << 20);
  foreign_opts.fingerprint = fingerprint_ + 1;
  auto foreign = StateCache::open(std::move(foreign_opts));
  ASSERT_TRUE(foreign.ok());
  EXPECT_FALSE((*foreign)->insert_blob(*blob).ok());
  ASSERT_TRUE(dst->insert_blob(*blob).ok());
  auto seq = t;
  seq.push_back(3);
  auto hit = dst->lookup(2, seq, 17);
  ASSERT_TRUE(hit);
  expect_continues(*hit, seq);
  EXPECT_EQ(dst->hottest(4), std::vector<uint64_t>{key});
  dst->erase(key);
  EXPECT_FALSE(dst->lookup(2, seq, 17));
}

// Turn 1 then turn 2 = turn 1 + answer + new message through the engine with the cache attached:
// turn 2 restores the end-of-response snapshot, prefills only the new tokens, and its greedy
// answer equals the answer without any cache.
TEST_F(Cache, SecondTurnPrefillsOnlyNewTokens) {
  auto c = open(int64_t(1) << 30);
  auto eng = engine::Engine::create(*model_, {});
  ASSERT_TRUE(eng.ok());
  Rng rng(8);
  auto run_turn = [&](std::vector<int32_t> prompt, bool cached, int64_t* hit_tokens) {
    engine::Request r;
    r.id = rng.next_u64() >> 1;
    r.prompt = std::move(prompt);
    r.max_tokens = 7;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    if (cached) *hit_tokens = engine::attach_state_cache(*c, 11, r);
    auto s = (*eng)->submit(std::move(r));
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE((*eng)->run_until_idle().ok());
    c->flush();
    return engine::collect(**s).tokens;
  };
  const auto turn1 = random_tokens(rng, 45);
  int64_t hit1 = -1, hit2 = -1;
  const auto answer = run_turn(turn1, true, &hit1);
  EXPECT_EQ(hit1, 0);
  ASSERT_EQ(answer.size(), 7u);
  auto turn2 = turn1;
  turn2.insert(turn2.end(), answer.begin(), answer.end());
  const auto msg = random_tokens(rng, 9);
  turn2.insert(turn2.end(), msg.begin(), msg.end());
  const int64_t before = (*eng)->stats().prompt_tokens;
  const auto cached_answer = run_turn(turn2, true, &hit2);
  // The end-of-response snapshot holds turn 1 + answer minus its last token (never fed back).
  EXPECT_EQ(hit2, 45 + 7 - 1);
  EXPECT_EQ((*eng)->stats().prompt_tokens - before, int64_t(turn2.size()) - hit2);
  EXPECT_EQ(cached_answer, run_turn(turn2, false, nullptr));
  EXPECT_EQ(c->stats().puts, 4);  // end of prompt + end of response, per cached turn
}

}  // namespace
}  // namespace flashseek::kvtest

namespace flashseek::kvtest {
namespace {

// A long prefill in small chunks leaves snapshots every N prompt tokens (at chunk ends), and a
// prompt that shares only the first part of it restores the deepest one below the divergence.
TEST_F(Cache, LongPrefillSnapshotsEveryNTokens) {
  auto every = cache_opts(int64_t(1) << 30);
  every.snapshot_every = 20;
  auto c = StateCache::open(std::move(every));
  ASSERT_TRUE(c.ok());
  auto eng = engine::Engine::create(*model_, {.budget = {.max_step_tokens = 16, .max_prefill_chunk = 16}});
  ASSERT_TRUE(eng.ok()) << eng.status().to_string();
  Rng rng(9);
  engine::Request r;
  r.id = 1;
  r.prompt = random_tokens(rng, 75);
  r.max_tokens = 1;
  r.sampling.temperature = 0;
  engine::attach_state_cache(**c, 5, r);
  const auto prompt = r.prompt;
  auto s = (*eng)->submit(std::move(r));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*eng)->run_until_idle().ok());
  (*c)->flush();
  // Chunks end at 16, 32, 48, 64, 75: multiples of 20 are crossed at 32, 48, 64; plus the end.
  EXPECT_EQ((*c)->stats().puts, 4);
  auto other = prompt;
  other[55] = (other[55] + 1) % int32_t(model_->config().vocab_size);
  auto hit = (*c)->lookup(5, other, 74);
  ASSERT_TRUE(hit);
  EXPECT_EQ(hit->n_tokens, 48);
  expect_continues(*hit, other);
}

}  // namespace
}  // namespace flashseek::kvtest

namespace flashseek::kvtest {
namespace {

// A snapshot is usable the moment put() returns (while it is still being serialised): turn 2
// arriving right after turn 1's response must not miss it.
TEST_F(Cache, SnapshotUsableBeforeItIsStored) {
  auto c = open(int64_t(1) << 30);
  Rng rng(13);
  for (int i = 0; i < 5; ++i) {
    const auto t = random_tokens(rng, 40 + i);
    auto st = run(t);
    c->put(6, t, *st);  // no flush
    auto seq = t;
    seq.push_back(1);
    auto hit = c->lookup(6, seq, int64_t(t.size()));
    ASSERT_TRUE(hit) << i;
    EXPECT_EQ(hit->n_tokens, int64_t(t.size()));
    expect_continues(*hit, seq);
    EXPECT_FALSE(c->lookup(7, seq, int64_t(t.size())));
  }
  c->flush();
  EXPECT_EQ(c->stats().puts, 5);
}

}  // namespace
}  // namespace flashseek::kvtest
