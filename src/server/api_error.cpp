#include "server/api_error.h"

namespace flashseek::server {

nlohmann::json ApiError::to_json() const {
  nlohmann::json err = {{"message", message}, {"type", type}, {"param", nullptr},
                        {"code", nullptr}};
  if (!param.empty()) err["param"] = param;
  if (!code.empty()) err["code"] = code;
  return {{"error", err}};
}

std::string ApiError::body() const { return dump_json(to_json()); }

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError from_status(const Status& status, std::string param) {
  ApiError e;
  e.message = status.message();
  e.param = std::move(param);
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kParseError:
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "service_unavailable";
      e.code = "overloaded";
      break;
    case StatusCode::kUnimplemented:
      e.http_status = 501;
      e.type = "not_implemented";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace flashseek::server
