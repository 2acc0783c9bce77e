// A server's membership in the sharing cluster: the engine cache's RemoteTier backed by the Redis
// registry (who owns what) and the peer transport (peer.h). Snapshots this server stores are
// announced as owned by it; a prompt whose longest prefix lives on a live peer is fetched from
// there, verified by the cache, stored here, and announced again (ownership moves to us). Any
// failure (registry down, peer dead, timeout, bad blob) returns nothing: the caller recomputes.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include "engine/state_cache.h"
#include "kvshare/peer.h"
#include "kvshare/registry.h"

namespace flashseek::kvshare {

struct ClusterOptions {
  std::string redis_url;
  RedisTlsOptions redis_tls;   // CA / client certificate for a rediss:// URL
  std::string secret;          // cluster secret shared by every server
  std::string server_id;       // empty: "<hostname>-<pid>"
  std::string kv_host = "127.0.0.1";  // where the snapshot endpoint listens
  int kv_port = 0;             // 0: any free port
  std::string advertise_host;  // how peers reach us (empty: kv_host)
  int timeout_ms = 2000;       // per transfer
  int handshake_timeout_ms = 1000;  // a peer must finish the handshake within this
  int max_peers = 16;          // peer connections served at once
  Transport transport = default_transport();  // how this server fetches (it serves both)
};

class Cluster final : public engine::RemoteTier {
 public:
  // Starts the snapshot endpoint and the registry client and attaches to `cache`.
  static Result<std::unique_ptr<Cluster>> start(engine::StateCache& cache, ClusterOptions options);
  ~Cluster() override;  // detaches from the cache, leaves the registry

  std::optional<std::vector<uint8_t>> fetch_longest(uint64_t tenant,
                                                    std::span<const uint64_t> hashes) override;
  void on_stored(uint64_t hash, uint64_t tenant, int64_t tokens, int64_t bytes) override;
  void on_dropped(uint64_t hash) override;
  std::string metrics() const override;

  // Drain: hands the `n` most recently used snapshots to live peers (round robin). Returns how
  // many a peer accepted.
  int64_t hand_over(size_t n);
  int kv_port() const { return kv_port_; }
  Transport transport() const { return transport_; }
  Registry& registry() { return *registry_; }

 private:
  Cluster(engine::StateCache& cache, ClusterOptions options);

  engine::StateCache& cache_;
  const ClusterOptions options_;
  std::unique_ptr<SnapshotServer> server_;
  std::unique_ptr<Registry> registry_;
  int kv_port_ = 0;
  Transport transport_ = Transport::kTcp;  // ucx only when the fetch node started
  std::unique_ptr<UcxNode> ucx_;           // the fetching side's worker
  PeerAuth auth_;
  std::atomic<int64_t> fetches_{0}, fetch_failures_{0}, handed_over_{0};
  // Fetch failures by cause: the owner failed authentication, a message or blob failed its MAC,
  // the owner offered a snapshot larger than this model's largest.
  std::atomic<int64_t> owner_auth_failures_{0}, bad_mac_{0}, oversize_{0};
  // Completed transfers per transport (index: Transport): count, bytes, seconds (in µs).
  std::atomic<int64_t> transfers_[2] = {}, transfer_bytes_[2] = {}, transfer_us_[2] = {};
};

}  // namespace flashseek::kvshare
