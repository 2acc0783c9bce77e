#include "kvshare/peer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "forward/state_io.h"

namespace flashseek::kvshare {

namespace {

constexpr char kHello[4] = {'F', 'S', 'K', 'V'};
constexpr size_t kNonce = 32;
constexpr uint64_t kMaxBlob = uint64_t(1) << 36;  // 64 GiB: larger is a protocol error
constexpr uint32_t kMaxUcxBlob = 1 << 20;           // rkey / worker address: larger is an error
// Replies to U.
constexpr uint8_t kUcxMissing = 0, kUcxOffer = 1, kUcxUnsupported = 2;

bool send_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    b += k;
    n -= size_t(k);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, b, n, 0);
    if (k <= 0) return false;
    b += k;
    n -= size_t(k);
  }
  return true;
}

void set_timeouts(int fd, int timeout_ms) {
  const timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  // Control messages are small and answered at once: without this, Nagle's algorithm and the
  // peer's delayed ACK add ~40 ms to a request/offer exchange.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::vector<uint8_t> mac(const std::string& secret, const uint8_t* nonce) {
  std::vector<uint8_t> out(32);
  unsigned len = 32;
  HMAC(EVP_sha256(), secret.data(), int(secret.size()), nonce, kNonce, out.data(), &len);
  return out;
}

// Connects to "host:port" and answers the server's challenge; returns the socket.
Result<int> connect_peer(const std::string& address, const std::string& secret, int timeout_ms) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return invalid_argument("peer address {}: expected host:port", address);
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: cannot resolve", address));
  int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
  set_timeouts(fd, timeout_ms);
  const int rc = fd >= 0 ? ::connect(fd, res->ai_addr, res->ai_addrlen) : -1;
  freeaddrinfo(res);
  if (rc != 0) {
    if (fd >= 0) ::close(fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: connection refused", address));
  }
  char hello[4];
  uint8_t nonce[kNonce];
  if (!recv_all(fd, hello, 4) || std::memcmp(hello, kHello, 4) != 0 || !recv_all(fd, nonce, kNonce) ||
      !send_all(fd, mac(secret, nonce).data(), 32)) {
    ::close(fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: handshake failed", address));
  }
  return fd;
}

bool recv_bytes(int fd, std::vector<uint8_t>& v) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, 4) || n == 0 || n > kMaxUcxBlob) return false;
  v.resize(n);
  return recv_all(fd, v.data(), n);
}

}  // namespace

Result<Transport> parse_transport(const std::string& name) {
  if (name == "ucx") {
    if (!ucx_built()) return invalid_argument("--kv-transport ucx: this build has no UCX");
    return Transport::kUcx;
  }
  if (name == "tcp") return Transport::kTcp;
  return invalid_argument("--kv-transport {}: expected ucx or tcp", name);
}

const char* transport_name(Transport t) { return t == Transport::kUcx ? "ucx" : "tcp"; }

Transport default_transport() { return ucx_built() ? Transport::kUcx : Transport::kTcp; }

SnapshotServer::SnapshotServer(engine::StateCache& cache, std::string secret, int timeout_ms,
                               bool enable_ucx)
    : cache_(cache), secret_(std::move(secret)), timeout_ms_(timeout_ms) {
  if (!enable_ucx) return;
  auto node = UcxNode::create();
  if (node.ok()) ucx_ = std::move(*node);
  else spdlog::warn("kvshare: UCX unavailable, serving snapshots over TCP only: {}", node.status().message());
}

SnapshotServer::~SnapshotServer() { stop(); }

Result<int> SnapshotServer::start(const std::string& host, int port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return invalid_argument("--kv-host {}: expected an IPv4 address", host);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 64) != 0)
    return io_error("kvshare: cannot listen on {}:{}: {}", host, port, std::strerror(errno));
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  thread_ = std::thread([this] { loop(); });
  return int(ntohs(addr.sin_port));
}

void SnapshotServer::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  registered_.clear();  // regions unregister before the node goes
}

void SnapshotServer::loop() {
  // Connections are handled one at a time: each is bounded by the socket timeouts.
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    set_timeouts(fd, timeout_ms_);
    handle(fd);
    ::close(fd);
  }
}

