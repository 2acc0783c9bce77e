// flashseek: one binary, one subcommand per tools/cmd_*.cpp (wiring only; logic lives in src/).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include <spdlog/spdlog.h>

#include "tools/command.h"

namespace flashseek::tools {
std::vector<CommandEntry>& command_registry() {
  static std::vector<CommandEntry> registry;
  return registry;
}
}  // namespace flashseek::tools

int main(int argc, char** argv) {
  using namespace flashseek::tools;
  CLI::App app{"flashseek: inference engine and OpenAI-compatible server for DeepSeek-V4.1-Flash"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flashseek 0.1.0");
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();

  auto& registry = command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandEntry& a, const CommandEntry& b) { return a.name < b.name; });
  std::map<std::string, std::function<int()>> runners;
  for (auto& entry : registry) runners[entry.name] = entry.setup(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  for (auto* sub : app.get_subcommands()) {
    auto it = runners.find(sub->get_name());
    if (it != runners.end() && it->second) {
      try {
        return it->second();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "flashseek %s: error: %s\n", sub->get_name().c_str(), e.what());
        return 1;
      }
    }
  }
  return 0;
}
