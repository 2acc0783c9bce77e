#include "kvshare/peer.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

#include "forward/state_io.h"

namespace flashseek::kvshare {

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kHello[4] = {'F', 'S', 'K', '2'};
constexpr size_t kNonce = 32, kMac = 32;
constexpr size_t kMaxId = 255;                 // server ids and addresses in the transcript
constexpr uint32_t kMaxMessage = 1 << 20;      // control messages (rkey, worker address)
constexpr uint32_t kMaxUcxBlob = 1 << 18;      // rkey / worker address: larger is an error
// Replies to G / U.
constexpr uint8_t kMissing = 0, kOffer = 1, kUcxUnsupported = 2;

// ---- HMAC-SHA256 (OpenSSL EVP_MAC) -------------------------------------------------------------

class Hmac {
 public:
  explicit Hmac(std::span<const uint8_t> key) {
    mac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    ctx_ = mac_ ? EVP_MAC_CTX_new(mac_) : nullptr;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    ok_ = ctx_ && EVP_MAC_init(ctx_, key.data(), key.size(), params) == 1;
  }
  explicit Hmac(const std::string& key)
      : Hmac(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(key.data()), key.size())) {}
  ~Hmac() {
    EVP_MAC_CTX_free(ctx_);
    EVP_MAC_free(mac_);
  }
  Hmac(const Hmac&) = delete;
  Hmac& operator=(const Hmac&) = delete;
  Hmac& add(const void* p, size_t n) {
    ok_ = ok_ && EVP_MAC_update(ctx_, static_cast<const unsigned char*>(p), n) == 1;
    return *this;
  }
  Hmac& add(std::span<const uint8_t> s) { return add(s.data(), s.size()); }
  Hmac& add(const std::string& s) { return add(s.data(), s.size()); }
  // An all-zero tag on an OpenSSL failure never equals a real one (it is compared, not trusted).
  std::vector<uint8_t> done() {
    std::vector<uint8_t> out(kMac, 0);
    size_t len = 0;
    if (!ok_ || EVP_MAC_final(ctx_, out.data(), &len, out.size()) != 1 || len != kMac) {
      out.assign(kMac, 0);
      RAND_bytes(out.data(), int(out.size()));  // unpredictable: cannot match a peer's tag
    }
    return out;
  }

 private:
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* ctx_ = nullptr;
  bool ok_ = false;
};

bool same_mac(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == kMac && b.size() == kMac && CRYPTO_memcmp(a.data(), b.data(), kMac) == 0;
}

// Key of the snapshot MACs: derived from the cluster secret alone (not from a connection's
// nonces), so a blob's MAC does not depend on the peer connection and is computed once per blob.
std::vector<uint8_t> data_key(const std::string& secret) {
  return Hmac(secret).add(std::string("flashseek-kv/2 data")).done();
}

std::vector<uint8_t> blob_tag(std::span<const uint8_t> key, std::span<const uint8_t> blob) {
  const uint64_t n = blob.size();
  return Hmac(key).add(&n, 8).add(blob).done();
}

// ---- sockets with absolute deadlines ------------------------------------------------------------

int ms_left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : int(std::min<int64_t>(ms, 1 << 30));
}

// Every read and write waits at most until `deadline` in total: a peer that trickles bytes
// cannot stretch an exchange (unlike a per-call socket timeout).
bool send_all(int fd, const void* p, size_t n, Clock::time_point deadline) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLOUT, 0};
    const int left = ms_left(deadline);
    if (left == 0 || ::poll(&pf, 1, left) <= 0) return false;
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (k <= 0) return false;
    b += k;
    n -= size_t(k);
  }
  return true;
}

bool recv_all(int fd, void* p, size_t n, Clock::time_point deadline) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    const int left = ms_left(deadline);
    if (left == 0 || ::poll(&pf, 1, left) <= 0) return false;
    const ssize_t k = ::recv(fd, b, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
    if (k <= 0) return false;
    b += k;
    n -= size_t(k);
  }
  return true;
}

