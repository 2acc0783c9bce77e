#include "engine/state_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <spdlog/spdlog.h>

#include "forward/state_io.h"

namespace flashseek::engine {

namespace fs = std::filesystem;

uint64_t chain_start(uint64_t tenant) { return XXH64(&tenant, sizeof(tenant), 0x66737374617465); }
uint64_t chain_next(uint64_t h, int32_t token) { return XXH64(&token, sizeof(token), h); }

std::vector<uint64_t> prefix_hashes(uint64_t tenant, std::span<const int32_t> tokens) {
  std::vector<uint64_t> h(tokens.size() + 1);
  h[0] = chain_start(tenant);
  for (size_t i = 0; i < tokens.size(); ++i) h[i + 1] = chain_next(h[i], tokens[i]);
  return h;
}


namespace {

// Reads the first `prefix` bytes of a file (its header), or with prefix = 0 the whole file,
// which then must not exceed `max_size` (checked before anything is allocated).
Result<std::vector<uint8_t>> read_file(const fs::path& p, size_t prefix, uint64_t max_size = 0) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return io_error("state cache: cannot open {}", p.string());
  std::error_code ec;
  const uint64_t file_size = fs::file_size(p, ec);
  if (ec) return io_error("state cache: cannot stat {}", p.string());
  if (prefix == 0 && file_size > max_size)
    return out_of_range("state cache: {} is {} B, a snapshot of this model is at most {} B",
                        p.string(), file_size, max_size);
  const size_t size = prefix > 0 ? size_t(std::min<uint64_t>(file_size, prefix)) : size_t(file_size);
  std::vector<uint8_t> buf(size);
  in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(size));
  if (size_t(in.gcount()) != size) return io_error("state cache: short read of {}", p.string());
  return buf;
}

Status write_file_atomic(const fs::path& p, const std::vector<uint8_t>& data) {
  const fs::path tmp = p.string() + ".tmp";
  std::error_code ec;
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
    out.close();
    written = bool(out);
  }
  // A failed write (disk full, I/O error) or rename leaves no partial .tmp file behind.
  if (!written) {
    fs::remove(tmp, ec);
    return io_error("state cache: cannot write {}", tmp.string());
  }
  fs::rename(tmp, p, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    return io_error("state cache: cannot rename {}: {}", tmp.string(), why);
  }
  return {};
}

}  // namespace

StateCache::StateCache(StateCacheOptions options)
    : options_(std::move(options)), max_bytes_(forward::max_snapshot_bytes(options_.geometry)) {}

Result<std::unique_ptr<StateCache>> StateCache::open(StateCacheOptions options) {
  if (options.host_bytes < 0)
    return invalid_argument("state cache: host_bytes must be >= 0 (got {})", options.host_bytes);
  if (options.dir_bytes < 0)
    return invalid_argument("state cache: dir_bytes must be >= 0 (got {})", options.dir_bytes);
  if (options.min_tokens < 1)
    return invalid_argument("state cache: min_tokens must be >= 1 (got {})", options.min_tokens);
  if (options.geometry.layers.empty() || options.geometry.max_tokens < 1)
    return invalid_argument("state cache: the model's snapshot geometry is required");
  if (options.max_pending < 1)
    return invalid_argument("state cache: max_pending must be >= 1 (got {})", options.max_pending);
  std::unique_ptr<StateCache> c(new StateCache(std::move(options)));
  if (!c->options_.dir.empty()) FS_RETURN_IF_ERROR(c->scan_dir());
  c->thread_ = std::thread([p = c.get()] { p->worker(); });
  return c;
}

StateCache::~StateCache() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string StateCache::path_of(uint64_t hash) const {
  return (fs::path(options_.dir) / fmt::format("{:016x}.fss", hash)).string();
}

