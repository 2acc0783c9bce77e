// Attacks on the HTTP/JSON request path, each class of issue 14 part A, against the real
// tokenizer and chat encoder (the generation backend is the fake): deep nesting inside every
// field that holds JSON, oversized chunked bodies, header floods, slow-trickle and idle
// connections while /healthz is probed, half-closed clients, cross-site content types, and
// requests that are too large to tokenize. Loopback only; every wait has a deadline.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include <gtest/gtest.h>

#include "server_fixture.h"

namespace flashseek::server::testing {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* kModel = "deepseek-v4.1-flash";

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  // Every blocking read or write in these tests has a deadline.
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Reads until EOF or the deadline; returns what arrived.
std::string read_until_eof(int fd, std::chrono::milliseconds limit) {
  std::string out;
  const auto deadline = Clock::now() + limit;
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, int(left.count())) <= 0) break;
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

// Status of the final (non-1xx) response in raw bytes; -1 if none.
int final_status(const std::string& raw) {
  size_t at = 0;
  while ((at = raw.find("HTTP/1.1 ", at)) != std::string::npos) {
    const int status = std::atoi(raw.c_str() + at + 9);
    if (status >= 200) return status;
    at += 9;
  }
  return -1;
}

std::string post_head(const std::string& path, const std::string& extra_headers) {
  return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
         extra_headers + "\r\n";
}

// Checks an OpenAI error object with the given status.
void expect_error(const httplib::Result& res, int status, const std::string& what) {
  ASSERT_TRUE(res) << what << ": no response";
  EXPECT_EQ(res->status, status) << what << ": " << res->body.substr(0, 300);
  const json j = json::parse(res->body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << what << ": " << res->body.substr(0, 300);
  EXPECT_TRUE(j["error"]["message"].is_string()) << what;
  EXPECT_TRUE(j["error"]["type"].is_string()) << what;
}

std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

json chat_body(const std::string& content = "hi") {
  return {{"model", kModel}, {"max_tokens", 4},
          {"messages", json::array({{{"role", "user"}, {"content", content}}})}};
}

// Deep nesting (>= 100k levels) in every field that holds JSON: the body is refused with a 400
// before a tree is built, and the server stays up. Before the fix each of these killed the
// process (SIGSEGV in a recursive copy / dump / destructor).
TEST(Attack, DeepNestingInEveryFieldIsA400) {
  LiveServer s({}, 4, 16, 1, Text::kReal);
  const std::string deep = nested(100'000);
  const std::string huge = nested(1'000'000);
  const std::string chat_prefix = "{\"model\":\"deepseek-v4.1-flash\",\"max_tokens\":2,";
  const std::string user_msg = "{\"role\":\"user\",\"content\":\"hi\"}";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/chat/completions", chat_prefix + "\"messages\":[" + user_msg + "],\"stop\":" + deep + "}"},
      {"/v1/chat/completions", chat_prefix + "\"messages\":[" + deep + "]}"},
      {"/v1/chat/completions", chat_prefix + "\"messages\":[" + user_msg + "," + huge + "]}"},
      {"/v1/chat/completions",
       chat_prefix + "\"messages\":[{\"role\":\"user\",\"content\":" + deep + "}]}"},
      {"/v1/completions", chat_prefix + "\"prompt\":" + deep + "}"},
      {"/v1/completions", chat_prefix + "\"prompt\":" + huge + "}"},
      {"/v1/chat/completions",
       chat_prefix + "\"messages\":[" + user_msg + "],\"tools\":[{\"type\":\"function\","
       "\"function\":{\"name\":\"f\",\"parameters\":{\"a\":" + deep + "}}}]}"},
      {"/v1/chat/completions",
       chat_prefix + "\"messages\":[" + user_msg + "],\"tools\":[{\"type\":\"function\","
       "\"function\":{\"name\":\"f\",\"parameters\":" + std::string(100'000, '{') + "}]}"},
  };
  auto c = s.client();
  for (size_t i = 0; i < cases.size(); ++i) {
    auto res = c.Post(cases[i].first, cases[i].second, "application/json");
    expect_error(res, 400, "case " + std::to_string(i));
  }
  // JSON inside a string: tool-call arguments nested 100k deep (the body itself is shallow).
  json body = chat_body();
  body["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                              {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                           {"function", {{"name", "f"},
                                                                         {"arguments", "{\"a\":" + deep + "}"}}}}})}});
  body["messages"].push_back({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "ok"}});
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  expect_error(res, 400, "tool-call arguments");
  EXPECT_NE(res->body.find("arguments"), std::string::npos) << res->body;
  // Nesting within the limit still works (a tool schema 45 levels deep).
  json schema = json::object();
  for (int i = 0; i < 20; ++i) schema = {{"type", "object"}, {"properties", {{"x", schema}}}};
  json ok = chat_body();
  ok["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", schema}}}}});
  auto fine = c.Post("/v1/chat/completions", ok.dump(), "application/json");
  ASSERT_TRUE(fine);
  EXPECT_EQ(fine->status, 200) << fine->body;
  EXPECT_EQ(c.Get("/healthz")->status, 200);
}

