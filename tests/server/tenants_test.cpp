// Tenants (server/tenants.h): the key-file syntax and its bounds (errors name the line, never the
// key), key -> tenant authentication, the cache scope of a request for every --cache-scope, the
// scope the HTTP layer hands the backend per key / `user`, and `flashseek serve` refusing a bad
// key file or FLASHSEEK_API_KEYS before loading anything.
#include "server/tenants.h"

#include <gtest/gtest.h>
#include <httplib.h>
#include <xxhash.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "fakes.h"
#include "server/http_server.h"
#include "test_util.h"

namespace flashseek::server::testing {
namespace {

namespace ft = flashseek::testing;
using json = nlohmann::json;

const std::string kSecret = "sk-very-secret-123";

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

TEST(Tenants, KeyFileSyntax) {
  const auto e = parse_api_keys(
      "# keys for the team\n\n   ka1   alice  \r\nka2\talice\nkb\n  # indented comment\n\t\n",
      "keys", false);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  ASSERT_EQ(e->size(), 3u);
  EXPECT_EQ((*e)[0].key, "ka1");
  EXPECT_EQ((*e)[0].tenant, "alice");
  EXPECT_EQ((*e)[1].key, "ka2");
  EXPECT_EQ((*e)[1].tenant, "alice");
  EXPECT_EQ((*e)[2].key, "kb");
  EXPECT_EQ((*e)[2].tenant, "kb");  // TENANT defaults to the key
  // The environment form: commas also end an entry.
  const auto env = parse_api_keys("ka1 alice,ka2 alice\nkb,,", "FLASHSEEK_API_KEYS", true);
  ASSERT_TRUE(env.ok()) << env.status().to_string();
  ASSERT_EQ(env->size(), 3u);
  EXPECT_EQ((*env)[1].tenant, "alice");
  EXPECT_EQ((*env)[2].tenant, "kb");
  EXPECT_TRUE(parse_api_keys("", "keys", false)->empty());
}

TEST(Tenants, MalformedKeyTextIsRejectedWithoutEchoingTheKey) {
  struct Case {
    std::string text, where;
  };
  const std::vector<Case> cases = {
      {"ok\n" + kSecret + " alice extra\n", "keys:2"},                // three fields
      {"ok\n" + kSecret + "\x01 alice\n", "keys:2"},                  // control byte
      {kSecret + "\xc3\xa9 alice\n", "keys:1"},                       // non-ASCII
      {kSecret + " " + std::string(kMaxApiKeyLineBytes, 'a'), "keys:1"},  // line too long
      {kSecret + std::string(kMaxApiKeyBytes, 'k'), "keys:1"},        // key too long
      {kSecret + " " + std::string(kMaxApiKeyBytes + 1, 't'), "keys:1"},  // tenant too long
  };
  for (const Case& c : cases) {
    const auto r = parse_api_keys(c.text, "keys", false);
    ASSERT_FALSE(r.ok()) << c.where;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.where + ":"), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find(kSecret), std::string::npos) << r.status().message();
  }
  std::string many;
  for (size_t i = 0; i <= kMaxApiKeys; ++i) many += "k" + std::to_string(i) + "\n";
  EXPECT_FALSE(parse_api_keys(many, "keys", false).ok());
  EXPECT_FALSE(parse_api_keys(std::string(kMaxApiKeyTextBytes + 1, '#'), "keys", false).ok());
}

TEST(Tenants, KeyFileReading) {
  ft::TempDir dir;
  const auto good = dir.path() / "good", empty = dir.path() / "empty", big = dir.path() / "big";
  write_file(good, "ka1 alice\nkb\n");
  write_file(empty, "# only comments\n\n");
  write_file(big, std::string(kMaxApiKeyTextBytes + 1, '#'));
  const auto r = read_api_key_file(good.string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), 2u);
  for (const auto& bad : {empty, big, dir.path() / "missing", dir.path()}) {
    const auto e = read_api_key_file(bad.string());
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.status().message().find(bad.string()), std::string::npos) << e.status().message();
  }
}

