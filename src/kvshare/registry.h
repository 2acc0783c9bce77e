// Snapshot registry in Redis (DESIGN.md §4): which server owns which snapshot, and which servers
// are alive. Keys (prefix "fs:"):
//   fs:server:<id>   = "<host>:<port>" of its snapshot endpoint, with a TTL (heartbeat)
//   fs:snap:<hash>   = hash {owner, tenant, tokens, bytes}, with a TTL (expiry)
//   channel fs:events: "own <hash> <id>" / "evict <hash> <id>"
// Every call is bounded by a short timeout and never throws: without Redis the server runs local
// only. A background thread sends the heartbeat, drains queued announcements, reconnects when
// Redis comes back and then re-announces everything this server owns (and replays withdrawals
// made while it was away). A listener thread subscribes to fs:events (resubscribing after Redis
// restarts) and keeps a local view of remote owners: a snapshot whose owner announced its
// eviction is skipped by find() even if its registry entry is still there, so no fetch is tried.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "kvshare/redis_tls.h"

struct redisContext;

namespace flashseek::kvshare {

struct RegistryOptions {
  std::string url;           // redis://host:port or rediss://host:port (TLS)
  std::string server_id;     // unique per server
  std::string advertise;     // "<host>:<port>" of this server's snapshot endpoint
  int heartbeat_ttl_s = 5;   // the server counts as dead this long after its last heartbeat
  int snapshot_ttl_s = 3600; // registry entries expire (re-announced while owned)
  int timeout_ms = 300;      // per Redis command
  RedisTlsOptions tls;       // CA / client certificate for rediss:// (unused for redis://)
};

struct SnapshotLocation {
  uint64_t hash = 0;
  std::string owner;    // server id
  std::string address;  // its snapshot endpoint
};

struct RedisUrl {
  std::string host;
  int port = 6379;
  std::string user, password;  // AUTH [user] password after every connect (empty: none)
  bool tls = false;            // rediss://: every connection is TLS, server certificate verified
};

// Parses redis[s]://[[user]:password@]host[:port][/db] (db ignored; user and password
// percent-decoded) or host:port. rediss:// means TLS (redis_tls.h).
Result<RedisUrl> parse_redis_url(const std::string& url);

class Registry {
 public:
  explicit Registry(RegistryOptions options);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Non-blocking: queued for the background thread.
  void announce(uint64_t hash, uint64_t tenant, int64_t tokens, int64_t bytes);
  void withdraw(uint64_t hash);
  // Blocking (bounded by the timeout): the first of `hashes` owned by a live peer (not us).
  std::optional<SnapshotLocation> find(std::span<const uint64_t> hashes);
  // Live peers (id → address), ourselves excluded (SCAN over fs:server:*), at most kMaxPeers: a
  // Redis that lists more server keys than any cluster has (hostile or broken) cannot make the
  // scan, the per-key GETs or a drain's hand-over unbounded.
  static constexpr size_t kMaxPeers = 1024;
  std::map<std::string, std::string> peers();
  bool connected() const { return connected_; }
  int64_t reconnects() const { return reconnects_; }
  // The last connect / TLS / AUTH error (empty: none yet), e.g. a TLS verification failure.
  std::string last_error() const;
  bool subscribed() const { return subscribed_; }
  int64_t events() const { return events_; }                // fs:events messages received
  int64_t stale_skipped() const { return stale_skipped_; }  // find() candidates skipped: evicted
  // Remote snapshots in the local view (announced by a peer, not evicted since subscribing).
  size_t view_size() const;
  const RegistryOptions& options() const { return options_; }

 private:
  struct Owned { uint64_t tenant; int64_t tokens, bytes; };
  struct Op { bool add; uint64_t hash; Owned meta; };
  bool ensure_connected();  // caller holds redis_mu_
  // A new connection with AUTH done (nullptr on failure, logged once per distinct error).
  redisContext* connect_redis(const char* what);
  bool owners_of(std::span<const uint64_t> hashes, std::vector<std::string>& owners);  // same
  void loop();
  void apply(const Op& op);  // caller holds redis_mu_
  void reannounce_all();     // caller holds redis_mu_
  void listen_loop();
  void on_event(const std::string& message);

  const RegistryOptions options_;
  RedisUrl url_;
  int port_ = 0;  // 0: no usable URL (local only)
  std::shared_ptr<RedisTlsContext> tls_;  // rediss:// only
  mutable std::mutex log_mu_;
  std::string last_error_;  // last connect / AUTH error logged
  std::mutex redis_mu_;          // one command at a time on ctx_
  redisContext* ctx_ = nullptr;
  std::atomic<bool> connected_{false};
  std::atomic<int64_t> reconnects_{0};
  bool need_reannounce_ = false;
  std::chrono::steady_clock::time_point last_request_connect_{};  // find()'s last reconnect try

  std::mutex mu_;                // guards ops_, owned_, stopping_
  std::condition_variable cv_;
  std::deque<Op> ops_;
  std::map<uint64_t, Owned> owned_;
  std::unordered_set<uint64_t> lost_withdrawals_;  // made while Redis was away: replayed
  bool stopping_ = false;
  std::thread thread_;

  // fs:events view (listener thread writes, find() reads).
  mutable std::mutex view_mu_;
  std::unordered_map<uint64_t, std::string> view_;     // hash → owner of the latest "own"
  std::unordered_map<uint64_t, std::string> evicted_;  // hash → owner that announced eviction
  std::atomic<bool> subscribed_{false};
  std::atomic<int64_t> events_{0}, stale_skipped_{0};
  std::thread listener_;
};

}  // namespace flashseek::kvshare