Status StateCache::scan_dir() {
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  if (ec) return io_error("--cache-dir {}: {}", options_.dir, ec.message());
  std::vector<std::pair<fs::file_time_type, uint64_t>> by_age;
  for (const auto& e : fs::directory_iterator(options_.dir, ec)) {
    const fs::path& p = e.path();
    if (p.extension() == ".tmp") {  // a write interrupted by a crash
      fs::remove(p, ec);
      continue;
    }
    if (p.extension() != ".fss") continue;
    const auto mtime = fs::last_write_time(p, ec);
    auto head = read_file(p, forward::kSnapshotHeaderBytes);
    const uint64_t size = fs::file_size(p, ec);
    if (head.ok() && !ec && size > max_bytes_) {
      spdlog::warn("state cache: removing {}: {} B exceeds the largest snapshot of this model ({} B)",
                   p.string(), size, max_bytes_);
      fs::remove(p, ec);
      ++stats_.oversize;
      continue;
    }
    auto h = head.ok() ? forward::peek_snapshot_header(*head) : Result<forward::SnapshotHeader>(head.status());
    if (!h.ok() || p.filename().string() != fmt::format("{:016x}.fss", h->prefix_hash)) {
      spdlog::warn("state cache: removing unreadable snapshot {}", p.string());
      fs::remove(p, ec);
      ++stats_.corrupt;
      continue;
    }
    if (h->fingerprint != options_.fingerprint) continue;  // another model's snapshot: left alone
    auto entry = std::make_unique<Entry>();
    entry->tenant = h->tenant;
    entry->n_tokens = h->n_tokens;
    entry->bytes = int64_t(fs::file_size(p, ec));
    entry->on_disk = true;
    ++stats_.disk_entries;
    stats_.disk_bytes += entry->bytes;
    index_[h->prefix_hash] = std::move(entry);
    by_age.emplace_back(mtime, h->prefix_hash);
  }
  if (ec) return io_error("--cache-dir {}: {}", options_.dir, ec.message());
  // Disk LRU order from the files' modification times (newest first), then the budget.
  std::sort(by_age.begin(), by_age.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [t, hash] : by_age) {
    disk_lru_.push_back(hash);
    index_.at(hash)->disk_it = std::prev(disk_lru_.end());
  }
  evict_disk();
  return {};
}

void StateCache::set_remote(RemoteTier* remote) {
  struct Held { uint64_t hash, tenant; int64_t tokens, bytes; };
  std::vector<Held> held;
  {
    std::lock_guard lock(mu_);
    remote_ = remote;
    if (remote)
      for (const auto& [hash, e] : index_) held.push_back({hash, e->tenant, e->n_tokens, e->bytes});
  }
  for (const Held& h : held) remote->on_stored(h.hash, h.tenant, h.tokens, h.bytes);
}

StateCacheStats StateCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void StateCache::put(uint64_t tenant, std::span<const int32_t> tokens,
                     const forward::SequenceState& state) {
  if (int64_t(tokens.size()) < options_.min_tokens) return;
  if (options_.host_bytes == 0 && options_.dir.empty()) return;
  const uint64_t hash = prefix_hashes(tenant, tokens).back();
  auto queued = [&] { return index_.count(hash) > 0 || pending_.count(hash) > 0; };
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queued()) return;
  }
  auto copy = state.clone();  // outside the lock: a long state takes a while to copy
  std::lock_guard lock(mu_);
  if (stopping_ || queued()) return;
  enqueue(hash, std::make_shared<const Pending>(Pending{
                    tenant, hash, std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(copy)}));
}

void StateCache::enqueue(uint64_t hash, std::shared_ptr<const Pending> p) {
  // Bounded: when serialisation falls behind (slow disk), the oldest queued snapshots are the
  // least likely to be wanted again; each holds a whole state clone in memory.
  while (int64_t(queue_.size()) >= options_.max_pending) {
    pending_.erase(queue_.front());
    queue_.pop_front();
    ++stats_.pending_dropped;
  }
  pending_[hash] = std::move(p);
  queue_.push_back(hash);
  cv_.notify_all();
}

void StateCache::flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

namespace {

// Page-store key: contents hashed with the tenant as seed (pages are never shared across tenants).
uint64_t page_key(uint64_t tenant, const forward::PagedRows::Page& p) {
  return XXH64(p.data.data(), p.data.size() * sizeof(float), tenant ^ 0x7061676573ull);
}

}  // namespace

void StateCache::worker() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    const std::shared_ptr<const Pending> p = pending_.at(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    serialize_and_store(*p, p->full ? *p->full : std::vector<uint8_t>{});
    lock.lock();
    pending_.erase(p->hash);  // indexed now (or dropped): lookups go through the tiers
    busy_ = false;
    cv_.notify_all();
  }
}

