#include "kvshare/registry.h"

#include <hiredis/hiredis.h>

#include <chrono>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace flashseek::kvshare {

namespace {

std::string snap_key(uint64_t hash) { return fmt::format("fs:snap:{:016x}", hash); }
std::string server_key(const std::string& id) { return "fs:server:" + id; }

// Runs one command; nullptr (and the context marked broken) on any error.
redisReply* command(redisContext* c, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  void* r = redisvCommand(c, fmt, ap);
  va_end(ap);
  return static_cast<redisReply*>(r);
}

struct ReplyGuard {
  redisReply* r;
  ~ReplyGuard() { if (r) freeReplyObject(r); }
};

}  // namespace

Result<std::pair<std::string, int>> parse_redis_url(const std::string& url) {
  std::string rest = url;
  if (rest.rfind("redis://", 0) == 0) rest = rest.substr(8);
  if (auto at = rest.find('@'); at != std::string::npos) rest = rest.substr(at + 1);
  if (auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  std::string host = rest;
  int port = 6379;
  if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    host = rest.substr(0, colon);
    try {
      size_t used = 0;
      port = std::stoi(rest.substr(colon + 1), &used);
      if (used != rest.size() - colon - 1) throw std::invalid_argument("port");
    } catch (...) {
      return invalid_argument("--redis {}: bad port", url);
    }
  }
  if (host.empty() || port <= 0 || port > 65535)
    return invalid_argument("--redis {}: expected redis://host:port", url);
  return std::make_pair(host, port);
}

Registry::Registry(RegistryOptions options) : options_(std::move(options)) {
  auto hp = parse_redis_url(options_.url);
  if (hp.ok()) {
    host_ = hp->first;
    port_ = hp->second;
  } else {
    spdlog::warn("kvshare: {}; running local only", hp.status().message());
  }
  thread_ = std::thread([this] { loop(); });
}

Registry::~Registry() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(redis_mu_);
  if (ctx_) {
    freeReplyObject(command(ctx_, "DEL %s", server_key(options_.server_id).c_str()));
    redisFree(ctx_);
  }
}

bool Registry::ensure_connected() {
  if (ctx_ && ctx_->err == 0) return true;
  if (ctx_) {
    redisFree(ctx_);
    ctx_ = nullptr;
    if (connected_) spdlog::warn("kvshare: lost Redis at {}:{}", host_, port_);
    connected_ = false;
  }
  if (port_ == 0) return false;
  const timeval tv{options_.timeout_ms / 1000, (options_.timeout_ms % 1000) * 1000};
  ctx_ = redisConnectWithTimeout(host_.c_str(), port_, tv);
  if (!ctx_ || ctx_->err) {
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
    return false;
  }
  redisSetTimeout(ctx_, tv);
  connected_ = true;
  ++reconnects_;
  need_reannounce_ = true;
  spdlog::info("kvshare: connected to Redis at {}:{}", host_, port_);
  return true;
}

void Registry::announce(uint64_t hash, uint64_t tenant, int64_t tokens, int64_t bytes) {
  std::lock_guard lock(mu_);
  owned_[hash] = {tenant, tokens, bytes};
  ops_.push_back({true, hash, {tenant, tokens, bytes}});
  cv_.notify_all();
}

void Registry::withdraw(uint64_t hash) {
  std::lock_guard lock(mu_);
  owned_.erase(hash);
  ops_.push_back({false, hash, {}});
  cv_.notify_all();
}

void Registry::apply(const Op& op) {
  const std::string key = snap_key(op.hash);
  const std::string& id = options_.server_id;
  if (op.add) {
    ReplyGuard a{command(ctx_, "HSET %s owner %s tenant %llu tokens %lld bytes %lld", key.c_str(),
                         id.c_str(), (unsigned long long)op.meta.tenant,
                         (long long)op.meta.tokens, (long long)op.meta.bytes)};
    ReplyGuard b{command(ctx_, "EXPIRE %s %d", key.c_str(), options_.snapshot_ttl_s)};
    ReplyGuard c{command(ctx_, "PUBLISH fs:events %s", fmt::format("own {:016x} {}", op.hash, id).c_str())};
  } else {
    // Only the owner's entry is removed: another server may have taken the snapshot over.
    ReplyGuard o{command(ctx_, "HGET %s owner", key.c_str())};
    if (o.r && o.r->type == REDIS_REPLY_STRING && id == o.r->str) {
      ReplyGuard d{command(ctx_, "DEL %s", key.c_str())};
      ReplyGuard p{command(ctx_, "PUBLISH fs:events %s", fmt::format("evict {:016x} {}", op.hash, id).c_str())};
    }
  }
}

