#include "server/http_server.h"

#include <signal.h>
#include <sys/socket.h>

#include <algorithm>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "server/api_handlers.h"

namespace flashseek::server {

using json = nlohmann::json;

namespace {

// httplib's Server with a deeper accept backlog: the packaged library listens with a backlog
// of 5, which makes bursts of concurrent clients wait for SYN retries.
class BacklogServer : public httplib::Server {
 public:
  void deepen_backlog(int backlog) {
    const auto sock = svr_sock_.load();
    if (sock != INVALID_SOCKET) ::listen(sock, backlog);  // re-listen updates the backlog
  }
};

}  // namespace

struct HttpServer::Impl {
  ServerDeps deps;
  ServerOptions options;
  Metrics metrics;
  std::atomic<bool> stopping{false};
  BacklogServer http;
  std::unique_ptr<ApiHandlers> api;
  Status config_error;  // returned by bind()

  bool authorized(const httplib::Request& req) const {
    return options.tenants.authenticate(req.get_header_value("Authorization")).has_value();
  }

  void routes();
};

void HttpServer::Impl::routes() {
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !authorized(req)) {
      ApiError e = bad_request("Incorrect API key provided", "", "invalid_api_key");
      e.http_status = 401;
      e.type = "authentication_error";
      metrics.count_request("auth", 401);
      send_error(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    const bool ready = deps.backend->ready() && !stopping;
    res.status = ready ? 200 : 503;
    res.set_content(ready ? "{\"status\":\"ready\"}" : "{\"status\":\"loading\"}",
                    "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(deps.backend->stats()), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const auto& id : options.model_ids)
      data.push_back({{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "flashseek"},
                      {"max_model_len", deps.backend->context_length()}});
    res.set_content(dump_json({{"object", "list"}, {"data", data}}), "application/json");
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    api->handle(req, res, Endpoint::kChat);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    api->handle(req, res, Endpoint::kCompletions);
  });
  // Unknown routes and httplib-level failures (e.g. body too large) still get OpenAI errors.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e = bad_request(res.status == 404 ? "no route for " + req.method + " " + req.path
                                               : "request failed: HTTP " +
                                                     std::to_string(res.status));
    e.http_status = res.status;
    if (res.status == 404) e.type = "not_found_error";
    metrics.count_request("other", res.status);
    res.set_content(e.body(), "application/json");
  });
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        spdlog::error("handler exception: {}", what);
        ApiError e = from_status({StatusCode::kInternal, what});
        metrics.count_request("other", 500);
        send_error(res, e);
      });
}

HttpServer::HttpServer(ServerDeps deps, ServerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->deps = deps;
  impl_->options = std::move(options);
  if (!impl_->options.api_key.empty())  // a key that cannot be added stops bind(): fail closed
    impl_->config_error =
        impl_->options.tenants.add_key(impl_->options.api_key, "").with_context("api_key");
  impl_->api = std::make_unique<ApiHandlers>(deps, impl_->options, impl_->metrics,
                                             impl_->stopping);
  const ServerOptions& o = impl_->options;
  const int threads = o.http_threads > 0
                          ? o.http_threads
                          : int(std::clamp<int64_t>(o.max_batch + o.max_queue + 16, 8, 2048));
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  impl_->http.set_payload_max_length(o.max_body_bytes);
  impl_->http.set_keep_alive_timeout(2);
  impl_->http.set_read_timeout(30, 0);
  impl_->http.set_write_timeout(30, 0);
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

Metrics& HttpServer::metrics() { return impl_->metrics; }

Result<int> HttpServer::bind() {
  // A client that disconnects mid-write must not kill the process (the packaged httplib sends
  // without MSG_NOSIGNAL).
  ::signal(SIGPIPE, SIG_IGN);
  if (!impl_->config_error.ok()) return impl_->config_error;
  const auto& o = impl_->options;
  int port = o.port;
  if (o.port == 0) {
    port = impl_->http.bind_to_any_port(o.host);
  } else if (!impl_->http.bind_to_port(o.host, o.port)) {
    port = -1;
  }
  if (port <= 0)
    return Status(StatusCode::kUnavailable,
                  fmt::format("cannot listen on {}:{} (in use or not allowed)", o.host, o.port));
  impl_->http.deepen_backlog(1024);
  return port;
}

void HttpServer::run() { impl_->http.listen_after_bind(); }

void HttpServer::stop() {
  impl_->stopping = true;
  impl_->http.stop();
}

}  // namespace flashseek::server
