// The conversation state cache (DESIGN.md §3, issue 6): snapshots of sequence states keyed by a
// hash chain over (tenant, token prefix), so a request whose prompt extends an earlier prompt or
// response restores the longest cached prefix and prefills only the rest.
//
// Tiers: host memory (serialised blobs, LRU under a byte budget) → optional directory on disk
// (write-through, LRU under an optional byte budget, survives restarts; every file is verified by checksum, fingerprint, state
// geometry, tenant and token ids when used, and a bad one is removed, never used; files larger
// than the model's largest snapshot are removed unread) → optional remote tier (kvshare).
// Pages shared between snapshots: in the host tier a snapshot is a "thin" blob whose sealed pages
// of compressed KV / index keys (forward::PagedRows) are references into a page store keyed by
// xxHash64(tenant, page contents); every snapshot of a conversation references the same pages,
// and the tier's byte count holds each page once. Disk files and blobs sent to peers are
// self-contained (forward/state_io.h).
//
// Threads: lookup() from any thread; put() from the engine's scheduler thread (it only queues a
// clone); one worker thread serialises and writes. flush() waits for the worker (tests).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/request.h"
#include "forward/model.h"
#include "forward/state_io.h"

namespace flashseek::engine {

// Hash chain: h(empty) = chain_start(tenant); h(t[0..i]) = chain_next(h(t[0..i-1]), t[i]).
uint64_t chain_start(uint64_t tenant);
uint64_t chain_next(uint64_t h, int32_t token);
// [tokens.size() + 1] hashes of every prefix length 0..n.
std::vector<uint64_t> prefix_hashes(uint64_t tenant, std::span<const int32_t> tokens);

enum class CacheTier { kHost, kDisk, kRemote };

struct StateCacheOptions {
  uint64_t fingerprint = 0;   // model identity (forward::checkpoint_fingerprint)
  int64_t host_bytes = int64_t(1) << 30;  // host-tier budget; 0 keeps nothing in memory
  std::string dir;            // disk tier directory (created); empty: none
  int64_t min_tokens = 2;     // shorter states are not worth a snapshot
  int64_t snapshot_every = 0; // also snapshot long prefills every N prompt tokens (0: off)
  int64_t dir_bytes = 0;      // disk-tier budget: least recently used files go first (0: none)
  // Shape of this model's states (forward::snapshot_geometry): every snapshot from disk, a peer
  // or memory is checked against it before use. Required (open() refuses a geometry without
  // layers); its max_tokens also bounds the size of any blob or file the cache reads.
  forward::SnapshotGeometry geometry;
  int64_t max_pending = 64;   // snapshots queued for the worker; beyond, the oldest is dropped
};

struct StateCacheStats {
  int64_t host_entries = 0, host_bytes = 0;  // blobs held in memory, pages included (once)
  int64_t host_pages = 0, host_page_bytes = 0;  // of those: distinct shared pages
  int64_t disk_entries = 0, disk_bytes = 0;  // files in the cache directory
  int64_t puts = 0;             // snapshots stored
  int64_t evictions = 0;        // blobs dropped from the host tier
  int64_t disk_evictions = 0;   // files removed to keep the disk tier under its budget
  int64_t hits_host = 0, hits_disk = 0, hits_remote = 0, misses = 0;
  int64_t hit_tokens_local = 0, hit_tokens_remote = 0;  // prompt tokens restored from cache
  int64_t corrupt = 0;          // blobs/files that failed verification (discarded)
  int64_t oversize = 0;         // blobs/files larger than max_snapshot_bytes (refused unread)
  int64_t pending_dropped = 0;  // queued snapshots dropped because the queue was full
  int64_t remote_bytes = 0;     // bytes fetched from peers
  double remote_seconds = 0;    // time spent fetching from peers
};

struct CacheHit {
  std::shared_ptr<const forward::SequenceState> state;  // holds tokens[0, n_tokens)
  int64_t n_tokens = 0;
  CacheTier tier = CacheTier::kHost;
};

// Where snapshots of other servers come from (kvshare implements it). `hashes` are the prefix
// hashes of the prompt, longest first; returns the blob of the longest one it can fetch.
class RemoteTier {
 public:
  virtual ~RemoteTier() = default;
  virtual std::optional<std::vector<uint8_t>> fetch_longest(uint64_t tenant,
                                                            std::span<const uint64_t> hashes) = 0;
  // A snapshot was stored / dropped locally (registry announcements).
  virtual void on_stored(uint64_t hash, uint64_t tenant, int64_t tokens, int64_t bytes) = 0;
  virtual void on_dropped(uint64_t hash) = 0;
  // Prometheus text of the remote tier's own counters (transfers, fallbacks, registry state).
  virtual std::string metrics() const { return {}; }
};

class StateCache {
 public:
  // Opens the tiers; with a directory, indexes the snapshot files already there (headers only).
  static Result<std::unique_ptr<StateCache>> open(StateCacheOptions options);
  ~StateCache();
  StateCache(const StateCache&) = delete;
  StateCache& operator=(const StateCache&) = delete;

  // Longest cached prefix of tokens[0, max_len] for this tenant (local tiers, then the remote
  // tier for longer prefixes); nullopt when none verifies.
  std::optional<CacheHit> lookup(uint64_t tenant, std::span<const int32_t> tokens,
                                 int64_t max_len);
  // Queues a snapshot of `state` (holding `tokens`) unless one with that key exists already.
  void put(uint64_t tenant, std::span<const int32_t> tokens, const forward::SequenceState& state);
  // Waits until every queued put is stored.
  void flush();

