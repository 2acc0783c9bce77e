// config.json text (model/config.h) as a checkpoint directory holds it. A config that parses
// writes out (config_to_hf_json, and the reference's format) to text that parses again and writes
// the same text: the parser and the writers agree on every field, and validation accepts what it
// once accepted.
#include <fstream>
#include <sstream>

#include "fuzz/targets.h"
#include "model/config.h"
#include "model/make_tiny.h"

namespace flashseek::fuzz {

namespace {

// The first line where two texts differ (for the failure message).
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = a.rfind('\n', i) == std::string::npos ? 0 : a.rfind('\n', i) + 1;
  auto line = [&](const std::string& s) { return s.substr(from, s.find('\n', from) - from); };
  return "\n  " + line(a) + "\n  " + line(b);
}

}  // namespace

bool run_config(std::span<const uint8_t> d) {
  auto cfg = model::parse_config(std::string(as_text(d)), "fuzz config.json");
  if (!cfg.ok()) return false;
  const std::string hf = model::config_to_hf_json(*cfg);
  auto again = model::parse_config(hf, "rewritten config.json");
  FUZZ_CHECK(again.ok(), "a written config does not parse: " + again.status().to_string() + "\n" + hf);
  FUZZ_CHECK(model::config_to_hf_json(*again) == hf,
             "config write / parse is not a fixed point:" + first_difference(hf, model::config_to_hf_json(*again)));
  // The reference's format holds fewer fields (no model_type, token ids, ...): its own write /
  // parse must be a fixed point too.
  const std::string ref_text = model::config_to_ref_json(*cfg);
  auto ref = model::parse_config(ref_text, "reference-style config");
  FUZZ_CHECK(ref.ok(), "the reference-style rewrite does not parse: " + ref.status().to_string());
  FUZZ_CHECK(model::config_to_ref_json(*ref) == ref_text,
             "reference-style write / parse is not a fixed point:" + first_difference(ref_text, model::config_to_ref_json(*ref)));
  return true;
}

std::vector<Bytes> seeds_config() {
  std::vector<Bytes> out;
  for (const char* name : {"tiny-v41", "tiny-v4", "demo"}) {
    auto cfg = model::builtin_config(name);
    if (!cfg.ok()) continue;
    out.push_back(to_bytes(model::config_to_hf_json(*cfg)));
    out.push_back(to_bytes(model::config_to_ref_json(*cfg)));
  }
  for (const char* file : {"v41-flash-config.json", "v4-flash-config.json"}) {
    std::ifstream in(std::string(FLASHSEEK_SOURCE_DIR) + "/tests/model/data/" + file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!ss.str().empty()) out.push_back(to_bytes(ss.str()));
  }
  return out;
}

}  // namespace flashseek::fuzz