void Registry::reannounce_all() {
  std::map<uint64_t, Owned> owned;
  {
    std::lock_guard lock(mu_);
    owned = owned_;
  }
  for (const auto& [hash, meta] : owned) apply({true, hash, meta});
  need_reannounce_ = ctx_ == nullptr || ctx_->err != 0;
}

void Registry::loop() {
  auto next_beat = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_until(lock, next_beat, [&] { return stopping_ || !ops_.empty(); });
    if (stopping_) break;
    std::deque<Op> ops;
    ops.swap(ops_);
    lock.unlock();
    {
      std::lock_guard rlock(redis_mu_);
      if (std::chrono::steady_clock::now() >= next_beat) {
        next_beat = std::chrono::steady_clock::now() + std::chrono::milliseconds(
                                                           options_.heartbeat_ttl_s * 1000 / 3);
        if (ensure_connected()) {
          ReplyGuard r{command(ctx_, "SET %s %s EX %d", server_key(options_.server_id).c_str(),
                               options_.advertise.c_str(), options_.heartbeat_ttl_s)};
          if (need_reannounce_) reannounce_all();  // after a (re)connect: Redis may be empty
        }
      }
      // Ops made while Redis is away are dropped: owned_ holds the truth, re-announced later.
      if (ensure_connected())
        for (const Op& op : ops) apply(op);
    }
    lock.lock();
  }
}

bool Registry::owners_of(std::span<const uint64_t> hashes, std::vector<std::string>& owners) {
  // One pipelined round trip for all candidate keys.
  for (uint64_t h : hashes) redisAppendCommand(ctx_, "HGET %s owner", snap_key(h).c_str());
  owners.assign(hashes.size(), {});
  for (size_t i = 0; i < hashes.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK) return false;
    ReplyGuard r{static_cast<redisReply*>(raw)};
    if (r.r && r.r->type == REDIS_REPLY_STRING) owners[i] = r.r->str;
  }
  return true;
}

std::optional<SnapshotLocation> Registry::find(std::span<const uint64_t> hashes) {
  std::lock_guard rlock(redis_mu_);
  // While Redis is down the request path tries to reconnect at most once a second (the
  // background loop also does); a connection that broke since its last use is retried once.
  if (hashes.empty()) return std::nullopt;
  if (!ctx_) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_request_connect_ < std::chrono::seconds(1)) return std::nullopt;
    last_request_connect_ = now;
    if (!ensure_connected()) return std::nullopt;
  }
  std::vector<std::string> owners;
  if (!owners_of(hashes, owners) && !(ensure_connected() && owners_of(hashes, owners)))
    return std::nullopt;
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (owners[i].empty() || owners[i] == options_.server_id) continue;
    ReplyGuard a{command(ctx_, "GET %s", server_key(owners[i]).c_str())};
    if (!a.r) return std::nullopt;
    if (a.r->type != REDIS_REPLY_STRING) continue;  // owner is dead (heartbeat expired)
    return SnapshotLocation{hashes[i], owners[i], a.r->str};
  }
  return std::nullopt;
}

std::map<std::string, std::string> Registry::peers() {
  std::map<std::string, std::string> out;
  std::lock_guard rlock(redis_mu_);
  if (!ctx_ || ctx_->err) return out;
  ReplyGuard keys{command(ctx_, "KEYS fs:server:*")};
  if (!keys.r || keys.r->type != REDIS_REPLY_ARRAY) return out;
  for (size_t i = 0; i < keys.r->elements; ++i) {
    const std::string k = keys.r->element[i]->str;
    const std::string id = k.substr(10);
    if (id == options_.server_id) continue;
    ReplyGuard v{command(ctx_, "GET %s", k.c_str())};
    if (v.r && v.r->type == REDIS_REPLY_STRING) out[id] = v.r->str;
  }
  return out;
}

}  // namespace flashseek::kvshare
