// Concurrency and robustness of the HTTP layer on the fake backend: a client disconnect cancels its
// request and frees the slot, 256 concurrent streams all succeed with the same text as run alone.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "server_fixture.h"

namespace flashseek::server::testing {
namespace {

using json = nlohmann::json;

// Opens a raw connection, sends one HTTP request and returns the socket (caller closes it).
int send_raw(int port, const std::string& path, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const std::string req = "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  EXPECT_EQ(write(fd, req.data(), req.size()), ssize_t(req.size()));
  return fd;
}

json long_request(bool stream) {
  return {{"model", "deepseek-v4.1-flash"}, {"max_tokens", 2000}, {"stream", stream},
          {"messages", json::array({{{"role", "user"}, {"content", "LONG"}}})}};
}

// Polls `done` every millisecond until it holds or `limit` passes; returns whether it held.
template <class F>
bool wait_until(F done, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Disconnect mid-request: the server notices the closed connection by itself (nobody cancels for
// it), cancels the request while it is still generating and frees its slot. The reply is 2000
// tokens at 60 ms a step (2 minutes), far longer than the deadlines below, so a request that
// is merely left to finish cannot pass; how many steps the detection takes is timing, not
// asserted here.
void expect_disconnect_cancels_and_frees_slot(LiveServer& s, bool stream) {
  const int fd = send_raw(s.port, "/v1/chat/completions", long_request(stream).dump());
  ASSERT_GE(fd, 0);
  // Wait until it is running and (when streaming) the first bytes arrived.
  const bool started = wait_until([&] { return s.backend->stats().running > 0; }, std::chrono::seconds(30));
  if (!started) close(fd);
  ASSERT_TRUE(started) << "the request never started running (30 s)";
  if (stream) {
    char buf[256];
    ASSERT_GT(read(fd, buf, sizeof(buf)), 0);
  }
  close(fd);
  EXPECT_TRUE(wait_until([&] { return s.backend->stats().running == 0; }, std::chrono::seconds(30)))
      << "the slot of a disconnected " << (stream ? "stream" : "non-stream") << " request was not freed in 30 s";
  EXPECT_EQ(s.backend->cancelled(), 1) << "the request must be cancelled, not left to run";
  // The metrics endpoint shows the free slot and no request in flight.
  EXPECT_EQ(s.settled_metric("flashseek_requests_in_flight", 0), 0);
  EXPECT_EQ(s.metric("flashseek_batch_size"), 0);
}

TEST(Stress, DisconnectMidStreamCancelsAndFreesSlot) {
  LiveServer s({}, 2, 4, /*step_ms=*/60);
  expect_disconnect_cancels_and_frees_slot(s, true);
}

TEST(Stress, DisconnectDuringNonStreamedRequestCancelsAndFreesSlot) {
  LiveServer s({}, 2, 4, /*step_ms=*/60);
  expect_disconnect_cancels_and_frees_slot(s, false);
}

std::string stream_text(LiveServer& s, const json& body, int& status) {
  httplib::Client c("127.0.0.1", s.port);
  c.set_read_timeout(60, 0);
  std::string raw;
  auto res = c.Post("/v1/chat/completions", httplib::Headers{}, body.dump(), "application/json");
  status = res ? res->status : -1;
  if (!res) return {};
  bool done = false;
  std::string text;
  for (const json& ev : sse_events(res->body, done))
    if (!ev["choices"].empty() && ev["choices"][0]["delta"].contains("content"))
      text += ev["choices"][0]["delta"]["content"].get<std::string>();
  if (!done) status = -2;
  return text;
}

TEST(Stress, ConcurrentStreamsAllSucceedAndMatchSingleRuns) {
  constexpr int kClients = 256;
  LiveServer s({}, /*max_batch=*/64, /*max_queue=*/256, /*step_ms=*/1);
  auto body = [](int i) {
    return json{{"model", "deepseek-v4.1-flash"}, {"temperature", 0}, {"stream", true},
                {"messages", json::array({{{"role", "user"}, {"content", "req " + std::to_string(i)}}})}};
  };
  std::vector<std::string> got(kClients);
  std::vector<int> status(kClients, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] { got[size_t(i)] = stream_text(s, body(i), status[size_t(i)]); });
  for (auto& t : clients) t.join();
  int errors = 0;
  for (int i = 0; i < kClients; ++i) errors += status[size_t(i)] != 200;
  EXPECT_EQ(errors, 0);
  // The same requests one at a time give the same text (greedy).
  for (int i = 0; i < kClients; i += 17) {
    int st = 0;
    EXPECT_EQ(stream_text(s, body(i), st), got[size_t(i)]) << i;
    EXPECT_FALSE(got[size_t(i)].empty());
  }
  EXPECT_EQ(s.settled_metric("flashseek_requests_in_flight", 0), 0);
}

}  // namespace
}  // namespace flashseek::server::testing
