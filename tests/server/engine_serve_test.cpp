// `flashseek serve` on a tiny random checkpoint with the real CPU engine: greedy output through
// the server equals the engine run alone (`flashseek run` when available), streamed or not, and
// under 256 concurrent streams (batch invariance through the whole stack).
#include <signal.h>

#include <fstream>
#include <regex>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "forward/cpu_model.h"
#include "server_fixture.h"
#include "test_util.h"

namespace flashseek::server::testing {
namespace {

using json = nlohmann::json;
namespace ft = flashseek::testing;

class ServeProcess {
 public:
  ServeProcess(const std::string& ckpt, const std::filesystem::path& log) {
    const auto r = ft::run_command(ft::flashseek_bin() + " serve --ckpt '" + ckpt +
                                   "' --port 0 --max-batch 16 --max-queue 512 > '" +
                                   log.string() + "' 2>&1 & echo $!");
    pid_ = std::atoi(r.output.c_str());
    const std::regex re("listening on http://[^:]+:([0-9]+)");
    for (int i = 0; i < 600 && port_ == 0; ++i) {
      std::ifstream in(log);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::smatch m;
      if (std::regex_search(text, m, re)) port_ = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~ServeProcess() {
    if (pid_ > 0) kill(pid_, SIGTERM);
  }
  int port() const { return port_; }
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
  int pid_ = -1;
  int port_ = 0;
};

// Greedy tokens of the engine alone: `flashseek run --json` if the command exists, else the
// engine in this process.
std::vector<int32_t> reference_tokens(const std::string& ckpt, const std::vector<int32_t>& prompt,
                                      int max_tokens) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const auto r = ft::run_command(ft::flashseek_bin() + " run --ckpt '" + ckpt + "' --prompt-ids " +
                                 ids + " --max-tokens " + std::to_string(max_tokens) +
                                 " --temperature 0 --json 2>/dev/null");
  if (r.exit_code == 0) {
    json j = json::parse(r.output.substr(r.output.find('{')), nullptr, false);
    if (!j.is_discarded() && j.contains("tokens")) return j["tokens"].get<std::vector<int32_t>>();
  }
  auto model = forward::load_model(ckpt, forward::Numerics::kReference);
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  auto engine = engine::Engine::create(**model, {});
  engine::Request req;
  req.id = 1;
  req.prompt = prompt;
  req.sampling.temperature = 0;
  req.max_tokens = max_tokens;
  auto stream = (*engine)->submit(std::move(req));
  EXPECT_TRUE(stream.ok());
  EXPECT_TRUE((*engine)->run_until_idle().ok());
  return engine::collect(**stream).tokens;
}

json completion(int port, const std::vector<int32_t>& prompt, int max_tokens, bool stream) {
  return {{"model", "deepseek-v4.1-flash"}, {"prompt", prompt}, {"max_tokens", max_tokens},
          {"temperature", 0}, {"return_token_ids", true}, {"stream", stream}};
}

std::vector<int32_t> server_tokens(int port, const json& body, int* status = nullptr) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  if (status) *status = res ? res->status : -1;
  std::vector<int32_t> out;
  if (!res || res->status != 200) return out;
  if (!body.value("stream", false)) return json::parse(res->body)["choices"][0]["token_ids"];
  bool done = false;
  for (const json& ev : sse_events(res->body, done))
    if (!ev["choices"].empty() && ev["choices"][0].contains("token_ids"))
      for (int32_t t : ev["choices"][0]["token_ids"]) out.push_back(t);
  if (!done && status) *status = -2;
  return out;
}

// `flashseek serve` needs the tokenizer (scripts/fetch_tokenizer.sh) even for token-id prompts.
bool have_tokenizer() {
  return std::getenv("FLASHSEEK_TOKENIZER") ||
         std::filesystem::exists(ft::source_dir() / "models/tokenizer/tokenizer.json");
}

TEST(EngineServe, GreedyThroughServerEqualsEngineRunAndSurvivesLoad) {
  if (!have_tokenizer()) FS_SKIP_UNLESS_CI("no tokenizer: run scripts/fetch_tokenizer.sh");
  ft::TempDir dir;
  const std::string ckpt = (dir.path() / "tiny").string();
  auto made = ft::run_command(ft::flashseek_bin() + " make-tiny --config tiny-v41 --seed 1 --out " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ServeProcess serve(ckpt, dir.path() / "serve.log");
  ASSERT_GT(serve.port(), 0) << "no 'listening on' line";
  ASSERT_TRUE(serve.wait_ready());

  const std::vector<int32_t> prompt = {5, 17, 99, 3, 42, 7};
  const auto want = reference_tokens(ckpt, prompt, 8);
  ASSERT_EQ(want.size(), 8u);
  EXPECT_EQ(server_tokens(serve.port(), completion(serve.port(), prompt, 8, false)), want);
  EXPECT_EQ(server_tokens(serve.port(), completion(serve.port(), prompt, 8, true)), want);

  // 256 concurrent streams with different prompts: no errors, each equals its run alone.
  constexpr int kClients = 256;
  auto prompt_of = [](int i) { return std::vector<int32_t>{5, 17, int32_t(10 + i % 200), 3, int32_t(i % 7)}; };
  std::vector<std::vector<int32_t>> got(kClients);
  std::vector<int> status(kClients, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      got[size_t(i)] = server_tokens(serve.port(), completion(serve.port(), prompt_of(i), 4, true),
                                     &status[size_t(i)]);
    });
  for (auto& t : clients) t.join();
  int errors = 0;
  for (int s : status) errors += s != 200;
  EXPECT_EQ(errors, 0);
  for (int i = 0; i < kClients; i += 37)
    EXPECT_EQ(got[size_t(i)], server_tokens(serve.port(), completion(serve.port(), prompt_of(i), 4, false)))
        << "client " << i;
}

// The openai SDK against the real stack on the full-vocabulary demo checkpoint.
TEST(EngineServe, OpenAiSdkAgainstDemoCheckpoint) {
  if (!have_tokenizer()) FS_SKIP_UNLESS_CI("no tokenizer: run scripts/fetch_tokenizer.sh");
  const auto js = ft::source_dir() / "tests/server/js";
  if (ft::run_command("node --version").exit_code != 0) FS_SKIP_UNLESS_CI("node is not installed");
  if (!std::filesystem::exists(js / "node_modules/openai/package.json"))
    FS_SKIP_UNLESS_CI("openai SDK missing: run npm ci --prefix tests/server/js");
  ft::TempDir dir;
  const std::string ckpt = (dir.path() / "demo").string();
  auto made = ft::run_command(ft::flashseek_bin() + " make-tiny --config demo --seed 1 --out " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  ServeProcess serve(ckpt, dir.path() / "serve.log");
  ASSERT_GT(serve.port(), 0);
  ASSERT_TRUE(serve.wait_ready());
  const auto r = ft::run_command("cd '" + js.string() + "' && FLASHSEEK_URL=http://127.0.0.1:" +
                                 std::to_string(serve.port()) +
                                 " timeout 120 node --test real_model.test.mjs");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("# pass 6"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace flashseek::server::testing
