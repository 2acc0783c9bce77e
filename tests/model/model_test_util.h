// Helpers shared by the model tests: temp directories, the extracted oracle fixture, JSON edits.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace flashseek::model::testutil {

// A fresh directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fs_model_XXXXXX").string();
    path_ = mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return (std::filesystem::path(path_) / rel).string(); }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string source_path(const std::string& rel) { return std::string(FLASHSEEK_SOURCE_DIR) + "/" + rel; }

// tests/golden/v41-official-continuous.tgz extracted once per test process.
inline const std::string& fixture_dir() {
  static TempDir dir;
  static std::string extracted = [] {
    const std::string cmd = "tar xzf '" + source_path("tests/golden/v41-official-continuous.tgz") + "' -C '" +
                            dir.path() + "'";
    if (std::system(cmd.c_str()) != 0) return std::string();
    return dir / "v41-official-continuous";
  }();
  return extracted;
}

}  // namespace flashseek::model::testutil
