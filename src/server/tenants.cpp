#include "server/tenants.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace flashseek::server {

namespace {

bool printable_no_space(unsigned char c) { return c > 0x20 && c < 0x7f; }

bool starts_with_bearer(std::string_view s) {
  constexpr std::string_view kScheme = "bearer ";  // the scheme is case-insensitive (RFC 7235)
  if (s.size() < kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i)
    if (char(std::tolower(static_cast<unsigned char>(s[i]))) != kScheme[i]) return false;
  return true;
}

}  // namespace

Result<CacheScope> parse_cache_scope(std::string_view name) {
  if (name == "tenant") return CacheScope::kTenant;
  if (name == "user") return CacheScope::kUser;
  if (name == "request") return CacheScope::kRequest;
  if (name == "shared") return CacheScope::kShared;
  return invalid_argument("cache scope '{}' is not one of tenant, user, request, shared", name);
}

const char* cache_scope_name(CacheScope scope) {
  switch (scope) {
    case CacheScope::kTenant: return "tenant";
    case CacheScope::kUser: return "user";
    case CacheScope::kRequest: return "request";
    case CacheScope::kShared: return "shared";
  }
  return "?";
}

Result<std::vector<ApiKeyEntry>> parse_api_keys(std::string_view text, std::string_view origin,
                                                bool comma_separates) {
  if (text.size() > kMaxApiKeyTextBytes)
    return invalid_argument("{}: {} bytes, more than the {} allowed for API keys", origin,
                            text.size(), kMaxApiKeyTextBytes);
  const char* what = comma_separates ? "entry" : "line";
  std::vector<ApiKeyEntry> out;
  size_t pos = 0;
  for (size_t number = 1;; ++number) {
    size_t end = text.find_first_of(comma_separates ? std::string_view(",\n") : "\n", pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (line.size() > kMaxApiKeyLineBytes)
      return invalid_argument("{}:{}: {} longer than {} bytes", origin, number, what,
                              kMaxApiKeyLineBytes);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    // Split on spaces and tabs; any other non-printable byte is an error (no key text in it).
    std::vector<std::string_view> fields;
    size_t i = 0;
    while (i < line.size()) {
      if (line[i] == ' ' || line[i] == '\t') {
        ++i;
        continue;
      }
      const size_t start = i;
      while (i < line.size() && line[i] != ' ' && line[i] != '\t') {
        if (!printable_no_space(static_cast<unsigned char>(line[i])))
          return invalid_argument("{}:{}: a key or tenant holds a byte other than printable ASCII "
                                  "(fields are separated by spaces or tabs)", origin, number);
        ++i;
      }
      fields.push_back(line.substr(start, i - start));
    }
    if (!fields.empty() && fields[0][0] != '#') {
      if (fields.size() > 2)
        return invalid_argument("{}:{}: expected `KEY [TENANT]`, found {} fields", origin, number,
                                fields.size());
      for (std::string_view f : fields)
        if (f.size() > kMaxApiKeyBytes)
          return invalid_argument("{}:{}: a key or tenant is longer than {} bytes", origin, number,
                                  kMaxApiKeyBytes);
      if (out.size() == kMaxApiKeys)
        return invalid_argument("{}: more than {} API keys", origin, kMaxApiKeys);
      out.push_back({std::string(fields[0]), std::string(fields.size() == 2 ? fields[1] : fields[0])});
    }
    if (end == text.size()) break;
    pos = end + 1;
  }
  return out;
}

Result<std::vector<ApiKeyEntry>> read_api_key_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return not_found("{}: cannot read the API key file", path);
  if (!fs::is_regular_file(st)) return invalid_argument("{}: not a regular file", path);
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return not_found("{}: cannot read the API key file", path);
  if (size > kMaxApiKeyTextBytes)
    return invalid_argument("{}: {} bytes, more than the {} allowed for API keys", path, size,
                            kMaxApiKeyTextBytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("{}: cannot read the API key file", path);
  std::string text(kMaxApiKeyTextBytes + 1, '\0');  // one byte more: a file that grew is caught
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  if (in.bad()) return not_found("{}: cannot read the API key file", path);
  FS_ASSIGN_OR_RETURN(auto entries, parse_api_keys(text, path, /*comma_separates=*/false));
  if (entries.empty())
    return invalid_argument("{}: no API keys (one `KEY [TENANT]` per line)", path);
  const fs::perms p = st.permissions();
  if ((p & (fs::perms::group_read | fs::perms::others_read)) != fs::perms::none)
    spdlog::warn("{}: the API key file is readable by other users (chmod 600 it)", path);
  return entries;
}

uint64_t tenant_of(std::string_view tenant_name) {
  if (tenant_name.empty()) return kSharedScope;
  return XXH64(tenant_name.data(), tenant_name.size(), /*seed=*/0x666c617368736b);
}

namespace {

std::array<uint8_t, 32> sha256(std::string_view s) {
  std::array<uint8_t, 32> d{};
  unsigned int n = 0;
  if (EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != d.size())
    d.fill(0);  // never reached with a working libcrypto; an all-zero digest matches no key
  return d;
}

}  // namespace

Status Tenants::add_key(std::string_view key, std::string_view tenant) {
  if (key.empty()) return invalid_argument("an API key is empty");
  if (key.size() > kMaxApiKeyBytes)
    return invalid_argument("an API key is longer than {} bytes", kMaxApiKeyBytes);
  if (tenant.size() > kMaxApiKeyBytes)
    return invalid_argument("a tenant name is longer than {} bytes", kMaxApiKeyBytes);
  const Digest digest = sha256(key);
  const uint64_t id = tenant_of(tenant.empty() ? key : tenant);
  for (const Key& k : keys_)
    if (k.digest == digest) {
      if (k.tenant == id) return {};
      return invalid_argument("an API key is given twice, for two different tenants");
    }
  if (keys_.size() >= kMaxApiKeys) return invalid_argument("more than {} API keys", kMaxApiKeys);
  keys_.push_back({digest, id});
  return {};
}

Status Tenants::add_keys(const std::vector<ApiKeyEntry>& entries) {
  for (const ApiKeyEntry& e : entries) FS_RETURN_IF_ERROR(add_key(e.key, e.tenant));
  return {};
}

size_t Tenants::tenant_count() const {
  std::set<uint64_t> ids;
  for (const Key& k : keys_) ids.insert(k.tenant);
  return ids.size();
}

std::optional<Caller> Tenants::authenticate(std::string_view authorization) const {
  if (keys_.empty()) return Caller{};
  if (authorization.size() <= 7 || !starts_with_bearer(authorization)) return std::nullopt;
  const std::string_view token = authorization.substr(7);
  if (token.size() > kMaxApiKeyBytes) return std::nullopt;  // longer than any configured key
  const Digest d = sha256(token);
  // Every key is compared and the match selected with masks, so the time does not depend on
  // which key (if any) matched.
  uint64_t tenant = 0, found = 0;
  for (const Key& k : keys_) {
    const uint64_t eq = uint64_t(CRYPTO_memcmp(d.data(), k.digest.data(), d.size()) == 0);
    tenant |= k.tenant & (0 - eq);
    found |= eq;
  }
  if (!found) return std::nullopt;
  return Caller{tenant};
}

std::optional<uint64_t> Tenants::request_scope(const Caller& caller, std::string_view user) const {
  switch (scope_) {
    case CacheScope::kShared: return kSharedScope;
    case CacheScope::kRequest: return std::nullopt;
    case CacheScope::kTenant: return caller.tenant;  // nullopt without keys: isolated
    case CacheScope::kUser:
      if (user.empty()) return std::nullopt;
      return XXH64(user.data(), user.size(),
                   caller.tenant.value_or(kSharedScope) ^ 0x757365722d73636full);
  }
  return std::nullopt;
}

std::optional<uint64_t> Tenants::request_scope(std::string_view authorization,
                                               std::string_view user) const {
  const auto caller = authenticate(authorization);
  if (!caller) return std::nullopt;
  return request_scope(*caller, user);
}

}  // namespace flashseek::server
