// StateCache bounds against hostile or failing inputs: a failed write leaves no .tmp file, cache
// files larger than any snapshot of the model are removed unread, a file or peer blob with a
// valid checksum but the wrong state geometry is dropped and counted, a peer answering with a
// longer snapshot than was asked for is refused, and the serialisation queue is bounded.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

#include <fmt/format.h>

#include "engine/state_cache.h"
#include "kv_test_util.h"

namespace flashseek::kvtest {
namespace {

using engine::StateCache;
namespace fs = std::filesystem;

class CacheBounds : public TinyModel {
 protected:
  std::unique_ptr<StateCache> open(engine::StateCacheOptions o) {
    auto c = StateCache::open(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  static fs::path file_of(const fs::path& dir, uint64_t hash) {
    return dir / fmt::format("{:016x}.fss", hash);
  }
  static int count_ext(const fs::path& dir, const std::string& ext) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ext;
    return n;
  }
};

TEST_F(CacheBounds, FailedWritesLeaveNoTmpFile) {
  flashseek::testing::TempDir dir;
  auto c = open(cache_opts(0, dir.path().string()));
  Rng rng(1);
  // Rename failure: the target name is taken by a non-empty directory.
  const auto a = random_tokens(rng, 12);
  const uint64_t ha = engine::prefix_hashes(1, a).back();
  fs::create_directories(file_of(dir.path(), ha) / "x");
  c->put(1, a, *run(a));
  c->flush();
  EXPECT_EQ(count_ext(dir.path(), ".tmp"), 0);
  EXPECT_EQ(c->stats().disk_entries, 0);
  // Write failure part-way (file size limit: the write fails with EFBIG instead of a signal).
  const auto b = random_tokens(rng, 40);
  auto st = run(b);
  struct sigaction ignore{}, old_action{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &old_action);
  rlimit old_limit{};
  getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit small = old_limit;
  small.rlim_cur = 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  c->put(1, b, *st);
  c->flush();
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_EQ(count_ext(dir.path(), ".tmp"), 0);
  EXPECT_FALSE(fs::exists(file_of(dir.path(), engine::prefix_hashes(1, b).back())));
  // The cache still works afterwards.
  const auto d = random_tokens(rng, 10);
  c->put(1, d, *run(d));
  c->flush();
  EXPECT_EQ(c->stats().disk_entries, 1);
}

TEST_F(CacheBounds, OversizeFilesAreRemovedUnread) {
  flashseek::testing::TempDir dir;
  Rng rng(2);
  const auto a = random_tokens(rng, 14), b = random_tokens(rng, 15);
  const uint64_t ha = engine::prefix_hashes(1, a).back(), hb = engine::prefix_hashes(1, b).back();
  uint64_t max = 0;
  {
    auto c = open(cache_opts(0, dir.path().string()));
    c->put(1, a, *run(a));
    c->put(1, b, *run(b));
    c->flush();
    max = c->max_snapshot_bytes();
  }
  // File a grows past the largest snapshot this model can have (header intact): at start it is
  // removed without being read.
  fs::resize_file(file_of(dir.path(), ha), max + 1);
  auto c = open(cache_opts(0, dir.path().string()));
  EXPECT_EQ(c->stats().oversize, 1);
  EXPECT_FALSE(fs::exists(file_of(dir.path(), ha)));
  EXPECT_EQ(c->stats().disk_entries, 1);
  // File b grows after it was indexed: the lookup checks the size before reading.
  fs::resize_file(file_of(dir.path(), hb), max + 1);
  auto prompt = b;
  prompt.push_back(3);
  EXPECT_FALSE(c->lookup(1, prompt, int64_t(b.size())));
  EXPECT_EQ(c->stats().oversize, 2);
  EXPECT_FALSE(fs::exists(file_of(dir.path(), hb)));
  EXPECT_FALSE(c->blob(hb));
}

// A disk file with a valid checksum (written by this process, re-encoded after a change) but a
// state that does not fit the model: dropped and counted on lookup; refused by insert_blob.
TEST_F(CacheBounds, WrongGeometryWithValidChecksumIsDropped) {
  flashseek::testing::TempDir dir;
  Rng rng(3);
  const auto t = random_tokens(rng, 30);
  const uint64_t h = engine::prefix_hashes(1, t).back();
  auto st = run(t);
  auto bad = st->clone();
  dynamic_cast<forward::CpuSequenceState&>(*bad).ring_size = 1;
  auto blob = forward::serialize_snapshot(*bad, t, {fingerprint_, 1, h, 30, 0});
  ASSERT_TRUE(blob.ok());
  {
    std::ofstream out(file_of(dir.path(), h), std::ios::binary);
    out.write(reinterpret_cast<const char*>(blob->data()), std::streamsize(blob->size()));
  }
  auto c = open(cache_opts(0, dir.path().string()));
  EXPECT_EQ(c->stats().disk_entries, 1);  // the header is fine: indexed
  auto prompt = t;
  prompt.push_back(1);
  EXPECT_FALSE(c->lookup(1, prompt, 30));
  EXPECT_EQ(c->stats().corrupt, 1);
  EXPECT_FALSE(fs::exists(file_of(dir.path(), h)));
  Status st2 = c->insert_blob(*blob);
  EXPECT_FALSE(st2.ok());
  EXPECT_NE(st2.message().find("ring size"), std::string::npos) << st2.message();
}

// A remote tier that answers with a fixed blob whatever it is asked for.
class FixedRemote final : public engine::RemoteTier {
 public:
  explicit FixedRemote(std::vector<uint8_t> blob) : blob_(std::move(blob)) {}
  std::optional<std::vector<uint8_t>> fetch_longest(uint64_t, std::span<const uint64_t>) override {
    return blob_;
  }
  void on_stored(uint64_t, uint64_t, int64_t, int64_t) override {}
  void on_dropped(uint64_t) override {}

