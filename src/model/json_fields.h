// Typed, error-reporting access to the keys of one JSON object of a config file. Every error
// names the file and the full key path ("config.json: text_config.hidden_size: ...").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace flashseek::model {

// Reads a whole checkpoint text file (config.json, the shard index), refusing one larger than
// `max_bytes` before reading it; errors name the file.
Result<std::string> read_bounded_file(const std::string& path, uint64_t max_bytes);

class JsonFields {
 public:
  // `where` is the prefix of error messages, e.g. "config.json: text_config.".
  JsonFields(const nlohmann::json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  // A key is "present" when it exists and is not null (the release writes `null` for unset keys).
  bool has(const char* key) const;
  std::string path(const char* key) const { return where_ + key; }

  // req_*: missing key is an error. opt_*: missing key leaves `out` unchanged.
  Status req_int(const char* key, int64_t& out) const;
  Status opt_int(const char* key, int64_t& out) const;
  Status req_int(const char* key, int& out) const;
  Status opt_int(const char* key, int& out) const;
  Status req_double(const char* key, double& out) const;
  Status opt_double(const char* key, double& out) const;
  Status opt_bool(const char* key, bool& out) const;
  Status req_string(const char* key, std::string& out) const;
  Status opt_string(const char* key, std::string& out) const;
  Status req_ints(const char* key, std::vector<int>& out) const;
  Status opt_ints(const char* key, std::vector<int>& out) const;
  Status req_ints(const char* key, std::vector<int64_t>& out) const;
  // The nested object at `key` (must be an object when present); nullptr when absent.
  Result<const nlohmann::json*> opt_object(const char* key) const;

 private:
  Status missing(const char* key) const;
  Status wrong_type(const char* key, const char* want) const;
  const nlohmann::json& obj_;
  std::string where_;
};

}  // namespace flashseek::model
