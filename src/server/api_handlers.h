// POST /v1/chat/completions and /v1/completions: content type -> bounded body -> bounded JSON
// -> validate -> admit -> render + tokenize -> generate -> respond (one JSON object, or SSE
// chunks ending with "data: [DONE]"). Admission comes before tokenization so that a full server
// spends no CPU on prompts it will not run.
#pragma once
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <httplib.h>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/http_server.h"
#include "server/openai_format.h"
#include "server/request.h"

namespace flashseek::server {

// Counts a request against max_batch + max_queue for as long as it lives.
class AdmissionTicket {
 public:
  explicit AdmissionTicket(std::atomic<int64_t>& in_flight) : in_flight_(in_flight) {}
  ~AdmissionTicket() { in_flight_--; }
  AdmissionTicket(const AdmissionTicket&) = delete;
  AdmissionTicket& operator=(const AdmissionTicket&) = delete;

 private:
  std::atomic<int64_t>& in_flight_;
};

// Everything a running request needs after validation.
struct PreparedRequest {
  ParsedRequest parsed;
  ResponseMeta meta;
  std::string echo_text;  // completions with echo: the prompt as text
  std::unique_ptr<Generation> generation;
  std::unique_ptr<AdmissionTicket> ticket;
  std::chrono::steady_clock::time_point start;
};

class ApiHandlers {
 public:
  ApiHandlers(ServerDeps deps, const ServerOptions& options, Metrics& metrics,
              const std::atomic<bool>& stopping);
  void handle(const httplib::Request& req, httplib::Response& res,
              const httplib::ContentReader& reader, Endpoint endpoint);

 private:
  std::optional<ApiError> read_body(const httplib::Request& req,
                                    const httplib::ContentReader& reader, std::string& body);
  std::optional<ApiError> validate(const std::string& body, Endpoint endpoint,
                                   PreparedRequest& out);
  std::optional<ApiError> prepare(const std::string& body, const std::string& authorization, Endpoint endpoint,
                                  PreparedRequest& out);
  std::optional<ApiError> tokenize(PreparedRequest& p, const std::string& raw_body,
                                   std::vector<int32_t>& prompt);
  void respond_once(const httplib::Request& req, httplib::Response& res, PreparedRequest& p);
  void respond_stream(const httplib::Request& req, httplib::Response& res,
                      std::shared_ptr<PreparedRequest> p);
  void log_done(const PreparedRequest& p, const std::string& finish);

  ServerDeps deps_;
  const ServerOptions& options_;
  Metrics& metrics_;
  const std::atomic<bool>& stopping_;
  std::atomic<uint64_t> next_id_{1};
};

void send_error(httplib::Response& res, const ApiError& err);

}  // namespace flashseek::server
