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
  bool default_thinking = false;   // thinking mode when a chat request does not say

  // Connections (see http_front.h and docs/server.md "Connections and limits").
  int64_t max_connections = 0;     // 0: max_batch + max_queue + 128; one thread each
  int head_timeout_ms = 10'000;    // a request head must arrive within this
  int request_timeout_ms = 60'000; // the whole request (head + body) within this
  int keep_alive_timeout_ms = 5'000;
  size_t max_header_count = 64;
  size_t max_head_bytes = 64u << 10;

  // Request bodies: checked before any JSON tree is built, then per field before the prompt
  // is rendered or tokenized.
  size_t max_body_bytes = 16u << 20;
  size_t max_json_depth = 64;          // nesting of the body and of JSON inside strings
  size_t max_json_values = 1u << 18;   // values in the body (each costs a tree node)
  size_t max_messages = 2048;          // chat messages (and content parts of one message)
  size_t max_tools = 256;              // tools, and tool calls of one message
  size_t max_prompt_bytes = 8u << 20;  // text to tokenize: prompt, or all message text
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
