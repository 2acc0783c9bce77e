#include "kvshare/peer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include <spdlog/spdlog.h>

#include "forward/state_io.h"

namespace flashseek::kvshare {

namespace {

constexpr char kHello[4] = {'F', 'S', 'K', 'V'};
constexpr size_t kNonce = 32;
constexpr uint64_t kMaxBlob = uint64_t(1) << 36;  // 64 GiB: larger is a protocol error

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

}  // namespace

SnapshotServer::SnapshotServer(engine::StateCache& cache, std::string secret, int timeout_ms)
    : cache_(cache), secret_(std::move(secret)), timeout_ms_(timeout_ms) {}

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
    auto blob = cache_.blob(req[0]);
    if (blob) {  // serve only the requesting tenant's snapshot
      auto h = forward::peek_snapshot_header(*blob);
      if (!h.ok() || h->tenant != req[1]) blob.reset();
    }
    const uint64_t n = blob ? blob->size() : 0;
    if (send_all(fd, &n, 8) && blob && send_all(fd, blob->data(), blob->size())) ++served_;
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
