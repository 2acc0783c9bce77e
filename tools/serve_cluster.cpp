#include "tools/serve_cluster.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include <spdlog/spdlog.h>

namespace flashseek::tools {

namespace {
std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

kvshare::RedisTlsOptions tls_options(const ClusterCli& c) {
  kvshare::RedisTlsOptions o;
  o.ca_file = c.redis_tls_ca;
  o.cert_file = c.redis_tls_cert;
  o.key_file = c.redis_tls_key;
  return o;
}
}  // namespace

void add_cluster_options(CLI::App* cmd, ClusterCli& c) {
  cmd->add_option("--redis", c.redis,
                  "registry for cross-server state sharing, redis://host:port or "
                  "rediss://host:port for TLS (env FLASHSEEK_REDIS_URL or DSUF_REDIS_URL)");
  cmd->add_option("--redis-tls-ca", c.redis_tls_ca,
                  "PEM CA file that signs the Redis server certificate (rediss://; default: the "
                  "system CAs)");
  cmd->add_option("--redis-tls-cert", c.redis_tls_cert,
                  "client certificate (PEM) for Redis mutual TLS (rediss://, with --redis-tls-key)");
  cmd->add_option("--redis-tls-key", c.redis_tls_key,
                  "private key (PEM) of --redis-tls-cert");
  cmd->add_option("--cluster-secret", c.secret,
                  "secret peers must prove to fetch snapshots (env FLASHSEEK_CLUSTER_SECRET)");
  cmd->add_option("--kv-host", c.kv_host, "snapshot endpoint address (default: --host)");
  cmd->add_option("--kv-port", c.kv_port, "snapshot endpoint port (0: any free port)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--server-id", c.server_id, "id in the registry (default: hostname-pid)");
  cmd->add_option("--advertise-host", c.advertise_host,
                  "address peers use to reach the snapshot endpoint (default: --kv-host)");
  cmd->add_option("--kv-transport", c.kv_transport,
                  "how snapshots are fetched from peers: ucx (one-sided GET of registered memory) "
                  "or tcp (default: ucx when built with UCX; set UCX_TLS to pick UCX transports)")
      ->check(CLI::IsMember({"ucx", "tcp"}));
  cmd->add_option("--kv-max-peers", c.kv_max_peers,
                  "peer connections the snapshot endpoint serves at once (more are refused)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-handshake-ms", c.kv_handshake_ms,
                  "a peer must complete the authentication handshake within this")
      ->capture_default_str()->check(CLI::Range(10, 60000));
  cmd->add_option("--kv-timeout-ms", c.kv_timeout_ms,
                  "bound of one snapshot transfer (request + data) after the handshake")
      ->capture_default_str()->check(CLI::Range(10, 600000));
  cmd->add_option("--drain-snapshots", c.drain_snapshots,
                  "hottest snapshots handed to peers on SIGTERM")
      ->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(1) << 20));
}

Status check_cluster_options(const ClusterCli& c) {
  std::string url = !c.redis.empty() ? c.redis : env("FLASHSEEK_REDIS_URL");
  if (url.empty()) url = env("DSUF_REDIS_URL");
  const bool tls_flags =
      !c.redis_tls_ca.empty() || !c.redis_tls_cert.empty() || !c.redis_tls_key.empty();
  if (url.empty()) {
    if (tls_flags) return invalid_argument("--redis-tls-* need a rediss:// --redis URL");
    return {};
  }
  FS_ASSIGN_OR_RETURN(auto parsed, kvshare::parse_redis_url(url));
  if (tls_flags && !parsed.tls)
    return invalid_argument("--redis-tls-* need a rediss:// URL (--redis is redis://, plain TCP)");
  // The CA and client certificate files load now: a bad one is an error before the model loads.
  if (parsed.tls) FS_RETURN_IF_ERROR(kvshare::RedisTlsContext::create(tls_options(c)).status());
  if (c.secret.empty() && env("FLASHSEEK_CLUSTER_SECRET").empty())
    return invalid_argument("--cluster-secret (or FLASHSEEK_CLUSTER_SECRET) is required with --redis");
  return {};
}

Result<std::unique_ptr<kvshare::Cluster>> start_cluster(engine::StateCache& cache,
                                                        const ClusterCli& c,
                                                        const std::string& http_host) {
  kvshare::ClusterOptions o;
  o.redis_url = !c.redis.empty() ? c.redis : env("FLASHSEEK_REDIS_URL");
  if (o.redis_url.empty()) o.redis_url = env("DSUF_REDIS_URL");
  if (o.redis_url.empty()) return std::unique_ptr<kvshare::Cluster>();
  o.secret = !c.secret.empty() ? c.secret : env("FLASHSEEK_CLUSTER_SECRET");
  o.redis_tls = tls_options(c);
  o.server_id = c.server_id;
  o.kv_host = !c.kv_host.empty() ? c.kv_host : (http_host == "0.0.0.0" ? "0.0.0.0" : http_host);
  o.kv_port = c.kv_port;
  o.advertise_host = c.advertise_host;
  o.max_peers = c.kv_max_peers;
  o.handshake_timeout_ms = c.kv_handshake_ms;
  o.timeout_ms = c.kv_timeout_ms;
  if (!c.kv_transport.empty()) {
    FS_ASSIGN_OR_RETURN(o.transport, kvshare::parse_transport(c.kv_transport));
  }
  if (o.advertise_host.empty() && o.kv_host == "0.0.0.0")
    return invalid_argument("--advertise-host is required when the snapshot endpoint listens on "
                            "0.0.0.0 (peers need a reachable address)");
  return kvshare::Cluster::start(cache, std::move(o));
}

void drain(engine::Engine& engine, engine::StateCache& cache, kvshare::Cluster* cluster,
           int64_t n_snapshots) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto s = engine.stats();
    if (s.running == 0 && s.waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  cache.flush();
  if (!cluster || n_snapshots <= 0) return;
  const int64_t n = cluster->hand_over(size_t(n_snapshots));
  spdlog::info("drain: handed {} snapshot(s) to peers", n);
}

}  // namespace flashseek::tools
