// Snapshot transport between servers. v1 runs over plain TCP sockets (not UCX yet): a server
// endpoint that serves GET (send me snapshot <hash> of <tenant>) and PUT (take this snapshot:
// drain hand-over). Every connection starts with a challenge: the server sends a random 32-byte
// nonce and the client must answer HMAC-SHA256(cluster secret, nonce); otherwise the server
// closes the connection. Blobs are verified by the receiver (checksum, fingerprint, key) before
// use (engine::StateCache). All socket operations are bounded by a timeout.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "engine/state_cache.h"

namespace flashseek::kvshare {

class SnapshotServer {
 public:
  SnapshotServer(engine::StateCache& cache, std::string secret, int timeout_ms = 2000);
  ~SnapshotServer();
  SnapshotServer(const SnapshotServer&) = delete;
  SnapshotServer& operator=(const SnapshotServer&) = delete;
  // Binds host:port (0: any free port), starts the accept thread; returns the port.
  Result<int> start(const std::string& host, int port);
  void stop();
  int64_t served() const { return served_; }
  int64_t rejected() const { return rejected_; }  // failed authentication

 private:
  void loop();
  void handle(int fd);

  engine::StateCache& cache_;
  const std::string secret_;
  const int timeout_ms_;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> served_{0}, rejected_{0};
  std::thread thread_;
};

// GET: the blob of snapshot `hash` for `tenant` from the peer at "host:port".
Result<std::vector<uint8_t>> fetch_snapshot(const std::string& address, const std::string& secret,
                                            uint64_t hash, uint64_t tenant, int timeout_ms);
// PUT: hands a blob to the peer (it verifies and stores it, then owns it).
Status push_snapshot(const std::string& address, const std::string& secret,
                     const std::vector<uint8_t>& blob, int timeout_ms);

}  // namespace flashseek::kvshare
