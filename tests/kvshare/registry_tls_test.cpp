// The registry over TLS (rediss://, issue 14) against a real TLS redis-server on loopback, with a
// throwaway CA and server certificate made by the openssl CLI: commands and the fs:events
// subscription work over TLS (with AUTH), a certificate from another CA or for another host name
// is refused with a verification error naming the host, a plain client on the TLS port (and a TLS
// client on a plain port) fails within a deadline, mutual TLS presents the client certificate,
// and opening/closing connections many times leaks no pump thread or fd.
#include <dirent.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <functional>
#include <string>
#include <thread>

#include "kvshare/redis_tls.h"
#include "kvshare/registry.h"
#include "redis_util.h"
#include "serve_util.h"
#include "test_util.h"

namespace flashseek::kvtest {
namespace {

using flashseek::testing::run_command;

bool eventually(const std::function<bool()>& f, int timeout_ms = 8000) {
  for (int i = 0; i < timeout_ms / 50; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return f();
}

bool have_tools() {
  return have_redis() && std::filesystem::exists("/usr/bin/openssl");
}

// Two CAs; a server certificate for IP 127.0.0.1 / DNS redis.test signed by the first; a client
// certificate signed by the first (for mutual TLS).
class Certs {
 public:
  Certs() {
    const std::string d = dir_.path().string();
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::string cmd = "cd " + d + " && set -e" +
                      " && openssl req -x509" + ec + " -keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca" +
                      " && openssl req -x509" + ec + " -keyout ca2.key -out ca2.crt -days 2 -subj /CN=other-ca" +
                      " && printf 'subjectAltName=IP:127.0.0.1,DNS:redis.test\\n' > server.ext" +
                      " && openssl req" + ec + " -keyout server.key -out server.csr -subj /CN=redis.test" +
                      " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
                      " -out server.crt -days 2 -extfile server.ext" +
                      " && openssl req" + ec + " -keyout client.key -out client.crt.csr -subj /CN=client" +
                      " && openssl x509 -req -in client.crt.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
                      " -out client.crt -days 2";
    const auto r = run_command(cmd);
    ok_ = r.exit_code == 0;
    output_ = r.output;
  }
  bool ok() const { return ok_; }
  const std::string& output() const { return output_; }
  std::string path(const std::string& name) const { return (dir_.path() / name).string(); }

 private:
  flashseek::testing::TempDir dir_;
  bool ok_ = false;
  std::string output_;
};

// redis-server with only a TLS port (plain port 0), password "pw".
class TlsRedis {
 public:
  TlsRedis(const Certs& certs, bool auth_clients) : certs_(certs), port_(free_port()) {
    const auto r = run_command(
        "/usr/bin/redis-server --port 0 --tls-port " + std::to_string(port_) +
        " --bind 127.0.0.1 --save '' --appendonly no --requirepass pw" +
        " --tls-cert-file " + certs.path("server.crt") + " --tls-key-file " +
        certs.path("server.key") + " --tls-ca-cert-file " + certs.path("ca.crt") +
        " --tls-auth-clients " + (auth_clients ? "yes" : "no") + " > /dev/null 2>&1 & echo $!");
    pid_ = std::atoi(r.output.c_str());
    tls_ = *kvshare::RedisTlsContext::create(options(auth_clients));
    eventually([&] { return query("PING").has_value(); });
  }
  ~TlsRedis() { stop(); }
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    for (int i = 0; i < 100 && kill(pid_, 0) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pid_ = -1;
  }
  kvshare::RedisTlsOptions options(bool client_cert) const {
    kvshare::RedisTlsOptions o;
    o.ca_file = certs_.path("ca.crt");
    if (client_cert) {
      o.cert_file = certs_.path("client.crt");
      o.key_file = certs_.path("client.key");
    }
    return o;
  }
  int port() const { return port_; }
  std::string where(const std::string& host = "127.0.0.1") const {
    return host + ":" + std::to_string(port_);
  }
  const kvshare::RedisTlsContext* tls() const { return tls_.get(); }
  // A string / status reply over TLS (authenticated), nullopt on error or nil.
  std::optional<std::string> query(const std::string& cmd) const {
    std::string error;
    redisContext* c = kvshare::redis_connect("127.0.0.1", port_, tls_.get(), 1000, error);
    if (!c) return std::nullopt;
    freeReplyObject(redisCommand(c, "AUTH pw"));
    auto* r = static_cast<redisReply*>(redisCommand(c, cmd.c_str()));
    std::optional<std::string> out;
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) out = r->str;
    if (r) freeReplyObject(r);
    kvshare::redis_free(c);
    return out;
  }

 private:
  const Certs& certs_;
  int port_;
  int pid_ = -1;
  std::shared_ptr<kvshare::RedisTlsContext> tls_;
};

kvshare::RegistryOptions registry_options(const std::string& url, const std::string& id,
                                          kvshare::RedisTlsOptions tls) {
  kvshare::RegistryOptions o;
  o.url = url;
  o.server_id = id;
  o.advertise = "127.0.0.1:1";
  o.tls = std::move(tls);
  return o;
}

size_t count_dir(const char* path) {
  size_t n = 0;
  if (DIR* d = opendir(path)) {
    while (readdir(d)) ++n;
    closedir(d);
  }
  return n;
}

// One set of certificates for the whole suite (made on first use, removed at exit).
const Certs& shared_certs() {
  static const Certs certs;
  return certs;
}

#define NEED_TOOLS()                                                      \
  if (!have_tools()) FS_SKIP_UNLESS_CI("needs redis-server and openssl"); \
  const Certs& certs = shared_certs();                                    \
  ASSERT_TRUE(certs.ok()) << certs.output();

TEST(RegistryTls, CommandsAndEventsWorkOverTlsWithAuth) {
  NEED_TOOLS();
  TlsRedis redis(certs, false);
  ASSERT_EQ(redis.query("PING"), "PONG");
  const auto tls = redis.options(false);
  kvshare::Registry a(registry_options("rediss://:pw@" + redis.where(), "a", tls));
  kvshare::Registry b(registry_options("rediss://:pw@" + redis.where(), "b", tls));
  kvshare::Registry wrong(registry_options("rediss://:nope@" + redis.where(), "w", tls));
  ASSERT_TRUE(eventually([&] { return b.subscribed(); }));
  a.announce(0x1234, 7, 5, 10);
  // The owner record is in Redis (read back over TLS) and the event reached b's subscription.
  EXPECT_TRUE(eventually([&] { return redis.query("HGET fs:snap:0000000000001234 owner") == "a"; }));
  EXPECT_TRUE(eventually([&] { return b.view_size() == 1 && b.events() >= 1; }));
  EXPECT_TRUE(eventually([&] { return redis.query("GET fs:server:a") == "127.0.0.1:1"; }));
  const uint64_t want[] = {0x1234};
  std::optional<kvshare::SnapshotLocation> loc;
  EXPECT_TRUE(eventually([&] { return (loc = b.find(want)).has_value(); }));
  if (loc) {
    EXPECT_EQ(loc->owner, "a");
    EXPECT_EQ(loc->address, "127.0.0.1:1");
  }
  EXPECT_TRUE(a.connected());
  // AUTH runs over TLS too: the wrong password never connects.
  EXPECT_TRUE(eventually([&] { return wrong.last_error().find("AUTH") != std::string::npos; }))
      << wrong.last_error();
  EXPECT_FALSE(wrong.connected());
  EXPECT_FALSE(wrong.subscribed());
}

TEST(RegistryTls, CertificateFromAnotherCaIsRefused) {
  NEED_TOOLS();
  TlsRedis redis(certs, false);
  auto tls = redis.options(false);
  tls.ca_file = certs.path("ca2.crt");
  kvshare::Registry r(registry_options("rediss://:pw@" + redis.where(), "x", tls));
  EXPECT_TRUE(eventually([&] {
    const std::string e = r.last_error();
    return e.find("verification failed") != std::string::npos &&
           e.find("127.0.0.1") != std::string::npos;
  })) << r.last_error();
  EXPECT_FALSE(r.connected());
  EXPECT_FALSE(r.subscribed());
}

TEST(RegistryTls, HostNameMismatchIsRefused) {
  NEED_TOOLS();
  TlsRedis redis(certs, false);
  // The certificate names 127.0.0.1 and redis.test, not localhost (which reaches the same port).
  kvshare::Registry r(
      registry_options("rediss://:pw@" + redis.where("localhost"), "x", redis.options(false)));
  EXPECT_TRUE(eventually([&] {
    const std::string e = r.last_error();
    return e.find("verification failed") != std::string::npos &&
           e.find("localhost") != std::string::npos && e.find("hostname mismatch") != std::string::npos;
  })) << r.last_error();
  EXPECT_FALSE(r.connected());
}

TEST(RegistryTls, PlainAndTlsMismatchFailWithinDeadline) {
  NEED_TOOLS();
  TlsRedis redis(certs, false);
  kvshare::Registry plain(registry_options("redis://:pw@" + redis.where(), "p", {}));
  EXPECT_TRUE(eventually([&] { return !plain.last_error().empty(); })) << "no error reported";
  EXPECT_FALSE(plain.connected());
  // The other way round: rediss:// against a plain Redis fails the handshake.
  RedisServer plain_redis(free_port());
  auto options = redis.options(false);
  options.handshake_timeout_ms = 300;
  kvshare::Registry tls(registry_options(
      "rediss://127.0.0.1:" + std::to_string(plain_redis.port()), "t", options));
  EXPECT_TRUE(eventually([&] {
    return tls.last_error().find("TLS handshake") != std::string::npos;
  })) << tls.last_error();
  EXPECT_FALSE(tls.connected());
}

TEST(RegistryTls, MutualTlsSendsTheClientCertificate) {
  NEED_TOOLS();
  TlsRedis redis(certs, true);
  ASSERT_EQ(redis.query("PING"), "PONG");
  kvshare::Registry with(registry_options("rediss://:pw@" + redis.where(), "m", redis.options(true)));
  kvshare::Registry without(
      registry_options("rediss://:pw@" + redis.where(), "n", redis.options(false)));
  EXPECT_TRUE(eventually([&] { return with.connected() && with.subscribed(); }))
      << with.last_error();
  EXPECT_TRUE(eventually([&] { return !without.last_error().empty(); }));
  EXPECT_FALSE(without.connected());
}

TEST(RegistryTls, OpenCloseManyTimesLeaksNoThreadOrFd) {
  NEED_TOOLS();
  TlsRedis redis(certs, false);
  ASSERT_EQ(redis.query("PING"), "PONG");
  const size_t fds = count_dir("/proc/self/fd"), threads = count_dir("/proc/self/task");
  for (int i = 0; i < 40; ++i) {
    std::string error;
    redisContext* c = kvshare::redis_connect("127.0.0.1", redis.port(), redis.tls(), 1000, error);
    ASSERT_NE(c, nullptr) << error;
    auto* r = static_cast<redisReply*>(redisCommand(c, "AUTH pw"));
    ASSERT_NE(r, nullptr);
    freeReplyObject(r);
    kvshare::redis_free(c);
  }
  for (int i = 0; i < 5; ++i) {  // whole registries: command and subscription connections
    kvshare::Registry reg(registry_options("rediss://:pw@" + redis.where(), "r", redis.options(false)));
    ASSERT_TRUE(eventually([&] { return reg.connected() && reg.subscribed(); })) << reg.last_error();
  }
  EXPECT_EQ(kvshare::redis_tls_pumps_alive(), 0);
  EXPECT_EQ(count_dir("/proc/self/fd"), fds);
  EXPECT_EQ(count_dir("/proc/self/task"), threads);
  // The server going away ends a live connection's pump; the command fails within its timeout.
  std::string error;
  redisContext* c = kvshare::redis_connect("127.0.0.1", redis.port(), redis.tls(), 1000, error);
  ASSERT_NE(c, nullptr) << error;
  redis.stop();
  auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
  EXPECT_EQ(r, nullptr);
  if (r) freeReplyObject(r);
  EXPECT_NE(c->err, 0);
  kvshare::redis_free(c);
  EXPECT_EQ(kvshare::redis_tls_pumps_alive(), 0);
  EXPECT_EQ(count_dir("/proc/self/fd"), fds);
}

TEST(RegistryTls, BadTlsFilesAreClearErrors) {
  auto missing = kvshare::RedisTlsContext::create({"/nonexistent/ca.pem", "", "", 1000});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/nonexistent/ca.pem"), std::string::npos);
  auto half = kvshare::RedisTlsContext::create({"", "/tmp/c.pem", "", 1000});
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("--redis-tls-key"), std::string::npos);
}

// serve accepts rediss:// (the URL check passes and the missing checkpoint is the error), and a
// CA file that does not load is refused before anything is loaded.
TEST(RegistryTls, ServeAcceptsTlsUrls) {
  const std::string bin = flashseek::testing::flashseek_bin();
  const auto ok = run_command(bin + " serve --ckpt /nonexistent --redis rediss://cache:6380 "
                                    "--cluster-secret s");
  EXPECT_NE(ok.exit_code, 0);
  EXPECT_EQ(ok.output.find("rediss://"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("config.json"), std::string::npos) << ok.output;
  const auto bad_ca = run_command(bin + " serve --ckpt /nonexistent --redis rediss://cache:6380 "
                                        "--cluster-secret s --redis-tls-ca /nonexistent/ca.pem");
  EXPECT_NE(bad_ca.exit_code, 0);
  EXPECT_NE(bad_ca.output.find("--redis-tls-ca /nonexistent/ca.pem"), std::string::npos)
      << bad_ca.output;
  EXPECT_EQ(bad_ca.output.find("config.json"), std::string::npos) << bad_ca.output;
  const auto plain = run_command(bin + " serve --ckpt /nonexistent --redis redis://cache:6380 "
                                       "--cluster-secret s --redis-tls-ca /tmp/ca.pem");
  EXPECT_NE(plain.exit_code, 0);
  EXPECT_NE(plain.output.find("rediss://"), std::string::npos) << plain.output;
}

// End to end: `flashseek serve --redis rediss://... --redis-tls-ca` (a tiny model) registers its
// heartbeat over TLS and reports the registry connected.
TEST(RegistryTls, ServeJoinsTheClusterOverTls) {
  NEED_TOOLS();
  if (!have_tokenizer()) FS_SKIP_UNLESS_CI("needs the tokenizer (scripts/fetch_tokenizer.sh)");
  TlsRedis redis(certs, false);
  ft::TempDir dir;
  const std::string ckpt = (dir.path() / "tiny").string();
  const auto made = run_command(ft::flashseek_bin() + " make-tiny --config tiny-v41 --seed 2 --out " + ckpt);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  Serve s(ckpt, dir.path() / "serve.log",
          "--redis rediss://:pw@" + redis.where() + " --redis-tls-ca " + certs.path("ca.crt") +
              " --cluster-secret s3cret --server-id tls-serve --kv-transport tcp");
  ASSERT_TRUE(s.wait_ready()) << s.log_text();
  EXPECT_TRUE(eventually([&] { return redis.query("GET fs:server:tls-serve").has_value(); }))
      << s.log_text();
  EXPECT_EQ(s.log_text().find(":pw@"), std::string::npos) << "the password is logged";
}

}  // namespace
}  // namespace flashseek::kvtest
