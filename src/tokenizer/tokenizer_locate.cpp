#include "tokenizer/tokenizer_locate.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace flashseek::tok {
namespace {

namespace fs = std::filesystem;

#ifndef FLASHSEEK_SOURCE_DIR
#define FLASHSEEK_SOURCE_DIR ""
#endif

std::vector<fs::path> repo_roots() {
  std::vector<fs::path> roots;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    roots.push_back(exe.parent_path().parent_path());                // <build>/bin/.. = <build>
    roots.push_back(exe.parent_path().parent_path().parent_path());  // <repo>/<build>/bin
  }
  if (std::string_view(FLASHSEEK_SOURCE_DIR).size() > 0) roots.emplace_back(FLASHSEEK_SOURCE_DIR);
  return roots;
}

// A path naming a file, or a directory that holds `file_name`.
std::string resolve(const fs::path& p, const char* file_name) {
  std::error_code ec;
  if (fs::is_directory(p, ec)) return (p / file_name).string();
  return p.string();
}

bool is_file(const std::string& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

Result<std::string> first_existing(const std::vector<std::string>& candidates, const char* what) {
  for (const auto& c : candidates) {
    if (is_file(c)) return c;
  }
  std::string tried;
  for (const auto& c : candidates) tried += "\n  " + c;
  return not_found("{} not found; tried:{}", what, tried);
}

std::string env_or_empty(std::string_view name) {
  const char* v = std::getenv(std::string(name).c_str());
  return v != nullptr ? v : "";
}

}  // namespace

Result<std::string> find_tokenizer_json(std::string_view explicit_path) {
  constexpr const char* kName = "tokenizer.json";
  if (!explicit_path.empty()) {
    const std::string p = resolve(fs::path(explicit_path), kName);
    if (!is_file(p)) return not_found("tokenizer file '{}' does not exist", p);
    return p;
  }
  if (const std::string env = env_or_empty(kTokenizerEnv); !env.empty()) {
    const std::string p = resolve(fs::path(env), kName);
    if (!is_file(p)) return not_found("tokenizer file '{}' (from ${}) does not exist", p, kTokenizerEnv);
    return p;
  }
  std::vector<std::string> candidates;
  for (const auto& root : repo_roots()) {
    candidates.push_back((root / "models" / "tokenizer" / kName).string());
  }
  auto found = first_existing(candidates, "tokenizer.json (run scripts/fetch_tokenizer.sh)");
  return found;
}

Result<std::string> find_v41_added_tokens(std::string_view explicit_path,
                                          const std::string& tokenizer_json) {
  constexpr const char* kName = "v41_added_tokens.json";
  if (!explicit_path.empty()) {
    const std::string p(explicit_path);
    if (!is_file(p)) return not_found("added tokens file '{}' does not exist", p);
    return p;
  }
  if (const std::string env = env_or_empty(kAddedTokensEnv); !env.empty()) {
    if (!is_file(env)) return not_found("added tokens file '{}' (from ${}) does not exist", env, kAddedTokensEnv);
    return env;
  }
  std::vector<std::string> candidates;
  if (!tokenizer_json.empty()) {
    candidates.push_back((fs::path(tokenizer_json).parent_path() / kName).string());
  }
  for (const auto& root : repo_roots()) {
    candidates.push_back((root / "data" / "tokenizer" / kName).string());
  }
  return first_existing(candidates, kName);
}

Result<Tokenizer> load_v41_tokenizer(std::string_view tokenizer_path,
                                     std::string_view added_tokens_path) {
  FS_ASSIGN_OR_RETURN(std::string json_path, find_tokenizer_json(tokenizer_path));
  FS_ASSIGN_OR_RETURN(std::string added_path, find_v41_added_tokens(added_tokens_path, json_path));
  TokenizerOptions options;
  options.added_tokens_path = added_path;
  return Tokenizer::load(json_path, options);
}

}  // namespace flashseek::tok
