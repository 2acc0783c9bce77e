#include "server/request_fields.h"

#include <cmath>

#include <fmt/format.h>

namespace flashseek::server::fields {

MaybeError get_bool(const json& body, const char* key, bool& out) {
  if (!present(body, key)) return std::nullopt;
  const json& v = body[key];
  if (!v.is_boolean()) return bad_request(fmt::format("'{}' must be a boolean", key), key);
  out = v.get<bool>();
  return std::nullopt;
}

MaybeError get_string(const json& body, const char* key, std::string& out) {
  if (!present(body, key)) return std::nullopt;
  const json& v = body[key];
  if (!v.is_string()) return bad_request(fmt::format("'{}' must be a string", key), key);
  out = v.get<std::string>();
  return std::nullopt;
}

MaybeError get_int(const json& body, const char* key, int64_t lo, int64_t hi,
                   std::optional<int64_t>& out) {
  if (!present(body, key)) return std::nullopt;
  const json& v = body[key];
  int64_t value = 0;
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
      return bad_request(fmt::format("'{}' is out of range", key), key);
    value = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9e15)
      return bad_request(fmt::format("'{}' must be an integer", key), key);
    value = int64_t(d);
  } else {
    return bad_request(fmt::format("'{}' must be an integer", key), key);
  }
  if (value < lo || value > hi)
    return bad_request(fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, value), key);
  out = value;
  return std::nullopt;
}

MaybeError get_number(const json& body, const char* key, double lo, double hi, double& out) {
  if (!present(body, key)) return std::nullopt;
  const json& v = body[key];
  if (!v.is_number()) return bad_request(fmt::format("'{}' must be a number", key), key);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    return bad_request(fmt::format("'{}' must be in [{}, {}]", key, lo, hi), key);
  out = d;
  return std::nullopt;
}

}  // namespace flashseek::server::fields