void set_nodelay(int fd) {
  // Control messages are small and answered at once: without this, Nagle's algorithm and the
  // peer's delayed ACK add ~40 ms to a request/offer exchange.
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- message building ---------------------------------------------------------------------------

class Buf {
 public:
  template <typename T>
  Buf& pod(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), b, b + sizeof(T));
    return *this;
  }
  Buf& bytes(std::span<const uint8_t> s) {
    out.insert(out.end(), s.begin(), s.end());
    return *this;
  }
  Buf& str16(const std::string& s) {  // u16 length + bytes (length-prefixed: unambiguous)
    pod<uint16_t>(uint16_t(s.size()));
    out.insert(out.end(), s.begin(), s.end());
    return *this;
  }
  Buf& blob32(std::span<const uint8_t> s) {
    pod<uint32_t>(uint32_t(s.size()));
    return bytes(s);
  }
  std::vector<uint8_t> out;
};

class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool pod(T& v) {
    if (sizeof(T) > in_.size() - pos_) return false;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool bytes(std::vector<uint8_t>& v, size_t n) {
    if (n > in_.size() - pos_) return false;
    v.assign(in_.begin() + pos_, in_.begin() + pos_ + n);
    pos_ += n;
    return true;
  }
  bool blob32(std::vector<uint8_t>& v, uint32_t max) {
    uint32_t n = 0;
    return pod(n) && n > 0 && n <= max && bytes(v, n);
  }
  bool end() const { return pos_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

std::string read_str16(int fd, Clock::time_point deadline, bool& ok) {
  uint16_t n = 0;
  ok = recv_all(fd, &n, 2, deadline) && n > 0 && n <= kMaxId;
  std::string s(ok ? n : 0, '\0');
  ok = ok && recv_all(fd, s.data(), n, deadline);
  return s;
}

// Transcript of a handshake: both ids, the dialed address, both nonces.
std::vector<uint8_t> transcript(const std::string& server_id, const std::string& client_id,
                                const std::string& address, const uint8_t* ns, const uint8_t* nc) {
  Buf t;
  t.str16(server_id).str16(client_id).str16(address);
  t.bytes({ns, kNonce}).bytes({nc, kNonce});
  return std::move(t.out);
}

std::vector<uint8_t> proof(const std::string& secret, const char* role,
                           const std::vector<uint8_t>& t) {
  return Hmac(secret).add(std::string("flashseek-kv/2 ")).add(std::string(role)).add(t).done();
}

std::vector<uint8_t> seal(const std::vector<uint8_t>& key, char dir, uint32_t seq,
                          std::span<const uint8_t> m) {
  return Hmac(key).add(&dir, 1).add(&seq, 4).add(m).done();
}

}  // namespace

bool PeerSession::send(std::span<const uint8_t> m) {
  Buf b;
  b.blob32(m).bytes(seal(key, self_dir, sent++, m));
  return send_all(fd, b.out.data(), b.out.size(), deadline);
}

bool PeerSession::recv(std::vector<uint8_t>& m, uint32_t max) {
  uint32_t n = 0;
  if (!recv_all(fd, &n, 4, deadline) || n == 0 || n > max) return false;
  m.resize(n);
  uint8_t tag[kMac];
  if (!recv_all(fd, m.data(), n, deadline) || !recv_all(fd, tag, kMac, deadline)) return false;
  if (!same_mac(seal(key, self_dir == 's' ? 'c' : 's', received++, m), {tag, kMac})) {
    mac_failed = true;
    return false;
  }
  return true;
}

std::vector<uint8_t> snapshot_mac(const std::string& secret, std::span<const uint8_t> blob) {
  return blob_tag(data_key(secret), blob);
}

Status accept_peer(PeerSession& s, const PeerAuth& auth, const std::string& advertise) {
  const Status io(StatusCode::kUnavailable, "kvshare: handshake failed");
  uint8_t ns[kNonce], nc[kNonce], mac_c[kMac];
  if (RAND_bytes(ns, kNonce) != 1) return io;
  Buf hello;
  hello.bytes({reinterpret_cast<const uint8_t*>(kHello), 4}).str16(auth.id).bytes({ns, kNonce});
  if (!send_all(s.fd, hello.out.data(), hello.out.size(), s.deadline)) return io;
  bool ok = false;
  const std::string client_id = read_str16(s.fd, s.deadline, ok);
  if (!ok || !recv_all(s.fd, nc, kNonce, s.deadline) || !recv_all(s.fd, mac_c, kMac, s.deadline))
    return io;
  const auto t = transcript(auth.id, client_id, advertise, ns, nc);
  // A client claiming our own id is a proof reflected back at us.
  if (client_id == auth.id || !same_mac(proof(auth.secret, "client", t), {mac_c, kMac}))
    return invalid_argument("kvshare: peer failed authentication");
  const auto mac_s = proof(auth.secret, "server", t);
  if (!send_all(s.fd, mac_s.data(), mac_s.size(), s.deadline)) return io;
  s.key = proof(auth.secret, "session", t);
  return {};
}

namespace {

using Session = PeerSession;

// Connects to the peer and runs the client side of the handshake.
Result<Session> connect_peer(const PeerAddress& peer, const PeerAuth& auth, int timeout_ms) {
  Session s;
  s.self_dir = 'c';
  s.deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::string& address = peer.address;
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || address.size() > kMaxId)
    return invalid_argument("peer address {}: expected host:port", address);
  if (auth.id.empty() || auth.id.size() > kMaxId)
    return invalid_argument("kvshare: this server's id must have 1..{} bytes", kMaxId);
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: cannot resolve", address));
  const int fd = ::socket(res->ai_family, SOCK_STREAM, 0);
  if (fd >= 0) {
    const timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));  // bounds connect()
    set_nodelay(fd);
  }
  const int rc = fd >= 0 ? ::connect(fd, res->ai_addr, res->ai_addrlen) : -1;
  freeaddrinfo(res);
  if (rc != 0) {
    if (fd >= 0) ::close(fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: connection refused", address));
  }
  s.fd = fd;
  auto fail = [&](StatusCode code, const std::string& why) {
    ::close(fd);
    return Status(code, fmt::format("peer {}: {}", address, why));
  };
  char hello[4];
  uint8_t ns[kNonce], nc[kNonce], mac_s[kMac];
  if (!recv_all(fd, hello, 4, s.deadline) || std::memcmp(hello, kHello, 4) != 0)
    return fail(StatusCode::kUnavailable, "handshake failed (not a flashseek-kv/2 endpoint)");
  bool ok = false;
  const std::string server_id = read_str16(fd, s.deadline, ok);
  if (!ok || !recv_all(fd, ns, kNonce, s.deadline))
    return fail(StatusCode::kUnavailable, "handshake failed");
  if (server_id == auth.id || (!peer.id.empty() && server_id != peer.id))
    return fail(StatusCode::kInvalidArgument,  // the id it sent is not echoed: peer bytes
                server_id == auth.id ? "answers with our own server id (reflection)"
                                     : fmt::format("answers as another server than '{}'", peer.id));
  if (RAND_bytes(nc, kNonce) != 1) return fail(StatusCode::kInternal, "no random bytes");
  const auto t = transcript(server_id, auth.id, address, ns, nc);
  Buf answer;
  answer.str16(auth.id).bytes({nc, kNonce}).bytes(proof(auth.secret, "client", t));
  if (!send_all(fd, answer.out.data(), answer.out.size(), s.deadline) ||
      !recv_all(fd, mac_s, kMac, s.deadline))
    return fail(StatusCode::kUnavailable, "handshake failed (refused: wrong cluster secret?)");
  if (!same_mac(proof(auth.secret, "server", t), {mac_s, kMac}))
    return fail(StatusCode::kInvalidArgument, "failed authentication (wrong cluster secret)");
  s.key = proof(auth.secret, "session", t);
  return s;
}

