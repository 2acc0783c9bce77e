#include "kvshare/registry.h"

#include <hiredis/hiredis.h>
#include <poll.h>

#include <chrono>
#include <sstream>

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

// Why a command's reply is not the expected status: the server's error text, or the connection's
// error (e.g. a TLS server closing a plain connection), or the wrong reply type.
std::string why_refused(const redisContext* c, const redisReply* r) {
  if (r && r->type == REDIS_REPLY_ERROR && r->str) return std::string(r->str, r->len);
  if (!r && c->err) return fmt::format("no valid reply ({})", c->errstr);
  return "no valid reply";
}

struct ReplyGuard {
  redisReply* r;
  ~ReplyGuard() { if (r) freeReplyObject(r); }
};

}  // namespace

namespace {

// %XX escapes of a URL's user-info part.
Result<std::string> percent_decode(const std::string& s, const std::string& url) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    auto hex = [](char c) {
      return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    };
    if (i + 2 >= s.size() || hex(s[i + 1]) < 0 || hex(s[i + 2]) < 0)
      return invalid_argument("--redis {}: bad %-escape in the user or password", url);
    out += char(hex(s[i + 1]) * 16 + hex(s[i + 2]));
    i += 2;
  }
  return out;
}

}  // namespace

Result<RedisUrl> parse_redis_url(const std::string& url) {
  RedisUrl out;
  std::string rest = url;
  if (rest.rfind("rediss://", 0) == 0) {
    rest = rest.substr(9);
    out.tls = true;
  } else if (rest.rfind("redis://", 0) == 0) {
    rest = rest.substr(8);
  }
  else if (rest.find("://") != std::string::npos)
    return invalid_argument("--redis {}: expected redis://host:port or rediss://host:port", url);
  if (auto slash = rest.find('/'); slash != std::string::npos) rest = rest.substr(0, slash);
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    const std::string info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const auto colon = info.find(':');
    if (colon == std::string::npos) {  // redis://password@host (a lone user-info is the password)
      FS_ASSIGN_OR_RETURN(out.password, percent_decode(info, url));
    } else {
      FS_ASSIGN_OR_RETURN(out.user, percent_decode(info.substr(0, colon), url));
      FS_ASSIGN_OR_RETURN(out.password, percent_decode(info.substr(colon + 1), url));
    }
    if (out.password.empty() && !out.user.empty())
      return invalid_argument("--redis {}: a user needs a password", url);
  }
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
  out.host = host;
  out.port = port;
  return out;
}

Registry::Registry(RegistryOptions options) : options_(std::move(options)) {
  auto url = parse_redis_url(options_.url);
  if (url.ok() && url->tls) {
    auto tls = RedisTlsContext::create(options_.tls);
    if (tls.ok()) {
      url_ = *url;
      port_ = url_.port;
      tls_ = *tls;
    } else {
      spdlog::warn("kvshare: {}; running local only", tls.status().message());
      std::lock_guard lock(log_mu_);
      last_error_ = tls.status().message();
    }
  } else if (url.ok()) {
    url_ = *url;
    port_ = url_.port;
  } else {
    spdlog::warn("kvshare: {}; running local only", url.status().message());
  }
  thread_ = std::thread([this] { loop(); });
  listener_ = std::thread([this] { listen_loop(); });
}

Registry::~Registry() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (listener_.joinable()) listener_.join();
  std::lock_guard lock(redis_mu_);
  if (ctx_) {
    freeReplyObject(command(ctx_, "DEL %s", server_key(options_.server_id).c_str()));
    redis_free(ctx_);
  }
}

bool Registry::ensure_connected() {
  if (ctx_ && ctx_->err == 0) return true;
  if (ctx_) {
    redis_free(ctx_);
    ctx_ = nullptr;
    if (connected_) spdlog::warn("kvshare: lost Redis at {}:{}", url_.host, url_.port);
    connected_ = false;
  }
  if (port_ == 0) return false;
  ctx_ = connect_redis("registry");
  if (!ctx_) return false;
  connected_ = true;
  ++reconnects_;
  need_reannounce_ = true;
  spdlog::info("kvshare: connected to Redis at {}:{}", url_.host, url_.port);
  return true;
}

