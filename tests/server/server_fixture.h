// A live HttpServer on a free loopback port, backed by the fakes, for HTTP-level tests.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "fakes.h"
#include "server/http_server.h"
#include "server/tokenizer_adapter.h"
#include "test_util.h"
#include "tokenizer/tokenizer_locate.h"

namespace flashseek::server::testing {

// The real V4.1 tokenizer and chat encoder (loaded once per test binary); a missing tokenizer is
// a test failure (scripts/setup.sh installs it).
struct RealText {
  static const RealText& get() {
    static RealText text;
    return text;
  }
  const tok::Tokenizer* tokenizer = nullptr;
  std::unique_ptr<TokenizerCodec> codec;
  std::unique_ptr<DeepSeekChat> chat;

 private:
  RealText() {
    static auto loaded =
        tok::load_v41_tokenizer((flashseek::testing::source_dir() / "models/tokenizer/tokenizer.json").string(),
                                (flashseek::testing::source_dir() / "data/tokenizer/v41_added_tokens.json").string());
    EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
    if (!loaded.ok()) return;
    tokenizer = &*loaded;
    codec = std::make_unique<TokenizerCodec>(*tokenizer);
    tok::ChatRequestOptions opts;
    opts.family = tok::ChatFamily::kV41;
    chat = std::make_unique<DeepSeekChat>(opts);
  }
};

// Which text ports a LiveServer uses: the small fakes, or the real tokenizer + chat encoder.
enum class Text { kFake, kReal };

struct LiveServer {
  FakeCodec codec;
  FakeChat chat;
  std::unique_ptr<FakeBackend> backend;
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  int port = 0;

  explicit LiveServer(ServerOptions opts = {}, int64_t max_batch = 4, int64_t max_queue = 16,
                      int step_ms = 2, Text text = Text::kFake,
                      const TextCodec* codec_override = nullptr,
                      Script script = default_script) {
    backend = std::make_unique<FakeBackend>(max_batch, max_queue, step_ms, std::move(script));
    opts.host = "127.0.0.1";
    opts.port = 0;
    opts.max_batch = max_batch;
    opts.max_queue = max_queue;
    if (opts.model_ids.size() == 1) opts.model_ids.push_back("tiny-demo");
    const TextCodec* use_codec = &codec;
    const ChatFormat* use_chat = &chat;
    if (text == Text::kReal) {
      const RealText& real = RealText::get();
      if (real.codec) use_codec = real.codec.get(), use_chat = real.chat.get();
    }
    if (codec_override) use_codec = codec_override;
    server = std::make_unique<HttpServer>(ServerDeps{backend.get(), use_codec, use_chat}, opts);
    auto bound = server->bind();
    EXPECT_TRUE(bound.ok()) << bound.status().to_string();
    port = bound.ok() ? *bound : 0;
    thread = std::thread([this] { server->run(); });
  }
  ~LiveServer() {
    server->stop();
    thread.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    return c;
  }
  // GET /metrics and return the value of one unlabelled sample (-1 if absent).
  double metric(const std::string& name) const {
    auto res = client().Get("/metrics");
    if (!res) return -1;
    const std::string key = "\n" + name + " ";
    const size_t at = res->body.find(key);
    if (at == std::string::npos) return -1;
    return std::stod(res->body.substr(at + key.size()));
  }
  // A gauge settles a moment after the client saw the last byte (the handler returns after the
  // write): polls until it is <= `value` or 5 s pass, and returns the last reading.
  double settled_metric(const std::string& name, double value) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    double v = metric(name);
    while (v > value && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      v = metric(name);
    }
    return v;
  }
};

// Parses the SSE body into the JSON of each "data:" event; sets `done` when [DONE] was seen.
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool& done) {
  std::vector<nlohmann::json> out;
  done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    const std::string payload = ev.substr(6);
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    out.push_back(nlohmann::json::parse(payload));
  }
  return out;
}

}  // namespace flashseek::server::testing
