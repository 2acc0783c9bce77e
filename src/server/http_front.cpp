#include "server/http_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace flashseek::server {

namespace {

using Clock = std::chrono::steady_clock;

enum class Phase { kIdle, kHead, kBody, kHandling, kDone };

struct Conn {
  int fd = -1;
  std::atomic<Phase> phase{Phase::kIdle};
  std::atomic<int64_t> since{0};  // steady-clock ns when the phase began (eviction order)
  std::atomic<bool> evicted{false};
  ConnectionInfo info;
  bool close_after = false;

  void enter(Phase p) {
    phase = p;
    since = Clock::now().time_since_epoch().count();
  }
};

thread_local Conn* tl_conn = nullptr;

constexpr size_t kTrimAfterBodyBytes = size_t(1) << 20;
std::atomic<int64_t> last_trim{0};  // steady-clock ns of the last malloc_trim

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return int(std::max<int64_t>(0, left.count()));
}

void ip_and_port(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  if (addr.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  else if (addr.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  else
    return;
  char host[NI_MAXHOST] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) == 0)
    ip = host;
}

// One connection's byte stream as httplib's parser sees it. Every read is held to the deadline
// of the phase it belongs to; head bytes, header lines and body bytes are counted and the read
// fails (with the reason noted in ConnectionInfo) when a limit is passed.
class ConnStream : public httplib::Stream {
 public:
  ConnStream(Conn& c, const FrontOptions& o) : c_(c), o_(o) {}

  // Waits until the next request starts (bytes buffered or arriving) or the keep-alive time is
  // over; false on timeout, EOF, error or eviction.
  bool wait_for_request() {
    if (pos_ < buf_.size()) return true;
    pollfd p{c_.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, o_.keep_alive_timeout_ms);
    return r > 0 && (p.revents & POLLIN) && !c_.evicted;
  }

  void begin_request() {
    const auto now = Clock::now();
    head_deadline_ = now + std::chrono::milliseconds(o_.head_timeout_ms);
    request_deadline_ = now + std::chrono::milliseconds(o_.request_timeout_ms);
    head_bytes_ = head_lines_ = body_bytes_ = 0;
    c_.info = ConnectionInfo{c_.fd};
    c_.close_after = false;
    c_.enter(Phase::kHead);
  }

  size_t body_bytes() const { return body_bytes_; }

  // The head is parsed: from here on reads are body bytes.
  void head_done(const httplib::Request& req) {
    c_.enter(Phase::kBody);
    // The library reads bodies of POST / PUT / PATCH / DELETE only: another method's body would
    // be parsed as the next request, so its connection is closed after the answer instead.
    const bool has_body = req.has_header("Transfer-Encoding") ||
                          (req.has_header("Content-Length") &&
                           req.get_header_value("Content-Length") != "0");
    const bool body_read = req.method == "POST" || req.method == "PUT" ||
                           req.method == "PATCH" || req.method == "DELETE";
    if (has_body && !body_read) c_.close_after = true;
    // A declared length over the limit is refused before a byte of it is read (httplib then
    // answers 413 from its own check of the same limit).
    if (req.has_header("Content-Length")) {
      const std::string v = req.get_header_value("Content-Length");
      char* end = nullptr;
      errno = 0;
      const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
      if (errno != 0 || end == v.c_str() || n > o_.max_body_bytes) c_.info.body_too_large = true;
    }
  }

  bool is_readable() const override {
    if (pos_ < buf_.size()) return true;
    pollfd p{c_.fd, POLLIN, 0};
    return ::poll(&p, 1, remaining_ms(deadline())) > 0;
  }