void StateCache::serialize_and_store(const Pending& p, std::vector<uint8_t> full) {
  const int64_t n = int64_t(p.tokens.size());
  const forward::SnapshotHeader h{options_.fingerprint, p.tenant, p.hash, n, 0};
  // Host tier: a thin blob whose sealed pages are references into the page store.
  std::vector<uint8_t> thin;
  PageList pages;
  int64_t ref_extra = 0;  // bytes the references save against the self-contained blob
  if (options_.host_bytes > 0) {
    const forward::PageSink sink = [&](const forward::PagePtr& page) -> std::optional<uint64_t> {
      const uint64_t key = page_key(p.tenant, *page);
      pages.emplace_back(key, page);
      ref_extra += int64_t(page->data.size() * sizeof(float)) - 8;
      return key;
    };
    auto blob = forward::serialize_snapshot(*p.state, p.tokens, h, &sink);
    if (!blob.ok()) {
      spdlog::warn("state cache: snapshot not stored: {}", blob.status().message());
      return;
    }
    thin = std::move(*blob);
    // A key already held for different contents (a hash collision) cannot be shared: this
    // snapshot then stays self-contained in memory.
    std::lock_guard lock(mu_);
    for (const auto& [key, page] : pages) {
      auto it = pages_.find(key);
      if (it != pages_.end() && it->second.page != page && it->second.page->data != page->data) {
        spdlog::warn("state cache: page key collision {:016x}; snapshot kept unshared", key);
        thin.clear();
        pages.clear();
        break;
      }
    }
  }
  if (full.empty() && (!options_.dir.empty() || thin.empty())) {
    auto blob = forward::serialize_snapshot(*p.state, p.tokens, h);
    if (!blob.ok()) {
      spdlog::warn("state cache: snapshot not stored: {}", blob.status().message());
      return;
    }
    full = std::move(*blob);
  }
  const int64_t bytes = full.empty() ? int64_t(thin.size()) + ref_extra : int64_t(full.size());
  store(std::move(full), std::move(thin), pages, p.hash, p.tenant, n, bytes);
}

void StateCache::store(std::vector<uint8_t> full, std::vector<uint8_t> thin, const PageList& pages,
                       uint64_t hash, uint64_t tenant, int64_t n_tokens, int64_t bytes) {
  bool on_disk = false;
  {
    std::lock_guard lock(mu_);  // a stored copy of this key goes first (its file too)
    if (index_.count(hash)) drop(hash, false);
  }
  if (!options_.dir.empty() && !full.empty()) {
    Status st = write_file_atomic(path_of(hash), full);
    if (st.ok()) on_disk = true;
    else spdlog::warn("{}", st.message());
  }
  if (!on_disk && options_.host_bytes == 0) return;  // no tier can hold it
  RemoteTier* remote = nullptr;
  {
    std::lock_guard lock(mu_);
    if (index_.count(hash)) drop(hash, false);
    auto e = std::make_unique<Entry>();
    e->tenant = tenant;
    e->n_tokens = n_tokens;
    e->bytes = bytes;
    e->on_disk = on_disk;
    if (on_disk) {
      ++stats_.disk_entries;
      stats_.disk_bytes += bytes;
      disk_lru_.push_front(hash);
      e->disk_it = disk_lru_.begin();
    }
    Entry& ref = *e;
    index_[hash] = std::move(e);
    if (options_.host_bytes > 0) {
      const bool use_thin = !thin.empty();
      hold_host(ref, hash,
                std::make_shared<const std::vector<uint8_t>>(std::move(use_thin ? thin : full)),
                use_thin ? pages : PageList{});
    }
    ++stats_.puts;
    evict_host();
    evict_disk();
    if (index_.count(hash)) remote = remote_;
  }
  if (remote) remote->on_stored(hash, tenant, n_tokens, bytes);
}

void StateCache::hold_host(Entry& e, uint64_t hash,
                           std::shared_ptr<const std::vector<uint8_t>> blob,
                           const PageList& pages) {
  e.host_bytes = int64_t(blob->size());
  e.blob = std::move(blob);
  lru_.push_front(hash);
  e.lru_it = lru_.begin();
  ++stats_.host_entries;
  stats_.host_bytes += e.host_bytes;
  e.page_keys.clear();
  for (const auto& [key, page] : pages) {
    StoredPage& sp = pages_[key];
    if (sp.refs++ == 0) {
      sp.page = page;
      const int64_t b = int64_t(page->data.size() * sizeof(float));
      ++stats_.host_pages;
      stats_.host_page_bytes += b;
      stats_.host_bytes += b;
    }
    e.page_keys.push_back(key);
  }
}

void StateCache::release_host(Entry& e) {
  if (!e.blob) return;
  lru_.erase(e.lru_it);
  e.blob.reset();
  --stats_.host_entries;
  stats_.host_bytes -= e.host_bytes;
  e.host_bytes = 0;
  for (uint64_t key : e.page_keys) {
    auto it = pages_.find(key);
    if (it == pages_.end() || --it->second.refs > 0) continue;
    const int64_t b = int64_t(it->second.page->data.size() * sizeof(float));
    --stats_.host_pages;
    stats_.host_page_bytes -= b;
    stats_.host_bytes -= b;
    pages_.erase(it);
  }
  e.page_keys.clear();
}

