#include "kvshare/redis_tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

namespace flashseek::kvshare {

namespace {

using Clock = std::chrono::steady_clock;

std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? int(left) : 0;
}

// OpenSSL writes to the socket with write(): a server that resets the connection would raise
// SIGPIPE, which kills a process that does not ignore it. SIGPIPE is blocked on the writing thread
// while this lives; one raised meanwhile is consumed before the old mask is restored.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Non-blocking TCP connect to the first address of host:port that answers before the deadline.
// (Name resolution itself is getaddrinfo's, not bounded here: the same as hiredis's own connect.)
int tcp_connect(const std::string& host, int port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    error = fmt::format("cannot resolve {}: {}", host, gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  error = "no address";
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, remaining_ms(deadline));
      int soerr = 0;
      socklen_t len = sizeof(soerr);
      if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0) {
        rc = 0;
      } else {
        error = rc == 0 ? "connect timed out" : std::strerror(soerr ? soerr : errno);
        rc = -1;
      }
    } else if (rc != 0) {
      error = std::strerror(errno);
    }
    if (rc != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    error.clear();
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

// Moves bytes between hiredis's socketpair end and the TLS session until either side closes.
// Both buffers are bounded: a side that does not read stops the other side from being read.
class Pump {
 public:
  Pump(SSL* ssl, int tcp, int pair) : ssl_(ssl), tcp_(tcp), pair_(pair) {
    ++alive_;
    thread_ = std::thread([this] {
      SigpipeBlock no_sigpipe;
      run();
      --alive_;
    });
  }
  ~Pump() {
    if (thread_.joinable()) thread_.join();
    SSL_free(ssl_);
    ::close(tcp_);
    ::close(pair_);
  }
  static std::atomic<int> alive_;

 private:
  void run() {
    constexpr size_t kBuf = 64 * 1024;
    std::vector<char> up(kBuf), down(kBuf);  // hiredis → TLS, TLS → hiredis
    size_t up_len = 0, down_off = 0, down_len = 0;
    bool tls_closed = false, tcp_hup = false;
    while (true) {
      bool progress = false, want_read = false, want_write = false;
      if (!tls_closed && down_len == 0) {
        ERR_clear_error();
        const int n = SSL_read(ssl_, down.data(), int(down.size()));
        if (n > 0) {
          down_off = 0;
          down_len = size_t(n);
          progress = true;
        } else {
          const int e = SSL_get_error(ssl_, n);
          if (e == SSL_ERROR_WANT_READ) want_read = true;
          else if (e == SSL_ERROR_WANT_WRITE) want_write = true;
          else tls_closed = true;  // close_notify, reset or a TLS error: the server is gone
        }
      }
      if (down_len > 0) {
        const ssize_t w = ::send(pair_, down.data() + down_off, down_len, MSG_NOSIGNAL);
        if (w > 0) {
          down_off += size_t(w);
          down_len -= size_t(w);
          progress = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          break;  // hiredis's end is closed
        }
      }
      if (tls_closed && down_len == 0) break;
      if (up_len < up.size()) {
        const ssize_t r = ::recv(pair_, up.data() + up_len, up.size() - up_len, 0);
        if (r == 0) break;  // hiredis closed its end (redisFree)
        if (r > 0) {
          up_len += size_t(r);
          progress = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          break;
        }
      }
      if (up_len > 0 && !tls_closed) {
        ERR_clear_error();
        const int n = SSL_write(ssl_, up.data(), int(up_len));
        if (n > 0) {
          std::memmove(up.data(), up.data() + n, up_len - size_t(n));
          up_len -= size_t(n);
          progress = true;
        } else {
          const int e = SSL_get_error(ssl_, n);
          if (e == SSL_ERROR_WANT_READ) want_read = true;
          else if (e == SSL_ERROR_WANT_WRITE) want_write = true;
          else tls_closed = true;
        }
      }
      if (progress) continue;
      if (tcp_hup && (want_read || want_write)) {  // the server hung up: nothing more arrives
        tls_closed = true;
        continue;
      }
      pollfd fds[2] = {
          {pair_, short((up_len < up.size() ? POLLIN : 0) | (down_len > 0 ? POLLOUT : 0)), 0},
          {tcp_hup ? -1 : tcp_, short((want_read ? POLLIN : 0) | (want_write ? POLLOUT : 0)), 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
      if (fds[0].revents & (POLLHUP | POLLERR | POLLNVAL)) break;  // hiredis side closed
      // The server hung up: its socket is no longer polled (it would report POLLHUP forever);
      // the next SSL_read returns what is still buffered, then the close.
      if (fds[1].revents & (POLLHUP | POLLERR)) tcp_hup = true;
    }
    // hiredis reads EOF from now on; its end stays open for writing (no SIGPIPE) until
    // redis_free() closes everything.
    ::shutdown(pair_, SHUT_WR);
  }

  SSL* ssl_;
  int tcp_, pair_;
  std::thread thread_;
};

std::atomic<int> Pump::alive_{0};

std::mutex g_pumps_mu;
std::unordered_map<const redisContext*, std::unique_ptr<Pump>> g_pumps;

bool is_ip_literal(const std::string& host) {
  in6_addr a6;
  in_addr a4;
  return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

// TCP connect + TLS handshake, both within the TLS options' deadline.
redisContext* connect_tls(const std::string& host, int port, const RedisTlsContext& tls,
                          int timeout_ms, std::string& error) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(tls.options().handshake_timeout_ms);
  const std::string where = fmt::format("{}:{}", host, port);
  int tcp = tcp_connect(host, port, deadline, error);
  if (tcp < 0) {
    error = fmt::format("cannot connect to {}: {}", where, error);
    return nullptr;
  }
  SSL* ssl = SSL_new(tls.ctx());
  auto fail = [&](std::string why) -> redisContext* {
    error = std::move(why);
    if (ssl) SSL_free(ssl);
    ::close(tcp);
    return nullptr;
  };
  if (!ssl) return fail("TLS: " + ssl_errors());
  SSL_set_fd(ssl, tcp);
  SigpipeBlock no_sigpipe;
  // The certificate must name the host of the URL: an IP literal is checked against the
  // certificate's IP SANs, a name against its DNS names (and sent as SNI).
  if (is_ip_literal(host)) {
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str()) != 1)
      return fail(fmt::format("TLS: bad IP address {}", host));
  } else {
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    if (SSL_set1_host(ssl, host.c_str()) != 1 || SSL_set_tlsext_host_name(ssl, host.c_str()) != 1)
      return fail(fmt::format("TLS: bad host name {}", host));
  }
  while (true) {
    ERR_clear_error();
    const int rc = SSL_connect(ssl);
    if (rc == 1) break;
    const int e = SSL_get_error(ssl, rc);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      pollfd p{tcp, short(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
      if (::poll(&p, 1, remaining_ms(deadline)) <= 0)
        return fail(fmt::format("TLS handshake with {} did not finish within {} ms", where,
                                tls.options().handshake_timeout_ms));
      continue;
    }
    if (const long v = SSL_get_verify_result(ssl); v != X509_V_OK)
      return fail(fmt::format("TLS certificate verification failed for {}: {}", where,
                              X509_verify_cert_error_string(v)));
    std::string why = ssl_errors();
    if (why.empty())
      why = e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN ? "connection closed by the server"
                                                                : fmt::format("error {}", e);
    return fail(fmt::format("TLS handshake with {} failed: {}", where, why));
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return fail(fmt::format("socketpair: {}", std::strerror(errno)));
  ::fcntl(sv[1], F_SETFL, ::fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  redisContext* c = redisConnectFd(sv[0]);
  if (!c) {
    ::close(sv[0]);
    ::close(sv[1]);
    return fail("out of memory");
  }
  const timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  redisSetTimeout(c, tv);
  std::lock_guard lock(g_pumps_mu);
  g_pumps[c] = std::make_unique<Pump>(ssl, tcp, sv[1]);
  return c;
}

}  // namespace

Result<std::shared_ptr<RedisTlsContext>> RedisTlsContext::create(const RedisTlsOptions& options) {
  if (options.cert_file.empty() != options.key_file.empty())
    return invalid_argument("--redis-tls-cert and --redis-tls-key go together (mutual TLS)");
  if (options.handshake_timeout_ms <= 0)
    return invalid_argument("Redis TLS handshake timeout must be positive");
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) return internal_error("TLS: {}", ssl_errors());
  auto fail = [&](std::string why) {
    SSL_CTX_free(ctx);
    return invalid_argument("{}", why);
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (!options.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, options.ca_file.c_str(), nullptr) != 1)
      return fail(fmt::format("--redis-tls-ca {}: cannot load CA certificates: {}",
                              options.ca_file, ssl_errors()));
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    return fail(fmt::format("TLS: cannot load the system CA certificates: {}", ssl_errors()));
  }
  if (!options.cert_file.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1)
      return fail(fmt::format("--redis-tls-cert {}: cannot load: {}", options.cert_file,
                              ssl_errors()));
    if (SSL_CTX_use_PrivateKey_file(ctx, options.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
      return fail(fmt::format("--redis-tls-key {}: cannot load: {}", options.key_file,
                              ssl_errors()));
    if (SSL_CTX_check_private_key(ctx) != 1)
      return fail(fmt::format("--redis-tls-key {} does not match --redis-tls-cert {}",
                              options.key_file, options.cert_file));
  }
  return std::shared_ptr<RedisTlsContext>(new RedisTlsContext(ctx, options));
}

RedisTlsContext::~RedisTlsContext() { SSL_CTX_free(ctx_); }

redisContext* redis_connect(const std::string& host, int port, const RedisTlsContext* tls,
                            int timeout_ms, std::string& error) {
  error.clear();
  if (tls) return connect_tls(host, port, *tls, timeout_ms, error);
  const timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
  if (!c || c->err) {
    error = c ? c->errstr : "out of memory";
    if (c) redisFree(c);
    return nullptr;
  }
  redisSetTimeout(c, tv);
  return c;
}

void redis_free(redisContext* c) {
  if (!c) return;
  std::unique_ptr<Pump> pump;
  {
    std::lock_guard lock(g_pumps_mu);
    if (auto it = g_pumps.find(c); it != g_pumps.end()) {
      pump = std::move(it->second);
      g_pumps.erase(it);
    }
  }
  redisFree(c);  // closes hiredis's end: the pump sees the hang-up and exits
  pump.reset();  // joins it, frees the session, closes the TCP socket
}

int redis_tls_pumps_alive() { return Pump::alive_.load(); }

}  // namespace flashseek::kvshare
