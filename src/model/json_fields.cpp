#include "model/json_fields.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

namespace flashseek::model {

Result<std::string> read_bounded_file(const std::string& path, uint64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("{}: cannot open: {}", path, std::strerror(errno));
  // Reads at most max_bytes + 1 bytes: the size is measured on the stream, not trusted from stat
  // (a FIFO or a file growing meanwhile cannot make this read without bound).
  std::string text;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    text.append(buf, size_t(in.gcount()));
    if (text.size() > max_bytes)
      return out_of_range("{}: larger than the limit of {} bytes", path, max_bytes);
  }
  if (in.bad()) return io_error("{}: read failed", path);
  return text;
}

bool JsonFields::has(const char* key) const {
  auto it = obj_.find(key);
  return it != obj_.end() && !it->is_null();
}

Status JsonFields::missing(const char* key) const {
  return invalid_argument("{}{}: required field is missing", where_, key);
}

Status JsonFields::wrong_type(const char* key, const char* want) const {
  return invalid_argument("{}{}: expected {}, got {} ({})", where_, key, want,
                          obj_.at(key).type_name(), obj_.at(key).dump());
}

Status JsonFields::req_int(const char* key, int64_t& out) const {
  if (!has(key)) return missing(key);
  return opt_int(key, out);
}

Status JsonFields::opt_int(const char* key, int64_t& out) const {
  if (!has(key)) return {};
  const auto& v = obj_.at(key);
  if (v.is_number_integer()) {
    out = v.get<int64_t>();
    return {};
  }
  // 16.0 is accepted for an integer field; 16.5 is not.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      out = int64_t(d);
      return {};
    }
  }
  return wrong_type(key, "an integer");
}

Status JsonFields::req_int(const char* key, int& out) const {
  if (!has(key)) return missing(key);
  return opt_int(key, out);
}

Status JsonFields::opt_int(const char* key, int& out) const {
  int64_t v = out;
  FS_RETURN_IF_ERROR(opt_int(key, v));
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    return invalid_argument("{}{}: value {} does not fit in 32 bits", where_, key, v);
  out = int(v);
  return {};
}

Status JsonFields::req_double(const char* key, double& out) const {
  if (!has(key)) return missing(key);
  return opt_double(key, out);
}

Status JsonFields::opt_double(const char* key, double& out) const {
  if (!has(key)) return {};
  const auto& v = obj_.at(key);
  if (!v.is_number()) return wrong_type(key, "a number");
  out = v.get<double>();
  return {};
}

Status JsonFields::opt_bool(const char* key, bool& out) const {
  if (!has(key)) return {};
  const auto& v = obj_.at(key);
  if (!v.is_boolean()) return wrong_type(key, "a boolean");
  out = v.get<bool>();
  return {};
}

Status JsonFields::req_string(const char* key, std::string& out) const {
  if (!has(key)) return missing(key);
  return opt_string(key, out);
}

Status JsonFields::opt_string(const char* key, std::string& out) const {
  if (!has(key)) return {};
  const auto& v = obj_.at(key);
  if (!v.is_string()) return wrong_type(key, "a string");
  out = v.get<std::string>();
  return {};
}

Status JsonFields::req_ints(const char* key, std::vector<int>& out) const {
  if (!has(key)) return missing(key);
  return opt_ints(key, out);
}

Status JsonFields::opt_ints(const char* key, std::vector<int>& out) const {
  if (!has(key)) return {};
  std::vector<int64_t> wide;
  FS_RETURN_IF_ERROR(req_ints(key, wide));
  out.clear();
  for (size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < std::numeric_limits<int>::min() || wide[i] > std::numeric_limits<int>::max())
      return invalid_argument("{}{}[{}]: value {} does not fit in 32 bits", where_, key, i, wide[i]);
    out.push_back(int(wide[i]));
  }
  return {};
}

Status JsonFields::req_ints(const char* key, std::vector<int64_t>& out) const {
  if (!has(key)) return missing(key);
  const auto& v = obj_.at(key);
  if (!v.is_array()) return wrong_type(key, "an array of integers");
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number_integer())
      return invalid_argument("{}{}[{}]: expected an integer, got {}", where_, key, i, v[i].dump());
    out.push_back(v[i].get<int64_t>());
  }
  return {};
}

Result<const nlohmann::json*> JsonFields::opt_object(const char* key) const {
  if (!has(key)) return static_cast<const nlohmann::json*>(nullptr);
  const auto& v = obj_.at(key);
  if (!v.is_object()) return wrong_type(key, "an object");
  return &v;
}

}  // namespace flashseek::model
