// flashseek inspect: per-component parameter / byte counts, dtype summary and validation of a
// checkpoint directory (--ckpt) or of a config alone (--config, counts in the release formats).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "model/checkpoint.h"
#include "model/counts.h"
#include "tools/command.h"

namespace flashseek::tools {
namespace {

int fail(const Status& st) {
  std::fprintf(stderr, "flashseek inspect: error: %s\n", st.message().c_str());
  return 1;
}

int inspect_config(const std::string& path, bool json) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(not_found("--config {}: cannot open", path));
  std::stringstream ss;
  ss << in.rdbuf();
  auto cfg = model::parse_config(ss.str(), path);
  if (!cfg.ok()) return fail(cfg.status());
  const model::ModelCounts m = model::count_from_config(*cfg);
  if (json) std::printf("%s\n", model::format_counts_json(m, nullptr, cfg->warnings).c_str());
  else std::printf("%s", model::format_counts_table(m).c_str());
  return 0;
}

int inspect_ckpt(const std::string& dir, bool json) {
  auto ck = model::Checkpoint::open(dir, /*validate=*/false);
  if (!ck.ok()) return fail(ck.status());
  const model::ValidationReport& rep = ck->validation();
  const model::ModelCounts m = model::count_from_checkpoint(*ck);
  if (json) {
    std::printf("%s\n", model::format_counts_json(m, &rep, ck->config().warnings).c_str());
  } else {
    std::printf("%s\n", model::format_counts_table(m).c_str());
    for (const auto& w : ck->config().warnings) std::printf("config warning: %s\n", w.c_str());
    for (const auto& w : rep.warnings) std::printf("warning: %s\n", w.c_str());
    for (const auto& e : rep.errors) std::printf("error: %s\n", e.c_str());
    std::printf("validation: %s (%zu errors, %zu warnings)\n", rep.ok() ? "OK" : "FAILED", rep.errors.size(),
                rep.warnings.size());
  }
  return rep.ok() ? 0 : 1;
}

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "parameter/byte counts, dtypes and validation of a checkpoint");
  auto ckpt = std::make_shared<std::string>();
  auto config = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto* o1 = cmd->add_option("--ckpt", *ckpt, "checkpoint directory (config.json + safetensors)");
  auto* o2 = cmd->add_option("--config", *config, "a config.json: count from the config alone, no weights");
  o1->excludes(o2);
  cmd->add_flag("--json", *json, "machine-readable output");
  return [ckpt, config, json]() -> int {
    if (!config->empty()) return inspect_config(*config, *json);
    if (!ckpt->empty()) return inspect_ckpt(*ckpt, *json);
    return fail(invalid_argument("one of --ckpt DIR or --config FILE is required"));
  };
}

FS_REGISTER_COMMAND("inspect", setup);

}  // namespace
}  // namespace flashseek::tools
