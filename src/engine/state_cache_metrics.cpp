// Prometheus exposition of the state cache counters (appended to the server's /metrics).
#include <fmt/format.h>

#include "engine/state_cache.h"

namespace flashseek::engine {

namespace {
void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}
}  // namespace

std::string state_cache_metrics(const StateCacheStats& s) {
  std::string out;
  header(out, "flashseek_state_cache_hits_total", "counter", "Prompts restored from a snapshot.");
  out += fmt::format("flashseek_state_cache_hits_total{{tier=\"host\"}} {}\n", s.hits_host);
  out += fmt::format("flashseek_state_cache_hits_total{{tier=\"disk\"}} {}\n", s.hits_disk);
  out += fmt::format("flashseek_state_cache_hits_total{{tier=\"remote\"}} {}\n", s.hits_remote);
  header(out, "flashseek_state_cache_misses_total", "counter", "Prompts with no usable snapshot.");
  out += fmt::format("flashseek_state_cache_misses_total {}\n", s.misses);
  header(out, "flashseek_state_cache_hit_tokens_total", "counter",
         "Prompt tokens restored instead of prefilled, by source.");
  out += fmt::format("flashseek_state_cache_hit_tokens_total{{source=\"local\"}} {}\n",
                     s.hit_tokens_local);
  out += fmt::format("flashseek_state_cache_hit_tokens_total{{source=\"remote\"}} {}\n",
                     s.hit_tokens_remote);
  header(out, "flashseek_state_cache_bytes", "gauge", "Snapshot bytes held, by tier.");
  out += fmt::format("flashseek_state_cache_bytes{{tier=\"host\"}} {}\n", s.host_bytes);
  out += fmt::format("flashseek_state_cache_bytes{{tier=\"disk\"}} {}\n", s.disk_bytes);
  header(out, "flashseek_state_cache_entries", "gauge", "Snapshots held, by tier.");
  out += fmt::format("flashseek_state_cache_entries{{tier=\"host\"}} {}\n", s.host_entries);
  out += fmt::format("flashseek_state_cache_entries{{tier=\"disk\"}} {}\n", s.disk_entries);
  header(out, "flashseek_state_cache_snapshots_total", "counter", "Snapshots stored.");
  out += fmt::format("flashseek_state_cache_snapshots_total {}\n", s.puts);
  header(out, "flashseek_state_cache_evictions_total", "counter", "Snapshots evicted from host memory.");
  out += fmt::format("flashseek_state_cache_evictions_total {}\n", s.evictions);
  header(out, "flashseek_state_cache_disk_evictions_total", "counter",
         "Snapshot files removed to keep the cache directory under --cache-dir-bytes.");
  out += fmt::format("flashseek_state_cache_disk_evictions_total {}\n", s.disk_evictions);
  header(out, "flashseek_state_cache_corrupt_total", "counter",
         "Snapshots that failed verification and were discarded.");
  out += fmt::format("flashseek_state_cache_corrupt_total {}\n", s.corrupt);
  header(out, "flashseek_state_cache_oversize_total", "counter",
         "Snapshot files or blobs refused unread: larger than any snapshot of this model.");
  out += fmt::format("flashseek_state_cache_oversize_total {}\n", s.oversize);
  header(out, "flashseek_state_cache_pending_dropped_total", "counter",
         "Snapshots dropped unstored because the serialisation queue was full.");
  out += fmt::format("flashseek_state_cache_pending_dropped_total {}\n", s.pending_dropped);
  header(out, "flashseek_state_cache_remote_bytes_total", "counter", "Snapshot bytes fetched from peers.");
  out += fmt::format("flashseek_state_cache_remote_bytes_total {}\n", s.remote_bytes);
  header(out, "flashseek_state_cache_remote_seconds_total", "counter", "Time spent fetching from peers.");
  out += fmt::format("flashseek_state_cache_remote_seconds_total {:.6f}\n", s.remote_seconds);
  return out;
}

std::string StateCache::metrics_text() const {
  std::string out = state_cache_metrics(stats());
  RemoteTier* remote = nullptr;
  {
    std::lock_guard lock(mu_);
    remote = remote_;
  }
  if (remote) out += remote->metrics();
  return out;
}

}  // namespace flashseek::engine