// A chunked body over the limit is refused with 413 after at most the limit (+ framing) was
// read, on the JSON routes and on any other POST route. Before the fix 256 MB were buffered.
TEST(Attack, OversizedChunkedBodyIs413) {
  ServerOptions o;
  o.max_body_bytes = 1u << 20;
  LiveServer s(o, 4, 16, 1, Text::kReal);
  // On the JSON routes (our bounded reader) and on a route the library reads for us.
  for (const std::string path : {"/v1/chat/completions", "/v1/no-such-route"}) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Transfer-Encoding: chunked\r\n\r\n"));
    // 64 KiB chunks until the server answers: it reads at most the limit (+ framing), so the
    // answer must come long before 64 MiB went out (the rest is socket buffers).
    const std::string chunk = "10000\r\n" + std::string(0x10000, 'a') + "\r\n";
    size_t sent = 0;
    while (sent < (64u << 20) && send_all(fd, chunk)) {
      sent += 0x10000;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) break;  // the answer (or close) arrived
    }
    const std::string raw = read_until_eof(fd, std::chrono::seconds(20));
    close(fd);
    EXPECT_EQ(final_status(raw), 413) << path << ": " << raw.substr(0, 300);
    EXPECT_LT(sent, size_t(24u << 20)) << path;
    EXPECT_NE(raw.find("\"error\""), std::string::npos) << path;
  }
  // A GET with a body: the library does not read it, so the server answers and closes rather
  // than parse the body as further requests.
  {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                             "10000\r\n" + std::string(0x10000, 'a') + "\r\n"));
    const std::string raw = read_until_eof(fd, std::chrono::seconds(20));
    close(fd);
    EXPECT_EQ(final_status(raw), 200) << raw.substr(0, 300);
    EXPECT_EQ(raw.find("HTTP/1.1", 1), std::string::npos) << "one answer only: " << raw.substr(0, 600);
  }
  // A chunked body within the limit is served.
  const json body = chat_body();
  const std::string text = body.dump();
  const int fd = connect_to(s.port);
  ASSERT_GE(fd, 0);
  char size_hex[32];
  std::snprintf(size_hex, sizeof(size_hex), "%zx", text.size());
  ASSERT_TRUE(send_all(fd, post_head("/v1/chat/completions", "Transfer-Encoding: chunked\r\nConnection: close\r\n") +
                               size_hex + "\r\n" + text + "\r\n0\r\n\r\n"));
  const std::string raw = read_until_eof(fd, std::chrono::seconds(20));
  close(fd);
  EXPECT_EQ(final_status(raw), 200) << raw.substr(0, 300);
}

// Header floods: more header lines than the limit get 431 and the connection is closed. Before
// the fix 500k header lines were read and stored.
TEST(Attack, HeaderFloodIs431) {
  LiveServer s({}, 4, 16, 1, Text::kReal);
  const int fd = connect_to(s.port);
  ASSERT_GE(fd, 0);
  std::string head = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 5000; ++i) head += "X-Flood-" + std::to_string(i) + ": y\r\n";
  head += "\r\n";
  send_all(fd, head);  // may fail part-way once the server answered and closed
  const std::string raw = read_until_eof(fd, std::chrono::seconds(20));
  close(fd);
  EXPECT_EQ(final_status(raw), 431) << raw.substr(0, 300);
  // A request with a normal number of headers is fine.
  httplib::Headers h;
  for (int i = 0; i < 40; ++i) h.emplace("X-Ok-" + std::to_string(i), "y");
  auto res = s.client().Get("/healthz", h);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

