// The connection layer under the HTTP routes: our own accept loop and keep-alive loop around
// cpp-httplib's request parser and router (Server::process_request), so that connections are
// held to deadlines the packaged library does not have:
//   - a request head must arrive completely within head_timeout (a client trickling one byte
//     every few seconds is cut off, whatever the per-read timeout),
//   - the whole request (head + body) within request_timeout,
//   - at most max_header_count header lines and max_head_bytes of head,
//   - at most max_body_bytes of body, chunked or not (the packaged library bounds only a
//     declared Content-Length),
//   - at most max_connections connections; a new one beyond that first closes the oldest
//     connection that is idle in keep-alive, then the oldest one still sending its request.
//     Connections whose request is being handled (generation) are never closed for this.
// One thread per connection (a pool of max_connections threads): handlers block on generation,
// which the library's synchronous handler model requires anyway.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include <httplib.h>

#include "core/status.h"

namespace flashseek::server {

struct FrontOptions {
  std::string host = "127.0.0.1";
  int port = 0;                        // 0: any free port
  size_t max_connections = 256;
  int head_timeout_ms = 10'000;        // request line + headers, from the first byte
  int request_timeout_ms = 60'000;     // head + body, from the first byte
  int keep_alive_timeout_ms = 5'000;   // idle time between requests on one connection
  int write_timeout_ms = 30'000;       // one blocked write (a client that stops reading)
  size_t max_header_count = 64;
  size_t max_head_bytes = 64u << 10;
  size_t max_body_bytes = 16u << 20;
  size_t max_requests_per_connection = 1000;
};

// httplib's router with its per-request entry point made reachable.
class RoutingServer : public httplib::Server {
 public:
  bool serve_request(httplib::Stream& strm, bool close_connection, bool& connection_closed,
                     const std::function<void(httplib::Request&)>& setup) {
    return process_request(strm, close_connection, connection_closed, setup);
  }
  // The library ends a streamed (content-provider) response early when its listening socket
  // is gone; ours is not the library's, so this tells it whether we are serving.
  void set_serving(int listen_fd) { svr_sock_ = listen_fd >= 0 ? listen_fd : INVALID_SOCKET; }
};

// What the handlers of the request running on this thread may ask about its connection.
struct ConnectionInfo {
  int fd = -1;
  bool head_too_large = false;   // too many header lines / bytes -> 431
  bool body_too_large = false;   // body over max_body_bytes -> 413
  bool timed_out = false;        // head or request deadline passed -> 408
};
// The connection of the request handled on the calling thread (null outside a request).
ConnectionInfo* current_connection();
// Marks the current request as being handled (body read): its connection is no longer closed
// to make room for new ones. Also closes the connection after this response when `close`.
void mark_handling(bool close_after = false);

class HttpFront {
 public:
  HttpFront(RoutingServer& router, FrontOptions options);
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  Result<int> bind();
  void run();   // accepts and serves until stop(); returns when every connection is closed
  void stop();  // safe from any thread, also before run()
  size_t open_connections() const;
  size_t evicted_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashseek::server
