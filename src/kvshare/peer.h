// Snapshot transport between servers. A server endpoint (TCP control channel) serves
//   G  GET over TCP: send me snapshot <hash> of <tenant> on this socket;
//   U  GET over UCX: tell me where snapshot <hash> of <tenant> lies in your ucp-registered memory
//      (address, size, packed rkey, worker address); the fetcher reads it with one one-sided
//      ucp_get_nbx (ucx.h) and reports completion on the socket, while the owner progresses its
//      worker (needed when UCX emulates RMA over TCP);
//   P  PUT: take this snapshot (drain hand-over; always over TCP).
// Every connection starts with a challenge: the server sends a random 32-byte nonce and the
// client must answer HMAC-SHA256(cluster secret, nonce); otherwise the server closes the
// connection, so an rkey is only ever handed to a peer that knows the secret. Blobs are verified
// by the receiver (checksum, fingerprint, key) before use (engine::StateCache). All socket
// operations and UCX waits are bounded by a timeout.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/state_cache.h"
#include "kvshare/ucx.h"

namespace flashseek::kvshare {

// How snapshot bytes move between servers (`serve --kv-transport`).
enum class Transport { kUcx, kTcp };
Result<Transport> parse_transport(const std::string& name);
const char* transport_name(Transport t);
// ucx when this build has UCX, else tcp.
Transport default_transport();

class SnapshotServer {
 public:
  // With enable_ucx (and a UCX build) the endpoint also serves U (GET over UCX); if UCX cannot
  // start, it logs why and serves TCP only.
  SnapshotServer(engine::StateCache& cache, std::string secret, int timeout_ms = 2000,
                 bool enable_ucx = ucx_built());
  ~SnapshotServer();
  SnapshotServer(const SnapshotServer&) = delete;
  SnapshotServer& operator=(const SnapshotServer&) = delete;
  // Binds host:port (0: any free port), starts the accept thread; returns the port.
  Result<int> start(const std::string& host, int port);
  void stop();
  int64_t served() const { return served_; }
  int64_t served_ucx() const { return served_ucx_; }  // of served(): over UCX
  int64_t rejected() const { return rejected_; }  // failed authentication
  bool ucx_enabled() const { return ucx_ != nullptr; }

 private:
  // A blob kept registered for UCX GETs while the cache still holds it (same buffer).
  struct Registered {
    std::shared_ptr<const std::vector<uint8_t>> blob;
    std::shared_ptr<UcxRegion> region;
  };
  void loop();
  void handle(int fd);
  std::shared_ptr<const std::vector<uint8_t>> tenant_blob(uint64_t hash, uint64_t tenant);
  void serve_ucx(int fd, uint64_t hash, uint64_t tenant);

  engine::StateCache& cache_;
  const std::string secret_;
  const int timeout_ms_;
  std::unique_ptr<UcxNode> ucx_;
  std::unordered_map<uint64_t, Registered> registered_;  // accept thread only
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> served_{0}, served_ucx_{0}, rejected_{0};
  std::thread thread_;
};

// GET: the blob of snapshot `hash` for `tenant` from the peer at "host:port".
Result<std::vector<uint8_t>> fetch_snapshot(const std::string& address, const std::string& secret,
                                            uint64_t hash, uint64_t tenant, int timeout_ms);
// GET over UCX: the peer registers the blob, this node reads it with one one-sided GET.
// kUnimplemented when the peer serves no UCX (the caller may use TCP instead).
Result<std::vector<uint8_t>> fetch_snapshot_ucx(const std::string& address,
                                                const std::string& secret, uint64_t hash,
                                                uint64_t tenant, int timeout_ms, UcxNode& node);
// PUT: hands a blob to the peer (it verifies and stores it, then owns it).
Status push_snapshot(const std::string& address, const std::string& secret,
                     const std::vector<uint8_t>& blob, int timeout_ms);

}  // namespace flashseek::kvshare
