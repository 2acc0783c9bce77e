// flashseek snapshot-size: what one conversation snapshot costs for a config (capacity planning
// for --host-cache-bytes / --cache-dir), from kvshare/snapshot_size.h.
#include <cstdio>

#include "kvshare/snapshot_size.h"
#include "model/make_tiny.h"
#include "tools/command.h"

namespace flashseek::tools {
namespace {

struct Opts {
  std::string config;
  std::vector<int64_t> tokens = {1000, 32768, 131072, 1048576};
};

int run(const Opts& o) {
  auto cfg = model::builtin_config(o.config);
  if (!cfg.ok()) cfg = model::load_config(o.config);
  if (!cfg.ok()) {
    std::fprintf(stderr, "flashseek snapshot-size: error: %s\n", cfg.status().message().c_str());
    return 1;
  }
  const auto s = kvshare::snapshot_size(*cfg);
  std::printf("%s: %lld layers, %lld own compressed KV (%lld with index keys)\n", o.config.c_str(),
              (long long)cfg->num_layers, (long long)s.kv_source_layers,
              (long long)s.index_key_layers);
  std::printf("fixed: %.2f MiB; growth: %.1f KiB per 1k tokens (fp32 rows, self-contained blobs)\n",
              s.fixed_bytes / 1048576.0, s.bytes_per_1k_tokens / 1024.0);
  for (int64_t t : o.tokens)
    std::printf("  %8lld tokens: %10.2f MiB\n", (long long)t, s.bytes_at(t) / 1048576.0);
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("snapshot-size", "bytes of a conversation-state snapshot");
  auto o = std::make_shared<Opts>();
  cmd->add_option("--config", o->config, "builtin config name or checkpoint directory")->required();
  cmd->add_option("--tokens", o->tokens, "context lengths to report");
  return [o] { return run(*o); };
}

FS_REGISTER_COMMAND("snapshot-size", setup);

}  // namespace
}  // namespace flashseek::tools
