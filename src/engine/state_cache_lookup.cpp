// StateCache: lookup (local tiers, then the remote tier), verification of blobs from disk or
// peers, and the request wiring.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "engine/state_cache.h"
#include "forward/state_io.h"

namespace flashseek::engine {

namespace {

// Decodes and checks that the blob is the snapshot of exactly tokens[0, n) for this tenant.
Result<std::unique_ptr<forward::CpuSequenceState>> verify(
    std::span<const uint8_t> blob, const StateCacheOptions& o, uint64_t tenant,
    std::span<const int32_t> tokens, const forward::PageSource* source = nullptr) {
  FS_ASSIGN_OR_RETURN(auto d,
                      forward::deserialize_snapshot(blob, o.fingerprint, o.geometry, source));
  if (d.header.tenant != tenant) return invalid_argument("snapshot: belongs to another tenant");
  if (d.tokens.size() > tokens.size() ||
      !std::equal(d.tokens.begin(), d.tokens.end(), tokens.begin()))
    return invalid_argument("snapshot: token ids differ from the prompt prefix");
  return std::move(d.state);
}

}  // namespace

std::optional<CacheHit> StateCache::try_pending(uint64_t tenant, std::span<const int32_t> tokens,
                                                uint64_t hash, int64_t n) {
  std::lock_guard lock(mu_);
  auto it = pending_.find(hash);
  if (it == pending_.end()) return std::nullopt;
  const Pending& p = *it->second;
  if (p.tenant != tenant || int64_t(p.tokens.size()) != n ||
      !std::equal(p.tokens.begin(), p.tokens.end(), tokens.begin()))
    return std::nullopt;
  ++stats_.hits_host;
  stats_.hit_tokens_local += n;
  return CacheHit{p.state, n, CacheTier::kHost};
}

std::optional<CacheHit> StateCache::try_local(uint64_t tenant, std::span<const int32_t> tokens,
                                              uint64_t hash, int64_t n) {
  std::shared_ptr<const std::vector<uint8_t>> blob;
  std::shared_ptr<const std::unordered_map<uint64_t, forward::PagePtr>> pages;  // thin blob's
  bool from_disk = false;
  {
    std::lock_guard lock(mu_);
    auto it = index_.find(hash);
    if (it == index_.end() || it->second->tenant != tenant || it->second->n_tokens != n)
      return std::nullopt;
    blob = it->second->blob;
    from_disk = !blob;
    if (blob && !it->second->page_keys.empty()) pages = pages_of(*it->second);
  }
  if (from_disk) {
    // Bounded read: the file's size is checked against the largest snapshot of this model first.
    std::vector<uint8_t> data;
    std::ifstream in(path_of(hash), std::ios::binary | std::ios::ate);
    const std::streamoff size = in ? std::streamoff(in.tellg()) : -1;
    if (size >= 0 && uint64_t(size) <= max_bytes_) {
      data.resize(size_t(size));
      in.seekg(0);
      in.read(reinterpret_cast<char*>(data.data()), size);
      if (in.gcount() != size) data.clear();
    } else if (size >= 0) {
      spdlog::warn("state cache: discarding snapshot file {:016x}: {} B exceeds {} B", hash, size,
                   max_bytes_);
      std::lock_guard lock(mu_);
      ++stats_.oversize;
      drop(hash, /*count_corrupt=*/false);
      return std::nullopt;
    }
    blob = std::make_shared<const std::vector<uint8_t>>(std::move(data));
  }
  const forward::PageSource source = [&](uint64_t key) -> const forward::PagedRows::Page* {
    auto it = pages->find(key);
    return it == pages->end() ? nullptr : it->second.get();
  };
  auto state = verify(*blob, options_, tenant, tokens.first(size_t(n)), pages ? &source : nullptr);
  std::lock_guard lock(mu_);
  if (!state.ok()) {
    spdlog::warn("state cache: discarding snapshot {:016x}: {}", hash, state.status().message());
    drop(hash, /*count_corrupt=*/true);
    return std::nullopt;
  }
  auto it = index_.find(hash);
  if (it != index_.end()) {
    Entry& e = *it->second;
    touch_disk(e);
    if (e.blob) {
      touch(e);
    } else if (options_.host_bytes > 0) {  // promote the disk hit into the host tier
      hold_host(e, hash, blob, {});
      evict_host();
    }
  }
  ++(from_disk ? stats_.hits_disk : stats_.hits_host);
  stats_.hit_tokens_local += n;
  return CacheHit{std::move(*state), n, from_disk ? CacheTier::kDisk : CacheTier::kHost};
}

std::optional<CacheHit> StateCache::try_remote(uint64_t tenant, std::span<const int32_t> tokens,
                                               std::span<const uint64_t> hashes,
                                               int64_t longer_than) {
  RemoteTier* remote = nullptr;
  {
    std::lock_guard lock(mu_);
    remote = remote_;
  }
  const int64_t max_len = int64_t(hashes.size()) - 1;
  if (!remote || max_len <= longer_than || max_len < options_.min_tokens) return std::nullopt;
  // Longest first, down to just above the best local candidate.
  std::vector<uint64_t> wanted;
  for (int64_t n = max_len; n > longer_than && n >= options_.min_tokens; --n)
    wanted.push_back(hashes[size_t(n)]);
  const auto t0 = std::chrono::steady_clock::now();
  auto blob = remote->fetch_longest(tenant, wanted);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!blob) return std::nullopt;
  // Only prefixes of tokens[0, max_len] were asked for: a peer that answers with a longer state
  // (e.g. the whole prompt) is refused like any other mismatch.
  auto state = blob->size() <= max_bytes_
                   ? verify(*blob, options_, tenant, tokens.first(size_t(max_len)))
                   : Result<std::unique_ptr<forward::CpuSequenceState>>(
                         out_of_range("snapshot: {} B exceeds {} B", blob->size(), max_bytes_));
  if (!state.ok()) {
    spdlog::warn("state cache: remote snapshot rejected: {}", state.status().message());
    std::lock_guard lock(mu_);
    ++stats_.corrupt;
    return std::nullopt;
  }
  const int64_t n = (*state)->len;
  if (n <= longer_than || n > max_len ||
      hashes[size_t(n)] != forward::peek_snapshot_header(*blob)->prefix_hash)
    return std::nullopt;
  {
    std::lock_guard lock(mu_);
    ++stats_.hits_remote;
    stats_.hit_tokens_remote += n;
    stats_.remote_bytes += int64_t(blob->size());
    stats_.remote_seconds += secs;
  }
  std::shared_ptr<const forward::SequenceState> out = std::move(*state);
  // Ownership moves here: stored by the worker (off the request path); in host memory the
  // snapshot joins the page store, so later snapshots of this conversation share its pages.
  {
    const uint64_t hash = hashes[size_t(n)];
    std::lock_guard lock(mu_);
    if (!stopping_ && !pending_.count(hash))
      enqueue(hash, std::make_shared<const Pending>(
                        Pending{tenant, hash, {tokens.begin(), tokens.begin() + n}, out,
                                std::make_shared<const std::vector<uint8_t>>(std::move(*blob))}));
  }
  return CacheHit{std::move(out), n, CacheTier::kRemote};
}

