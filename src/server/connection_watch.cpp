#include "server/connection_watch.h"

#include <poll.h>
#include <sys/socket.h>

#include <cstring>

#include "server/http_front.h"

namespace flashseek::server {

ConnectionWatch ConnectionWatch::current() {
  const ConnectionInfo* conn = current_connection();
  return ConnectionWatch(conn ? conn->fd : -1);
}

bool ConnectionWatch::gone(const std::function<bool()>& probe) {
  if (fd_ < 0) return false;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return true;  // reset or fully shut down
  if ((p.revents & POLLRDHUP) && !probed_) {
    probed_ = true;
    return probe && !probe();
  }
  return false;  // half-closed and the probe went through: keep serving
}

bool send_interim_continue(int fd, bool http11) {
  if (!http11) return true;
  static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
  const size_t len = std::strlen(kContinue);
  return ::send(fd, kContinue, len, MSG_NOSIGNAL | MSG_DONTWAIT) == ssize_t(len);
}

}  // namespace flashseek::server