 private:
  std::vector<uint8_t> blob_;
};

// Asked for prefixes of prompt[0, P-1), a peer returns the snapshot of the whole prompt (P
// tokens): it is refused and counted (before, its length indexed past the prefix-hash table).
TEST_F(CacheBounds, RemoteSnapshotLongerThanAskedIsRefused) {
  auto c = open(cache_opts(1 << 24));
  Rng rng(4);
  const auto prompt = random_tokens(rng, 20);
  const uint64_t h = engine::prefix_hashes(1, prompt).back();
  auto blob = forward::serialize_snapshot(*run(prompt), prompt, {fingerprint_, 1, h, 20, 0});
  ASSERT_TRUE(blob.ok());
  FixedRemote remote(*blob);
  c->set_remote(&remote);
  EXPECT_FALSE(c->lookup(1, prompt, 19));
  EXPECT_EQ(c->stats().corrupt, 1);
  EXPECT_EQ(c->stats().hits_remote, 0);
  c->set_remote(nullptr);
}

// Holds the worker inside on_stored() until released, so puts pile up in the queue.
class BlockingRemote final : public engine::RemoteTier {
 public:
  std::optional<std::vector<uint8_t>> fetch_longest(uint64_t, std::span<const uint64_t>) override {
    return std::nullopt;
  }
  void on_stored(uint64_t, uint64_t, int64_t, int64_t) override {
    std::unique_lock lock(mu);
    entered = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(30), [&] { return released; });
  }
  void on_dropped(uint64_t) override {}
  bool wait_entered() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return entered; });
  }
  void release() {
    std::lock_guard lock(mu);
    released = true;
    cv.notify_all();
  }
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, released = false;
};

TEST_F(CacheBounds, PendingQueueIsBoundedDroppingTheOldest) {
  auto o = cache_opts(1 << 26);
  o.max_pending = 2;
  auto c = open(std::move(o));
  BlockingRemote remote;
  c->set_remote(&remote);
  Rng rng(5);
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 6; ++i) seqs.push_back(random_tokens(rng, 8 + i));
  c->put(1, seqs[0], *run(seqs[0]));
  ASSERT_TRUE(remote.wait_entered());  // the worker is busy with seqs[0]
  for (int i = 1; i < 6; ++i) c->put(1, seqs[size_t(i)], *run(seqs[size_t(i)]));
  EXPECT_EQ(c->stats().pending_dropped, 3);  // seqs[1..3] dropped, seqs[4..5] kept
  remote.release();
  c->flush();
  c->set_remote(nullptr);
  for (int i = 0; i < 6; ++i) {
    auto prompt = seqs[size_t(i)];
    prompt.push_back(1);
    const bool kept = i == 0 || i >= 4;
    EXPECT_EQ(bool(c->lookup(1, prompt, int64_t(prompt.size()) - 1)), kept) << i;
  }
  EXPECT_NE(c->metrics_text().find("flashseek_state_cache_pending_dropped_total 3"),
            std::string::npos);
}

}  // namespace
}  // namespace flashseek::kvtest