void SnapshotServer::handle(int fd) {
  uint8_t nonce[kNonce], answer[32];
  if (RAND_bytes(nonce, kNonce) != 1) return;
  if (!send_all(fd, kHello, 4) || !send_all(fd, nonce, kNonce) || !recv_all(fd, answer, 32)) return;
  if (CRYPTO_memcmp(answer, mac(secret_, nonce).data(), 32) != 0) {
    ++rejected_;
    spdlog::warn("kvshare: peer failed authentication (wrong cluster secret)");
    return;
  }
  char op = 0;
  if (!recv_all(fd, &op, 1)) return;
  if (op == 'G') {
    uint64_t req[2];  // hash, tenant
    if (!recv_all(fd, req, sizeof(req))) return;
    auto blob = tenant_blob(req[0], req[1]);
    const uint64_t n = blob ? blob->size() : 0;
    if (send_all(fd, &n, 8) && blob && send_all(fd, blob->data(), blob->size())) ++served_;
  } else if (op == 'U') {
    uint64_t req[2];  // hash, tenant
    if (recv_all(fd, req, sizeof(req))) serve_ucx(fd, req[0], req[1]);
  } else if (op == 'P') {
    uint64_t n = 0;
    if (!recv_all(fd, &n, 8) || n > kMaxBlob) return;
    std::vector<uint8_t> blob(static_cast<size_t>(n));
    if (!recv_all(fd, blob.data(), blob.size())) return;
    Status st = cache_.insert_blob(std::move(blob));
    if (!st.ok()) spdlog::warn("kvshare: pushed snapshot rejected: {}", st.message());
    const uint8_t ok = st.ok() ? 1 : 0;
    send_all(fd, &ok, 1);
  }
}

std::shared_ptr<const std::vector<uint8_t>> SnapshotServer::tenant_blob(uint64_t hash,
                                                                        uint64_t tenant) {
  auto blob = cache_.blob(hash);
  if (blob) {  // serve only the requesting tenant's snapshot
    auto h = forward::peek_snapshot_header(*blob);
    if (!h.ok() || h->tenant != tenant) blob.reset();
  }
  return blob;
}

void SnapshotServer::serve_ucx(int fd, uint64_t hash, uint64_t tenant) {
  // Registrations of blobs the cache dropped (we hold the last reference) go first.
  std::erase_if(registered_, [](const auto& kv) { return kv.second.blob.use_count() == 1; });
  if (!ucx_) {
    send_all(fd, &kUcxUnsupported, 1);
    return;
  }
  auto blob = tenant_blob(hash, tenant);
  if (!blob) {
    send_all(fd, &kUcxMissing, 1);
    return;
  }
  auto it = registered_.find(hash);
  if (it == registered_.end() || it->second.blob != blob) {
    auto region = ucx_->map(blob->data(), blob->size());
    if (!region.ok()) {
      spdlog::warn("kvshare: {}", region.status().message());
      send_all(fd, &kUcxUnsupported, 1);
      return;
    }
    it = registered_.insert_or_assign(hash, Registered{blob, std::move(*region)}).first;
  }
  const UcxRegion& r = *it->second.region;
  const uint64_t where[2] = {r.size(), r.address()};
  std::vector<uint8_t> offer(1 + sizeof(where));  // one write: offer, size, address, rkey, worker
  offer[0] = kUcxOffer;
  std::memcpy(offer.data() + 1, where, sizeof(where));
  for (const std::vector<uint8_t>* v : {&r.rkey(), &ucx_->address()}) {
    const uint32_t n = uint32_t(v->size());
    offer.insert(offer.end(), reinterpret_cast<const uint8_t*>(&n), reinterpret_cast<const uint8_t*>(&n) + 4);
    offer.insert(offer.end(), v->begin(), v->end());
  }
  if (!send_all(fd, offer.data(), offer.size())) return;
  // The fetcher reads by itself; we progress our worker (software RMA over TCP needs it) until
  // it reports completion on the socket, or the timeout passes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  int idle = 0;
  while (std::chrono::steady_clock::now() < deadline && !stopping_) {
    idle = ucx_->progress() ? 0 : idle + 1;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, idle > 1000 ? 1 : 0) > 0) {
      uint8_t ok = 0;
      if (recv_all(fd, &ok, 1) && ok == 1) {
        ++served_;
        ++served_ucx_;
      }
      break;
    }
  }
  // A blob made for this GET only (pages inlined from a thin host blob) is unregistered now.
  blob.reset();
  std::erase_if(registered_, [](const auto& kv) { return kv.second.blob.use_count() == 1; });
}

