// `flashseek serve` options and steps for cross-server snapshot sharing (issue 6), kept out of
// cmd_serve.cpp: --redis / --cluster-secret / --kv-host / --kv-port / --server-id /
// --advertise-host / --drain-snapshots / --kv-transport, the cluster start-up, and the SIGTERM drain.
#pragma once
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/state_cache.h"
#include "kvshare/cluster.h"

namespace flashseek::tools {

struct ClusterCli {
  std::string redis, secret, kv_host, server_id, advertise_host;
  std::string kv_transport;  // ucx | tcp (empty: ucx when built with UCX)
  std::string redis_tls_ca, redis_tls_cert, redis_tls_key;  // rediss:// only
  int kv_port = 0;
  int kv_max_peers = 16, kv_handshake_ms = 1000, kv_timeout_ms = 2000;
  int64_t drain_snapshots = 32;
};

void add_cluster_options(CLI::App* cmd, ClusterCli& c);

// The Redis URL (flag or environment) parses and the cluster secret is set when it is given.
Status check_cluster_options(const ClusterCli& c);

// nullptr (and no error) when no Redis URL is given by flag or environment.
Result<std::unique_ptr<kvshare::Cluster>> start_cluster(engine::StateCache& cache,
                                                        const ClusterCli& c,
                                                        const std::string& http_host);

// After the HTTP listener stopped: waits (bounded) for running requests to finish, stores the
// pending snapshots, and hands the hottest ones to live peers.
void drain(engine::Engine& engine, engine::StateCache& cache, kvshare::Cluster* cluster,
           int64_t n_snapshots);

}  // namespace flashseek::tools
