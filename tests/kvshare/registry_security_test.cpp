// The Redis registry against a protected or hostile Redis: user:password in the URL is sent as
// AUTH (a wrong password never connects), and malformed replies — on the fs:events subscription
// or to registry commands — are type-checked and ignored, never dereferenced (before, a push
// whose first element was not a string aborted the server). TLS (rediss://): registry_tls_test.cpp.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kvshare/registry.h"
#include "redis_util.h"

namespace flashseek::kvtest {
namespace {

bool eventually(const std::function<bool()>& f, int timeout_ms = 8000) {
  for (int i = 0; i < timeout_ms / 50; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return f();
}

TEST(RegistryAuth, PasswordAndUserPasswordAreSentAsAuth) {
  if (!have_redis()) GTEST_SKIP() << "needs redis-server";
  RedisServer redis(free_port(), "s3cr%t");
  const std::string where = "127.0.0.1:" + std::to_string(redis.port());
  kvshare::Registry pw({"redis://:s3cr%25t@" + where, "pw", "127.0.0.1:1"});
  kvshare::Registry user({"redis://default:s3cr%25t@" + where, "user", "127.0.0.1:2"});
  kvshare::Registry wrong({"redis://:nope@" + where, "wrong", "127.0.0.1:3"});
  kvshare::Registry none({"redis://" + where, "none", "127.0.0.1:4"});
  pw.announce(1, 1, 5, 10);
  user.announce(2, 1, 5, 10);
  wrong.announce(3, 1, 5, 10);
  none.announce(4, 1, 5, 10);
  EXPECT_TRUE(redis.wait_for("HGET fs:snap:0000000000000001 owner", "pw"));
  EXPECT_TRUE(redis.wait_for("HGET fs:snap:0000000000000002 owner", "user"));
  EXPECT_TRUE(eventually([&] { return pw.subscribed() && user.subscribed(); }));
  // By now the others had the same time to connect: they never passed AUTH.
  EXPECT_FALSE(wrong.connected());
  EXPECT_FALSE(none.connected());
  EXPECT_FALSE(wrong.subscribed());
  EXPECT_FALSE(redis.query("HGET fs:snap:0000000000000003 owner"));
  EXPECT_FALSE(redis.query("HGET fs:snap:0000000000000004 owner"));
}

// A tiny fake Redis. kMalformed: answers the subscription with malformed pushes (then one valid
// event) and every other command with replies of unexpected types. kScanFlood: a SCAN that never
// ends (cursor "1"), 500 new server keys per round, each key's GET a valid address.
class FakeRedis {
 public:
  enum class Mode { kMalformed, kScanFlood };
  explicit FakeRedis(Mode mode = Mode::kMalformed) : mode_(mode) {
    lfd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(lfd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(lfd_, 8);
    socklen_t len = sizeof(a);
    getsockname(lfd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeRedis() {
    stop_ = true;
    thread_.join();
    for (int fd : conns_) ::close(fd);
    ::close(lfd_);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  int64_t scans() const { return scans_; }
  int64_t gets() const { return gets_; }

 private:
  struct Conn {
    int fd;
    std::string in;
  };
  // Complete RESP commands at the front of `in` (arrays of bulk strings); removes them.
  static std::vector<std::vector<std::string>> commands(std::string& in) {
    std::vector<std::vector<std::string>> out;
    while (true) {
      size_t pos = 0;
      auto line = [&](std::string& l) {
        const size_t e = in.find("\r\n", pos);
        if (e == std::string::npos) return false;
        l = in.substr(pos, e - pos);
        pos = e + 2;
        return true;
      };
      std::string l;
      if (!line(l) || l.empty() || l[0] != '*') return out;
      const int n = std::atoi(l.c_str() + 1);
      std::vector<std::string> cmd;
      for (int i = 0; i < n; ++i) {
        if (!line(l) || l.empty() || l[0] != '$') return out;
        const size_t len = size_t(std::atoi(l.c_str() + 1));
        if (in.size() < pos + len + 2) return out;
        cmd.push_back(in.substr(pos, len));
        pos += len + 2;
      }
      in.erase(0, pos);
      out.push_back(std::move(cmd));
    }
  }
  static void say(int fd, const std::string& s) { ::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }
  static std::string bulk(const std::string& s) {
    return "$" + std::to_string(s.size()) + "\r\n" + s + "\r\n";
  }
  void answer(int fd, const std::vector<std::string>& cmd) {
    const std::string& name = cmd.empty() ? std::string() : cmd[0];
    if (mode_ == Mode::kScanFlood) {
      if (name == "SUBSCRIBE") {
        say(fd, "*3\r\n" + bulk("subscribe") + bulk("fs:events") + ":1\r\n");
      } else if (name == "SCAN") {
        std::string keys;
        for (int i = 0; i < 500; ++i) keys += bulk("fs:server:s" + std::to_string(scans_ * 500 + i));
        ++scans_;
        say(fd, "*2\r\n" + bulk("1") + "*500\r\n" + keys);
      } else if (name == "GET") {
        ++gets_;
        say(fd, bulk("10.0.0.1:7000"));
      } else if (name == "HGET") {
        say(fd, "$-1\r\n");
      } else {
        say(fd, "+OK\r\n");
      }
      return;
    }
    if (name == "SUBSCRIBE") {
      say(fd, "*3\r\n" + bulk("subscribe") + bulk("fs:events") + ":1\r\n");
      say(fd, "*3\r\n:1\r\n" + bulk("fs:events") + bulk("own 0000000000000009 evil"));  // int kind
      say(fd, "*2\r\n" + bulk("message") + bulk("fs:events"));                          // short
      say(fd, "*3\r\n" + bulk("message") + bulk("fs:events") + "*-1\r\n");              // nil body
      say(fd, "*3\r\n" + bulk("message") + bulk("fs:events") + ":42\r\n");              // int body
      say(fd, "*3\r\n" + bulk("message") + bulk("fs:events") + bulk("own 0000000000000001 peerX"));
    } else if (name == "HGET") {
      say(fd, "*2\r\n:1\r\n:2\r\n");  // an array where a string is expected
    } else if (name == "GET") {
      say(fd, ":5\r\n");
    } else if (name == "SCAN") {
      say(fd, "*2\r\n:0\r\n*1\r\n:7\r\n");  // cursor and keys of the wrong types
    } else {
      say(fd, "+OK\r\n");
    }
  }
  void loop() {
    std::vector<Conn> conns;
    while (!stop_) {
      std::vector<pollfd> p{{lfd_, POLLIN, 0}};
      for (const Conn& c : conns) p.push_back({c.fd, POLLIN, 0});
      if (::poll(p.data(), p.size(), 50) <= 0) continue;
      if (p[0].revents & POLLIN) {
        const int fd = ::accept(lfd_, nullptr, nullptr);
        if (fd >= 0) {
          conns.push_back({fd, {}});
          conns_.push_back(fd);
        }
      }
      for (size_t i = 1; i < p.size(); ++i) {
        if (!(p[i].revents & POLLIN)) continue;
        char buf[4096];
        const ssize_t n = ::recv(p[i].fd, buf, sizeof(buf), 0);
        if (n <= 0) continue;
        Conn& c = conns[i - 1];
        c.in.append(buf, size_t(n));
        for (const auto& cmd : commands(c.in)) answer(c.fd, cmd);
      }
    }
  }
  const Mode mode_;
  int lfd_ = -1, port_ = 0;
  std::atomic<int64_t> scans_{0}, gets_{0};
  std::atomic<bool> stop_{false};
  std::vector<int> conns_;
  std::thread thread_;
};

TEST(RegistryHostileRedis, MalformedRepliesAreIgnoredNotDereferenced) {
  FakeRedis fake;
  kvshare::Registry r({fake.url(), "me", "127.0.0.1:1"});
  // Only the one well-formed event counts; the malformed pushes before it are skipped.
  ASSERT_TRUE(eventually([&] { return r.events() >= 1; }));
  EXPECT_EQ(r.events(), 1);
  EXPECT_EQ(r.view_size(), 1u);
  r.announce(5, 1, 3, 10);
  const uint64_t hashes[] = {1, 2};
  EXPECT_FALSE(r.find(hashes));   // owners come back as arrays: no candidate
  EXPECT_TRUE(r.peers().empty()); // SCAN reply of the wrong shape: nothing
  EXPECT_TRUE(r.connected());
}

// A Redis listing server keys without end: peers() stops at Registry::kMaxPeers keys (before,
// 10,000 SCAN rounds of keys and then one GET per key: millions of round trips under the lock
// that find() waits on).
TEST(RegistryHostileRedis, EndlessServerListStopsAtMaxPeers) {
  FakeRedis fake(FakeRedis::Mode::kScanFlood);
  kvshare::Registry r({fake.url(), "me", "127.0.0.1:1"});
  ASSERT_TRUE(eventually([&] { return r.connected(); }));
  const auto peers = r.peers();
  EXPECT_EQ(peers.size(), kvshare::Registry::kMaxPeers);
  EXPECT_EQ(fake.gets(), int64_t(kvshare::Registry::kMaxPeers));
  EXPECT_EQ(fake.scans(), int64_t((kvshare::Registry::kMaxPeers + 499) / 500));
  for (const auto& [id, address] : peers) {
    EXPECT_EQ(id.rfind("s", 0), 0u);
    EXPECT_EQ(address, "10.0.0.1:7000");
  }
}

}  // namespace
}  // namespace flashseek::kvtest
