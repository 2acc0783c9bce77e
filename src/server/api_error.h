// OpenAI error objects: {"error": {"message", "type", "param", "code"}} with the HTTP status
// that goes with them. Every failure the server reports goes through here.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace flashseek::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null

  nlohmann::json to_json() const;
  std::string body() const;  // serialised to_json(), never throws
};

ApiError bad_request(std::string message, std::string param = "", std::string code = "");
// Maps an engine/tokenizer Status (e.g. queue full -> 503, invalid argument -> 400).
ApiError from_status(const Status& status, std::string param = "");

// JSON serialisation that never throws: invalid UTF-8 becomes U+FFFD.
std::string dump_json(const nlohmann::json& j);

}  // namespace flashseek::server