  // The self-contained blob of a snapshot by key (host tier, else disk); for serving peers.
  std::shared_ptr<const std::vector<uint8_t>> blob(uint64_t hash);
  // Stores a blob fetched from elsewhere after full verification (checksum, fingerprint).
  Status insert_blob(std::vector<uint8_t> blob);
  // Drops a snapshot from every local tier (ownership moved away).
  void erase(uint64_t hash);
  // Keys of the host-tier snapshots, most recently used first (drain hands these over).
  std::vector<uint64_t> hottest(size_t n) const;

  // Attaches the remote tier and announces every snapshot already held (e.g. indexed from the
  // cache directory at start) through it.
  void set_remote(RemoteTier* remote);
  StateCacheStats stats() const;
  // Prometheus text: the stats above plus the remote tier's metrics().
  std::string metrics_text() const;
  uint64_t fingerprint() const { return options_.fingerprint; }
  // Largest blob a snapshot of this model can be (forward::max_snapshot_bytes of the geometry).
  uint64_t max_snapshot_bytes() const { return max_bytes_; }
  const StateCacheOptions& options() const { return options_; }

 private:
  struct Entry {
    uint64_t tenant = 0;
    int64_t n_tokens = 0;
    int64_t bytes = 0;                                 // self-contained size (disk, wire)
    std::shared_ptr<const std::vector<uint8_t>> blob;  // set while in the host tier
    int64_t host_bytes = 0;                            // size of `blob` (thin: pages apart)
    std::vector<uint64_t> page_keys;                   // pages `blob` references
    bool on_disk = false;
    std::list<uint64_t>::iterator lru_it;              // valid while blob is set
    std::list<uint64_t>::iterator disk_it;             // valid while on_disk
  };
  // A snapshot queued for (or being) serialised: lookups already use its state, so a turn that
  // follows its predecessor's response immediately still finds it.
  struct Pending {
    uint64_t tenant, hash;
    std::vector<int32_t> tokens;
    std::shared_ptr<const forward::SequenceState> state;
    std::shared_ptr<const std::vector<uint8_t>> full;  // self-contained blob, if known (fetched)
  };
  explicit StateCache(StateCacheOptions options);
  Status scan_dir();
  void worker();
  // Serialises a snapshot (thin for the host tier, self-contained for disk unless `full` is
  // given already) and stores it.
  void serialize_and_store(const Pending& p, std::vector<uint8_t> full = {});
  using PageList = std::vector<std::pair<uint64_t, forward::PagePtr>>;
  // Indexes a snapshot: `full` (self-contained) goes to disk; the host tier keeps `thin` (whose
  // references are `pages`) or, when thin is empty, `full`. `bytes` = self-contained size.
  void store(std::vector<uint8_t> full, std::vector<uint8_t> thin, const PageList& pages,
             uint64_t hash, uint64_t tenant, int64_t n_tokens, int64_t bytes);
  void store(std::vector<uint8_t> blob, uint64_t hash, uint64_t tenant, int64_t n_tokens) {
    const int64_t bytes = int64_t(blob.size());
    store(std::move(blob), {}, {}, hash, tenant, n_tokens, bytes);
  }
  // Host-tier membership of an entry's blob and its pages; caller holds mu_.
  void hold_host(Entry& e, uint64_t hash, std::shared_ptr<const std::vector<uint8_t>> blob,
                 const PageList& pages);
  void release_host(Entry& e);
  // The pages an entry references (kept alive while a caller decodes outside the lock).
  std::shared_ptr<const std::unordered_map<uint64_t, forward::PagePtr>> pages_of(
      const Entry& e) const;  // caller holds mu_
  void touch(Entry& e);                 // caller holds mu_
  void evict_host();                    // caller holds mu_
  void evict_disk();                    // caller holds mu_
  void touch_disk(Entry& e);            // caller holds mu_
  void drop(uint64_t hash, bool count_corrupt);  // caller holds mu_
  std::string path_of(uint64_t hash) const;
  std::optional<CacheHit> try_pending(uint64_t tenant, std::span<const int32_t> tokens,
                                      uint64_t hash, int64_t n);
  std::optional<CacheHit> try_local(uint64_t tenant, std::span<const int32_t> tokens,
                                    uint64_t hash, int64_t n);
  std::optional<CacheHit> try_remote(uint64_t tenant, std::span<const int32_t> tokens,
                                     std::span<const uint64_t> hashes, int64_t longer_than);

  // Queues a snapshot for the worker, dropping the oldest queued one beyond max_pending; caller
  // holds mu_.
  void enqueue(uint64_t hash, std::shared_ptr<const Pending> p);

  const StateCacheOptions options_;
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::unique_ptr<Entry>> index_;
  std::list<uint64_t> lru_;             // host-tier keys, most recent first
  std::list<uint64_t> disk_lru_;        // disk-tier keys, most recent first
  struct StoredPage {
    forward::PagePtr page;
    int64_t refs = 0;                   // references from host-tier thin blobs
  };
  std::unordered_map<uint64_t, StoredPage> pages_;  // the host tier's shared pages
  StateCacheStats stats_;
  RemoteTier* remote_ = nullptr;

  std::condition_variable cv_;          // worker wake-up / flush
  std::deque<uint64_t> queue_;                          // keys waiting for the worker
  std::unordered_map<uint64_t, std::shared_ptr<const Pending>> pending_;  // queued or in progress
  bool busy_ = false, stopping_ = false;
  std::thread thread_;
};

// Wires a request to the cache: restores the longest cached prefix of its prompt (unless it asks
// for prompt logprobs) and installs the snapshot sink. Returns the prompt tokens served from
// cache (0 on a miss).
int64_t attach_state_cache(StateCache& cache, uint64_t tenant, Request& request);

// Prometheus text of a cache's counters (flashseek_state_cache_*).
std::string state_cache_metrics(const StateCacheStats& s);

}  // namespace flashseek::engine