std::optional<CacheHit> StateCache::lookup(uint64_t tenant, std::span<const int32_t> tokens,
                                           int64_t max_len) {
  max_len = std::min<int64_t>(max_len, int64_t(tokens.size()));
  if (max_len < options_.min_tokens) {
    std::lock_guard lock(mu_);
    ++stats_.misses;
    return std::nullopt;
  }
  const std::vector<uint64_t> hashes = prefix_hashes(tenant, tokens.first(size_t(max_len)));
  std::vector<int64_t> candidates;  // local prefix lengths with an index entry, longest first
  {
    std::lock_guard lock(mu_);
    for (int64_t n = max_len; n >= options_.min_tokens; --n)
      if (index_.count(hashes[size_t(n)]) || pending_.count(hashes[size_t(n)]))
        candidates.push_back(n);
  }
  const int64_t best_local = candidates.empty() ? 0 : candidates.front();
  if (auto hit = try_remote(tenant, tokens, hashes, best_local)) return hit;
  for (int64_t n : candidates) {
    if (auto hit = try_pending(tenant, tokens, hashes[size_t(n)], n)) return hit;
    if (auto hit = try_local(tenant, tokens, hashes[size_t(n)], n)) return hit;
  }
  std::lock_guard lock(mu_);
  ++stats_.misses;
  return std::nullopt;
}

Status StateCache::insert_blob(std::vector<uint8_t> blob) {
  if (blob.size() > max_bytes_)
    return out_of_range("snapshot: {} B exceeds the largest snapshot of this model ({} B)",
                        blob.size(), max_bytes_);
  FS_ASSIGN_OR_RETURN(auto d, forward::deserialize_snapshot(blob, options_.fingerprint,
                                                            options_.geometry));
  if (prefix_hashes(d.header.tenant, d.tokens).back() != d.header.prefix_hash)
    return invalid_argument("snapshot: key {:016x} does not match its tokens",
                            d.header.prefix_hash);
  std::shared_ptr<const forward::SequenceState> state = std::move(d.state);
  serialize_and_store(Pending{d.header.tenant, d.header.prefix_hash, std::move(d.tokens), state},
                      std::move(blob));
  return {};
}

int64_t attach_state_cache(StateCache& cache, uint64_t tenant, Request& request) {
  int64_t cached = 0;
  if (request.prompt_logprobs < 0 && !request.prefix) {
    // The last prompt token must run through the model (its logits pick the first token).
    const int64_t max_len = int64_t(request.prompt.size()) - 1;
    if (auto hit = cache.lookup(tenant, request.prompt, max_len)) {
      request.prefix = std::move(hit->state);
      cached = hit->n_tokens;
    }
  }
  request.snapshot_every = cache.options().snapshot_every;
  request.on_snapshot = [&cache, tenant](std::span<const int32_t> tokens,
                                         const forward::SequenceState& state) {
    cache.put(tenant, tokens, state);
  };
  return cached;
}

}  // namespace flashseek::engine
