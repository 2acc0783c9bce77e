#include "kvshare/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace flashseek::kvshare {

namespace {
constexpr size_t kHandOverTries = 4;  // peers tried per snapshot on a drain's hand-over
}  // namespace

Cluster::Cluster(engine::StateCache& cache, ClusterOptions options)
    : cache_(cache), options_(std::move(options)) {}

Result<std::unique_ptr<Cluster>> Cluster::start(engine::StateCache& cache, ClusterOptions o) {
  if (o.secret.empty())
    return invalid_argument("--cluster-secret (or FLASHSEEK_CLUSTER_SECRET) is required with --redis");
  FS_ASSIGN_OR_RETURN(const RedisUrl url, parse_redis_url(o.redis_url));
  if (url.tls) FS_RETURN_IF_ERROR(RedisTlsContext::create(o.redis_tls).status());
  if (o.server_id.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    o.server_id = fmt::format("{}-{}", host, getpid());
  }
  if (o.advertise_host.empty()) o.advertise_host = o.kv_host;
  if (o.server_id.size() > 255) return invalid_argument("--server-id: at most 255 bytes");
  std::unique_ptr<Cluster> c(new Cluster(cache, o));
  c->auth_ = {o.secret, o.server_id};
  SnapshotServerOptions so;
  so.auth = c->auth_;
  so.timeout_ms = o.timeout_ms;
  so.handshake_timeout_ms = o.handshake_timeout_ms;
  so.max_peers = o.max_peers;
  so.enable_ucx = ucx_built();
  so.advertise_host = o.advertise_host;  // peers dial it; bound into every handshake
  c->server_ = std::make_unique<SnapshotServer>(cache, std::move(so));
  if (o.transport == Transport::kUcx) {
    auto node = UcxNode::create();
    if (node.ok()) {
      c->ucx_ = std::move(*node);
      c->transport_ = Transport::kUcx;
    } else {
      spdlog::warn("kvshare: {}; fetching over TCP", node.status().message());
    }
  }
  FS_ASSIGN_OR_RETURN(c->kv_port_, c->server_->start(o.kv_host, o.kv_port));
  RegistryOptions ro;
  ro.url = o.redis_url;
  ro.server_id = o.server_id;
  ro.advertise = c->server_->advertise();
  ro.tls = o.redis_tls;
  c->registry_ = std::make_unique<Registry>(ro);
  cache.set_remote(c.get());
  spdlog::info("kvshare: server {} serves snapshots on {} (UCX {}), fetches over {}, registry {}",
               o.server_id, ro.advertise, c->server_->ucx_enabled() ? "on" : "off",
               transport_name(c->transport_),  // the URL's password stays out of the log
               fmt::format("{}://{}:{}", url.tls ? "rediss" : "redis", url.host, url.port));
  return c;
}

Cluster::~Cluster() {
  cache_.set_remote(nullptr);
  server_->stop();
  registry_.reset();
}

std::optional<std::vector<uint8_t>> Cluster::fetch_longest(uint64_t tenant,
                                                           std::span<const uint64_t> hashes) {
  auto loc = registry_->find(hashes);
  if (!loc) return std::nullopt;
  ++fetches_;
  const auto t0 = std::chrono::steady_clock::now();
  Transport used = transport_;
  const PeerAddress peer{loc->address, loc->owner};
  const uint64_t max_bytes = cache_.max_snapshot_bytes();
  auto blob = used == Transport::kUcx
                  ? fetch_snapshot_ucx(peer, auth_, loc->hash, tenant, options_.timeout_ms,
                                       max_bytes, *ucx_)
                  : fetch_snapshot(peer, auth_, loc->hash, tenant, options_.timeout_ms, max_bytes);
  if (!blob.ok() && blob.status().code() == StatusCode::kUnimplemented) {  // peer without UCX
    used = Transport::kTcp;
    blob = fetch_snapshot(peer, auth_, loc->hash, tenant, options_.timeout_ms, max_bytes);
  }
  if (!blob.ok()) {
    switch (blob.status().code()) {
      case StatusCode::kInvalidArgument: ++owner_auth_failures_; break;
      case StatusCode::kParseError: ++bad_mac_; break;
      case StatusCode::kOutOfRange: ++oversize_; break;
      default: break;
    }
  }
  if (blob.ok()) {
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now() - t0).count();
    ++transfers_[int(used)];
    transfer_bytes_[int(used)] += int64_t(blob->size());
    transfer_us_[int(used)] += us;
  } else {
    ++fetch_failures_;
    spdlog::warn("kvshare: fetching {:016x} from {} failed, recomputing: {}", loc->hash,
                 loc->owner, blob.status().message());
    return std::nullopt;
  }
  return std::move(*blob);
}

