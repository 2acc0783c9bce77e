// flashseek kv-bench: snapshot transfer throughput between two endpoints on loopback, over UCX
// (one-sided GET of registered memory; UCX_TLS picks the UCX transports) and over TCP, for a
// range of blob sizes. Both ends run in this process (owner: SnapshotServer thread; fetcher:
// the main thread), each GET is verified against the owner's bytes. Issue 6's benchmark note.
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "engine/state_cache.h"
#include "forward/state_io.h"
#include "kvshare/peer.h"
#include "kvshare/ucx.h"
#include "tools/command.h"

namespace flashseek::tools {
namespace {

struct Opts {
  std::vector<double> mib = {1, 4, 16, 64};
  int repeat = 5;
  std::vector<std::string> transports = {"ucx", "tcp"};
};

// A valid snapshot blob of about `bytes` (one layer's ring carries the size).
Result<std::vector<uint8_t>> synthetic_blob(uint64_t fingerprint, uint64_t tenant, size_t bytes) {
  forward::CpuSequenceState st;
  st.len = 2;
  st.ring_size = int64_t(bytes / sizeof(float));
  st.layers.resize(1);
  st.layers[0].ckv.reset(1);
  st.layers[0].ikeys.reset(1);
  st.layers[0].ring.assign(bytes / sizeof(float), 0.5f);
  for (size_t i = 0; i < st.layers[0].ring.size(); i += 1024) st.layers[0].ring[i] = float(i);
  const std::vector<int32_t> tokens = {11, 12};  // < synthetic_geometry's vocabulary
  const uint64_t hash = engine::prefix_hashes(tenant, tokens).back();
  return forward::serialize_snapshot(st, tokens, {fingerprint, tenant, hash, 2, 0});
}

// The geometry of those blobs: one layer whose ring holds `bytes` (one float per slot).
forward::SnapshotGeometry synthetic_geometry(size_t bytes) {
  forward::SnapshotGeometry g;
  g.vocab_size = 16;
  g.max_tokens = 2;
  g.ring_size = int64_t(bytes / sizeof(float));
  g.ring_width = 1;
  g.layers.resize(1);
  g.layers[0].ckv.width = g.layers[0].ikeys.width = 1;
  return g;
}

int fail(const Status& st) {
  std::fprintf(stderr, "flashseek kv-bench: error: %s\n", st.message().c_str());
  return 1;
}

int run(const Opts& o) {
  constexpr uint64_t kFingerprint = 0x6b7662656e6368, kTenant = 1;
  std::vector<kvshare::Transport> transports;
  for (const auto& name : o.transports) {
    auto t = kvshare::parse_transport(name);
    if (!t.ok()) return fail(t.status());
    transports.push_back(*t);
  }
  const char* tls = std::getenv("UCX_TLS");
  std::printf("snapshot transfer on loopback (UCX_TLS=%s), best and median of %d GETs\n",
              tls ? tls : "(unset)", o.repeat);
  std::printf("%10s %6s %12s %12s %12s\n", "size", "via", "best ms", "median ms", "best GB/s");
  for (double mib : o.mib) {
    const size_t bytes = size_t(mib * 1048576.0);
    engine::StateCacheOptions co{kFingerprint, int64_t(bytes) * 2 + (1 << 20), {}, 2};
    co.geometry = synthetic_geometry(bytes);
    auto cache = engine::StateCache::open(std::move(co));
    if (!cache.ok()) return fail(cache.status());
    auto blob = synthetic_blob(kFingerprint, kTenant, bytes);
    if (!blob.ok()) return fail(blob.status());
    const auto head = forward::peek_snapshot_header(*blob);
    const std::vector<uint8_t> want = *blob;
    if (Status st = (*cache)->insert_blob(std::move(*blob)); !st.ok()) return fail(st);
    kvshare::SnapshotServerOptions so;
    so.auth = {"bench", "bench-owner"};
    so.timeout_ms = so.handshake_timeout_ms = 30000;
    kvshare::SnapshotServer server(**cache, std::move(so));
    const kvshare::PeerAuth me{"bench", "bench-fetcher"};
    auto port = server.start("127.0.0.1", 0);
    if (!port.ok()) return fail(port.status());
    const std::string addr = "127.0.0.1:" + std::to_string(*port);
    std::unique_ptr<kvshare::UcxNode> node;
    for (kvshare::Transport t : transports) {
      if (t == kvshare::Transport::kUcx && !node) {
        auto n = kvshare::UcxNode::create();
        if (!n.ok()) return fail(n.status());
        node = std::move(*n);
      }
      std::vector<double> ms;
      for (int i = 0; i < o.repeat; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        auto got = t == kvshare::Transport::kUcx
                       ? kvshare::fetch_snapshot_ucx({addr, "bench-owner"}, me, head->prefix_hash,
                                                     kTenant, 30000, want.size(), *node)
                       : kvshare::fetch_snapshot({addr, "bench-owner"}, me, head->prefix_hash,
                                                 kTenant, 30000, want.size());
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                         .count());
        if (!got.ok()) return fail(got.status());
        if (*got != want) return fail(Status(StatusCode::kInternal, "fetched bytes differ"));
      }
      std::sort(ms.begin(), ms.end());
      std::printf("%7.0f MiB %6s %12.2f %12.2f %12.2f\n", mib, kvshare::transport_name(t), ms[0],
                  ms[ms.size() / 2], double(want.size()) / (ms[0] * 1e-3) / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}

std::function<int()> setup(CLI::App& app) {
  auto* cmd = app.add_subcommand("kv-bench", "snapshot transfer throughput, UCX vs TCP, loopback");
  auto o = std::make_shared<Opts>();
  cmd->add_option("--mib", o->mib, "blob sizes in MiB")->check(CLI::Range(0.001, 4096.0));
  cmd->add_option("--repeat", o->repeat, "GETs per size and transport")
      ->capture_default_str()->check(CLI::Range(1, 1000));
  cmd->add_option("--transports", o->transports, "ucx and/or tcp")
      ->check(CLI::IsMember({"ucx", "tcp"}));
  return [o] { return run(*o); };
}

FS_REGISTER_COMMAND("kv-bench", setup);

}  // namespace
}  // namespace flashseek::tools
