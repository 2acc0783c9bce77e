// Notices that an HTTP client has gone away while its request is still running, so the request
// can be cancelled and its batch slot freed at once (not only when the next write fails).
//
// A client may also half-close (shutdown(SHUT_WR)) after sending its request and still read the
// answer, and the socket looks the same to us in both cases (the peer's FIN arrived). So when the
// peer's FIN is seen, the watch writes one harmless probe that fits where the response is (an
// interim "100 Continue" before a response, an SSE comment inside a stream): a closed client's
// kernel answers it with a reset, which the next check sees; a half-closed client reads it and
// is served to the end.
#pragma once
#include <functional>

namespace flashseek::server {

class ConnectionWatch {
 public:
  ConnectionWatch() = default;  // watches nothing: gone() is always false
  explicit ConnectionWatch(int fd) : fd_(fd) {}
  // Watches the connection of the request handled on the calling thread.
  static ConnectionWatch current();
  bool watching() const { return fd_ >= 0; }
  // True once the peer closed or reset the connection (checked without blocking). `probe`
  // writes the probe described above and returns false when that write failed; it is called
  // at most once per watch.
  bool gone(const std::function<bool()>& probe);
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  bool probed_ = false;
};

// The probe for a response not yet started: an interim 100 (Continue), which HTTP/1.1 clients
// must skip (RFC 9110 §15.2). For an HTTP/1.0 client nothing is written (1xx is not allowed).
bool send_interim_continue(int fd, bool http11);

}  // namespace flashseek::server
