// Subcommand registry: each tools/cmd_*.cpp registers itself with FS_REGISTER_COMMAND, so adding a
// command touches no shared file. A command's callback returns the process exit code; errors
// print one clear message on stderr and return non-zero.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace flashseek::tools {

// Called once with the top-level app; must create the subcommand and return a runner that is
// invoked if that subcommand was selected.
using CommandSetup = std::function<std::function<int()>(CLI::App& app)>;

struct CommandEntry {
  std::string name;
  CommandSetup setup;
};

std::vector<CommandEntry>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(setup)});
  }
};

}  // namespace flashseek::tools

#define FS_REGISTER_COMMAND(name, setup_fn) \
  static ::flashseek::tools::CommandRegistrar FS_CONCAT(_fs_cmd_, __LINE__)(name, setup_fn)
#ifndef FS_CONCAT
#define FS_CONCAT_INNER(a, b) a##b
#define FS_CONCAT(a, b) FS_CONCAT_INNER(a, b)
#endif