redisContext* Registry::connect_redis(const char* what) {
  std::string error;
  redisContext* c = redis_connect(url_.host, url_.port, tls_.get(), options_.timeout_ms, error);
  if (c) {
    if (!url_.password.empty()) {
      ReplyGuard r{url_.user.empty()
                       ? command(c, "AUTH %b", url_.password.data(), url_.password.size())
                       : command(c, "AUTH %b %b", url_.user.data(), url_.user.size(),
                                 url_.password.data(), url_.password.size())};
      if (!r.r || r.r->type != REDIS_REPLY_STATUS)
        error = fmt::format("AUTH refused: {}", why_refused(c, r.r));
    }
    if (error.empty()) {  // e.g. NOAUTH: a server that wants a password the URL does not give
      ReplyGuard r{command(c, "PING")};
      if (!r.r || r.r->type != REDIS_REPLY_STATUS)
        error = fmt::format("PING refused: {}", why_refused(c, r.r));
    }
  }
  if (error.empty()) return c;
  redis_free(c);
  std::lock_guard lock(log_mu_);
  if (error != last_error_) {  // a Redis that stays away is logged once, not every retry
    spdlog::warn("kvshare: Redis {}:{} ({}): {}", url_.host, url_.port, what, error);
    last_error_ = error;
  }
  return nullptr;
}

std::string Registry::last_error() const {
  std::lock_guard lock(log_mu_);
  return last_error_;
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
  lost_withdrawals_.erase(hash);
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
    if (o.r && o.r->type == REDIS_REPLY_STRING && o.r->str && id == std::string(o.r->str, o.r->len)) {
      ReplyGuard d{command(ctx_, "DEL %s", key.c_str())};
      ReplyGuard p{command(ctx_, "PUBLISH fs:events %s", fmt::format("evict {:016x} {}", op.hash, id).c_str())};
    }
  }
}

void Registry::reannounce_all() {
  std::map<uint64_t, Owned> owned;
  std::unordered_set<uint64_t> withdrawn;
  {
    std::lock_guard lock(mu_);
    owned = owned_;
    withdrawn.swap(lost_withdrawals_);
  }
  for (const auto& [hash, meta] : owned) apply({true, hash, meta});
  for (uint64_t hash : withdrawn)
    if (!owned.count(hash)) apply({false, hash, {}});
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
      // Announcements made while Redis is away are dropped: owned_ holds the truth and is
      // re-announced later; withdrawals are remembered and replayed then.
      if (ensure_connected()) {
        for (const Op& op : ops) apply(op);
      } else {
        std::lock_guard lock2(mu_);
        for (const Op& op : ops)
          if (!op.add && !owned_.count(op.hash)) lost_withdrawals_.insert(op.hash);
      }
    }
    lock.lock();
  }
}

size_t Registry::view_size() const {
  std::lock_guard lock(view_mu_);
  return view_.size();
}

void Registry::on_event(const std::string& message) {
  std::istringstream in(message);
  std::string kind, hex, owner;
  if (!(in >> kind >> hex >> owner)) return;
  uint64_t hash = 0;
  try {
    hash = std::stoull(hex, nullptr, 16);
  } catch (...) {
    return;
  }
  ++events_;
  constexpr size_t kMaxView = size_t(1) << 20;  // bounds memory; the registry stays the truth
  std::lock_guard lock(view_mu_);
  if (kind == "own") {
    evicted_.erase(hash);
    if (view_.size() >= kMaxView) view_.clear();
    view_[hash] = owner;
  } else if (kind == "evict") {
    if (auto it = view_.find(hash); it != view_.end() && it->second == owner) view_.erase(it);
    if (evicted_.size() >= kMaxView) evicted_.clear();
    evicted_[hash] = owner;
  }
}

