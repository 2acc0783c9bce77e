// Snapshots entering the state cache (engine/state_cache.h) the two ways untrusted bytes do: a
// file found in the cache directory at start (bit 2 of the mode byte) or a blob fetched from a
// peer (insert_blob). Mode bit 0 repairs the blob's key (the prefix hash of its tenant and
// tokens), its fingerprint and its checksum so that mutations get past them; bit 1 picks
// tiny-v4's geometry. What the cache then returns for the blob's tokens must be the state that
// deserialize_snapshot decodes from the same bytes, and a blob that does not decode must never
// be returned.
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "engine/state_cache.h"
#include "forward/state_io.h"
#include "fuzz/targets.h"

namespace flashseek::fuzz {

namespace {

namespace fs = std::filesystem;

void store_u64(Bytes& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

// The token ids a blob claims to hold, when its header's count fits the blob.
std::vector<int32_t> claimed_tokens(const Bytes& b) {
  if (b.size() < forward::kSnapshotHeaderBytes) return {};
  const uint64_t n = load_u64(b, kSnapTokensAt);
  if (n > (b.size() - forward::kSnapshotHeaderBytes) / 4) return {};
  std::vector<int32_t> t(n);
  if (n) std::memcpy(t.data(), b.data() + forward::kSnapshotHeaderBytes, n * 4);
  return t;
}

const fs::path& cache_dir() {
  static const fs::path dir = [] {
    std::string d = (fs::temp_directory_path() / "fs-fuzz-cache-XXXXXX").string();
    if (!mkdtemp(d.data())) fail(__FILE__, __LINE__, "mkdtemp failed");
    return fs::path(d);
  }();
  return dir;
}

}  // namespace

bool run_state_cache(std::span<const uint8_t> d) {
  // The cache logs a warning per discarded snapshot: one per input here.
  static const bool quiet = (spdlog::set_level(spdlog::level::err), true);
  (void)quiet;
  if (d.empty()) return false;
  const uint8_t mode = d[0];
  Bytes blob(d.begin() + 1, d.end());
  const bool big_enough = blob.size() >= forward::kSnapshotHeaderBytes + 8;
  uint64_t fingerprint = 0x5eed;
  if ((mode & 1) && big_enough) {
    const auto tokens = claimed_tokens(blob);
    store_u64(blob, kSnapKeyAt, engine::prefix_hashes(load_u64(blob, kSnapTenantAt), tokens).back());
    fingerprint = load_u64(blob, kSnapFingerprintAt);
    store_u64(blob, blob.size() - 8, XXH64(blob.data(), blob.size() - 8, 0));
  }
  engine::StateCacheOptions o;
  o.fingerprint = fingerprint;
  o.geometry = tiny_geometry(mode & 2);
  o.min_tokens = 1;
  const bool from_disk = mode & 4;
  if (from_disk) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(cache_dir(), ec)) fs::remove_all(e.path(), ec);
    o.dir = cache_dir().string();
    // Named by the key the header claims, as the cache names its own files.
    const uint64_t key = big_enough ? load_u64(blob, kSnapKeyAt) : 0;
    std::ofstream(cache_dir() / fmt::format("{:016x}.fss", key), std::ios::binary)
        .write(reinterpret_cast<const char*>(blob.data()), std::streamsize(blob.size()));
  }
  auto cache = engine::StateCache::open(o);
  FUZZ_CHECK(cache.ok(), "the cache did not open: " + cache.status().to_string());
  bool inserted = true;
  if (!from_disk) inserted = (*cache)->insert_blob(blob).ok();

  auto direct = forward::deserialize_snapshot(blob, fingerprint, o.geometry);
  std::vector<int32_t> tokens = claimed_tokens(blob);
  const uint64_t tenant = big_enough ? load_u64(blob, kSnapTenantAt) : 0;
  tokens.push_back(0);  // lookups leave the last prompt token to the model
  const auto hit = (*cache)->lookup(tenant, tokens, int64_t(tokens.size()) - 1);
  if (!hit) return false;
  FUZZ_CHECK(inserted, "a refused blob was returned by a lookup");
  FUZZ_CHECK(direct.ok(), "the cache returned a state its bytes do not decode to: " + direct.status().to_string());
  FUZZ_CHECK(hit->n_tokens == direct->header.n_tokens, "the hit holds another number of tokens");
  const std::span<const int32_t> held(tokens.data(), size_t(hit->n_tokens));
  auto a = forward::serialize_snapshot(*hit->state, held, direct->header);
  auto b = forward::serialize_snapshot(*direct->state, held, direct->header);
  FUZZ_CHECK(a.ok() && b.ok() && *a == *b, "the cache's state differs from the decoded one");
  return true;
}

std::vector<Bytes> seeds_state_cache() {
  std::vector<Bytes> out;
  for (Bytes s : seeds_snapshot()) {
    const Bytes blob(s.begin() + 1, s.end());
    if (claimed_tokens(blob).empty()) continue;  // (an empty state is never looked up)
    s[0] |= 1;
    out.push_back(s);
    s[0] |= 4;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace flashseek::fuzz
