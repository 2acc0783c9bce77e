// The OpenAI-compatible HTTP server: routes, API-key check, admission control (queue full ->
// 503 + Retry-After), health/readiness, metrics. Generation goes through the GenerationBackend
// port; text through the TextCodec / ChatFormat ports.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/backend.h"
#include "server/metrics.h"
#include "server/tenants.h"
#include "server/text_port.h"

namespace flashseek::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                 // 0: any free port (see HttpServer::bind)
  // API keys, their tenants and the cache scope (server/tenants.h). With keys, /v1/* need
  // "Authorization: Bearer <key>".
  Tenants tenants;
  std::string api_key;             // non-empty: one more key, its own tenant (added to `tenants`)
  std::vector<std::string> model_ids = {"deepseek-v4.1-flash"};  // first is reported as owner
  int64_t max_batch = 8;           // backend slots (reported; the backend enforces them)
  int64_t max_queue = 64;          // admitted requests beyond max_batch before 503
  int http_threads = 0;            // 0: max_batch + max_queue + 16
  bool default_thinking = false;   // thinking mode when a chat request does not say
  size_t max_body_bytes = 16u << 20;
};

struct ServerDeps {
  GenerationBackend* backend = nullptr;
  const TextCodec* codec = nullptr;
  const ChatFormat* chat = nullptr;
};

class HttpServer {
 public:
  HttpServer(ServerDeps deps, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (useful with port 0).
  Result<int> bind();
  // Serves until stop(); call after bind().
  void run();
  void stop();
  Metrics& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashseek::server
