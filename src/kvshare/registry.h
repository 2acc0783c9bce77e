// Snapshot registry in Redis (DESIGN.md §4): which server owns which snapshot, and which servers
// are alive. Keys (prefix "fs:"):
//   fs:server:<id>   = "<host>:<port>" of its snapshot endpoint, with a TTL (heartbeat)
//   fs:snap:<hash>   = hash {owner, tenant, tokens, bytes}, with a TTL (expiry)
//   channel fs:events: "own <hash> <id>" / "evict <hash> <id>"
// Every call is bounded by a short timeout and never throws: without Redis the server runs local
// only. A background thread sends the heartbeat, drains queued announcements, reconnects when
// Redis comes back and then re-announces everything this server owns.
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
#include <vector>

#include "core/status.h"

struct redisContext;

namespace flashseek::kvshare {

struct RegistryOptions {
  std::string url;           // redis://host:port
  std::string server_id;     // unique per server
  std::string advertise;     // "<host>:<port>" of this server's snapshot endpoint
  int heartbeat_ttl_s = 5;   // the server counts as dead this long after its last heartbeat
  int snapshot_ttl_s = 3600; // registry entries expire (re-announced while owned)
  int timeout_ms = 300;      // per Redis command
};

struct SnapshotLocation {
  uint64_t hash = 0;
  std::string owner;    // server id
  std::string address;  // its snapshot endpoint
};

// Parses redis://host[:port][/db] (db ignored) or host:port.
Result<std::pair<std::string, int>> parse_redis_url(const std::string& url);

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
  // Live peers (id → address), ourselves excluded.
  std::map<std::string, std::string> peers();
  bool connected() const { return connected_; }
  int64_t reconnects() const { return reconnects_; }
  const RegistryOptions& options() const { return options_; }

 private:
  struct Owned { uint64_t tenant; int64_t tokens, bytes; };
  struct Op { bool add; uint64_t hash; Owned meta; };
  bool ensure_connected();  // caller holds redis_mu_
  bool owners_of(std::span<const uint64_t> hashes, std::vector<std::string>& owners);  // same
  void loop();
  void apply(const Op& op);  // caller holds redis_mu_
  void reannounce_all();     // caller holds redis_mu_

  const RegistryOptions options_;
  std::string host_;
  int port_ = 0;
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
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace flashseek::kvshare
