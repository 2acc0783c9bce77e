// Text and JSON renderings of ModelCounts (used by `flashseek inspect`).
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/counts.h"

namespace flashseek::model {

std::string format_counts_table(const ModelCounts& m) {
  std::string s = fmt::format("{:<30} {:>18} {:>10} {:>18} {:>10} {:>9}\n", "component", "params", "(B)",
                              "bytes", "(GB)", "tensors");
  auto line = [&](const char* name, const CountRow& r) {
    s += fmt::format("{:<30} {:>18} {:>10.2f} {:>18} {:>10.2f} {:>9}\n", name, r.params, double(r.params) / 1e9,
                     r.bytes, double(r.bytes) / 1e9, r.tensors);
  };
  for (int i = 0; i < kNumComponents; ++i)
    if (m.components[size_t(i)].tensors > 0) line(component_name(Component(i)), m.components[size_t(i)]);
  line("total", m.total);
  s += fmt::format("total size {:.1f} GiB\n\n{:<10} {:>9} {:>18} {:>18}\n", double(m.total.bytes) / double(1ull << 30),
                   "dtype", "tensors", "elements", "bytes");
  for (const auto& [name, r] : m.dtypes)
    s += fmt::format("{:<10} {:>9} {:>18} {:>18}\n", name, r.tensors, r.params, r.bytes);
  return s;
}

std::string format_counts_json(const ModelCounts& m, const ValidationReport* report,
                               const std::vector<std::string>& config_warnings) {
  using nlohmann::json;
  auto row = [](const CountRow& r) { return json{{"params", r.params}, {"bytes", r.bytes}, {"tensors", r.tensors}}; };
  json j;
  j["components"] = json::array();
  for (int i = 0; i < kNumComponents; ++i) {
    json r = row(m.components[size_t(i)]);
    r["name"] = component_name(Component(i));
    j["components"].push_back(r);
  }
  j["total"] = row(m.total);
  j["dtypes"] = json::object();
  for (const auto& [name, r] : m.dtypes)
    j["dtypes"][name] = {{"tensors", r.tensors}, {"elements", r.params}, {"bytes", r.bytes}};
  j["config_warnings"] = config_warnings;
  if (report) {
    j["valid"] = report->ok();
    j["errors"] = report->errors;
    j["warnings"] = report->warnings;
  }
  return j.dump(1);
}

}  // namespace flashseek::model
