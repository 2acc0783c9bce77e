#include "server/http_server.h"

#include <signal.h>
#include <sys/socket.h>

#include <algorithm>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "server/api_handlers.h"
#include "server/http_front.h"

namespace flashseek::server {

using json = nlohmann::json;

namespace {


}  // namespace

struct HttpServer::Impl {
  ServerDeps deps;
  ServerOptions options;
  Metrics metrics;
  std::atomic<bool> stopping{false};
  RoutingServer http;
  std::unique_ptr<HttpFront> front;
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
  // The body is read by the handler (ApiHandlers::read_body) so that its decoded size is
  // bounded for chunked requests too.
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& reader) {
    api->handle(req, res, reader, Endpoint::kChat);
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
    api->handle(req, res, reader, Endpoint::kCompletions);
  });
  // Unknown routes and httplib-level failures (oversized head or body, deadlines) still get
  // OpenAI errors; the connection layer says which limit was hit.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (const ConnectionInfo* conn = current_connection()) {
      if (conn->head_too_large) res.status = 431;
      else if (conn->body_too_large) res.status = 413;
      else if (conn->timed_out) res.status = 408;
    }
    std::string message = "request failed: HTTP " + std::to_string(res.status);
    if (res.status == 404) message = "no route for " + req.method + " " + req.path;
    if (res.status == 431)
      message = fmt::format("request head over {} header lines or {} bytes",
                            options.max_header_count, options.max_head_bytes);
    if (res.status == 413)
      message = fmt::format("request body over {} bytes", options.max_body_bytes);
    if (res.status == 408) message = "request not received in time";
    ApiError e = bad_request(message);
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
  FrontOptions fo;
  fo.host = o.host;
  fo.port = o.port;
  fo.max_connections = size_t(o.max_connections > 0
                                  ? o.max_connections
                                  : std::clamp<int64_t>(o.max_batch + o.max_queue + 128, 64, 8192));
  fo.head_timeout_ms = o.head_timeout_ms;
  fo.request_timeout_ms = o.request_timeout_ms;
  fo.keep_alive_timeout_ms = o.keep_alive_timeout_ms;
  fo.max_header_count = o.max_header_count;
  fo.max_head_bytes = o.max_head_bytes;
  fo.max_body_bytes = o.max_body_bytes;
  impl_->front = std::make_unique<HttpFront>(impl_->http, fo);
  impl_->http.set_payload_max_length(o.max_body_bytes);
  impl_->http.set_keep_alive_timeout(std::max(1, o.keep_alive_timeout_ms / 1000));
  impl_->routes();
}

HttpServer::~HttpServer() { stop(); }

Metrics& HttpServer::metrics() { return impl_->metrics; }

Result<int> HttpServer::bind() {
  // A client that disconnects mid-write must not kill the process (writes use MSG_NOSIGNAL;
  // this also covers anything else in the process that writes to a socket).
  ::signal(SIGPIPE, SIG_IGN);
  if (!impl_->config_error.ok()) return impl_->config_error;
  return impl_->front->bind();
}

void HttpServer::run() { impl_->front->run(); }

void HttpServer::stop() {
  impl_->stopping = true;
  impl_->front->stop();
}

}  // namespace flashseek::server
