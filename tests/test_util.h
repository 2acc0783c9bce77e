// Small helpers shared by tests: paths of the built binary and of repo data, temp dirs, running
// a command while capturing its output, and skipping for a missing dependency (a failure in CI).
#pragma once
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

namespace flashseek::testing {

// True when the environment variable CI is "true" (.ci/run exports it). CI installs every tool,
// service and data file the suite needs (scripts/setup.sh: redis-server, node + npm modules, the
// tokenizer, UCX, python3-numpy), so there a missing one means a broken setup, not a reason to skip.
inline bool in_ci() {
  const char* v = std::getenv("CI");
  return v != nullptr && std::string(v) == "true";
}

// FS_SKIP_UNLESS_CI(message): for a dependency that is missing on this machine. Skips the test
// (visibly, with the message) on a developer machine; fails it under CI=true. Like GTEST_SKIP it
// returns from the enclosing void function (a test body or SetUp). `message` may be a << chain.
#define FS_SKIP_UNLESS_CI(message)                                                              \
  do {                                                                                          \
    if (::flashseek::testing::in_ci())                                                          \
      GTEST_FAIL() << message << " (CI=true: .ci/run installs this, so it must be present)";     \
    else                                                                                        \
      GTEST_SKIP() << message;                                                                  \
  } while (0)

inline std::string flashseek_bin() {
  if (const char* env = std::getenv("FLASHSEEK_BIN"); env && *env) return env;
  return FLASHSEEK_BIN_PATH;
}

inline std::filesystem::path source_dir() { return FLASHSEEK_SOURCE_DIR; }

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("flashseek-test-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `cmd` through the shell, capturing stdout+stderr.
inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace flashseek::testing