// Slow-trickle and idle connections, more of them than the server has connections, while
// /healthz and /readyz are probed: every probe answers within its deadline, and every
// trickling connection is cut off. Before the fix, ~90 tricklers blocked every route.
TEST(Attack, TricklersAndIdleConnectionsDoNotBlockHealthz) {
  ServerOptions o;
  o.max_connections = 24;
  o.head_timeout_ms = 1500;
  o.keep_alive_timeout_ms = 60'000;  // idle connections are not timed out: only evicted
  LiveServer s(o, 2, 4, 1, Text::kReal);
  constexpr int kTricklers = 40, kIdle = 40;
  std::vector<int> trickle, idle;
  for (int i = 0; i < kTricklers; ++i) trickle.push_back(connect_to(s.port));
  for (int i = 0; i < kIdle; ++i) idle.push_back(connect_to(s.port));
  std::atomic<bool> done{false};
  std::atomic<int> cut_off{0};
  const std::string head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  std::thread feeder([&] {
    std::vector<size_t> pos(trickle.size(), 0);
    std::vector<bool> closed(trickle.size(), false);
    while (!done) {
      for (size_t i = 0; i < trickle.size(); ++i) {
        if (closed[i] || trickle[i] < 0) continue;
        const char c = pos[i] < head.size() ? head[pos[i]] : 'a';
        pos[i]++;
        if (send(trickle[i], &c, 1, MSG_NOSIGNAL) != 1) {
          closed[i] = true;
          cut_off++;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // Probes: each must be answered within 10 s (a deadline for the test, not a speed claim).
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    httplib::Client c("127.0.0.1", s.port);
    c.set_connection_timeout(10, 0);
    c.set_read_timeout(10, 0);
    auto res = c.Get(i % 2 ? "/readyz" : "/healthz");
    answered += res && res->status == 200;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(answered, 20);
  // Every trickler is cut off (evicted or past the head deadline) within 20 s.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (cut_off < kTricklers && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  done = true;
  feeder.join();
  EXPECT_EQ(cut_off.load(), kTricklers);
  // A full chat request still works.
  auto res = s.client().Post("/v1/chat/completions", chat_body().dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  for (int fd : trickle) if (fd >= 0) close(fd);
  for (int fd : idle) if (fd >= 0) close(fd);
}

// A client that half-closes after its request still gets the whole response (streamed or not).
// Before the fix the request was cancelled as if the client had gone.
TEST(Attack, HalfClosedClientGetsItsResponse) {
  LiveServer s({}, 4, 16, /*step_ms=*/5, Text::kReal);
  for (const bool stream : {false, true}) {
    json body = chat_body("hello there");
    body["max_tokens"] = 20;
    body["stream"] = stream;
    const std::string text = body.dump();
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, post_head("/v1/chat/completions",
                                       "Content-Length: " + std::to_string(text.size()) + "\r\n") + text));
    shutdown(fd, SHUT_WR);
    const std::string raw = read_until_eof(fd, std::chrono::seconds(30));
    close(fd);
    ASSERT_EQ(final_status(raw), 200) << raw.substr(0, 300);
    if (stream) {
      EXPECT_NE(raw.find("data: [DONE]"), std::string::npos) << raw.substr(0, 500);
    } else {
      const size_t at = raw.find("\r\n\r\n", raw.find("HTTP/1.1 200"));
      ASSERT_NE(at, std::string::npos);
      const json j = json::parse(raw.substr(at + 4), nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << raw.substr(0, 500);
      EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string()) << j.dump();
      EXPECT_EQ(j["choices"][0]["finish_reason"], "length") << j.dump();  // max_tokens 20
    }
  }
  EXPECT_EQ(s.backend->cancelled(), 0);
}

// JSON routes need Content-Type application/json (parameters allowed): a cross-site "simple"
// request (text/plain, form) is refused with 415. Before the fix it was served.
TEST(Attack, JsonRoutesNeedJsonContentType) {
  LiveServer s({}, 4, 16, 1, Text::kReal);
  const std::string body = chat_body().dump();
  auto c = s.client();
  for (const std::string type : {"text/plain", "application/x-www-form-urlencoded",
                                 "multipart/form-data; boundary=x", "application/jsonx", ""}) {
    auto res = c.Post("/v1/chat/completions", body, type.c_str());
    expect_error(res, 415, "'" + type + "'");
  }
  for (const std::string type : {"application/json", "application/json; charset=utf-8",
                                 "Application/JSON ;charset=UTF-8"}) {
    auto res = c.Post("/v1/completions", json{{"model", kModel}, {"prompt", "hi"}, {"max_tokens", 2}}.dump(),
                      type.c_str());
    ASSERT_TRUE(res) << type;
    EXPECT_EQ(res->status, 200) << type << ": " << res->body;
  }
}

// Counts encode calls on the real codec: proves what was (not) tokenized.
class CountingCodec : public TextCodec {
 public:
  explicit CountingCodec(const TextCodec& inner) : inner_(inner) {}
  Result<std::vector<int32_t>> encode(std::string_view text) const override {
    encoded++;
    return inner_.encode(text);
  }
  std::string decode(std::span<const int32_t> ids) const override { return inner_.decode(ids); }
  std::string token_text(int32_t id) const override { return inner_.token_text(id); }
  std::unique_ptr<StreamDecoder> stream_decoder() const override { return inner_.stream_decoder(); }
  mutable std::atomic<int> encoded{0};

 private:
  const TextCodec& inner_;
};

// Per-request memory bounds: too many messages, too much text, too many tools are refused
// before rendering or tokenization.
TEST(Attack, OversizedRequestsAreRefusedBeforeTokenization) {
  ASSERT_NE(RealText::get().codec, nullptr);
  CountingCodec counting(*RealText::get().codec);
  LiveServer s({}, 4, 16, 1, Text::kReal, &counting);
  auto c = s.client();
  // 3,000 messages: over --max-messages; 100,000 (3.4 MB): over the JSON value count as well.
  for (const int n : {3'000, 100'000}) {
    json many = chat_body();
    for (int i = 0; i < n; ++i) many["messages"].push_back({{"role", "user"}, {"content", "x"}});
    auto res = c.Post("/v1/chat/completions", many.dump(), "application/json");
    expect_error(res, 400, "messages");
    if (n == 3'000) {
      EXPECT_EQ(json::parse(res->body)["error"]["param"], "messages") << res->body;
    }
  }
  expect_error(c.Post("/v1/chat/completions", chat_body(std::string(10u << 20, 'a')).dump(),
                      "application/json"), 413, "content");
  expect_error(c.Post("/v1/completions",
                      json{{"model", kModel}, {"prompt", std::string(10u << 20, 'a')}}.dump(),
                      "application/json"), 413, "prompt");
  json parts = chat_body();
  parts["messages"][0]["content"] = json::array();
  for (int i = 0; i < 3; ++i) parts["messages"][0]["content"].push_back({{"type", "text"}, {"text", std::string(3u << 20, 'b')}});
  expect_error(c.Post("/v1/chat/completions", parts.dump(), "application/json"), 413, "parts");
  json tools = chat_body();
  tools["tools"] = json::array();
  for (int i = 0; i < 1000; ++i)
    tools["tools"].push_back({{"type", "function"}, {"function", {{"name", "f" + std::to_string(i)}}}});
  expect_error(c.Post("/v1/chat/completions", tools.dump(), "application/json"), 400, "tools");
  json ids = {{"model", kModel}, {"prompt", std::vector<int32_t>(5000, 7)}};
  expect_error(c.Post("/v1/completions", ids.dump(), "application/json"), 400, "prompt ids");
  EXPECT_EQ(counting.encoded.load(), 0);
  // A request within the limits is tokenized (once).
  auto res = c.Post("/v1/chat/completions", chat_body().dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(counting.encoded.load(), 1);
}

// Admission comes before tokenization: a full server answers 503 without tokenizing. Before the
// fix a 10 MB prompt was tokenized (seconds of CPU) and then refused.
TEST(Attack, FullServerRefusesBeforeTokenizing) {
  ASSERT_NE(RealText::get().codec, nullptr);
  CountingCodec counting(*RealText::get().codec);
  // One slot and one queue place (limit 2); two requests that generate slowly fill them.
  LiveServer s({}, 1, 1, /*step_ms=*/20, Text::kReal, &counting,
               [](const std::vector<int32_t>&, const GenRequest&) { return std::string(3000, 'z'); });
  json body = chat_body();
  body["max_tokens"] = 3000;
  body["stream"] = true;
  const std::string text = body.dump();
  std::vector<int> held;
  for (int i = 0; i < 2; ++i) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, post_head("/v1/chat/completions",
                                       "Content-Length: " + std::to_string(text.size()) + "\r\n") + text));
    char buf[16] = {0};
    ASSERT_EQ(recv(fd, buf, 12, MSG_WAITALL), 12);  // the stream started: "HTTP/1.1 200"
    ASSERT_EQ(std::string(buf, 12), "HTTP/1.1 200");
    held.push_back(fd);
    // The backend's queue holds one request: let the first one reach its slot before the next.
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (s.backend->stats().running == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_EQ(s.backend->stats().running, 1);
  }
  ASSERT_EQ(counting.encoded.load(), 2);
  const int before = counting.encoded.load();
  auto res = s.client().Post("/v1/chat/completions", chat_body(std::string(1u << 20, 'q')).dump(),
                             "application/json");
  expect_error(res, 503, "full");
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(counting.encoded.load(), before);
  for (int fd : held) close(fd);
}

}  // namespace
}  // namespace flashseek::server::testing
