// `flashseek serve --load-format dummy`: serves generated weights (the same greedy reply as
// `run` on them), accepts vLLM's --max-num-seqs / --max-model-len, answers a request longer than
// the context with a 400, and refuses a model that does not fit its memory plan at start.
#include <signal.h>

#include <fstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace flashseek::server::testing {
namespace {

using json = nlohmann::json;
namespace ft = flashseek::testing;

bool have_tokenizer() {
  return std::getenv("FLASHSEEK_TOKENIZER") ||
         std::filesystem::exists(ft::source_dir() / "models/tokenizer/tokenizer.json");
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// One `flashseek serve` process in the background (killed on destruction); port from its log.
class Serve {
 public:
  Serve(const std::string& args, const std::filesystem::path& log) : log_(log) {
    const auto r = ft::run_command(ft::flashseek_bin() + " serve --port 0 " + args + " > '" + log.string() +
                                   "' 2>&1 & echo $!");
    pid_ = std::atoi(r.output.c_str());
    const std::regex re("listening on http://[^:]+:([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {  // at most 30 s
      std::smatch m;
      const std::string text = read_all(log);
      if (std::regex_search(text, m, re)) port_ = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~Serve() {
    if (pid_ > 0) kill(pid_, SIGTERM);
  }
  int port() const { return port_; }
  bool wait_ready() const {
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 1200; ++i) {  // at most 60 s
      auto res = c.Get("/readyz");
      if (res && res->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::string log() const { return read_all(log_); }

 private:
  std::filesystem::path log_;
  int pid_ = -1;
  int port_ = 0;
};

TEST(DummyServe, ServesGeneratedWeightsAndRefusesTooLongRequests) {
  if (!have_tokenizer()) FS_SKIP_UNLESS_CI("no tokenizer: run scripts/fetch_tokenizer.sh");
  ft::TempDir dir;
  Serve serve("--load-format dummy --config tiny-v41 --seed 2 --max-num-seqs 2 --max-model-len 32",
              dir.path() / "serve.log");
  ASSERT_GT(serve.port(), 0) << serve.log();
  ASSERT_TRUE(serve.wait_ready()) << serve.log();
  EXPECT_NE(serve.log().find("memory plan (host memory)"), std::string::npos) << serve.log();

  // The greedy reply equals `run` on the same generated weights.
  const auto r = ft::run_command("(" + ft::flashseek_bin() + " run --load-format dummy --config tiny-v41 --seed 2 "
                                 "--prompt-ids 5,17,99,3,42,7 --max-tokens 8 --temperature 0 --ignore-eos "
                                 "--speculative off --json 2>/dev/null)");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json want = json::parse(r.output)["tokens"];
  httplib::Client c("127.0.0.1", serve.port());
  c.set_read_timeout(120, 0);
  json body = {{"model", "deepseek-v4.1-flash"}, {"prompt", {5, 17, 99, 3, 42, 7}}, {"max_tokens", 8},
               {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
  auto ok = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(ok);
  ASSERT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["choices"][0]["token_ids"], want);

  // 6 prompt tokens + 27 > --max-model-len 32: a 400 naming the context, not a crash.
  body["max_tokens"] = 27;
  auto too_long = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(too_long);
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  EXPECT_EQ(json::parse(too_long->body)["error"]["code"], "context_length_exceeded") << too_long->body;
}

TEST(DummyServe, RefusesAModelThatDoesNotFitAtStart) {
  if (!have_tokenizer()) FS_SKIP_UNLESS_CI("no tokenizer: run scripts/fetch_tokenizer.sh");
  const auto r = ft::run_command(ft::flashseek_bin() + " serve --port 0 --load-format dummy --config tiny-v41 "
                                 "--max-batch 4 --memory-limit 2000000");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("does not fit in host memory"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2000000 bytes available"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("listening on"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace flashseek::server::testing