void Cluster::on_stored(uint64_t hash, uint64_t tenant, int64_t tokens, int64_t bytes) {
  registry_->announce(hash, tenant, tokens, bytes);
}

void Cluster::on_dropped(uint64_t hash) { registry_->withdraw(hash); }

int64_t Cluster::hand_over(size_t n) {
  const auto peers = registry_->peers();
  if (peers.empty()) return 0;
  int64_t done = 0;
  auto peer = peers.begin();
  for (uint64_t hash : cache_.hottest(n)) {
    auto blob = cache_.blob(hash);
    if (!blob) continue;
    // A few peers per snapshot: each try may wait the full timeout, and a drain must end.
    for (size_t tries = 0; tries < std::min<size_t>(peers.size(), kHandOverTries); ++tries) {
      const auto& [id, address] = *peer;
      if (++peer == peers.end()) peer = peers.begin();
      Status st = push_snapshot({address, id}, auth_, *blob, options_.timeout_ms);
      if (st.ok()) {
        ++done;
        break;
      }
      spdlog::warn("kvshare: hand-over of {:016x} to {} failed: {}", hash, id, st.message());
    }
  }
  handed_over_ += done;
  return done;
}

std::string Cluster::metrics() const {
  std::string out;
  auto line = [&](const char* name, const char* type, const char* help, double v) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  line("flashseek_kvshare_registry_up", "gauge", "1 while connected to Redis.",
       registry_->connected() ? 1 : 0);
  line("flashseek_kvshare_events_subscribed", "gauge", "1 while subscribed to fs:events.",
       registry_->subscribed() ? 1 : 0);
  line("flashseek_kvshare_events_total", "counter", "fs:events messages received.",
       double(registry_->events()));
  line("flashseek_kvshare_stale_owners_skipped_total", "counter",
       "Registry candidates skipped because their owner announced the eviction.",
       double(registry_->stale_skipped()));
  line("flashseek_kvshare_remote_view_snapshots", "gauge",
       "Snapshots of live peers known from fs:events since subscribing.",
       double(registry_->view_size()));
  line("flashseek_kvshare_fetches_total", "counter", "Snapshot fetches from peers attempted.",
       double(fetches_));
  line("flashseek_kvshare_recompute_fallbacks_total", "counter",
       "Peer fetches that failed (the prefix was recomputed).", double(fetch_failures_));
  line("flashseek_kvshare_served_total", "counter", "Snapshots sent to peers.",
       double(server_->served()));
  line("flashseek_kvshare_auth_rejected_total", "counter",
       "Peer connections refused: wrong cluster secret.", double(server_->rejected()));
  line("flashseek_kvshare_owner_auth_failures_total", "counter",
       "Fetches refused because the owner failed authentication (wrong secret, wrong id, relay).",
       double(owner_auth_failures_));
  line("flashseek_kvshare_bad_mac_total", "counter",
       "Messages or snapshots that failed their MAC (dropped; the prefix is recomputed).",
       double(bad_mac_ + server_->bad_mac()));
  line("flashseek_kvshare_oversize_total", "counter",
       "Snapshots refused unallocated: larger than this model's largest snapshot.",
       double(oversize_ + server_->oversize()));
  line("flashseek_kvshare_peers_busy_total", "counter",
       "Peer connections closed unserved: the concurrent-peer limit was reached.",
       double(server_->busy()));
  line("flashseek_kvshare_handed_over_total", "counter", "Snapshots pushed to peers on drain.",
       double(handed_over_));
  line("flashseek_kvshare_served_ucx_total", "counter", "Of the snapshots sent, read by peers over UCX.",
       double(server_->served_ucx()));
  auto per_transport = [&](const char* name, const char* help, const std::atomic<int64_t>* v,
                           double scale) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", name, help, name);
    for (Transport t : {Transport::kUcx, Transport::kTcp})
      out += fmt::format("{}{{transport=\"{}\"}} {}\n", name, transport_name(t),
                         double(v[int(t)]) * scale);
  };
  per_transport("flashseek_kvshare_transfers_total", "Snapshots fetched from peers, by transport.",
                transfers_, 1);
  per_transport("flashseek_kvshare_transfer_bytes_total", "Snapshot bytes fetched, by transport.",
                transfer_bytes_, 1);
  per_transport("flashseek_kvshare_transfer_seconds_total",
                "Time of successful fetches (control + data), by transport.", transfer_us_, 1e-6);
  return out;
}

}  // namespace flashseek::kvshare