void Registry::listen_loop() {
  redisContext* sub = nullptr;
  auto wait_a_bit = [&](int ms) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return stopping_; });
    return !stopping_;
  };
  auto drop = [&] {
    redis_free(sub);
    sub = nullptr;
    subscribed_ = false;
  };
  while (true) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    if (!sub) {
      if (port_ == 0) {
        if (!wait_a_bit(1000)) break;
        continue;
      }
      sub = connect_redis("events");
      ReplyGuard r{sub ? command(sub, "SUBSCRIBE fs:events") : nullptr};
      if (!r.r || r.r->type != REDIS_REPLY_ARRAY) {
        drop();
        if (!wait_a_bit(500)) break;
        continue;
      }
      {
        // Events may have been missed while unsubscribed: forget what the view knew.
        std::lock_guard lock(view_mu_);
        view_.clear();
        evicted_.clear();
      }
      subscribed_ = true;
    }
    pollfd p{sub->fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 200);
    if (ready == 0) continue;
    if (ready < 0 || redisBufferRead(sub) != REDIS_OK) {
      spdlog::warn("kvshare: lost the fs:events subscription; resubscribing");
      drop();
      continue;
    }
    void* raw = nullptr;
    int rc = REDIS_OK;
    while ((rc = redisGetReplyFromReader(sub, &raw)) == REDIS_OK && raw) {
      ReplyGuard m{static_cast<redisReply*>(raw)};
      raw = nullptr;
      // Every element's type is checked before its string is read: a malformed push (wrong
      // types, a nil, too few elements) is ignored, never dereferenced.
      const redisReply* r = m.r;
      auto is_str = [](const redisReply* e) {
        return e && (e->type == REDIS_REPLY_STRING || e->type == REDIS_REPLY_STATUS) && e->str;
      };
      if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 && r->element && is_str(r->element[0]) &&
          is_str(r->element[2]) && std::string(r->element[0]->str, r->element[0]->len) == "message" &&
          r->element[2]->len <= 1024)
        on_event(std::string(r->element[2]->str, r->element[2]->len));
    }
    if (rc != REDIS_OK) {  // protocol error: the stream cannot be resynchronised
      spdlog::warn("kvshare: malformed reply on the fs:events subscription; resubscribing");
      drop();
      if (!wait_a_bit(500)) break;
    }
  }
  drop();
}

bool Registry::owners_of(std::span<const uint64_t> hashes, std::vector<std::string>& owners) {
  // One pipelined round trip for all candidate keys.
  for (uint64_t h : hashes) redisAppendCommand(ctx_, "HGET %s owner", snap_key(h).c_str());
  owners.assign(hashes.size(), {});
  for (size_t i = 0; i < hashes.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK) return false;
    ReplyGuard r{static_cast<redisReply*>(raw)};
    if (r.r && r.r->type == REDIS_REPLY_STRING && r.r->str && r.r->len > 0 && r.r->len <= 255)
      owners[i].assign(r.r->str, r.r->len);
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
    {
      std::lock_guard lock(view_mu_);
      auto it = evicted_.find(hashes[i]);
      if (it != evicted_.end() && it->second == owners[i]) {  // stale entry: owner dropped it
        ++stale_skipped_;
        continue;
      }
    }
    ReplyGuard a{command(ctx_, "GET %s", server_key(owners[i]).c_str())};
    if (!a.r) return std::nullopt;
    // Not a string: the owner is dead (heartbeat expired) or the entry is malformed.
    if (a.r->type != REDIS_REPLY_STRING || !a.r->str || a.r->len == 0 || a.r->len > 255) continue;
    return SnapshotLocation{hashes[i], owners[i], std::string(a.r->str, a.r->len)};
  }
  return std::nullopt;
}

std::map<std::string, std::string> Registry::peers() {
  std::map<std::string, std::string> out;
  std::lock_guard rlock(redis_mu_);
  if (!ctx_ || ctx_->err) return out;
  // SCAN (not KEYS): never blocks Redis for long, whatever the number of keys.
  std::vector<std::string> keys;
  std::string cursor = "0";
  for (int rounds = 0; rounds < 10000 && keys.size() < kMaxPeers; ++rounds) {
    ReplyGuard r{command(ctx_, "SCAN %s MATCH fs:server:* COUNT 1000", cursor.c_str())};
    if (!r.r || r.r->type != REDIS_REPLY_ARRAY || r.r->elements != 2 ||
        r.r->element[0]->type != REDIS_REPLY_STRING || !r.r->element[0]->str ||
        r.r->element[1]->type != REDIS_REPLY_ARRAY)
      return out;
    for (size_t i = 0; i < r.r->element[1]->elements && keys.size() < kMaxPeers; ++i) {
      const redisReply* k = r.r->element[1]->element[i];
      if (k && k->type == REDIS_REPLY_STRING && k->str && k->len > 10 && k->len <= 10 + 255)
        keys.push_back(std::string(k->str, k->len));
    }
    cursor.assign(r.r->element[0]->str, r.r->element[0]->len);
    if (cursor == "0") break;
  }
  for (const std::string& k : keys) {
    const std::string id = k.substr(10);
    if (id == options_.server_id || out.count(id)) continue;  // SCAN may repeat a key
    ReplyGuard v{command(ctx_, "GET %s", k.c_str())};
    if (v.r && v.r->type == REDIS_REPLY_STRING && v.r->str && v.r->len > 0 && v.r->len <= 255)
      out[id].assign(v.r->str, v.r->len);
  }
  return out;
}

}  // namespace flashseek::kvshare
