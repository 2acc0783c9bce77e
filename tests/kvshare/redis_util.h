// A throwaway redis-server on a free loopback port for the sharing tests, and small queries.
#pragma once
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "test_util.h"

namespace flashseek::kvtest {

inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

inline bool have_redis() { return std::filesystem::exists("/usr/bin/redis-server"); }

class RedisServer {
 public:
  // password: started with --requirepass (queries authenticate).
  explicit RedisServer(int port, std::string password = {})
      : port_(port), password_(std::move(password)) {
    start();
  }
  ~RedisServer() { stop(); }
  void start() {
    const auto r = flashseek::testing::run_command(
        "/usr/bin/redis-server --port " + std::to_string(port_) +
        " --bind 127.0.0.1 --save '' --appendonly no" +
        (password_.empty() ? std::string() : " --requirepass " + password_) +
        " > /dev/null 2>&1 & echo $!");
    pid_ = std::atoi(r.output.c_str());
    for (int i = 0; i < 100 && !query("PING"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    for (int i = 0; i < 100 && kill(pid_, 0) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pid_ = -1;
  }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  // The string reply of a one-word-argument command, nullopt on error / nil.
  std::optional<std::string> query(const std::string& cmd) const {
    redisContext* c = redisConnect("127.0.0.1", port_);
    if (!c || c->err) {
      if (c) redisFree(c);
      return std::nullopt;
    }
    if (!password_.empty())
      freeReplyObject(redisCommand(c, "AUTH %s", password_.c_str()));
    auto* r = static_cast<redisReply*>(redisCommand(c, cmd.c_str()));
    std::optional<std::string> out;
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) out = r->str;
    if (r) freeReplyObject(r);
    redisFree(c);
    return out;
  }
  // Polls until `cmd` returns `want` (at most ~timeout_ms).
  bool wait_for(const std::string& cmd, const std::string& want, int timeout_ms = 8000) const {
    for (int i = 0; i < timeout_ms / 50; ++i) {
      if (query(cmd) == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  int port_;
  std::string password_;
  int pid_ = -1;
};

}  // namespace flashseek::kvtest
