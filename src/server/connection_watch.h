// Notices that an HTTP client has gone away while its request is still running, so the request
// can be cancelled and its batch slot freed at once (not only when the next write fails).
//
// cpp-httplib 0.11 (the Debian build is a shared library) does not expose the connection's
// socket to handlers, so the socket is found once per request by matching the connection's
// local/remote address and port against this process's open sockets.
#pragma once
#include <string>

namespace flashseek::server {

class ConnectionWatch {
 public:
  ConnectionWatch() = default;  // watches nothing: gone() is always false
  ConnectionWatch(const std::string& local_addr, int local_port, const std::string& remote_addr,
                  int remote_port);
  bool watching() const { return fd_ >= 0; }
  // True once the peer closed or reset the connection (checked without blocking).
  bool gone() const;

 private:
  int fd_ = -1;
};

}  // namespace flashseek::server
