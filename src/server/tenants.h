// Callers and cache scopes: which API keys the server accepts, which tenant each key
// belongs to, and which conversation-state cache a request may read and fill.
//
// The state cache reports `cached_tokens` and answers faster on a hit, so a hit tells the caller
// that somebody in the same cache scope sent that prefix before. Scopes are therefore chosen so
// that a hit can only reveal a caller's own (or their own tenant's) prompts, unless the operator
// opts in to sharing:
//   tenant  (default) one cache per tenant; keys of one tenant share it. Without API keys there
//           is no tenant: every request is isolated (it neither reuses nor leaves cached state).
//   user    one cache per (tenant, request `user` field); a request without `user` is isolated.
//           Without API keys the `user` string alone selects the cache, so it must be a value
//           callers cannot guess (e.g. set by a trusted gateway).
//   request no reuse across requests, keys or not.
//   shared  one cache for every caller and tenant (a single trusted client, or a trusted front
//           end): a hit then confirms what other callers asked.
// Tenant ids are xxHash64 of the tenant name, so servers with the same key file share a tenant's
// snapshots through kvshare, and `--api-key K` alone keeps the id it always had (tenant "K").
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace flashseek::server {

enum class CacheScope { kTenant, kUser, kRequest, kShared };

// "tenant" | "user" | "request" | "shared".
Result<CacheScope> parse_cache_scope(std::string_view name);
const char* cache_scope_name(CacheScope scope);

// Bounds on key material (checked before any other work on it).
inline constexpr size_t kMaxApiKeyTextBytes = 1u << 20;  // a key file or the environment value
inline constexpr size_t kMaxApiKeyLineBytes = 4096;      // one "KEY [TENANT]" entry
inline constexpr size_t kMaxApiKeyBytes = 512;           // one key or tenant name
inline constexpr size_t kMaxApiKeys = 10000;             // keys per server

struct ApiKeyEntry {
  std::string key;
  std::string tenant;  // never empty after parsing (defaults to the key)
};

// Parses key entries: one `KEY [TENANT]` per line (fields separated by spaces or tabs, TENANT
// defaulting to KEY), blank lines and lines starting with `#` skipped, CRLF accepted. With
// `comma_separates`, a comma also ends an entry (for one-line environment values). Keys and tenant
// names are printable ASCII without spaces. Errors name `origin` and the entry number, never the
// key text.
Result<std::vector<ApiKeyEntry>> parse_api_keys(std::string_view text, std::string_view origin,
                                                bool comma_separates);
// Reads and parses a key file (a regular file of at most kMaxApiKeyTextBytes, at least one key).
Result<std::vector<ApiKeyEntry>> read_api_key_file(const std::string& path);

// Tenant id of a tenant name (xxHash64; 0 for the empty name, which is the shared scope).
uint64_t tenant_of(std::string_view tenant_name);
// The cache scope every caller shares under CacheScope::kShared.
inline constexpr uint64_t kSharedScope = 0;

// Who sent a request: the tenant of the key it presented (nullopt when the server has no keys).
struct Caller {
  std::optional<uint64_t> tenant;
};

class Tenants {
 public:
  Tenants() = default;  // no keys, CacheScope::kTenant: every request isolated

  // Accepts `key` for `tenant` (empty: the key is its own tenant). Adding a key twice for the
  // same tenant is a no-op; for another tenant it is an error (the key would be ambiguous).
  Status add_key(std::string_view key, std::string_view tenant);
  Status add_keys(const std::vector<ApiKeyEntry>& entries);
  void set_cache_scope(CacheScope scope) { scope_ = scope; }
  CacheScope cache_scope() const { return scope_; }
  bool keys_required() const { return !keys_.empty(); }
  size_t key_count() const { return keys_.size(); }
  size_t tenant_count() const;

  // The caller for an `Authorization` header value; nullopt when keys are configured and the
  // header is not `Bearer <one of them>`. The presented key is compared with every configured
  // key (SHA-256 digests, constant-time), so timing reveals neither which key nor how much of it
  // matched.
  std::optional<Caller> authenticate(std::string_view authorization) const;
  // The state-cache scope of a request from `caller` carrying OpenAI's `user` field; nullopt:
  // the request is isolated (no lookup, no snapshots kept).
  std::optional<uint64_t> request_scope(const Caller& caller, std::string_view user) const;
  // authenticate + request_scope; an unauthenticated header gives nullopt (isolated).
  std::optional<uint64_t> request_scope(std::string_view authorization,
                                        std::string_view user) const;

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Key {
    Digest digest;  // SHA-256 of the key: what requests are compared against
    uint64_t tenant;
  };
  std::vector<Key> keys_;
  CacheScope scope_ = CacheScope::kTenant;
};

}  // namespace flashseek::server