TEST(Tenants, KeysMapToTenants) {
  Tenants t;
  ASSERT_TRUE(t.add_keys({{"ka1", "alice"}, {"ka2", "alice"}, {"kb", "bob"}}).ok());
  ASSERT_TRUE(t.add_key("kc", "").ok());        // --api-key: its own tenant
  EXPECT_TRUE(t.add_key("ka1", "alice").ok());  // repeated for the same tenant: no-op
  EXPECT_FALSE(t.add_key("ka1", "bob").ok());   // one key, two tenants: ambiguous
  EXPECT_FALSE(t.add_key("", "x").ok());
  EXPECT_EQ(t.key_count(), 4u);
  EXPECT_EQ(t.tenant_count(), 3u);
  ASSERT_TRUE(t.keys_required());
  const auto a1 = t.authenticate("Bearer ka1"), a2 = t.authenticate("bearer ka2");
  const auto b = t.authenticate("Bearer kb"), c = t.authenticate("Bearer kc");
  ASSERT_TRUE(a1 && a2 && b && c);
  EXPECT_EQ(a1->tenant, tenant_of("alice"));
  EXPECT_EQ(a2->tenant, a1->tenant);
  EXPECT_EQ(b->tenant, tenant_of("bob"));
  EXPECT_NE(b->tenant, a1->tenant);
  // A lone --api-key keeps the tenant id earlier versions derived from it, so an existing
  // --cache-dir still hits.
  EXPECT_EQ(c->tenant, XXH64("kc", 2, 0x666c617368736b));
  for (const char* wrong : {"", "ka1", "Bearer", "Bearer ", "Bearer ka", "Bearer ka1 ",
                            "Bearer ka1x", "Basic ka1", "Bearer  ka1"})
    EXPECT_FALSE(t.authenticate(wrong)) << wrong;
  EXPECT_FALSE(t.authenticate("Bearer " + std::string(kMaxApiKeyBytes + 1, 'k')));
  // Without keys everyone is let in, with no tenant.
  const auto anon = Tenants().authenticate("Bearer whatever");
  ASSERT_TRUE(anon);
  EXPECT_FALSE(anon->tenant);
}

TEST(Tenants, RequestScopeForEveryMode) {
  const Caller alice{tenant_of("alice")}, bob{tenant_of("bob")}, anonymous{};
  Tenants t;
  // tenant (default): per tenant; without keys every request is isolated.
  EXPECT_EQ(t.cache_scope(), CacheScope::kTenant);
  EXPECT_EQ(t.request_scope(alice, ""), tenant_of("alice"));
  EXPECT_EQ(t.request_scope(alice, "u1"), tenant_of("alice"));  // `user` plays no part
  EXPECT_NE(t.request_scope(alice, ""), t.request_scope(bob, ""));
  EXPECT_FALSE(t.request_scope(anonymous, ""));
  EXPECT_FALSE(t.request_scope(anonymous, "u1"));
  // user: per (tenant, user); no user: isolated.
  t.set_cache_scope(CacheScope::kUser);
  EXPECT_FALSE(t.request_scope(alice, ""));
  EXPECT_FALSE(t.request_scope(anonymous, ""));
  ASSERT_TRUE(t.request_scope(alice, "u1") && t.request_scope(anonymous, "u1"));
  EXPECT_EQ(t.request_scope(alice, "u1"), t.request_scope(alice, "u1"));
  EXPECT_NE(t.request_scope(alice, "u1"), t.request_scope(alice, "u2"));
  EXPECT_NE(t.request_scope(alice, "u1"), t.request_scope(bob, "u1"));
  EXPECT_NE(t.request_scope(alice, "u1"), t.request_scope(anonymous, "u1"));
  EXPECT_NE(t.request_scope(alice, "u1"), tenant_of("alice"));
  // request: never reused.
  t.set_cache_scope(CacheScope::kRequest);
  EXPECT_FALSE(t.request_scope(alice, "u1"));
  EXPECT_FALSE(t.request_scope(anonymous, ""));
  // shared: one scope for everybody.
  t.set_cache_scope(CacheScope::kShared);
  EXPECT_EQ(t.request_scope(alice, ""), kSharedScope);
  EXPECT_EQ(t.request_scope(bob, "u2"), kSharedScope);
  EXPECT_EQ(t.request_scope(anonymous, ""), kSharedScope);
  for (const char* name : {"tenant", "user", "request", "shared"})
    EXPECT_STREQ(cache_scope_name(*parse_cache_scope(name)), name);
  EXPECT_FALSE(parse_cache_scope("global").ok());
}

