#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "fuzz/targets.h"
#include "model/make_tiny.h"
#include "tokenizer/tokenizer_locate.h"

namespace flashseek::fuzz {

namespace {

constexpr Target kTargets[] = {
    {"snapshot", run_snapshot, seeds_snapshot},
    {"state_cache", run_state_cache, seeds_state_cache},
    {"safetensors", run_safetensors, seeds_safetensors},
    {"config", run_config, seeds_config},
    {"request", run_request, seeds_request, /*needs_tokenizer=*/true},
    {"completion", run_completion, seeds_completion},
    {"tokenizer", run_tokenizer, seeds_tokenizer, /*needs_tokenizer=*/true},
    {"api_keys", run_api_keys, seeds_api_keys},
    {"redis_url", run_redis_url, seeds_redis_url},
};

// Temporary checkpoint directories, removed when the process exits normally.
struct TinyDirs {
  std::mutex mu;
  std::map<std::string, std::string> dirs;
  ~TinyDirs() {
    std::error_code ec;
    for (auto& [name, dir] : dirs) std::filesystem::remove_all(dir, ec);
  }
};

}  // namespace

std::span<const Target> targets() { return kTargets; }

const Target* find_target(std::string_view name) {
  for (const Target& t : kTargets)
    if (name == t.name) return &t;
  return nullptr;
}

void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", file, line, what.c_str());
  std::fflush(stderr);
  std::abort();
}

const std::string& tiny_checkpoint(const std::string& config_name) {
  static TinyDirs tiny;
  std::lock_guard lock(tiny.mu);
  if (auto it = tiny.dirs.find(config_name); it != tiny.dirs.end()) return it->second;
  std::string dir = (std::filesystem::temp_directory_path() / "fs-fuzz-XXXXXX").string();
  if (!mkdtemp(dir.data())) fail(__FILE__, __LINE__, "mkdtemp failed");
  auto cfg = model::builtin_config(config_name);
  if (!cfg.ok()) fail(__FILE__, __LINE__, cfg.status().to_string());
  if (auto st = model::make_tiny_checkpoint(*cfg, {.seed = 5}, dir); !st.ok())
    fail(__FILE__, __LINE__, st.to_string());
  return tiny.dirs.emplace(config_name, std::move(dir)).first->second;
}

const tok::Tokenizer& v41_tokenizer() {
  static const tok::Tokenizer* t = [] {
    auto r = tok::load_v41_tokenizer();
    if (!r.ok()) fail(__FILE__, __LINE__, r.status().to_string());
    return new tok::Tokenizer(std::move(*r));  // kept for the process: harness threads may use it
  }();
  return *t;
}

}  // namespace flashseek::fuzz