Status transfer_error(const Session& s, const std::string& address, const char* what) {
  if (s.mac_failed)
    return Status(StatusCode::kParseError, fmt::format("peer {}: {} failed its MAC", address, what));
  return Status(StatusCode::kUnavailable, fmt::format("peer {}: {} failed", address, what));
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

SnapshotServer::SnapshotServer(engine::StateCache& cache, SnapshotServerOptions options)
    : cache_(cache), options_(std::move(options)) {
  if (!options_.enable_ucx) return;
  auto node = UcxNode::create();
  if (node.ok()) ucx_ = std::move(*node);
  else spdlog::warn("kvshare: UCX unavailable, serving snapshots over TCP only: {}", node.status().message());
}

SnapshotServer::~SnapshotServer() { stop(); }

Result<int> SnapshotServer::start(const std::string& host, int port) {
  if (options_.auth.secret.empty()) return invalid_argument("kvshare: the cluster secret is empty");
  if (options_.auth.id.empty() || options_.auth.id.size() > kMaxId)
    return invalid_argument("kvshare: the server id must have 1..{} bytes", kMaxId);
  if (options_.max_peers < 1) return invalid_argument("kvshare: max_peers must be >= 1");
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
  const int bound = int(ntohs(addr.sin_port));
  advertise_ = fmt::format("{}:{}", options_.advertise_host.empty() ? host : options_.advertise_host,
                           bound);
  if (advertise_.size() > kMaxId) return invalid_argument("kvshare: advertised address too long");
  thread_ = std::thread([this] { loop(); });
  return bound;
}

void SnapshotServer::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  reap(/*all=*/true);  // each handler ends by its own deadline (or sees stopping_)
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  std::lock_guard lock(reg_mu_);
  registered_.clear();  // regions unregister before the node goes
}