// An HttpServer on the fake backend that records the cache scope of every request it submits.
struct ScopeServer {
  FakeCodec codec;
  FakeChat chat;
  std::mutex mu;
  std::vector<std::optional<uint64_t>> scopes;
  std::unique_ptr<FakeBackend> backend;
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  int port = 0;

  explicit ScopeServer(ServerOptions opts) {
    backend = std::make_unique<FakeBackend>(
        4, 16, 1, [this](const std::vector<int32_t>& prompt, const GenRequest& req) {
          std::lock_guard<std::mutex> lock(mu);
          scopes.push_back(req.tenant);
          return default_script(prompt, req);
        });
    opts.host = "127.0.0.1";
    opts.port = 0;
    server = std::make_unique<HttpServer>(ServerDeps{backend.get(), &codec, &chat}, opts);
    auto bound = server->bind();
    EXPECT_TRUE(bound.ok());
    port = bound.ok() ? *bound : 0;
    thread = std::thread([this] { server->run(); });
  }
  ~ScopeServer() {
    server->stop();
    thread.join();
  }
  // Posts a completion with `key` / `user`; returns the HTTP status and the recorded scope.
  std::pair<int, std::optional<uint64_t>> post(const std::string& key, const std::string& user) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(30, 0);
    if (!key.empty()) c.set_bearer_token_auth(key);
    json body = {{"model", "deepseek-v4.1-flash"}, {"prompt", "hello"}, {"max_tokens", 2}};
    if (!user.empty()) body["user"] = user;
    const size_t before = n_scopes();
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    if (!res) return {-1, std::nullopt};
    std::lock_guard<std::mutex> lock(mu);
    if (scopes.size() != before + 1) return {res->status, 0xdeadull};  // not exactly one submit
    return {res->status, scopes.back()};
  }
  size_t n_scopes() {
    std::lock_guard<std::mutex> lock(mu);
    return scopes.size();
  }
};

ServerOptions with_keys(CacheScope scope) {
  ServerOptions o;
  EXPECT_TRUE(o.tenants.add_keys({{"ka1", "alice"}, {"ka2", "alice"}, {"kb", "bob"}}).ok());
  o.tenants.set_cache_scope(scope);
  return o;
}

TEST(TenantsHttp, KeysOfOneTenantShareAScopeOtherTenantsNever) {
  ScopeServer s(with_keys(CacheScope::kTenant));
  const auto a1 = s.post("ka1", ""), a2 = s.post("ka2", "x"), b = s.post("kb", "");
  ASSERT_EQ(a1.first, 200);
  ASSERT_EQ(a2.first, 200);
  ASSERT_EQ(b.first, 200);
  EXPECT_EQ(a1.second, tenant_of("alice"));
  EXPECT_EQ(a2.second, tenant_of("alice"));
  EXPECT_EQ(b.second, tenant_of("bob"));
  const size_t n = s.n_scopes();
  EXPECT_EQ(s.post("kz", "").first, 401);
  EXPECT_EQ(s.post("", "").first, 401);
  EXPECT_EQ(s.n_scopes(), n);  // nothing submitted for a rejected key
}

