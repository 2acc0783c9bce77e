// Redis connections for the registry, plain or TLS (rediss://).
//
// Debian's hiredis (0.14) has no TLS support (hiredis_ssl came with 1.0) and no Debian package
// adds it, so TLS is written here by hand with OpenSSL: the TCP connection to Redis is opened
// here, a TLS client session runs on it (the server certificate is verified against the system
// CAs or a given CA file, and its name against the URL's host), and hiredis gets one end of a
// socketpair through redisConnectFd(). A pump thread per connection moves bytes between the other
// end and the TLS session; it exits when either side closes. hiredis code (timeouts, the pub/sub
// poll on ctx->fd) is unchanged: it sees an ordinary stream socket.
#pragma once
#include <memory>
#include <string>

#include "core/status.h"

struct redisContext;
typedef struct ssl_ctx_st SSL_CTX;

namespace flashseek::kvshare {

struct RedisTlsOptions {
  std::string ca_file;    // PEM CA bundle that signs the server certificate (empty: system CAs)
  std::string cert_file;  // client certificate for mutual TLS (with key_file; empty: none)
  std::string key_file;
  int handshake_timeout_ms = 1000;  // TCP connect + TLS handshake must finish within this
};

// A client TLS configuration (CA store, optional client certificate) shared by connections.
class RedisTlsContext {
 public:
  // Loads the CA store and the client certificate/key; an error names the file that failed.
  static Result<std::shared_ptr<RedisTlsContext>> create(const RedisTlsOptions& options);
  ~RedisTlsContext();
  RedisTlsContext(const RedisTlsContext&) = delete;
  RedisTlsContext& operator=(const RedisTlsContext&) = delete;
  SSL_CTX* ctx() const { return ctx_; }
  const RedisTlsOptions& options() const { return options_; }

 private:
  RedisTlsContext(SSL_CTX* ctx, RedisTlsOptions options) : ctx_(ctx), options_(std::move(options)) {}
  SSL_CTX* ctx_;
  const RedisTlsOptions options_;
};

// Connects to host:port. tls == nullptr: plain TCP (redisConnectWithTimeout, bounded by
// timeout_ms). Otherwise TCP + TLS handshake bounded by the TLS options' handshake timeout; a
// certificate that fails verification is an error "TLS certificate verification failed for
// <host>:<port>: <reason>". On success the context is connected, with timeout_ms set as its
// command timeout; on failure nullptr and `error` says why. Free it with redis_free().
redisContext* redis_connect(const std::string& host, int port, const RedisTlsContext* tls,
                            int timeout_ms, std::string& error);

// redisFree, and for a TLS connection: waits for its pump thread to exit (closing hiredis's end
// of the socketpair ends the pump) and releases the TLS session and the TCP socket.
void redis_free(redisContext* c);

// Pump threads alive now (for leak checks).
int redis_tls_pumps_alive();

}  // namespace flashseek::kvshare
