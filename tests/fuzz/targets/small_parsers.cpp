// Small text parsers of operator input: API-key files and values (server/tenants.h) and Redis
// URLs (kvshare/registry.h). Byte 0 of an API-key input picks comma separation (odd).
#include "fuzz/targets.h"
#include "kvshare/registry.h"
#include "server/tenants.h"

namespace flashseek::fuzz {

namespace {

bool printable_no_space(std::string_view s) {
  for (unsigned char c : s)
    if (c <= 0x20 || c >= 0x7f) return false;
  return true;
}

// The next printable, non-space ASCII character other than the separators (',') and the comment
// mark ('#'), cyclically; every other byte unchanged.
char rotate_printable(char c) {
  auto special = [](unsigned char u) { return u == ',' || u == '#'; };
  const auto u = static_cast<unsigned char>(c);
  if (!printable_no_space(std::string_view(&c, 1)) || special(u)) return c;
  unsigned char n = u;
  do n = n == 0x7e ? 0x21 : static_cast<unsigned char>(n + 1);
  while (special(n));
  return static_cast<char>(n);
}

}  // namespace

bool run_api_keys(std::span<const uint8_t> d) {
  if (d.empty()) return false;
  const std::string_view text = as_text(d.subspan(1));
  auto keys = server::parse_api_keys(text, "fuzz", d[0] % 2 == 1);
  if (!keys.ok()) {
    // Errors name the origin and the entry, never key text: the same input with every key and
    // tenant character replaced (a bijection on printable ASCII that keeps the separators, '#'
    // and so the structure, lengths and duplicates) must give the same message.
    std::string other(text);
    for (char& c : other) c = rotate_printable(c);
    auto again = server::parse_api_keys(other, "fuzz", d[0] % 2 == 1);
    FUZZ_CHECK(!again.ok() && again.status().message() == keys.status().message(),
               "an API-key error depends on key text: " + keys.status().message());
    return false;
  }
  FUZZ_CHECK(keys->size() <= server::kMaxApiKeys, "more keys than the limit");
  for (const auto& k : *keys) {
    FUZZ_CHECK(!k.key.empty() && printable_no_space(k.key), "a key that is empty or not printable");
    FUZZ_CHECK(!k.tenant.empty() && printable_no_space(k.tenant), "a tenant that is empty or not printable");
    FUZZ_CHECK(text.find(k.key) != std::string_view::npos, "a key that is not in the text");
  }
  return true;
}

std::vector<Bytes> seeds_api_keys() {
  return {with_mode(0, "sk-alpha-0123456789 team-a\nsk-beta-9876543210\n# comment\n\n"),
          with_mode(1, "sk-one tenant1,sk-two,sk-three tenant3"), with_mode(0, "key-with-crlf\r\n")};
}

bool run_redis_url(std::span<const uint8_t> d) {
  auto url = kvshare::parse_redis_url(std::string(as_text(d)));
  if (!url.ok()) return false;
  FUZZ_CHECK(!url->host.empty(), "an empty host");
  FUZZ_CHECK(url->port > 0 && url->port < 65536, "a port out of range: " + std::to_string(url->port));
  return true;
}

std::vector<Bytes> seeds_redis_url() {
  return {to_bytes("redis://localhost:6379/0"), to_bytes("rediss://user:p%40ss@cache.example:6380"),
          to_bytes("10.0.0.1:7000"), to_bytes("redis://:secret@[::1]:6379"), to_bytes("redis://h")};
}

}  // namespace flashseek::fuzz