  bool is_writable() const override {
    pollfd p{c_.fd, POLLOUT, 0};
    return ::poll(&p, 1, o_.write_timeout_ms) > 0 && (p.revents & (POLLERR | POLLHUP)) == 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (c_.info.head_too_large || c_.info.body_too_large || c_.info.timed_out) return -1;
    if (pos_ >= buf_.size() && !fill()) return -1;
    size_t n = std::min(size, buf_.size() - pos_);
    const Phase phase = c_.phase;
    if (phase == Phase::kHead) {
      // The parser reads the head one byte at a time: count lines and bytes as they go.
      for (size_t i = 0; i < n; ++i)
        if (buf_[pos_ + i] == '\n') head_lines_++;
      head_bytes_ += n;
      // +1: the request line; +1: the blank line that ends the head.
      if (head_lines_ > o_.max_header_count + 2 || head_bytes_ > o_.max_head_bytes) {
        c_.info.head_too_large = true;
        c_.close_after = true;
        return -1;
      }
    } else {
      body_bytes_ += n;
      // Raw bytes include chunk framing; the handler checks the exact decoded size.
      const size_t allowance = o_.max_body_bytes / 8 + (64u << 10);
      if (body_bytes_ > o_.max_body_bytes + allowance) {
        c_.info.body_too_large = true;
        c_.close_after = true;
        return -1;
      }
    }
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    return ssize_t(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    const ssize_t n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
    return n < 0 ? -1 : n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(c_.fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip_and_port(addr, len, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(c_.fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      ip_and_port(addr, len, ip, port);
  }
  // The library uses this only for its select() FD_SETSIZE guard; this stream polls, so it
  // reports no descriptor and connections beyond fd 1023 are served too.
  socket_t socket() const override { return -1; }

 private:
  Clock::time_point deadline() const {
    return c_.phase == Phase::kHead ? head_deadline_ : request_deadline_;
  }

  bool fill() {
    const Phase phase = c_.phase;
    if (phase == Phase::kIdle || phase == Phase::kDone) return false;
    const auto until = deadline();
    for (;;) {
      const int wait = remaining_ms(until);
      if (wait <= 0) {
        c_.info.timed_out = true;
        c_.close_after = true;
        return false;
      }
      pollfd p{c_.fd, POLLIN, 0};
      const int r = ::poll(&p, 1, wait);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) continue;  // the deadline check above ends it
      if (r < 0 || c_.evicted) return false;
      buf_.resize(16u << 10);
      const ssize_t n = ::recv(c_.fd, buf_.data(), buf_.size(), 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n <= 0) {
        buf_.clear();
        pos_ = 0;
        return false;
      }
      buf_.resize(size_t(n));
      pos_ = 0;
      return true;
    }
  }

  Conn& c_;
  const FrontOptions& o_;
  std::vector<char> buf_;
  size_t pos_ = 0;
  Clock::time_point head_deadline_{}, request_deadline_{};
  size_t head_bytes_ = 0, head_lines_ = 0, body_bytes_ = 0;
};

}  // namespace

ConnectionInfo* current_connection() { return tl_conn ? &tl_conn->info : nullptr; }

void mark_handling(bool close_after) {
  if (!tl_conn) return;
  tl_conn->enter(Phase::kHandling);
  if (close_after) tl_conn->close_after = true;
}

struct HttpFront::Impl {
  RoutingServer& router;
  FrontOptions o;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::atomic<bool> stopping{false};
  std::atomic<size_t> evicted{0};

  mutable std::mutex mu;
  std::condition_variable cv;
  std::list<std::shared_ptr<Conn>> live;       // every open connection
  std::deque<std::shared_ptr<Conn>> pending;   // accepted, waiting for a thread
  std::vector<std::thread> workers;

  Impl(RoutingServer& r, FrontOptions opts) : router(r), o(std::move(opts)) {}

  void serve(const std::shared_ptr<Conn>& c);
  void worker_loop();
  void admit(int fd);
  void close_all_idle();
};

void HttpFront::Impl::serve(const std::shared_ptr<Conn>& c) {
  tl_conn = c.get();
  ConnStream strm(*c, o);
  for (size_t n = 0; !stopping && !c->evicted; ++n) {
    c->enter(Phase::kIdle);
    if (!strm.wait_for_request()) break;
    strm.begin_request();
    const bool last = n + 1 >= o.max_requests_per_connection || stopping;
    bool closed = false;
    const bool ok = router.serve_request(strm, last, closed,
                                         [&](httplib::Request& req) { strm.head_done(req); });
    // A large body leaves its copies (body, JSON tree, rendered prompt) in this thread's malloc
    // arena, which glibc keeps after they are freed; with a thread per connection that adds up
    // to the peak of every thread. Hand the free pages back after large requests.
    // At most once a second process-wide: a trim walks every arena and costs milliseconds.
    if (strm.body_bytes() >= kTrimAfterBodyBytes) {
      const int64_t now = Clock::now().time_since_epoch().count();
      int64_t last = last_trim.load();
      if (now - last >= int64_t(std::chrono::nanoseconds(std::chrono::seconds(1)).count()) &&
          last_trim.compare_exchange_strong(last, now))
        malloc_trim(0);
    }
    if (!ok || closed || last || c->close_after) break;
  }
  c->enter(Phase::kDone);
  tl_conn = nullptr;
  // Lingering close after an early answer (413, 431, 408, 415 while the client may still be
  // sending): stop sending, then read what the client still sends for a moment, so the answer
  // is not destroyed by the reset that closing with unread data causes.
  if (c->close_after && !c->evicted) {
    ::shutdown(c->fd, SHUT_WR);
    char sink[4096];
    const auto until = Clock::now() + std::chrono::milliseconds(500);
    size_t drained = 0;
    while (drained < (1u << 20)) {
      pollfd p{c->fd, POLLIN, 0};
      if (::poll(&p, 1, remaining_ms(until)) <= 0) break;
      const ssize_t got = ::recv(c->fd, sink, sizeof(sink), 0);
      if (got <= 0) break;
      drained += size_t(got);
    }
  }
  ::close(c->fd);
  std::lock_guard<std::mutex> lock(mu);
  live.remove(c);
}

void HttpFront::Impl::worker_loop() {
  for (;;) {
    std::shared_ptr<Conn> c;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return !pending.empty() || stopping; });
      if (pending.empty()) return;
      c = std::move(pending.front());
      pending.pop_front();
    }
    serve(c);
  }
}