std::shared_ptr<const std::unordered_map<uint64_t, forward::PagePtr>> StateCache::pages_of(
    const Entry& e) const {
  auto out = std::make_shared<std::unordered_map<uint64_t, forward::PagePtr>>();
  for (uint64_t key : e.page_keys)
    if (auto it = pages_.find(key); it != pages_.end()) (*out)[key] = it->second.page;
  return out;
}

void StateCache::touch(Entry& e) {
  lru_.splice(lru_.begin(), lru_, e.lru_it);
}

void StateCache::evict_host() {
  while (stats_.host_bytes > options_.host_bytes && !lru_.empty()) {
    const uint64_t hash = lru_.back();
    Entry& e = *index_.at(hash);
    release_host(e);
    ++stats_.evictions;
    if (!e.on_disk) {
      index_.erase(hash);
      if (remote_) remote_->on_dropped(hash);
    }
  }
}

void StateCache::touch_disk(Entry& e) {
  if (!e.on_disk) return;
  disk_lru_.splice(disk_lru_.begin(), disk_lru_, e.disk_it);
  // The file's mtime carries the recency across restarts (scan_dir orders by it).
  std::error_code ec;
  fs::last_write_time(path_of(*e.disk_it), fs::file_time_type::clock::now(), ec);
}

void StateCache::evict_disk() {
  if (options_.dir_bytes <= 0) return;
  while (stats_.disk_bytes > options_.dir_bytes && !disk_lru_.empty()) {
    const uint64_t hash = disk_lru_.back();
    Entry& e = *index_.at(hash);
    disk_lru_.pop_back();
    std::error_code ec;
    fs::remove(path_of(hash), ec);
    e.on_disk = false;
    --stats_.disk_entries;
    stats_.disk_bytes -= e.bytes;
    ++stats_.disk_evictions;
    if (!e.blob) {  // in no tier any more: peers learn it is gone
      index_.erase(hash);
      if (remote_) remote_->on_dropped(hash);
    }
  }
}

void StateCache::drop(uint64_t hash, bool count_corrupt) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  Entry& e = *it->second;
  release_host(e);
  if (e.on_disk) {
    std::error_code ec;
    fs::remove(path_of(hash), ec);
    disk_lru_.erase(e.disk_it);
    --stats_.disk_entries;
    stats_.disk_bytes -= e.bytes;
  }
  if (count_corrupt) ++stats_.corrupt;
  index_.erase(it);
  if (remote_) remote_->on_dropped(hash);
}

void StateCache::erase(uint64_t hash) {
  std::lock_guard lock(mu_);
  drop(hash, false);
}

std::vector<uint64_t> StateCache::hottest(size_t n) const {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> out;
  for (auto it = lru_.begin(); it != lru_.end() && out.size() < n; ++it) out.push_back(*it);
  return out;
}

std::shared_ptr<const std::vector<uint8_t>> StateCache::blob(uint64_t hash) {
  std::shared_ptr<const std::vector<uint8_t>> thin;
  std::shared_ptr<const std::unordered_map<uint64_t, forward::PagePtr>> pages;
  {
    std::lock_guard lock(mu_);
    auto it = index_.find(hash);
    if (it == index_.end()) return nullptr;
    const Entry& e = *it->second;
    if (e.blob && e.page_keys.empty()) return e.blob;
    if (e.blob) {
      thin = e.blob;
      pages = pages_of(e);
    } else if (!e.on_disk) {
      return nullptr;
    }
  }
  if (thin) {  // make it self-contained: the pages go inline
    const forward::PageSource source = [&](uint64_t key) -> const forward::PagedRows::Page* {
      auto it = pages->find(key);
      return it == pages->end() ? nullptr : it->second.get();
    };
    auto d = forward::deserialize_snapshot(*thin, options_.fingerprint, options_.geometry, &source);
    if (!d.ok()) return nullptr;
    auto full = forward::serialize_snapshot(*d->state, d->tokens, d->header);
    if (!full.ok()) return nullptr;
    return std::make_shared<const std::vector<uint8_t>>(std::move(*full));
  }
  auto data = read_file(path_of(hash), 0, max_bytes_);
  if (!data.ok()) return nullptr;
  return std::make_shared<const std::vector<uint8_t>>(std::move(*data));
}

}  // namespace flashseek::engine
