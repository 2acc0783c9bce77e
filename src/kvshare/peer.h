// Snapshot transport between servers. A server endpoint (TCP control channel) serves
//   G  GET over TCP: send me snapshot <hash> of <tenant> on this socket;
//   U  GET over UCX: tell me where snapshot <hash> of <tenant> lies in your ucp-registered memory
//      (address, size, packed rkey, worker address); the fetcher reads it with one one-sided
//      ucp_get_nbx (ucx.h) and reports completion on the socket, while the owner progresses its
//      worker (needed when UCX emulates RMA over TCP);
//   P  PUT: take this snapshot (drain hand-over; always over TCP).
//
// Every connection starts with a mutual handshake (protocol "FSK2", docs/kvshare.md):
//   server → client: "FSK2", server id, 32-byte nonce Ns
//   client → server: client id, 32-byte nonce Nc, HMAC-SHA256(K, "client" ‖ T)
//   server → client: HMAC-SHA256(K, "server" ‖ T)
// with K the cluster secret and T = (server id, client id, the address the client dialed, Ns,
// Nc), each length-prefixed. Both sides prove the secret over both nonces, bound to both ids,
// the dialed address and the role, so a proof relayed or reflected from another connection
// does not verify (a server also refuses a client that claims its own id, and a client refuses
// a server whose id is not the owner the registry named). MACs are compared in constant time.
// After it, every control message carries HMAC-SHA256(session key, direction ‖ sequence ‖
// message) with the session key HMAC(K, "session" ‖ T), and every snapshot carries
// HMAC-SHA256(data key, blob) with the data key HMAC(K, "data"): a blob changed in transit (or
// in registered memory) is refused. The receiver then verifies the blob itself (checksum,
// fingerprint, model geometry, key) before use (engine::StateCache).
//
// Bounds: the endpoint serves up to max_peers connections at once (more are closed at once),
// each handshake must finish within handshake_timeout_ms and the whole exchange within
// timeout_ms; sizes a peer announces are checked against the local maximum snapshot size
// before anything is allocated.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
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

// What a server proves in a handshake: the cluster secret, and its own id (registry server id).
struct PeerAuth {
  std::string secret;
  std::string id;
};

// A peer to connect to: "host:port" as the registry advertises it, and the server id expected
// there (empty: any id but our own).
struct PeerAddress {
  std::string address;
  std::string id;
};

// Error codes of the fetch / push functions beyond kUnavailable (transport failures):
//   kInvalidArgument  the peer failed authentication (wrong secret, unexpected id, relayed proof)
//   kParseError       a message or snapshot failed its MAC (changed in transit)
//   kOutOfRange       the peer announced a snapshot larger than max_bytes (nothing allocated)
//   kNotFound         the peer does not hold the snapshot (for this tenant)
//   kUnimplemented    the peer serves no UCX (fetch_snapshot_ucx only)

// One authenticated connection: after the handshake, control messages in both directions are
// sealed with the session key (u32 length, message, MAC over direction ‖ sequence ‖ message).
struct PeerSession {
  int fd = -1;
  std::chrono::steady_clock::time_point deadline;  // bounds every read and write
  std::vector<uint8_t> key;                        // session key
  char self_dir = 's';                             // 's' server, 'c' client
  uint32_t sent = 0, received = 0;
  bool mac_failed = false;                         // the last recv() failed on its MAC
  bool send(std::span<const uint8_t> message);
  // A message of 1..max bytes whose MAC verifies.
  bool recv(std::vector<uint8_t>& message, uint32_t max = 1 << 20);
};

// Protocol pieces, also used by tests that play a misbehaving peer:
// the server side of the handshake on an accepted socket (advertise: the address this server is
// dialed at); kInvalidArgument when the client failed authentication.
Status accept_peer(PeerSession& s, const PeerAuth& auth, const std::string& advertise);
// HMAC-SHA256 of a snapshot blob under the cluster's data key.
std::vector<uint8_t> snapshot_mac(const std::string& secret, std::span<const uint8_t> blob);

struct SnapshotServerOptions {
  PeerAuth auth;
  std::string advertise_host;   // host peers dial (bound into handshakes); empty: start()'s host
  int timeout_ms = 2000;        // whole exchange after the handshake
  int handshake_timeout_ms = 1000;
  int max_peers = 16;           // connections served at once; more are closed unserved
  bool enable_ucx = ucx_built();
};

class SnapshotServer {
 public:
  // With enable_ucx (and a UCX build) the endpoint also serves U (GET over UCX); if UCX cannot
  // start, it logs why and serves TCP only.
  SnapshotServer(engine::StateCache& cache, SnapshotServerOptions options);
  ~SnapshotServer();
  SnapshotServer(const SnapshotServer&) = delete;
  SnapshotServer& operator=(const SnapshotServer&) = delete;
  // Binds host:port (0: any free port), starts the accept thread; returns the port.
  Result<int> start(const std::string& host, int port);
  void stop();
  int64_t served() const { return served_; }
  int64_t served_ucx() const { return served_ucx_; }  // of served(): over UCX
  int64_t rejected() const { return rejected_; }      // failed authentication
  int64_t busy() const { return busy_; }              // closed unserved: max_peers reached
  int64_t bad_mac() const { return bad_mac_; }        // messages / pushed blobs failing their MAC
  int64_t oversize() const { return oversize_; }      // pushes larger than the local maximum
  int active() const { return active_; }              // connections being served now
  bool ucx_enabled() const { return ucx_ != nullptr; }
  const std::string& advertise() const { return advertise_; }  // "host:port", after start()

 private:
  // A blob kept registered for UCX GETs while the cache still holds it (same buffer).
  struct Registered {
    std::shared_ptr<const std::vector<uint8_t>> blob;
    std::shared_ptr<UcxRegion> region;
    std::vector<uint8_t> tag;  // data MAC of the blob
  };
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  void loop();
  void reap(bool all);
  void handle(int fd);
  std::shared_ptr<const std::vector<uint8_t>> tenant_blob(uint64_t hash, uint64_t tenant);
  void serve_ucx(PeerSession& s, uint64_t hash, uint64_t tenant);

  engine::StateCache& cache_;
  const SnapshotServerOptions options_;
  std::string advertise_;
  std::unique_ptr<UcxNode> ucx_;
  std::mutex reg_mu_;
  std::unordered_map<uint64_t, Registered> registered_;  // guarded by reg_mu_
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> served_{0}, served_ucx_{0}, rejected_{0}, busy_{0}, bad_mac_{0},
      oversize_{0};
  std::atomic<int> active_{0};
  std::list<Worker> workers_;  // accept thread only
  std::thread thread_;
};

// GET: the blob of snapshot `hash` for `tenant` from `peer` (at most max_bytes).
Result<std::vector<uint8_t>> fetch_snapshot(const PeerAddress& peer, const PeerAuth& auth,
                                            uint64_t hash, uint64_t tenant, int timeout_ms,
                                            uint64_t max_bytes);
// GET over UCX: the peer registers the blob, this node reads it with one one-sided GET.
// kUnimplemented when the peer serves no UCX (the caller may use TCP instead).
Result<std::vector<uint8_t>> fetch_snapshot_ucx(const PeerAddress& peer, const PeerAuth& auth,
                                                uint64_t hash, uint64_t tenant, int timeout_ms,
                                                uint64_t max_bytes, UcxNode& node);
// PUT: hands a blob to the peer (it verifies and stores it, then owns it).
Status push_snapshot(const PeerAddress& peer, const PeerAuth& auth,
                     const std::vector<uint8_t>& blob, int timeout_ms);

}  // namespace flashseek::kvshare