void SnapshotServer::reap(bool all) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (all || it->done->load()) {
      if (it->thread.joinable()) it->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

void SnapshotServer::loop() {
  // Peers are served concurrently, at most max_peers at once; each connection is bounded by the
  // handshake and transfer deadlines, so a stalled peer holds one slot for a bounded time.
  while (!stopping_) {
    reap(false);
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) continue;
    if (active_ >= options_.max_peers) {
      ++busy_;
      ::close(fd);
      continue;
    }
    set_nodelay(fd);
    ++active_;
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers_.push_back({std::thread([this, fd, done] {
                          handle(fd);
                          ::close(fd);
                          --active_;
                          *done = true;
                        }),
                        done});
  }
}

void SnapshotServer::handle(int fd) {
  PeerSession s;
  s.fd = fd;
  s.self_dir = 's';
  s.deadline = Clock::now() + std::chrono::milliseconds(options_.handshake_timeout_ms);
  const Status shake = accept_peer(s, options_.auth, advertise_);
  if (shake.code() == StatusCode::kInvalidArgument) {
    ++rejected_;
    spdlog::warn("kvshare: peer failed authentication (wrong cluster secret or relayed proof)");
    return;
  }
  if (!shake.ok()) return;
  s.deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms);
  std::vector<uint8_t> req;
  if (!s.recv(req)) {
    if (s.mac_failed) ++bad_mac_;
    return;
  }
  Cursor c(req);
  char op = 0;
  uint64_t hash = 0, tenant = 0;
  if (!c.pod(op)) return;
  const auto dkey = data_key(options_.auth.secret);
  if (op == 'G' || op == 'U') {
    if (!c.pod(hash) || !c.pod(tenant) || !c.end()) return;
    if (op == 'U') return serve_ucx(s, hash, tenant);
    auto blob = tenant_blob(hash, tenant);
    Buf reply;
    reply.pod<uint8_t>(blob ? kOffer : kMissing).pod<uint64_t>(blob ? blob->size() : 0);
    if (blob) reply.bytes(blob_tag(dkey, *blob));
    if (s.send(reply.out) && blob && send_all(fd, blob->data(), blob->size(), s.deadline))
      ++served_;
  } else if (op == 'P') {
    uint64_t n = 0;
    std::vector<uint8_t> tag;
    if (!c.pod(n) || !c.bytes(tag, kMac) || !c.end()) return;
    uint8_t ok = 0;
    if (n == 0 || n > cache_.max_snapshot_bytes()) {  // refused before allocating
      ++oversize_;
      spdlog::warn("kvshare: refusing a pushed snapshot of {} B (at most {} B)", n,
                   cache_.max_snapshot_bytes());
      Buf reply;
      reply.pod<uint8_t>(ok);
      s.send(reply.out);
      return;
    }
    std::vector<uint8_t> blob(static_cast<size_t>(n));
    if (!recv_all(fd, blob.data(), blob.size(), s.deadline)) return;
    if (!same_mac(blob_tag(dkey, blob), tag)) {
      ++bad_mac_;
      spdlog::warn("kvshare: pushed snapshot failed its MAC; dropped");
    } else {
      Status st = cache_.insert_blob(std::move(blob));
      if (!st.ok()) spdlog::warn("kvshare: pushed snapshot rejected: {}", st.message());
      ok = st.ok() ? 1 : 0;
    }
    Buf reply;
    reply.pod<uint8_t>(ok);
    s.send(reply.out);
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

void SnapshotServer::serve_ucx(PeerSession& s, uint64_t hash, uint64_t tenant) {
  if (!ucx_) {
    Buf reply;
    reply.pod<uint8_t>(kUcxUnsupported);
    s.send(reply.out);
    return;
  }
  auto blob = tenant_blob(hash, tenant);
  if (!blob) {
    Buf reply;
    reply.pod<uint8_t>(kMissing);
    s.send(reply.out);
    return;
  }
  std::shared_ptr<UcxRegion> region;
  std::vector<uint8_t> tag;
  {
    std::lock_guard lock(reg_mu_);
    // Registrations of blobs the cache dropped (we hold the last reference) go first.
    std::erase_if(registered_, [](const auto& kv) { return kv.second.blob.use_count() == 1; });
    auto it = registered_.find(hash);
    if (it == registered_.end() || it->second.blob != blob) {
      // Remote peers may only read the blob (never write our memory).
      auto r = ucx_->map(blob->data(), blob->size(), UcxAccess::kRemoteRead);
      if (!r.ok()) {
        spdlog::warn("kvshare: {}", r.status().message());
        Buf reply;
        reply.pod<uint8_t>(kUcxUnsupported);
        s.send(reply.out);
        return;
      }
      it = registered_.insert_or_assign(
          hash, Registered{blob, std::move(*r), blob_tag(data_key(options_.auth.secret), *blob)}).first;
    }
    region = it->second.region;
    tag = it->second.tag;
  }
  // One message: offer, size, address, data MAC, rkey, worker address.
  Buf offer;
  offer.pod<uint8_t>(kOffer).pod<uint64_t>(region->size()).pod<uint64_t>(region->address());
  offer.bytes(tag).blob32(region->rkey()).blob32(ucx_->address());
  if (!s.send(offer.out)) return;
  // The fetcher reads by itself; we progress our worker (software RMA over TCP needs it) until
  // it reports completion on the socket, or the deadline passes.
  int idle = 0;
  while (Clock::now() < s.deadline && !stopping_) {
    idle = ucx_->progress() ? 0 : idle + 1;
    pollfd p{s.fd, POLLIN, 0};
    if (::poll(&p, 1, idle > 1000 ? 1 : 0) > 0) {
      std::vector<uint8_t> done;
      if (s.recv(done, 1) && done[0] == 1) {
        ++served_;
        ++served_ucx_;
      } else if (s.mac_failed) {
        ++bad_mac_;
      }
      break;
    }
  }
  // A blob made for this GET only (pages inlined from a thin host blob) is unregistered now.
  region.reset();
  blob.reset();
  std::lock_guard lock(reg_mu_);
  std::erase_if(registered_, [](const auto& kv) { return kv.second.blob.use_count() == 1; });
}

Result<std::vector<uint8_t>> fetch_snapshot(const PeerAddress& peer, const PeerAuth& auth,
                                            uint64_t hash, uint64_t tenant, int timeout_ms,
                                            uint64_t max_bytes) {
  FS_ASSIGN_OR_RETURN(Session s, connect_peer(peer, auth, timeout_ms));
  Buf req;
  req.pod<char>('G').pod(hash).pod(tenant);
  std::vector<uint8_t> reply, tag;
  uint8_t status = 0;
  uint64_t n = 0;
  if (!s.send(req.out) || !s.recv(reply)) {
    ::close(s.fd);
    return transfer_error(s, peer.address, "request");
  }
  Cursor c(reply);
  if (!c.pod(status) || !c.pod(n) || (status == kOffer && !c.bytes(tag, kMac)) || !c.end()) {
    ::close(s.fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: malformed reply", peer.address));
  }
  if (status != kOffer || n == 0) {
    ::close(s.fd);
    return not_found("peer {}: snapshot {:016x} not available", peer.address, hash);
  }
  if (n > max_bytes) {  // checked before allocating: the peer does not choose our memory use
    ::close(s.fd);
    return out_of_range("peer {}: snapshot of {} B exceeds the local maximum {} B", peer.address,
                        n, max_bytes);
  }
  std::vector<uint8_t> blob(static_cast<size_t>(n));
  const bool ok = recv_all(s.fd, blob.data(), blob.size(), s.deadline);
  ::close(s.fd);
  if (!ok) return Status(StatusCode::kUnavailable, fmt::format("peer {}: transfer failed", peer.address));
  if (!same_mac(blob_tag(data_key(auth.secret), blob), tag))
    return Status(StatusCode::kParseError,
                  fmt::format("peer {}: snapshot {:016x} failed its MAC", peer.address, hash));
  return blob;
}

Result<std::vector<uint8_t>> fetch_snapshot_ucx(const PeerAddress& peer, const PeerAuth& auth,
                                                uint64_t hash, uint64_t tenant, int timeout_ms,
                                                uint64_t max_bytes, UcxNode& node) {
  FS_ASSIGN_OR_RETURN(Session s, connect_peer(peer, auth, timeout_ms));
  Buf req;
  req.pod<char>('U').pod(hash).pod(tenant);
  std::vector<uint8_t> reply;
  if (!s.send(req.out) || !s.recv(reply)) {
    ::close(s.fd);
    return transfer_error(s, peer.address, "request");
  }
  Cursor c(reply);
  uint8_t status = 0;
  uint64_t size = 0, address = 0;
  std::vector<uint8_t> tag, rkey, worker;
  if (!c.pod(status)) {
    ::close(s.fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: malformed reply", peer.address));
  }
  if (status != kOffer) {
    ::close(s.fd);
    if (status == kMissing) return not_found("peer {}: snapshot {:016x} not available", peer.address, hash);
    return Status(StatusCode::kUnimplemented, fmt::format("peer {}: serves no UCX", peer.address));
  }
  if (!c.pod(size) || !c.pod(address) || !c.bytes(tag, kMac) || !c.blob32(rkey, kMaxUcxBlob) ||
      !c.blob32(worker, kMaxUcxBlob) || !c.end() || size == 0) {
    ::close(s.fd);
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: bad UCX offer", peer.address));
  }
  if (size > max_bytes) {
    ::close(s.fd);
    return out_of_range("peer {}: snapshot of {} B exceeds the local maximum {} B", peer.address,
                        size, max_bytes);
  }
  std::vector<uint8_t> blob(static_cast<size_t>(size));
  // The GET gets the connection's deadline minus a reserve for the completion report below, so
  // that an owner whose memory never answers the GET still learns that the fetch gave up.
  const int left = ms_left(s.deadline);
  Status st = node.get(worker, address, rkey, blob.data(), blob.size(),
                       std::max(1, left - std::min(left / 4, 100)));
  const bool good = st.ok() && same_mac(blob_tag(data_key(auth.secret), blob), tag);
  Buf done;
  done.pod<uint8_t>(good ? 1 : 0);
  s.send(done.out);
  ::close(s.fd);
  if (!st.ok())
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: {}", peer.address, st.message()));
  if (!good)
    return Status(StatusCode::kParseError,
                  fmt::format("peer {}: snapshot {:016x} failed its MAC", peer.address, hash));
  return blob;
}

Status push_snapshot(const PeerAddress& peer, const PeerAuth& auth,
                     const std::vector<uint8_t>& blob, int timeout_ms) {
  FS_ASSIGN_OR_RETURN(Session s, connect_peer(peer, auth, timeout_ms));
  Buf req;
  req.pod<char>('P').pod<uint64_t>(blob.size()).bytes(blob_tag(data_key(auth.secret), blob));
  std::vector<uint8_t> reply;
  const bool sent = s.send(req.out) && send_all(s.fd, blob.data(), blob.size(), s.deadline) &&
                    s.recv(reply, 1);
  ::close(s.fd);
  if (!sent) return transfer_error(s, peer.address, "push");
  if (reply[0] != 1)
    return Status(StatusCode::kUnavailable, fmt::format("peer {}: push refused", peer.address));
  return {};
}

}  // namespace flashseek::kvshare