TEST(TenantsHttp, NoKeysIsolatesUnlessOptedIn) {
  {
    ScopeServer s(ServerOptions{});  // default: tenant scope, no keys
    for (const std::string user : {"", "u1"}) {
      const auto r = s.post("", user);
      ASSERT_EQ(r.first, 200);
      EXPECT_FALSE(r.second) << "an anonymous request must be isolated";
    }
    EXPECT_EQ(s.post("any-key", "").first, 200);  // no keys configured: any header is fine
  }
  {
    ServerOptions o;
    o.tenants.set_cache_scope(CacheScope::kShared);
    ScopeServer s(o);
    EXPECT_EQ(s.post("", "").second, kSharedScope);
    EXPECT_EQ(s.post("", "u1").second, kSharedScope);
  }
  {
    ServerOptions o;
    o.tenants.set_cache_scope(CacheScope::kUser);
    ScopeServer s(o);
    const auto u1 = s.post("", "u1"), u1_again = s.post("", "u1"), u2 = s.post("", "u2");
    ASSERT_TRUE(u1.second && u2.second);
    EXPECT_EQ(u1.second, u1_again.second);
    EXPECT_NE(u1.second, u2.second);
    EXPECT_FALSE(s.post("", "").second);
  }
}

TEST(TenantsHttp, UserScopeStaysInsideTheTenant) {
  ScopeServer s(with_keys(CacheScope::kUser));
  const auto a1 = s.post("ka1", "u1"), a2 = s.post("ka2", "u1"), b = s.post("kb", "u1");
  ASSERT_TRUE(a1.second && a2.second && b.second);
  EXPECT_EQ(a1.second, a2.second);
  EXPECT_NE(a1.second, b.second);
  EXPECT_NE(a1.second, s.post("ka1", "u2").second);
  EXPECT_FALSE(s.post("ka1", "").second);
}

TEST(TenantsHttp, LegacyApiKeyOptionIsItsOwnTenant) {
  ServerOptions o;
  o.api_key = "sekrit";
  ScopeServer s(o);
  EXPECT_EQ(s.post("sekrit", "").second, tenant_of("sekrit"));
  EXPECT_EQ(s.post("other", "").first, 401);
  // A key that cannot be accepted must not leave the server open: bind() refuses to start.
  ServerOptions bad;
  bad.api_key = std::string(kMaxApiKeyBytes + 1, 'k');
  bad.host = "127.0.0.1";
  bad.port = 0;
  FakeBackend backend(1, 1, 1);
  FakeCodec codec;
  FakeChat chat;
  HttpServer server(ServerDeps{&backend, &codec, &chat}, bad);
  EXPECT_FALSE(server.bind().ok());
}

TEST(TenantsCli, BadKeysFailBeforeLoading) {
  ft::TempDir dir;
  const auto bad = dir.path() / "keys.txt";
  write_file(bad, "ka1 alice\n" + kSecret + " alice extra\n");
  // --ckpt does not exist: the keys are checked first, so this error is about them.
  const std::string serve = ft::flashseek_bin() + " serve --ckpt '" + (dir.path() / "none").string() +
                            "' --port 0 ";
  auto r = ft::run_command(serve + "--api-key-file '" + bad.string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("keys.txt:2"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(kSecret), std::string::npos) << r.output;
  r = ft::run_command(serve + "--api-key-file '" + (dir.path() / "missing").string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing"), std::string::npos) << r.output;
  r = ft::run_command("FLASHSEEK_API_KEYS='ka1 alice,x y z' " + serve);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("FLASHSEEK_API_KEYS:2"), std::string::npos) << r.output;
  write_file(bad, "ka1 alice\nka1 bob\n");  // one key, two tenants
  r = ft::run_command(serve + "--api-key-file '" + bad.string() + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("two different tenants"), std::string::npos) << r.output;
  r = ft::run_command(serve + "--shared-cache --cache-scope tenant");
  EXPECT_NE(r.exit_code, 0);
}

}  // namespace
}  // namespace flashseek::server::testing
