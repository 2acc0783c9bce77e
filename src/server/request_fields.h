// Typed field readers shared by the request parsers: each returns an ApiError naming the field
// when the value has the wrong type or is out of range; an absent or null field leaves `out`.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace flashseek::server::fields {

using json = nlohmann::json;
using MaybeError = std::optional<ApiError>;

inline bool present(const json& body, const char* key) {
  auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

MaybeError get_bool(const json& body, const char* key, bool& out);
MaybeError get_string(const json& body, const char* key, std::string& out);
// Integers only (2.0 is accepted, 2.5 is not), within [lo, hi].
MaybeError get_int(const json& body, const char* key, int64_t lo, int64_t hi,
                   std::optional<int64_t>& out);
MaybeError get_number(const json& body, const char* key, double lo, double hi, double& out);

}  // namespace flashseek::server::fields

#define FS_API_TRY(expr)                         \
  do {                                           \
    if (auto _fs_err = (expr)) return _fs_err;   \
  } while (0)