// Registers a new connection; at the cap, first closes the oldest connection that is finished
// (lingering) or idle in keep-alive, else the oldest one still sending its request; with none
// of those (every connection is being handled), the new one is refused.
void HttpFront::Impl::admit(int fd) {
  std::lock_guard<std::mutex> lock(mu);
  size_t open = 0;
  for (const auto& c : live) open += !c->evicted;
  if (open >= o.max_connections) {
    std::shared_ptr<Conn> victim;
    // kDone: answered and lingering before the close; kIdle: between requests.
    for (const Phase want : {Phase::kDone, Phase::kIdle, Phase::kHead, Phase::kBody}) {
      for (const auto& c : live)
        if (!c->evicted && c->phase == want && (!victim || c->since < victim->since)) victim = c;
      if (victim) break;
    }
    if (!victim) {
      ::close(fd);
      evicted++;
      return;
    }
    victim->evicted = true;
    ::shutdown(victim->fd, SHUT_RDWR);  // wakes its thread, which closes it
    evicted++;
  }
  auto c = std::make_shared<Conn>();
  c->fd = fd;
  c->enter(Phase::kIdle);
  live.push_back(c);
  pending.push_back(std::move(c));
  cv.notify_one();
}

void HttpFront::Impl::close_all_idle() {
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& c : live)
    if (c->phase != Phase::kHandling && !c->evicted) {
      c->evicted = true;
      ::shutdown(c->fd, SHUT_RDWR);
    }
}

HttpFront::HttpFront(RoutingServer& router, FrontOptions options)
    : impl_(std::make_unique<Impl>(router, std::move(options))) {
  if (::pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) impl_->wake[0] = impl_->wake[1] = -1;
}

HttpFront::~HttpFront() {
  stop();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  for (int fd : impl_->wake)
    if (fd >= 0) ::close(fd);
}

Result<int> HttpFront::bind() {
  const auto& o = impl_->o;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(o.port);
  if (getaddrinfo(o.host.c_str(), port.c_str(), &hints, &res) != 0 || !res)
    return Status(StatusCode::kUnavailable, fmt::format("cannot resolve {}", o.host));
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return Status(StatusCode::kUnavailable,
                  fmt::format("cannot listen on {}:{} (in use or not allowed)", o.host, o.port));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string ip;
  int bound = -1;
  ip_and_port(addr, len, ip, bound);
  impl_->listen_fd = fd;
  return bound;
}

void HttpFront::run() {
  Impl& m = *impl_;
  if (m.listen_fd < 0) return;
  if (!m.stopping) m.router.set_serving(m.listen_fd);
  const size_t threads = std::max<size_t>(1, m.o.max_connections);
  for (size_t i = 0; i < threads; ++i) m.workers.emplace_back([&m] { m.worker_loop(); });
  while (!m.stopping) {
    pollfd p[2] = {{m.listen_fd, POLLIN, 0}, {m.wake[0], POLLIN, 0}};
    const int r = ::poll(p, m.wake[0] >= 0 ? 2 : 1, 1000);
    if (r <= 0 || !(p[0].revents & POLLIN)) continue;
    const int fd = ::accept4(m.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors or similar: back off briefly instead of spinning.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    m.admit(fd);
  }
  ::close(m.listen_fd);
  m.listen_fd = -1;
  // Handlers see the server's own stopping flag; idle and half-received connections are closed.
  m.close_all_idle();
  m.cv.notify_all();
  for (auto& t : m.workers) t.join();
  m.workers.clear();
  std::lock_guard<std::mutex> lock(m.mu);
  for (const auto& c : m.pending) ::close(c->fd);
  m.pending.clear();
}

void HttpFront::stop() {
  impl_->stopping = true;
  impl_->router.set_serving(-1);  // running streams end
  if (impl_->wake[1] >= 0) (void)!::write(impl_->wake[1], "x", 1);
  impl_->cv.notify_all();
  impl_->close_all_idle();
}

size_t HttpFront::open_connections() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->live.size();
}

size_t HttpFront::evicted_connections() const { return impl_->evicted; }

}  // namespace flashseek::server