Result<std::vector<uint8_t>> fetch_snapshot(const std::string& address, const std::string& secret,
                                            uint64_t hash, uint64_t tenant, int timeout_ms) {
  FS_ASSIGN_OR_RETURN(int fd, connect_peer(address, secret, timeout_ms));
  const uint64_t req[2] = {hash, tenant};
  uint64_t n = 0;
  std::vector<uint8_t> blob;
  bool ok = send_all(fd, "G", 1) && send_all(fd, req, sizeof(req)) && recv_all(fd, &n, 8);
  if (ok && n > 0 && n <= kMaxBlob) {
    blob.resize(static_cast<size_t>(n));
    ok = recv_all(fd, blob.data(), blob.size());
  }
  ::close(fd);
  if (!ok) return Status(StatusCode::kUnavailable, fmt::format("peer {}: transfer failed", address));
  if (n == 0 || n > kMaxBlob)
    return not_found("peer {}: snapshot {:016x} not available", address, hash);
  return blob;
}

Result<std::vector<uint8_t>> fetch_snapshot_ucx(const std::string& address,
                                                const std::string& secret, uint64_t hash,
                                                uint64_t tenant, int timeout_ms, UcxNode& node) {
  const auto t0 = std::chrono::steady_clock::now();
  FS_ASSIGN_OR_RETURN(int fd, connect_peer(address, secret, timeout_ms));
  const uint64_t req[2] = {hash, tenant};
  uint8_t reply = 0;
  uint64_t where[2] = {0, 0};  // size, address
  std::vector<uint8_t> rkey, worker;
  uint8_t msg[1 + sizeof(req)] = {'U'};
  std::memcpy(msg + 1, req, sizeof(req));
  if (!send_all(fd, msg, sizeof(msg)) || !recv_all(fd, &reply, 1)) {
    ::close(fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: request failed", address));
  }
  if (reply != kUcxOffer) {
    ::close(fd);
    if (reply == kUcxMissing) return not_found("peer {}: snapshot {:016x} not available", address, hash);
    return Status(StatusCode::kUnimplemented, fmt::format("peer {}: serves no UCX", address));
  }
  if (!recv_all(fd, where, sizeof(where)) || where[0] == 0 || where[0] > kMaxBlob ||
      !recv_bytes(fd, rkey) || !recv_bytes(fd, worker)) {
    ::close(fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: bad UCX offer", address));
  }
  std::vector<uint8_t> blob(static_cast<size_t>(where[0]));
  const int spent = int(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0).count());
  Status st = node.get(worker, where[1], rkey, blob.data(), blob.size(),
                       std::max(1, timeout_ms - spent));
  const uint8_t done = st.ok() ? 1 : 0;
  send_all(fd, &done, 1);
  ::close(fd);
  if (!st.ok())
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: {}", address, st.message()));
  return blob;
}

Status push_snapshot(const std::string& address, const std::string& secret,
                     const std::vector<uint8_t>& blob, int timeout_ms) {
  FS_ASSIGN_OR_RETURN(int fd, connect_peer(address, secret, timeout_ms));
  const uint64_t n = blob.size();
  uint8_t ok = 0;
  const bool sent = send_all(fd, "P", 1) && send_all(fd, &n, 8) &&
                    send_all(fd, blob.data(), blob.size()) && recv_all(fd, &ok, 1);
  ::close(fd);
  if (!sent || ok != 1)
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: push refused or failed", address));
  return {};
}

}  // namespace flashseek::kvshare
