// Helpers for the tests that drive `flashseek serve` processes: start/stop with a log file, wait
// for /readyz, greedy completions over token ids, /metrics values.
#pragma once
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace flashseek::kvtest {

namespace ft = flashseek::testing;
using json = nlohmann::json;

class Serve {
 public:
  // `args` are extra `flashseek serve` flags.
  Serve(const std::string& ckpt, const std::filesystem::path& log, const std::string& args)
      : log_(log) {
    const auto r = ft::run_command(ft::flashseek_bin() + " serve --ckpt '" + ckpt +
                                   "' --port 0 " + args + " > '" + log.string() + "' 2>&1 & echo $!");
    pid_ = std::atoi(r.output.c_str());
    const std::regex re("listening on http://[^:]+:([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::smatch m;
      const std::string text = log_text();
      if (std::regex_search(text, m, re)) port_ = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Serve() { stop(); }
  Serve(const Serve&) = delete;
  Serve& operator=(const Serve&) = delete;

  // SIGTERM, then waits (at most 20 s) for the process to exit.
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 400 && kill(pid_, 0) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    pid_ = -1;
  }
  // SIGKILL: no drain, no goodbye to the registry (its heartbeat key just expires).
  void kill_hard() {
    if (pid_ > 0) kill(pid_, SIGKILL);
    pid_ = -1;
  }
  int port() const { return port_; }
  std::string log_text() const {
    std::ifstream in(log_);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  bool wait_ready() const {
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 600; ++i) {
      auto res = c.Get("/readyz");
      if (res && res->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  std::filesystem::path log_;
  int pid_ = -1;
  int port_ = 0;
};

struct Completion {
  int status = -1;
  std::vector<int32_t> tokens;
  int64_t cached_tokens = -1;
};

// Greedy /v1/completions on token ids, with an optional API key and OpenAI `user` field.
inline Completion complete(int port, const std::vector<int32_t>& prompt, int max_tokens,
                           const std::string& api_key = {}, const std::string& user = {}) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  json body = {{"model", "deepseek-v4.1-flash"}, {"prompt", prompt},
               {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", true},
               {"return_token_ids", true}};
  if (!user.empty()) body["user"] = user;
  auto res = c.Post("/v1/completions", h, body.dump(), "application/json");
  Completion out;
  if (!res) return out;
  out.status = res->status;
  if (res->status != 200) return out;
  const json j = json::parse(res->body);
  out.tokens = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  out.cached_tokens = j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  return out;
}

// A metric's value from /metrics (the first line starting with `name`), -1 if absent.
inline double metric(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  auto res = c.Get("/metrics");
  if (!res) return -1;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  return -1;
}

inline bool have_tokenizer() {
  return std::getenv("FLASHSEEK_TOKENIZER") ||
         std::filesystem::exists(ft::source_dir() / "models/tokenizer/tokenizer.json");
}

// Greedy tokens of the engine alone (`flashseek run --json`).
inline std::vector<int32_t> run_tokens(const std::string& ckpt, const std::vector<int32_t>& prompt,
                                       int max_tokens) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const auto r = ft::run_command(ft::flashseek_bin() + " run --ckpt '" + ckpt + "' --prompt-ids " +
                                 ids + " --max-tokens " + std::to_string(max_tokens) +
                                 " --ignore-eos --temperature 0 --json 2>/dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output.substr(r.output.find('{')), nullptr, false);
  if (j.is_discarded() || !j.contains("tokens")) return {};
  return j["tokens"].get<std::vector<int32_t>>();
}

}  // namespace flashseek::kvtest
